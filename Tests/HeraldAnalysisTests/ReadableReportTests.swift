import XCTest
import LabNode
import LabPlan
@testable import HeraldAnalysis

/// report.html read top-down (issue 24): the verdict with its reasons by check first, the plan's
/// settings, the run over time with time axes, distributions, floor map, gap reasons, links,
/// natural order; rendered in headless Chromium with screenshots kept in results/test-report/.
final class ReadableReportTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = TestPaths.temp("readable-report") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    /// Screenshots and pages a person can look at after the tests (gitignored).
    static let artefacts = TestPaths.packageRoot.appendingPathComponent("results/test-report")

    func simulate(_ planFile: String, name: String, configure: (inout Plan) -> Void = { _ in }) throws -> URL {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/\(planFile)").path
        var plan = try Plan.load(path: path)
        configure(&plan)
        let out = tmp.appendingPathComponent(name)
        _ = try Simulation(plan: plan, planText: try String(contentsOfFile: path, encoding: .utf8), seed: 1, output: out).run()
        return out
    }

    static func section(_ s: String, from: String, to: String) -> String { ScaledReportTests.section(s, from: from, to: to) }

    // MARK: what the analysis keeps for the page

    func testTheRunOverTimeAddsUpToTheRowsAndWindowsOfTheLogs() throws {
        let bundle = try simulate("smoke.yaml", name: "smoke")
        let report = try Analyser.analyse(bundle)
        let c = report.charts, r = report.result
        // 2 min + 10 s warm-up: 30 s buckets from the plan's start.
        XCTAssertEqual(c.timeline.width, 30)
        XCTAssertEqual(c.timeline.count, 4, "the contact event ends the run at 2 min")
        XCTAssertEqual(c.timeline.origin, LogTime.parse(text: "2026-01-01 00:00:00"))
        XCTAssertEqual(c.nodeSeries.count, r.devices.count)
        for (d, s) in zip(r.devices, c.nodeSeries) {
            XCTAssertEqual(s.rssiRows.reduce(0) { $0 + Int($1) }, d.measureRows, "every RSSI row of \(d.folder) is in the run's window")
            XCTAssertEqual(s.reads.reduce(0) { $0 + Int($1) }, d.readRows)
            XCTAssertGreaterThan(s.rssiRows.reduce(0) { $0 + Int($1) }, 0)
            XCTAssertTrue(s.battery.contains { !$0.isNaN }, "battery.csv levels of \(d.folder)")
        }
        XCTAssertEqual(c.windowPairs.count, r.parameters.cetotal)
        XCTAssertEqual(c.windowPairs.reduce(0) { $0 + Int($1) }, r.pairs.reduce(0) { $0 + $1.strictWindows }, "per-window counts add up to the pairs' windows")
        // The manifest's settings and positions.
        XCTAssertEqual(c.context.radio["kind"], .string("sim"))
        XCTAssertEqual(c.context.crowding, false)
        XCTAssertEqual(c.context.nodes["beta"]?.position?.x, 1)
        XCTAssertEqual(c.context.warmup, 10)
        XCTAssertEqual(c.context.description, "Two nodes one metre apart for two minutes; the demo and CI plan.")
    }

    func testTimelineBucketsAreRoundAndBounded() {
        XCTAssertEqual(Timeline(from: 0, to: 600).width, 30)
        XCTAssertEqual(Timeline(from: 0, to: 8 * 3600 + 60).width, 60)
        XCTAssertEqual(Timeline(from: 0, to: 8 * 3600 + 60).count, 481)
        XCTAssertLessThanOrEqual(Timeline(from: 0, to: 366 * 86400).count, Timeline.maximumBuckets)
        XCTAssertEqual(Timeline(from: 10, to: 5).count, 0, "an empty window has no buckets")
        XCTAssertEqual(Timeline(from: .nan, to: 5).count, 0)
        let t = Timeline(from: 100, to: 190)
        XCTAssertEqual(t.index(100), 0)
        XCTAssertEqual(t.index(190), 2, "the end belongs to the last bucket")
        XCTAssertNil(t.index(99.9))
        XCTAssertNil(t.index(190.1))
    }

    // MARK: time axes

    func testTimeAxesAreLabelledForTenMinuteAndEightHourRuns() {
        func labels(_ span: Double) -> [String] {
            let axis = HTMLReport.timeAxis(HTMLReport.Frame(width: 1000, xMin: 0, xMax: span), title: "run time")
            return axis.components(separatedBy: "<text ").dropFirst().map { String($0.drop { $0 != ">" }.dropFirst().prefix { $0 != "<" }) }
        }
        XCTAssertEqual(labels(10 * 60), ["0 min", "1 min", "2 min", "3 min", "4 min", "5 min", "6 min", "7 min", "8 min", "9 min", "10 min", "run time"])
        XCTAssertEqual(labels(8 * 3600 + 60), ["0 h", "1 h", "2 h", "3 h", "4 h", "5 h", "6 h", "7 h", "8 h", "run time"])
        XCTAssertEqual(labels(210), ["0:00", "0:30", "1:00", "1:30", "2:00", "2:30", "3:00", "3:30", "run time"])
        XCTAssertEqual(labels(90).first, "0 s")
        XCTAssertEqual(HTMLReport.timeLabel(5400, span: 8 * 3600, step: 1800), "1:30 h")
        XCTAssertEqual(HTMLReport.runTimeText(3723), "1:02:03")
    }

    // MARK: the page, top-down

    func testVerdictReasonsSettingsAndLinksComeFirst() throws {
        let bundle = try simulate("smoke.yaml", name: "failing") { $0.thresholds.timeToFirstRead = 0.01 }
        let report = try Analyser.analyse(bundle)
        let out = bundle.appendingPathComponent("report")
        try ReportWriter.write(report, to: out)
        let html = try String(contentsOf: out.appendingPathComponent("report.html"), encoding: .utf8)
        let top = String(html[..<html.range(of: "<h2")!.lowerBound])
        XCTAssertTrue(top.contains("<b class=\"fail\">FAIL</b>"))
        XCTAssertTrue(top.contains("time to first read, each pair fails for 2 of 2"), "the reason beside the verdict")
        XCTAssertTrue(top.contains("Time to first read, each pair</td><td class=\"l\">at most 0 s</td><td class=\"fail\">2 of 2 fail"), "summary by check")
        XCTAssertTrue(top.contains("✓</span> Continuity of each pair"))
        XCTAssertTrue(top.contains("longevity change 0.0000</b><span class=\"small\">missed windows, % points: first hour against last hour (0 is best"), "longevity says what good is")
        for file in ["junit.xml", "pairs.csv", "summary.json"] {
            XCTAssertTrue(top.contains("<a href=\"\(file)\">\(file)</a>"), file)
            XCTAssertTrue(FileManager.default.fileExists(atPath: out.appendingPathComponent(file).path), "the link leads to a file beside the page: \(file)")
        }
        // The plan's settings right after.
        let settings = Self.section(html, from: "<h2 id=\"settings\">", to: "<h2")
        for text in ["seed</th><td class=\"l\">1<", "radio</th><td class=\"l\">sim · crowding off<", "advertInterval 250 ms", "duration 2 min, warm-up 10 s", "the plan file as submitted"] {
            XCTAssertTrue(settings.contains(text), text)
        }
        // Every chart of the run has a time axis; the interval histogram has axis titles.
        let overTime = Self.section(html, from: "<h2 id=\"time\">", to: "<h2 id=\"heatmap\">")
        XCTAssertEqual(overTime.components(separatedBy: "<svg").count - 1, 5, "detected so far, continuity per window, rows, reads, battery")
        XCTAssertEqual(overTime.components(separatedBy: "run time (0 = 2026-01-01 00:00:00").count - 1, 5)
        XCTAssertTrue(html.contains("intervals (count)"))
        XCTAssertTrue(html.contains("seconds between consecutive RSSI samples of a pair"))
        let worst = Self.section(html, from: "<h2 id=\"worst\">", to: "<h2>Per node")
        XCTAssertEqual(worst.components(separatedBy: "<svg").count - 1, worst.components(separatedBy: ">run time</text>").count - 1)
        // Distributions, the floor map and RSSI against distance.
        XCTAssertTrue(html.contains("aria-label=\"histogram of time to first detection\""))
        XCTAssertTrue(html.contains("aria-label=\"histogram of time to first read\""))
        XCTAssertTrue(html.contains("aria-label=\"floor map of the nodes\""))
        XCTAssertTrue(html.contains("RSSI against distance (2 pairs)"))
        XCTAssertTrue(html.contains("Every node is complete"))
    }

    func testGapReasonsAndManifestTextAreEscapedAndBadFieldsIgnored() throws {
        let bundle = try simulate("smoke.yaml", name: "partial") { $0.radio.crowding = CrowdingSettings() }
        let url = bundle.appendingPathComponent("manifest.json")
        var manifest = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        var nodes = try XCTUnwrap(manifest["nodes"] as? [[String: Any]])
        nodes[0]["state"] = "partial"
        nodes[0]["message"] = "agent <b>lost</b> & back"
        nodes[0]["gaps"] = [["from": "2026-01-01T00:00:40.000Z", "to": "2026-01-01T00:01:10.000Z", "reason": "<script>alert(1)</script> restarted"],
                            ["from": 12, "reason": 7]]
        nodes[1]["position"] = "nowhere"
        nodes[1]["message"] = String(repeating: "x", count: 100_000)
        manifest["nodes"] = nodes
        manifest["planText"] = "name: </pre><img src=x onerror=alert(2)>"
        try JSONSerialization.data(withJSONObject: manifest).write(to: url)

        let report = try Analyser.analyse(bundle)
        let ctx = report.charts.context
        XCTAssertEqual(ctx.nodes["alpha"]?.gaps.count, 2)
        XCTAssertEqual(ctx.nodes["alpha"]?.gaps.last?.reason, "7", "a number where a text should be is shown as written")
        XCTAssertNil(ctx.nodes["alpha"]?.gaps.last?.from, "a time that is not one is left out")
        XCTAssertNil(ctx.nodes["beta"]?.position, "a position that is not [x, y] is left out")
        XCTAssertEqual(ctx.crowding, true)
        XCTAssertEqual(ctx.nodes["beta"]?.message?.count, 1001, "a huge text is cut")
        let html = HTMLReport.render(report)
        XCTAssertFalse(html.contains("<script>alert"))
        XCTAssertFalse(html.contains("<img src=x"))
        XCTAssertFalse(html.contains("<b>lost</b>"))
        XCTAssertTrue(html.contains("0:00:40–0:01:10 (30 s): &lt;script&gt;alert(1)&lt;/script&gt; restarted"), "gap reason with its run time")
        XCTAssertTrue(html.contains("agent &lt;b&gt;lost&lt;/b&gt; &amp; back"))
        XCTAssertTrue(html.contains("2 nodes not complete or with gaps"), "alpha partial, beta with a message")
        XCTAssertTrue(html.contains("radio</th><td class=\"l\">sim · crowding on<"))
        XCTAssertTrue(html.contains("<title>alpha: &lt;script&gt;alert(1)&lt;/script&gt; restarted</title>"), "the gap is shaded on the per-node charts")
        XCTAssertEqual(html.components(separatedBy: "<script>").count - 1, 1, "only the page's own script")
    }

    func testAPlainFolderLeavesOutWhatOnlyAManifestKnows() {
        var report = ScaledReportTests.synthetic(devices: 3, cetotal: 10)
        report.result.input = InputDescription(path: "/logs/test", kind: "folder")
        report.charts.context = ReportContext()
        let html = HTMLReport.render(report)
        let settings = Self.section(html, from: "<h2 id=\"settings\">", to: "<h2")
        for row in [">plan<", ">run<", ">seed<", ">radio<"] { XCTAssertFalse(settings.contains(row), row) }
        XCTAssertTrue(settings.contains("A plain folder of logs: no manifest"))
        XCTAssertTrue(html.contains("The manifest gives no node positions"))
        XCTAssertFalse(html.contains("Every node is complete"), "nothing is said about node states without a manifest")
    }

    func testHeraldNumbersBesideTheNaturalOrder() {
        let html = HTMLReport.render(ScaledReportTests.synthetic(devices: 12, cetotal: 20))
        let table = Self.section(html, from: "Herald's #</th>", to: "</table>")
        let rows = table.components(separatedBy: "<tr><td>").dropFirst().map { $0.components(separatedBy: "</td>").prefix(3).map { $0.replacingOccurrences(of: "<td class=\"l\">", with: "").replacingOccurrences(of: "<td>", with: "") } }
        XCTAssertEqual(rows.prefix(3).map { $0.joined(separator: " ") }, ["1 n1 1", "2 n2 5", "3 n3 6"], "# natural, Herald's # alphabetical (n10, n11, n12 come before n2)")
        XCTAssertEqual(rows.last?.joined(separator: " "), "12 n12 4")
    }

    func testHundredNodeReportWithEverySectionStaysUnderOneMegabyte() {
        let report = ScaledReportTests.synthetic(devices: 100, cetotal: 960)
        let html = HTMLReport.render(report)
        XCTAssertLessThan(html.utf8.count, 1_000_000, "report.html is \(html.utf8.count) bytes")
        XCTAssertTrue(html.contains("all 100 nodes: lowest to highest"), "many nodes: a band, the median and the lowest")
        XCTAssertTrue(html.contains("aria-label=\"floor map of the nodes\""))
        XCTAssertFalse(html.contains("<link") || html.contains("<script src") || html.contains("<img"), "self-contained")
    }

    // MARK: in Chromium, with screenshots kept

    /// Renders a page in headless Chromium: a full-page screenshot kept under results/test-report/
    /// and the console's errors.
    static func screenshot(_ page: URL, as name: String, height: Int) throws -> (png: URL, errors: [String])? {
        guard let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else { return nil }
        try FileManager.default.createDirectory(at: artefacts, withIntermediateDirectories: true)
        let png = artefacts.appendingPathComponent(name + ".png")
        try? FileManager.default.removeItem(at: png)
        let (code, _, err) = try TestPaths.run(chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,\(height)",
                                                           "--enable-logging=stderr", "--v=0", "--screenshot=\(png.path)", page.absoluteString])
        XCTAssertEqual(code, 0, err)
        let errors = err.split(separator: "\n").map(String.init).filter { $0.contains("CONSOLE") || $0.contains("Uncaught") || $0.contains("ERR_FILE_NOT_FOUND") || $0.contains("attribute d: ") }
        return (png, errors)
    }

    func testSimulatedTenNodeReportRendersWithoutConsoleErrorsInChromium() throws {
        let bundle = try simulate("office-10.yaml", name: "office-10") { $0.duration = 600 }
        let report = try Analyser.analyse(bundle)
        let out = bundle.appendingPathComponent("report")
        try ReportWriter.write(report, to: out)
        let html = try String(contentsOf: out.appendingPathComponent("report.html"), encoding: .utf8)
        XCTAssertLessThan(html.utf8.count, 1_000_000)
        guard let (png, errors) = try Self.screenshot(out.appendingPathComponent("report.html"), as: "office-10-10min", height: 9000) else {
            throw XCTSkip("chromium is not installed (make deps installs Debian's chromium)")
        }
        XCTAssertTrue(errors.isEmpty, errors.joined(separator: "\n"))
        let size = (try FileManager.default.attributesOfItem(atPath: png.path)[.size] as? NSNumber)?.intValue ?? 0
        XCTAssertGreaterThan(size, 100_000, "a screenshot with content")
        try? FileManager.default.removeItem(at: Self.artefacts.appendingPathComponent("office-10-10min.html"))
        try FileManager.default.copyItem(at: out.appendingPathComponent("report.html"), to: Self.artefacts.appendingPathComponent("office-10-10min.html"))
    }

    func testHundredNodeReportRendersWithoutConsoleErrorsInChromium() throws {
        let page = Self.artefacts.appendingPathComponent("synthetic-100.html")
        try TestPaths.write(HTMLReport.render(ScaledReportTests.synthetic(devices: 100, cetotal: 960)), to: page)
        guard let (png, errors) = try Self.screenshot(page, as: "synthetic-100", height: 14500) else {
            throw XCTSkip("chromium is not installed (make deps installs Debian's chromium)")
        }
        XCTAssertTrue(errors.isEmpty, errors.joined(separator: "\n"))
        let size = (try FileManager.default.attributesOfItem(atPath: png.path)[.size] as? NSNumber)?.intValue ?? 0
        XCTAssertGreaterThan(size, 100_000, "a screenshot with content")
    }
}
