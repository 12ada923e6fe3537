import XCTest
import LabNode
import LabPlan
@testable import HeraldAnalysis
@testable import LabHistory

/// `analyse` on a bundle from the simulator writes every output; the report renders in Chromium.
final class BundleReportTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = TestPaths.temp("bundle") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func simulate(seed: UInt64 = 1, name: String = "run", configure: (inout Plan) -> Void = { _ in }) throws -> URL {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        var plan = try Plan.load(path: path)
        configure(&plan)
        let out = tmp.appendingPathComponent(name)
        _ = try Simulation(plan: plan, planText: try String(contentsOfFile: path, encoding: .utf8), seed: seed, output: out).run()
        return out
    }

    func testAnalyseWritesEveryOutputBesideTheNodes() throws {
        let bundle = try simulate()
        let report = try Analyser.analyse(bundle)
        try ReportWriter.write(report, to: ReportWriter.defaultOutput(for: bundle, kind: report.result.input.kind))
        let files = try FileManager.default.contentsOfDirectory(atPath: bundle.appendingPathComponent("report").path).sorted()
        XCTAssertEqual(files, ["formal-continuity.csv", "formal-summary.csv", "junit.xml", "pairs.csv", "report.html", "summary-discovery-pairs.csv", "summary.json"])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: bundle.appendingPathComponent("nodes/alpha").path).sorted(),
                       ["battery.csv", "contacts.csv", "detection.csv", "log.txt", "statistics.csv"], "nothing written inside a node folder")
        let r = report.result
        XCTAssertEqual(r.input.kind, "bundle")
        XCTAssertEqual(r.input.plan, "smoke")
        XCTAssertEqual(r.parameters.ceStart, "2026-01-01 00:00:10")
        XCTAssertEqual(r.strict.achieveddetections, 2)
        XCTAssertTrue(r.passed)
        // JUnit: one test case per node and metric plus the headline figures, with stable names.
        let junit = try String(contentsOf: bundle.appendingPathComponent("report/junit.xml"), encoding: .utf8)
        XCTAssertEqual(junit.components(separatedBy: "<testcase ").count - 1, 2 + 2 * 4)
        XCTAssertTrue(junit.contains("name=\"smoke/continuity/alpha\""), junit)
        XCTAssertTrue(junit.contains("name=\"smoke/detection/overall\""), junit)
        XCTAssertFalse(junit.contains(r.input.runId!), "no run id in test names")
        XCTAssertTrue(junit.contains(" time=\""))
        XCTAssertFalse(junit.contains("<failure"))
        let perPair = JUnit.xml(r, perPair: true)
        XCTAssertTrue(perPair.contains("name=\"smoke/continuity/alpha sees beta\""), perPair)
        let summary = try ReportWriter.readSummary(bundle.appendingPathComponent("report/summary.json"))
        XCTAssertEqual(summary.format, "heraldlab-summary/1")
        XCTAssertEqual(summary.pairs.count, 2)
        let pairs = try String(contentsOf: bundle.appendingPathComponent("report/pairs.csv"), encoding: .utf8)
        XCTAssertEqual(pairs.split(separator: "\n").count, 3)
    }

    func testPlanThresholdsDecideTheJUnitVerdict() throws {
        let bundle = try simulate { $0.thresholds.timeToFirstDetection = 0.01 }
        let report = try Analyser.analyse(bundle)
        XCTAssertFalse(report.result.passed)
        let junit = JUnit.xml(report.result)
        XCTAssertEqual(junit.components(separatedBy: "<failure").count - 1, 2, "time to first detection fails for both nodes")
        XCTAssertTrue(junit.contains("timeToFirstDetection of alpha: 1 of 1 pairs failed: alpha sees beta"), junit)
    }

    func testReportRendersWithoutConsoleErrorsInChromium() throws {
        guard let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw XCTSkip("chromium is not installed (make deps installs Debian's chromium)")
        }
        let bundle = try simulate()
        let report = try Analyser.analyse(bundle)
        let out = bundle.appendingPathComponent("report")
        try ReportWriter.write(report, to: out)
        let shot = tmp.appendingPathComponent("report.png")
        let (code, _, err) = try TestPaths.run(chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000",
                                                           "--enable-logging=stderr", "--v=0", "--screenshot=\(shot.path)", out.appendingPathComponent("report.html").absoluteString])
        XCTAssertEqual(code, 0, err)
        let attributes = try FileManager.default.attributesOfItem(atPath: shot.path)
        XCTAssertGreaterThan((attributes[.size] as? NSNumber)?.intValue ?? 0, 20_000, "a screenshot with content")
        let consoleErrors = err.split(separator: "\n").filter { $0.contains("CONSOLE") || $0.contains("Uncaught") || $0.contains("ERR_FILE_NOT_FOUND") }
        XCTAssertTrue(consoleErrors.isEmpty, consoleErrors.joined(separator: "\n"))
        let html = try String(contentsOf: out.appendingPathComponent("report.html"), encoding: .utf8)
        XCTAssertFalse(html.contains("http://") && html.contains("<script src"), "self-contained")
        XCTAssertTrue(html.contains("<svg"))
        // Keep the screenshot where a person can look at it.
        try FileManager.default.createDirectory(at: ReadableReportTests.artefacts, withIntermediateDirectories: true)
        let keep = ReadableReportTests.artefacts.appendingPathComponent("smoke.png")
        try? FileManager.default.removeItem(at: keep)
        try? FileManager.default.copyItem(at: shot, to: keep)
    }

    func testHistoryRecordsRunsAndFindsTheLatestBaseline() throws {
        let store = try HistoryStore(url: tmp.appendingPathComponent("results/history.sqlite"))
        let a = try Analyser.analyse(try simulate(seed: 1, name: "a")).result
        let b = try Analyser.analyse(try simulate(seed: 2, name: "b")).result
        try store.record(a, reportPath: "a/report")
        try store.record(b, reportPath: "b/report")
        XCTAssertEqual(try store.runs(plan: "smoke").map(\.runId), ["a", "b"])
        XCTAssertEqual(try store.runs(plan: "other").count, 0)
        XCTAssertEqual(try store.latest(like: b)?.runId, "a")
        XCTAssertNil(try store.latest(like: a), "a run recorded after a is not a's baseline")
        // Another variant is not a baseline of this one.
        var other = b
        other.input.variant = "slow"
        XCTAssertNil(try store.latest(like: other))
        XCTAssertEqual(try store.summary(of: store.runs()[0]).strict.achievedwindows, a.strict.achievedwindows)
        // A run with an infrastructure fault is never the latest baseline (issue 38).
        var faulty = try Analyser.analyse(try simulate(seed: 3, name: "c")).result
        faulty.input.infrastructure = ["node alpha: agent paused"]
        try store.record(faulty, reportPath: "c/report")
        var next = b
        next.input.runId = "d"
        next.input.path = "d"
        try store.record(next, reportPath: "d/report")
        XCTAssertEqual(try store.latest(like: next)?.runId, "b", "the faulty run c is skipped")
    }
}
