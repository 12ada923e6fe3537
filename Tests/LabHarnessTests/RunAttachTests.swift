import Foundation
import XCTest
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab run` as a CI step and at a terminal: Ctrl-C detaches and says how to follow the run
/// again; --attach follows it and fetches its bundle; --junit and --summary put the report's files
/// where the CI system reads them.
final class RunAttachTests: XCTestCase {
    var lab: LabProcesses?
    override func tearDown() { lab?.stopAll(); lab = nil }

    func testCtrlCDetachesAndAttachFollowsTheRunToItsVerdict() throws {
        let lab = try LabProcesses.make(agents: 2)
        self.lab = lab
        let planFile = lab.dir.appendingPathComponent("attach.yaml")
        try LabProcesses.plan("attach", nodes: 2, duration: "15s").write(to: planFile, atomically: true, encoding: .utf8)

        // A run followed at a terminal, interrupted once submitted.
        let output = lab.dir.appendingPathComponent("run.out")
        FileManager.default.createFile(atPath: output.path, contents: nil)
        let handle = try FileHandle(forWritingTo: output)
        let p = Process()
        p.executableURL = LabProcesses.binary
        p.arguments = ["run", planFile.path, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path, "--out", lab.dir.appendingPathComponent("first").path]
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        var id = ""
        try lab.waitUntil(timeout: 30, "the run submitted") {
            let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
            guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("run ") && $0.contains(" submitted: ") }) else { return false }
            id = String(line.split(separator: " ")[1])
            return true
        }
        kill(p.processIdentifier, SIGINT)
        p.waitUntilExit()
        let said = try String(contentsOf: output, encoding: .utf8)
        XCTAssertEqual(p.terminationStatus, 130, said)
        XCTAssertTrue(said.contains("detached; run \(id) goes on at the coordinator"), said)
        XCTAssertTrue(said.contains("herald-lab run --attach \(id) --coordinator \(lab.coordinatorURL)"), said)
        XCTAssertTrue(said.contains("herald-lab runs abort \(id) --coordinator \(lab.coordinatorURL)"), said)
        // Issue 40: the hint carries the credential option given, to be pasted as it is, never the secret.
        XCTAssertTrue(said.contains("herald-lab run --attach \(id) --coordinator \(lab.coordinatorURL) --token-file \(lab.tokenFile.path)"), said)
        XCTAssertFalse(said.contains(lab.token), "the token itself is never printed")
        let state = lab.runRecord(id)?["state"] as? String
        XCTAssertTrue(["queued", "arming", "running", "gathering", "complete"].contains(state ?? "?"), "the run goes on: \(state ?? "none")")

        // Followed again, to its end, with the files a CI system publishes.
        let out = lab.dir.appendingPathComponent("fetched")
        let junit = lab.dir.appendingPathComponent("ci/junit.xml"), summary = lab.dir.appendingPathComponent("ci/summary.json")
        let (code, text) = try lab.cli(["run", "--attach", id, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path,
                                        "--out", out.path, "--junit", junit.path, "--summary", summary.path])
        XCTAssertEqual(code, 0, text)
        XCTAssertTrue(text.contains("run \(id) attached: 2 nodes"), text)
        XCTAssertTrue(text.contains("verdict: PASS"), text)
        XCTAssertTrue(FileManager.default.fileExists(atPath: out.appendingPathComponent("\(id)/manifest.json").path))
        XCTAssertTrue(try String(contentsOf: junit, encoding: .utf8).contains("<testsuite"))
        XCTAssertNotNil(try JSONSerialization.jsonObject(with: Data(contentsOf: summary)) as? [String: Any])

        // The runs, for scripts.
        let (listed, json) = try lab.cli(["runs", "list", "--json", "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(listed, 0, json)
        let runs = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]], json)
        XCTAssertEqual(runs.first { $0["id"] as? String == id }?["state"] as? String, "complete")
    }

    func testAttachRefusesABadIdAndAPlanTogetherWithAnId() throws {
        let lab = try LabProcesses.make(agents: 1)
        self.lab = lab
        let (bad, badOut) = try lab.cli(["run", "--attach", "../x", "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(bad, 2, badOut)
        XCTAssertTrue(badOut.contains("--attach: run id \"../x\""), badOut)
        let (both, bothOut) = try lab.cli(["run", "plans/smoke.yaml", "--attach", "r1", "--coordinator", lab.coordinatorURL])
        XCTAssertEqual(both, 2, bothOut)
        let (none, noneOut) = try lab.cli(["run", "--coordinator", lab.coordinatorURL])
        XCTAssertEqual(none, 2, noneOut)
        let (unknown, unknownOut) = try lab.cli(["run", "--attach", "no-such-run", "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(unknown, 2, unknownOut)
    }
}
