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

    func testRegressExitsOneOnARegressionZeroOtherwiseAndThreeWhenItCannotTell() throws {
        let good = try simulate("good")
        // Same plan, a much lossier radio: continuity falls.
        let bad = try simulate("bad") { $0.radio.reportLoss = 0.97; $0.sensor.scanOn = 1; $0.sensor.scanOff = 10 }
        XCTAssertEqual(try herald(["analyse", good.path]).0, 0)
        XCTAssertEqual(try herald(["analyse", bad.path]).0, 1, "the lossy run fails its thresholds (recorded all the same)")
        let (same, sameOut, _) = try herald(["regress", good.path, "--baseline", good.path])
        XCTAssertEqual(same, 0, sameOut)
        XCTAssertTrue(sameOut.contains("no regression"))
        let (worse, worseOut, _) = try herald(["regress", bad.path, "--baseline", good.path])
        XCTAssertEqual(worse, 1, worseOut)
        XCTAssertTrue(worseOut.contains("REGRESSION"), worseOut)
        XCTAssertTrue(worseOut.contains("RSSI samples"), worseOut)
        XCTAssertTrue(worseOut.contains("warning: the baseline's settings differ in radio.reportLoss"), worseOut)
        let (worseJSON, jsonOut, _) = try herald(["regress", bad.path, "--baseline", good.path, "--json", "-"])
        XCTAssertEqual(worseJSON, 1, "the same exit code with --json -")
        let judgement = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(jsonOut.utf8)) as? [String: Any], "standard output is the JSON alone: \(jsonOut)")
        XCTAssertEqual(judgement["verdict"] as? String, "regression")
        let (latest, _, latestErr) = try herald(["regress", bad.path, "--baseline", "latest"])
        XCTAssertEqual(latest, 3, "latest respects the settings: the good run is not a baseline of the lossy one")
        XCTAssertTrue(latestErr.contains("with this variant, these settings"), latestErr)
        let (history, historyOut, _) = try herald(["regress", good.path, "--baseline", "history"])
        XCTAssertEqual(history, 3, historyOut)
        XCTAssertTrue(historyOut.contains("inconclusive: 0 earlier runs"), historyOut)
        XCTAssertTrue(historyOut.contains("at least 3 are needed"), historyOut)
        let (better, _, _) = try herald(["regress", good.path, "--baseline", bad.path])
        XCTAssertEqual(better, 0, "an improvement is not a regression")
        let (missing, _, err) = try herald(["regress", tmp.appendingPathComponent("none").path, "--baseline", good.path])
        XCTAssertEqual(missing, 2, err)
        let other = try simulate("other") { $0.name = "other-plan" }
        let (refused, _, refusedErr) = try herald(["regress", other.path, "--baseline", good.path])
        XCTAssertEqual(refused, 2)
        XCTAssertTrue(refusedErr.contains("is a run of plan smoke, this run is of plan other-plan"), refusedErr)
        // Analysed twice, one history row.
        XCTAssertEqual(try herald(["analyse", good.path]).0, 0)
        let (_, rows, _) = try herald(["history", "--plan", "smoke"])
        XCTAssertEqual(rows.components(separatedBy: "good").count - 1, 1, rows)
    }

    /// Issue 40, item 7, as a user meets it: a mistyped subcommand, keyword or plan is exit 2
    /// with the close one; analyse says where it recorded the history; --json [FILE] alike.
    func testSlipsAreExitTwoWithTheCloseOneAndAnalyseSaysWhereItRecorded() throws {
        let (sim, _, simErr) = try herald(["simulat", "plans/smoke.yaml"])
        XCTAssertEqual(sim, 2, simErr)
        XCTAssertTrue(simErr.contains("unknown command 'simulat'; did you mean 'simulate'?"), simErr)
        let good = try simulate("good")
        let (code, _, err) = try herald(["analyse", good.path])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(err.contains("history: recorded in \(tmp.appendingPathComponent("results/history.sqlite").standardizedFileURL.path)"), err)
        let (base, _, baseErr) = try herald(["regress", good.path, "--baseline", "histroy"])
        XCTAssertEqual(base, 2, baseErr)
        XCTAssertTrue(baseErr.contains("--baseline \"histroy\": no such bundle, and not history or latest; did you mean 'history'?"), baseErr)
        let (plan, planOut, planErr) = try herald(["history", "--plan", "smok"])
        XCTAssertEqual(plan, 2, planOut)
        XCTAssertTrue(planErr.contains("--plan \"smok\": no plan by that name") && planErr.contains("did you mean 'smoke'?"), planErr)
        let (mode, _, modeErr) = try herald(["analyse", good.path, "--mode", "stric", "--no-history"])
        XCTAssertEqual(mode, 2)
        XCTAssertTrue(modeErr.contains("did you mean 'strict'?"), modeErr)
        // --json FILE writes the file and prints the text; --json alone prints the JSON alone.
        let file = tmp.appendingPathComponent("history.json")
        let (hcode, hout, herr) = try herald(["history", "--json", file.path])
        XCTAssertEqual(hcode, 0, herr)
        XCTAssertTrue(hout.contains("verdict"), hout)
        let rows = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: file)) as? [[String: Any]])
        XCTAssertEqual(rows.first?["verdict"] as? String, "pass")
        let (pcode, pout, perr) = try herald(["plan", "check", "--json", TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path])
        XCTAssertEqual(pcode, 0, perr)
        let checked = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(pout.utf8)) as? [String: Any], pout)
        XCTAssertEqual((checked["plan"] as? [String: Any])?["name"] as? String, "smoke")
        let simulated = tmp.appendingPathComponent("simulated")
        let (scode, sout, serr) = try herald(["simulate", TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path, "--out", simulated.path, "--quiet", "--json"])
        XCTAssertEqual(scode, 0, serr)
        let simJSON = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(sout.utf8)) as? [String: Any], sout)
        XCTAssertEqual(simJSON["bundle"] as? String, simulated.path)
        XCTAssertEqual(simJSON["plan"] as? String, "smoke")
    }

    func testCompareNamesTheSettingsThatDifferAndGivesIntervalsAndVerdicts() throws {
        let a = try simulate("a")
        let b = try simulate("b") { $0.variant = "slow-scan\u{1b}[2J"; $0.sensor.scanOn = 2 }
        let json = tmp.appendingPathComponent("effects.json")
        let (code, out, err) = try herald(["compare", a.path, b.path, "--json", json.path])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(out.contains("factor: sensor.scanOn × variant"), out)
        XCTAssertFalse(out.contains("advertInterval"), "only the settings that differ are named: \(out)")
        XCTAssertFalse(out.contains("\u{1b}"), "labels are printed escaped")
        XCTAssertTrue(out.contains("slow-scan\\x1B[2J"), out)
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
        // The report: self-contained, renders in headless Chromium without console errors.
        let html = tmp.appendingPathComponent("study.html")
        XCTAssertEqual(try herald(["compare", a.path, b.path, "--html", html.path]).0, 0)
        let page = try String(contentsOf: html, encoding: .utf8)
        XCTAssertTrue(page.contains("forest plot") && page.contains("<svg"), "a forest plot")
        XCTAssertFalse(page.contains("<script") || page.contains("src=\"http"), "self-contained")
        if let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) {
            let shot = tmp.appendingPathComponent("study.png")
            let (code, _, err) = try TestPaths.run(chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,1600", "--enable-logging=stderr", "--v=0",
                                                               "--screenshot=\(shot.path)", html.absoluteString])
            XCTAssertEqual(code, 0, err)
            XCTAssertGreaterThan((try FileManager.default.attributesOfItem(atPath: shot.path)[.size] as? NSNumber)?.intValue ?? 0, 20_000)
            let consoleErrors = err.split(separator: "\n").filter { $0.contains("CONSOLE") || $0.contains("Uncaught") || $0.contains("ERR_FILE_NOT_FOUND") }
            XCTAssertTrue(consoleErrors.isEmpty, consoleErrors.joined(separator: "\n"))
        }
        XCTAssertEqual(try herald(["compare", a.path]).0, 2, "one bundle is nothing to compare")
        let (same, _, sameErr) = try herald(["compare", a.path, a.path])
        XCTAssertEqual(same, 2)
        XCTAssertTrue(sameErr.contains("same settings"), sameErr)
    }

    func testAnalyseWritesBesideAPlainFolderAndRecordsHistory() throws {
        let bundle = try simulate("plain")
        let plain = bundle.appendingPathComponent("nodes")
        // The filter window holds the warm-up, where the payloads are read.
        let (code, out, err) = try herald(["analyse", plain.path, "--ce-start", "2026-01-01 00:00:10", "--ce-end", "2026-01-01 00:02:00",
                                           "--filter-start", "2026-01-01 00:00:00", "--mode", "herald"])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(out.contains("herald mode: detection 2 of 2 pairs"), out)
        XCTAssertTrue(FileManager.default.fileExists(atPath: bundle.appendingPathComponent("nodes-report/report.html").path), "beside the folder, never inside it")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: plain.path).sorted(), ["alpha", "beta"])
        let (hcode, hout, _) = try herald(["history"])
        XCTAssertEqual(hcode, 0)
        XCTAssertTrue(hout.contains("nodes"), hout)
        let (acode, aout, aerr) = try herald(["analyse", bundle.path, "--json", "--no-history"])
        XCTAssertEqual(acode, 0, aerr)
        let summary = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(aout.utf8)) as? [String: Any], aout)
        XCTAssertEqual(summary["passed"] as? Bool, true)
        XCTAssertNotNil(summary["checks"] as? [[String: Any]])
        let (jcode, jout, jerr) = try herald(["history", "--json"])
        XCTAssertEqual(jcode, 0, jerr)
        let rows = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(jout.utf8)) as? [[String: Any]], jout)
        XCTAssertEqual(rows.count, 1)
        XCTAssertEqual(rows.first?["detectionPct"] as? Double, 100)
        XCTAssertNotNil(rows.first?["runId"] as? String)
        let (bad, _, berr) = try herald(["analyse", plain.path, "--ce-start", "yesterday"])
        XCTAssertEqual(bad, 2)
        XCTAssertTrue(berr.contains("expected YYYY-MM-DD HH:MM:SS"), berr)
    }

    func testAnalyseExitsOneWhenTheVerdictIsFail() throws {
        let failing = try simulate("failing") { $0.thresholds.timeToFirstDetection = 0.01 }
        let (code, out, _) = try herald(["analyse", failing.path, "--no-history", "--metrics"])
        XCTAssertEqual(code, 1, out)
        XCTAssertTrue(out.contains("verdict: FAIL"), out)
        XCTAssertTrue(out.contains("metric (devices as units)"), out)
        XCTAssertEqual(try herald(["analyse", try simulate("passing").path, "--no-history"]).0, 0)
    }

    func testSimulateAStudyWritesItsRunsIndexAndReportAndCompareReadsIt() throws {
        let plan = tmp.appendingPathComponent("study.yaml")
        try TestPaths.write("""
        name: tiny-study
        duration: 20s
        warmup: 2s
        nodes: {count: 4, prefix: n}
        sensor: {advertInterval: 250ms}
        radio: {kind: sim}
        study:
          factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}]
          repeats: 2
          margins: {timeToFirstDetection: 20%}
        """, to: plan)
        let (check, checkOut, _) = try herald(["plan", "check", plan.path])
        XCTAssertEqual(check, 0)
        XCTAssertTrue(checkOut.contains("2 levels × 2 repeats = 4 runs"), checkOut)
        let out = tmp.appendingPathComponent("studies")
        let (code, text, err) = try herald(["simulate", plan.path, "--out", out.path, "--quiet"])
        XCTAssertEqual(code, 0, err)
        XCTAssertTrue(text.contains("factor: sensor.advertInterval  (baseline 100ms)"), text)
        let folder = out.appendingPathComponent("tiny-study")
        let index = try JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("study.json"))) as! [String: Any]
        XCTAssertEqual((index["runs"] as! [[String: Any]]).count, 4)
        XCTAssertEqual(index["levels"] as! [String], ["100ms", "1s"])
        for name in ["compare.json", "study.html", "run-01-L1", "run-04-L2"] where !FileManager.default.fileExists(atPath: folder.appendingPathComponent(name).path) {
            // The run folders' level suffix follows the seeded order; look for any four runs.
            if name.hasPrefix("run-") { continue }
            XCTFail("\(name) missing")
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasPrefix("run-") }.count, 4)
        let (again, againOut, _) = try herald(["compare", folder.path])
        XCTAssertEqual(again, 0)
        XCTAssertTrue(againOut.contains("level 100ms: 2 runs"), againOut)
        XCTAssertEqual(try herald(["simulate", plan.path, "--out", out.path, "--quiet"]).0, 2, "a study folder is never overwritten")
    }
}
