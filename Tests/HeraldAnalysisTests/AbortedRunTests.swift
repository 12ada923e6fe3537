import XCTest
@testable import HeraldAnalysis
import LabHistory
import LabNode
import LabPlan

/// Issue 40, item 3: an aborted run has no verdict. The coordinator writes `aborted: true` into
/// an aborted run's manifest; the analysis says so, the summary gives no verdict, and the history
/// keeps the run (marked) out of every baseline, arrow and trend.
final class AbortedRunTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = TestPaths.temp("aborted") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    /// A simulated smoke run in `name`, its manifest marked aborted when asked.
    func bundle(_ name: String, aborted: Bool) throws -> URL {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        let out = tmp.appendingPathComponent(name)
        _ = try Simulation(plan: try Plan.load(path: path), planText: "", seed: 1, output: out).run()
        if aborted {
            let url = out.appendingPathComponent("manifest.json")
            var json = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
            json["aborted"] = true
            try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys]).write(to: url)
        }
        return out
    }

    func testAnAbortedRunHasNoVerdictAndIsNoBaseline() throws {
        let clean = try Analyser.analyse(try bundle("clean", aborted: false)).result
        XCTAssertNil(clean.input.aborted)
        let abortedReport = try Analyser.analyse(try bundle("stopped", aborted: true))
        let aborted = abortedReport.result
        let html = HTMLReport.render(abortedReport)
        XCTAssertTrue(html.contains("<b class=\"aborted\">ABORTED</b><span>no verdict</span>"), "report.html: no verdict")
        XCTAssertFalse(html.contains(">PASS</b>") || html.contains(">FAIL</b>"))
        XCTAssertEqual(aborted.input.aborted, true)
        XCTAssertEqual(Regression.infrastructure(aborted).first, "the run was aborted", "an aborted run is never a protocol regression")
        let text = Summary.text(aborted, mode: .strict)
        XCTAssertTrue(text.contains("verdict: none (the run was aborted"), text)
        XCTAssertFalse(text.contains("verdict: FAIL") || text.contains("verdict: PASS"), text)
        // summary.json carries it, so regress and history read it back.
        let decoded = try JSONDecoder().decode(AnalysisResult.self, from: try ReportWriter.summaryJSON(aborted))
        XCTAssertEqual(decoded.input.aborted, true)
        // The history: the aborted row says so, and is no baseline even with infra runs asked for.
        let store = try HistoryStore(url: tmp.appendingPathComponent("history.sqlite"))
        var row = try store.record(aborted, reportPath: "")
        XCTAssertTrue(row.aborted)
        XCTAssertEqual(row.verdict, "aborted")
        XCTAssertFalse(row.isClean)
        row = try store.record(clean, reportPath: "")
        XCTAssertEqual(row.verdict, "pass")
        XCTAssertTrue(row.isClean)
        var next = clean
        next.input.path = tmp.appendingPathComponent("next").path
        next.input.runId = "next"
        XCTAssertEqual(try store.baseline(like: next, last: 10, includeInfra: true).map(\.path), [clean.input.path])
        XCTAssertEqual(try store.runs().map(\.aborted), [true, false], "kept in the history, marked")
        XCTAssertEqual(try store.plans(), ["smoke"])
    }
}
