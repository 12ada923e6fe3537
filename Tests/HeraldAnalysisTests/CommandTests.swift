import XCTest
import LabNode
import LabPlan

/// The analysis commands as a user runs them: exit codes and what they print.
final class CommandTests: XCTestCase {
    var tmp: URL!
    override func setUpWithError() throws {
        guard FileManager.default.isExecutableFile(atPath: TestPaths.binary.path) else { throw XCTSkip("build herald-lab first (swift build)") }
        tmp = TestPaths.temp("cmd")
    }
    override func tearDown() { if let tmp { try? FileManager.default.removeItem(at: tmp) } }

    func simulate(_ name: String, configure: (inout Plan) -> Void = { _ in }) throws -> URL {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        var plan = try Plan.load(path: path)
        configure(&plan)
        let out = tmp.appendingPathComponent(name)
        _ = try Simulation(plan: plan, planText: "", output: out).run()
        return out
    }

    func herald(_ args: [String]) throws -> (Int32, String, String) {
        try TestPaths.run(TestPaths.binary.path, args, environment: ["HERALDLAB_RESULTS": tmp.appendingPathComponent("results").path])
    }

    func testRegressExitsOneOnARegressionAndZeroOtherwise() throws {
        let good = try simulate("good")
        // Same plan, a much lossier radio: continuity falls.
        let bad = try simulate("bad") { $0.radio.reportLoss = 0.97; $0.sensor.scanOn = 1; $0.sensor.scanOff = 10 }
        XCTAssertEqual(try herald(["analyse", good.path]).0, 0)
        XCTAssertEqual(try herald(["analyse", bad.path]).0, 0)
        let (same, sameOut, _) = try herald(["regress", good.path, "--baseline", good.path])
        XCTAssertEqual(same, 0, sameOut)
        XCTAssertTrue(sameOut.contains("no regression"))
        let (worse, worseOut, _) = try herald(["regress", bad.path, "--baseline", good.path])
        XCTAssertEqual(worse, 1, worseOut)
        XCTAssertTrue(worseOut.contains("REGRESSION"), worseOut)
        XCTAssertTrue(worseOut.contains("continuity % (strict)"), worseOut)
        let (latest, latestOut, _) = try herald(["regress", bad.path, "--baseline", "latest"])
        XCTAssertEqual(latest, 1, "the latest earlier run of the plan is the good one")
        XCTAssertTrue(latestOut.contains("baseline: good"), latestOut)
        let (better, _, _) = try herald(["regress", good.path, "--baseline", bad.path])
        XCTAssertEqual(better, 0, "an improvement is not a regression")
        let (missing, _, err) = try herald(["regress", tmp.appendingPathComponent("none").path, "--baseline", good.path])
        XCTAssertEqual(missing, 2, err)
    }

    func testCompareNamesTheSettingsThatDifferAndGivesIntervalsAndVerdicts() throws {
        let a = try simulate("a")
        let b = try simulate("b") { $0.variant = "slow-scan"; $0.sensor.scanOn = 2 }
        let json = tmp.appendingPathComponent("effects.json")
        let (code, out, err) = try herald(["compare", a.path, b.path, "--json", json.path])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(out.contains("factor: sensor.scanOn × variant"), out)
        XCTAssertFalse(out.contains("advertInterval"), "only the settings that differ are named: \(out)")
        XCTAssertTrue(out.contains("difference [95 %]"), out)
        XCTAssertTrue(out.contains("check: every arm got its devices"), out)
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: json)) as! [String: Any]
        let effects = object["effects"] as! [[String: Any]]
        XCTAssertEqual(effects.count, 10)
        for e in effects {
            for key in ["metric", "factor", "baseline", "level", "verdict"] { XCTAssertNotNil(e[key], "\(key) in \(e)") }
            XCTAssertTrue(["better", "worse", "same", "inconclusive", "no data"].contains(e["verdict"] as! String))
            if let ci = e["ci95"] as? [Double] { XCTAssertLessThanOrEqual(ci[0], ci[1]) }
        }
        XCTAssertEqual(try herald(["compare", a.path]).0, 2, "one bundle is nothing to compare")
        let (same, _, sameErr) = try herald(["compare", a.path, a.path])
        XCTAssertEqual(same, 2)
        XCTAssertTrue(sameErr.contains("same settings"), sameErr)
    }

    func testAnalyseWritesBesideAPlainFolderAndRecordsHistory() throws {
        let bundle = try simulate("plain")
        let plain = bundle.appendingPathComponent("nodes")
        let (code, out, err) = try herald(["analyse", plain.path, "--ce-start", "2026-01-01 00:00:10", "--ce-end", "2026-01-01 00:02:00", "--mode", "herald"])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(out.contains("herald mode: detection 2 of 2 pairs"), out)
        XCTAssertTrue(FileManager.default.fileExists(atPath: bundle.appendingPathComponent("nodes-report/report.html").path), "beside the folder, never inside it")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: plain.path).sorted(), ["alpha", "beta"])
        let (hcode, hout, _) = try herald(["history"])
        XCTAssertEqual(hcode, 0)
        XCTAssertTrue(hout.contains("nodes"), hout)
        let (bad, _, berr) = try herald(["analyse", plain.path, "--ce-start", "yesterday"])
        XCTAssertEqual(bad, 2)
        XCTAssertTrue(berr.contains("expected YYYY-MM-DD HH:MM:SS"), berr)
    }
}
