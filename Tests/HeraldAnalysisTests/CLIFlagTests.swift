import XCTest
import LabNode
import LabPlan

/// The command line as a newcomer meets it: --version, and units on every duration flag.
final class CLIFlagTests: XCTestCase {
    override func setUpWithError() throws {
        guard FileManager.default.isExecutableFile(atPath: TestPaths.binary.path) else { throw XCTSkip("build herald-lab first (swift build)") }
    }

    func herald(_ args: [String]) throws -> (Int32, String, String) {
        try TestPaths.run(TestPaths.binary.path, args)
    }

    func testVersionPrintsTheReleaseAndTheCommit() throws {
        let (code, out, err) = try herald(["--version"])
        XCTAssertEqual(code, 0, err)
        let line = out.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertTrue(line.hasPrefix("herald-lab \(HeraldLabVersion.version) (commit "), line)
        let commit = line.dropFirst("herald-lab \(HeraldLabVersion.version) (commit ".count).dropLast()
        XCTAssertEqual(String(commit), HeraldLabVersion.commit)
        // Built from this checkout: a hexadecimal commit, perhaps marked dirty.
        XCTAssertNotNil(commit.split(separator: "-").first.flatMap { UInt64($0, radix: 16) }, "\(commit)")
    }

    func testEveryManifestRecordsTheCommit() throws {
        let tmp = TestPaths.temp("manifest-commit")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var plan = try Plan.load(path: TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path)
        plan.duration = 20; plan.warmup = 0
        _ = try Simulation(plan: plan, planText: "", output: tmp).run()
        let manifest = try JSONSerialization.jsonObject(with: Data(contentsOf: tmp.appendingPathComponent("manifest.json"))) as? [String: Any]
        let software = try XCTUnwrap(manifest?["software"] as? [String: Any])
        XCTAssertEqual(software["commit"] as? String, HeraldLabVersion.commit)
        XCTAssertEqual(software["version"] as? String, HeraldLabVersion.version)
    }

    func testDurationFlagsRefuseBareNumbersWithAHintAndExitTwo() throws {
        let plan = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        let cases: [([String], String)] = [
            (["node", plan, "--node", "alpha", "--duration", "120"], "\"120\" has no unit; write a duration with one, such as 120s"),
            (["node", plan, "--node", "alpha", "--every", "5"], "\"5\" has no unit; write a duration with one, such as 5s"),
            (["coordinator", "--insecure", "--gather-patience", "30"], "\"30\" has no unit; write a duration with one, such as 30s"),
            (["coordinator", "--insecure", "--retain", "30"], "\"30\" has no unit; write a duration with one, such as 30h"),
            (["coordinator", "--insecure", "--gather-patience", "2d"], "\"2d\" is too long; at most 1 days (24h)"),
            (["dongles", "check", "--coordinator", "http://127.0.0.1:9", "--bound", "45"], "\"45\" has no unit; write a duration with one, such as 45s"),
        ]
        for (args, message) in cases {
            let (code, out, err) = try herald(args)
            XCTAssertEqual(code, 2, "\(args): \(out) \(err)")
            XCTAssertTrue(err.contains(message), "\(args): \(err)")
        }
    }

    /// Each service takes --log-level (issue 22); a level it does not know is exit 2, naming the
    /// flag and the levels.
    func testServicesTakeALogLevelAndRefuseAnUnknownOneWithExitTwo() throws {
        for service in [["coordinator", "--insecure"], ["agent", "--insecure", "--name", "a1", "--data", "/nonexistent"], ["air", "--insecure"]] {
            let (code, out, err) = try herald(service + ["--log-level", "verbose"])
            XCTAssertEqual(code, 2, "\(service): \(out) \(err)")
            XCTAssertTrue(err.contains("--log-level: 'verbose' is not a log level (one of trace|debug|info|notice|warning|error|critical)"), "\(service): \(err)")
            let (helpCode, help, _) = try herald([service[0], "--help"])
            XCTAssertEqual(helpCode, 0)
            XCTAssertTrue(help.contains("--log-level"), help)
        }
    }

    func testTheOldRetainDaysFlagIsGoneWithAPointerToTheNewOne() throws {
        let (code, _, err) = try herald(["coordinator", "--insecure", "--retain-days", "30"])
        XCTAssertEqual(code, 2)
        XCTAssertTrue(err.contains("--retain-days is now --retain, which takes a duration with its unit, such as --retain 30d"), err)
    }
}
