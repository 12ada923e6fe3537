import Foundation
import XCTest

enum TestPaths {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let fixture = packageRoot.deletingLastPathComponent().appendingPathComponent("shared/herald/fixtures/herald-2020-12-08.tar.xz")
    static let binary = packageRoot.appendingPathComponent(".build/debug/herald-lab")

    static func temp(_ name: String) -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// Runs a program; returns (exit code, stdout, stderr).
    @discardableResult
    static func run(_ executable: String, _ args: [String], environment: [String: String] = [:]) throws -> (Int32, String, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        p.environment = env
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }

    /// The published Herald test, unpacked once per test run.
    static let unpackedFixture: URL? = {
        guard FileManager.default.fileExists(atPath: fixture.path) else { return nil }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("heraldlab-fixture-\(ProcessInfo.processInfo.processIdentifier)")
        let target = dir.appendingPathComponent("herald-2020-12-08")
        if FileManager.default.fileExists(atPath: target.appendingPathComponent("A10/contacts.csv").path) { return target }
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        guard let (code, _, _) = try? run("/usr/bin/tar", ["-xJf", fixture.path, "-C", dir.path]), code == 0 else { return nil }
        return target
    }()

    static func write(_ text: String, to url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(text.utf8).write(to: url)
    }
}
