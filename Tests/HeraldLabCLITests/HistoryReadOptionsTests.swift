import Foundation
import XCTest

/// `--history postgres://…` and `--lab` on the reading commands (issue 41): bad input is exit 2
/// naming the flag, before any database is reached (none is needed here); a password in the
/// URL is refused and never echoed.
final class HistoryReadOptionsTests: XCTestCase {
    static let binary = PlanCheckNeedsTests.binary
    let url = "postgres://reader@127.0.0.1:1/herald_results"

    func run(_ args: [String]) throws -> (Int32, String) {
        let p = Process()
        p.executableURL = Self.binary
        p.arguments = args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    func testBadHistoryAndLabFlagsAreExit2NamingTheFlag() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.binary.path) else { throw XCTSkip("build herald-lab first") }
        let tmp = FileManager.default.temporaryDirectory.appendingPathComponent("hro-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: tmp) }
        let results = ["--results", tmp.path]
        let cases: [([String], String)] = [
            (["history", "--lab", "north"] + results, "--lab goes with --history postgres://"),
            (["history", "--history-password-file", "/nonexistent"] + results, "--history-password-file goes with --history"),
            (["history", "--history", url, "--lab", ""], "--lab \"\": empty"),
            (["history", "--history", url, "--lab", "north\u{1B}[31m"], "--lab \"north\\x1B[31m\": holds control or format characters"),
            (["history", "--history", url, "--lab", String(repeating: "x", count: 129)], "over 128 characters"),
            (["history", "--history", "mysql://reader@host/db"], "--history: "),
            (["history", "--history", "postgres://reader:hunter2@127.0.0.1/db"], "a password in the URL is refused"),
            (["regress", tmp.path, "--baseline", "history", "--history", url, "--lab", "a", "--lab", "b"], "--lab given 2 times: one lab here"),
            (["regress", tmp.path, "--baseline", tmp.path, "--history", url], "--history goes with --baseline history or latest"),
            (["regress", tmp.path, "--baseline", "history", "--lab", "a"] + results, "--lab goes with --history"),
            (["compare", "--history", url, "--lab", "a", "--plan", "p"], "--lab: 2 labs needed with --history (--lab A --lab B), 1 given"),
            (["compare", "--history", url, "--lab", "a", "--lab", "b", "--lab", "c", "--plan", "p"], "--lab given 3 times: at most 2 labs here"),
            (["compare", "--history", url, "--lab", "a", "--lab", "a", "--plan", "p"], "--lab: two different labs"),
            (["compare", "--history", url, "--lab", "a", "--lab", "b"], "--plan: needed with --history"),
            (["compare", "--history", url, "--lab", "a", "--lab", "b", "--plan", "p", "--last", "0"], "--last 0: expected 1 to 1000"),
            (["compare", "--history", url, "--lab", "a", "--lab", "b", "--plan", "p", tmp.path], "not both"),
            (["compare", tmp.path, tmp.path, "--plan", "p"], "--plan goes with --history"),
            (["analyse", tmp.path, "--lab", "a"] + results, "--lab goes with --history"),
            (["regress", "accept", "smoke", "--by", "ci", "--reason", "r", "--lab", "a"] + results, "--lab goes with --history"),
            (["regress", "accept", "smoke", "--by", "ci", "--reason", "r", "--history", url, "--lab", "a", "--lab", "b"], "--lab given 2 times"),
            (["analyse", tmp.path, "--history", url, "--no-history"], "--no-history and --history: one or the other"),
            (["analyse", tmp.path, "--history", url, "--lab", "a", "--lab", "b"], "--lab given 2 times"),
        ]
        for (args, expected) in cases {
            let (code, text) = try run(args)
            XCTAssertEqual(code, 2, "\(args): \(text)")
            XCTAssertTrue(text.contains(expected), "\(args): expected \(expected.debugDescription) in \(text)")
            XCTAssertFalse(text.contains("hunter2"), "\(args): the password is echoed: \(text)")
            XCTAssertFalse(text.contains("\u{1B}"), "\(args): a raw escape: \(text)")
        }
    }
}
