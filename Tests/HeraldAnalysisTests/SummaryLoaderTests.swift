import XCTest
import LabNode
import LabPlan
@testable import HeraldAnalysis

/// compare and regress read a bundle's report/summary.json; a damaged one was once replaced in
/// silence by a fresh analysis with the default options (issue 39), so a comparison could use
/// other windows than the report it sat beside. Now the loader says so, naming the file and why.
final class SummaryLoaderTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = TestPaths.temp("summary-loader") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func bundle() throws -> URL {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        let out = tmp.appendingPathComponent("run")
        _ = try Simulation(plan: try Plan.load(path: path), planText: try String(contentsOfFile: path, encoding: .utf8), seed: 1, output: out).run()
        let report = try Analyser.analyse(out)
        try ReportWriter.write(report, to: ReportWriter.defaultOutput(for: out, kind: report.result.input.kind))
        return out
    }

    func testADamagedSummaryIsReportedAndTheBundleAnalysedAgain() throws {
        let run = try bundle()
        var notes: [String] = []
        let read = try SummaryLoader.load(run, note: { notes.append($0) })
        XCTAssertEqual(notes, [], "a readable summary is read without a word")
        let summary = run.appendingPathComponent("report/summary.json")
        try Data("{\"format\": \"heraldlab-summary/1\", \"pairs\": [".utf8).write(to: summary)
        let again = try SummaryLoader.load(run, note: { notes.append($0) })
        XCTAssertEqual(notes.count, 1, "\(notes)")
        let note = notes.first ?? ""
        XCTAssertTrue(note.contains(summary.path) && note.contains("cannot be read") && note.contains("analysing") && note.contains("default options"), note)
        XCTAssertEqual(again.pairs.count, read.pairs.count, "the fresh analysis stands in for it")
    }
}
