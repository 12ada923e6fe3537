import XCTest
@testable import HeraldAnalysis

/// report.html at scale: natural device order, a heatmap that fits the page, charts only for the
/// worst pairs, and the full per-pair detail as paged data, all under 1 MB at 150 devices.
final class ScaledReportTests: XCTestCase {
    // MARK: natural order

    func testNaturalOrderComparesDigitRunsAsNumbers() {
        XCTAssertTrue(NaturalOrder.less("n2", "n10"))
        XCTAssertFalse(NaturalOrder.less("n10", "n2"))
        XCTAssertTrue(NaturalOrder.less("n9", "n10"))
        XCTAssertTrue(NaturalOrder.less("n", "n1"))
        XCTAssertTrue(NaturalOrder.less("node2-b", "node10-a"))
        XCTAssertTrue(NaturalOrder.less("b2c9", "b2c10"))
        XCTAssertTrue(NaturalOrder.less("Alpha", "beta"), "letters ignore case first")
        XCTAssertTrue(NaturalOrder.less("99999999999999999999998", "99999999999999999999999"), "numbers longer than Int compare")
        XCTAssertEqual(NaturalOrder.compare("n7", "n7"), .orderedSame)
        XCTAssertNotEqual(NaturalOrder.compare("a1", "a01"), .orderedSame, "leading zeros still give a total order")
        let shuffled = ["n10", "n2", "n100", "n1", "N3", "n20", "a01", "a1", "b", "n11"]
        XCTAssertEqual(shuffled.sorted(by: NaturalOrder.less), ["a01", "a1", "b", "n1", "n2", "N3", "n10", "n11", "n20", "n100"])
        // Sorting is stable under reversal of the input (a total order).
        XCTAssertEqual(shuffled.reversed().sorted(by: NaturalOrder.less), shuffled.sorted(by: NaturalOrder.less))
    }

    func testAxisLabelsDropTheCommonPrefixButNeverCutANumber() {
        XCTAssertEqual(NaturalOrder.abbreviations(["n1", "n10", "n11"]).prefix, "n")
        XCTAssertEqual(NaturalOrder.abbreviations(["n1", "n10", "n11"]).labels, ["1", "10", "11"])
        XCTAssertEqual(NaturalOrder.abbreviations(["node-a", "node-b"]).labels, ["a", "b"])
        XCTAssertEqual(NaturalOrder.abbreviations(["alpha", "beta"]).labels, ["alpha", "beta"])
        XCTAssertEqual(NaturalOrder.abbreviations(["ab", "abc"]).labels, ["ab", "abc"], "no name is left empty")
        XCTAssertEqual(NaturalOrder.abbreviations(["Samsung-Galaxy-A20", "x"]).labels, ["Samsung…", "x"])
    }

    func testDevicesAppearInNaturalOrderEverywhere() {
        let report = Self.synthetic(devices: 12, cetotal: 20)
        XCTAssertEqual(report.result.devices.prefix(4).map(\.folder), ["n1", "n10", "n11", "n12"], "the analyser's order is alphabetical")
        let model = ReportModel(report.result)
        XCTAssertEqual(model.names, (1...12).map { "n\($0)" })
        let html = HTMLReport.render(report)
        for section in ["<h2 id=\"nodes\">Nodes</h2>", "id=\"pb\""] {
            let start = html.range(of: section)!.upperBound
            let n2 = html.range(of: ">n2<", range: start..<html.endIndex)!.lowerBound
            let n10 = html.range(of: ">n10<", range: start..<html.endIndex)!.lowerBound
            XCTAssertLessThan(n2, n10, "n2 before n10 after \(section)")
        }
        XCTAssertLessThan(html.range(of: ">n2 sees n1<")!.lowerBound, html.range(of: ">n10 sees n1<")!.lowerBound, "failed checks")
        XCTAssertLessThan(html.range(of: "<li>n2: detection")!.lowerBound, html.range(of: "<li>n10: detection")!.lowerBound)
        let heatmapHeader = html.range(of: "<table id=\"hm\"")!.upperBound
        XCTAssertLessThan(html.range(of: "title=\"n9\"", range: heatmapHeader..<html.endIndex)!.lowerBound,
                          html.range(of: "title=\"n10\"", range: heatmapHeader..<html.endIndex)!.lowerBound)
    }

    func testReportsWithOneOrTwoDevicesRender() {
        let one = HTMLReport.render(Self.synthetic(devices: 1, cetotal: 10))
        XCTAssertTrue(one.contains("Fewer than two devices"))
        XCTAssertFalse(one.contains("<script>"), "no data, no script")
        let two = HTMLReport.render(Self.synthetic(devices: 2, cetotal: 10))
        XCTAssertEqual(Self.section(two, from: "<table id=\"hm\"", to: "</table>").components(separatedBy: "<td").count - 1, 4)
        XCTAssertTrue(two.contains("<script>"))
        XCTAssertTrue(two.hasSuffix("</body></html>\n"))
    }

    // MARK: 150 devices

    func testReportFor150DevicesStaysUnderOneMegabyte() throws {
        let report = Self.synthetic(devices: 150, cetotal: 960)
        let html = HTMLReport.render(report)
        let bytes = html.utf8.count
        XCTAssertLessThan(bytes, 1_000_000, "report.html is \(bytes) bytes")

        // Heatmap: one cell per ordered pair plus the diagonal.
        let heatmap = Self.section(html, from: "<table id=\"hm\"", to: "</table>")
        XCTAssertEqual(heatmap.components(separatedBy: "<td").count - 1, 150 * 150)
        XCTAssertEqual(heatmap.components(separatedBy: "<td class=s>").count - 1, 150)
        let undetected = report.result.pairs.filter { !$0.detected }.count
        XCTAssertGreaterThan(undetected, 0)
        XCTAssertEqual(heatmap.components(separatedBy: "<td class=u>").count - 1, undetected, "undetected pairs are their own class")
        XCTAssertEqual(heatmap.components(separatedBy: "<tr>").count - 1, 151, "a header row and one row per observer")
        XCTAssertTrue(html.contains("not detected (\(undetected))"), "the legend counts the undetected pairs")
        XCTAssertLessThanOrEqual(HTMLReport.cellSize(150) * 150, 1100, "150 cells fit beside the labels on a 1280 px page")

        // Charts only for the worst pairs.
        XCTAssertEqual(html.components(separatedBy: "aria-label=\"RSSI and gaps:").count - 1, HTMLReport.worstPairCount)
        let model = ReportModel(report.result)
        let worst = HTMLReport.worstPairs(model)
        XCTAssertEqual(worst.count, 20)
        let continuities = worst.map { model.continuity($0.o, $0.d) }
        XCTAssertEqual(continuities, continuities.sorted())
        let worstSet = Set(worst.map { $0.o * 1000 + $0.d })
        let lowestOutside = model.orderedPairs.filter { model.detected[$0.o * model.n + $0.d] && !worstSet.contains($0.o * 1000 + $0.d) }
            .map { model.continuity($0.o, $0.d) }.min()!
        XCTAssertGreaterThanOrEqual(lowestOutside, continuities.last!)
        XCTAssertFalse(worst.contains { !model.detected[$0.o * model.n + $0.d] }, "undetected pairs are listed apart, without charts")

        // Every pair as data for the paged table, only the first page as rows.
        let data = Self.section(html, from: "D=[", to: "];")
        XCTAssertEqual(data.split(separator: ",").count, 150 * 149 * 5)
        XCTAssertEqual(Self.section(html, from: "<tbody id=\"pb\">", to: "</tbody>").components(separatedBy: "<tr>").count - 1, HTMLReport.pageSize)

        // Per-node summaries, worst first.
        let observers = HTMLReport.nodeSummaries(model, asObserver: true)
        XCTAssertEqual(observers.count, 150)
        XCTAssertEqual(observers.map(\.meanContinuity), observers.map(\.meanContinuity).sorted())
        XCTAssertEqual(HTMLReport.nodeSummaries(model, asObserver: false).count, 150)

        // Self-contained.
        XCTAssertFalse(html.contains("<script src"))
        XCTAssertFalse(html.contains("<link"))
        XCTAssertEqual(html.components(separatedBy: "<script>").count - 1, 1)
        // Deterministic.
        XCTAssertEqual(HTMLReport.render(Self.synthetic(devices: 150, cetotal: 960)), html)
    }

    func testWorstCaseHeatmapFor150DevicesStillUnderOneMegabyte() {
        let report = Self.synthetic(devices: 150, cetotal: 960, spread: true)
        let html = HTMLReport.render(report)
        XCTAssertLessThan(html.utf8.count, 1_000_000, "report.html is \(html.utf8.count) bytes")
        let heatmap = Self.section(html, from: "<table id=\"hm\"", to: "</table>")
        XCTAssertEqual(heatmap.components(separatedBy: "<td").count - 1, 150 * 150)
        for b in HTMLReport.buckets { XCTAssertFalse(html.contains("\(b.label) (0)"), "every class is present: \(b.label)") }
    }

    func testReportFor150DevicesRendersInChromium() throws {
        guard let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw XCTSkip("chromium is not installed (make deps installs Debian's chromium)")
        }
        let tmp = TestPaths.temp("scaled-report")
        defer { try? FileManager.default.removeItem(at: tmp) }
        let report = Self.synthetic(devices: 150, cetotal: 960)
        let html = HTMLReport.render(report)
        let page = tmp.appendingPathComponent("report.html")
        try TestPaths.write(html, to: page)

        let shot = tmp.appendingPathComponent("report.png")
        let (code, _, err) = try TestPaths.run(chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000",
                                                           "--enable-logging=stderr", "--v=0", "--screenshot=\(shot.path)", page.absoluteString])
        XCTAssertEqual(code, 0, err)
        let consoleErrors = err.split(separator: "\n").filter { $0.contains("CONSOLE") || $0.contains("Uncaught") || $0.contains("ERR_FILE_NOT_FOUND") }
        XCTAssertTrue(consoleErrors.isEmpty, consoleErrors.joined(separator: "\n"))
        let size = (try FileManager.default.attributesOfItem(atPath: shot.path)[.size] as? NSNumber)?.intValue ?? 0
        XCTAssertGreaterThan(size, 20_000, "a screenshot with content")

        // The script ran (the pager says so), the heatmap fits a 1280 px page, and filtering, hover
        // and click work: a probe appended to a copy of the page writes what it finds into the DOM.
        let probe = tmp.appendingPathComponent("probe.html")
        let probeScript = """
        <pre id="probe"></pre><script>(function(){var $=function(i){return document.getElementById(i)},hm=$('hm'),r=hm.getBoundingClientRect(),out=[];
        out.push('right='+Math.ceil(r.right)+' scroll='+document.documentElement.scrollWidth);
        $('ft').value='0';$('ft').dispatchEvent(new Event('change'));out.push($('pn').textContent);
        var cell=hm.rows[3].cells[10];cell.dispatchEvent(new MouseEvent('mouseover',{bubbles:true}));out.push($('hmi').textContent);
        cell.dispatchEvent(new MouseEvent('click',{bubbles:true}));out.push($('pn').textContent);
        out.push($('pb').rows[0].cells[0].textContent+'/'+$('pb').rows[0].cells[1].textContent);
        $('probe').textContent=out.join('|')})();</script></body></html>
        """
        try TestPaths.write(html.replacingOccurrences(of: "</body></html>", with: probeScript), to: probe)
        let (dumpCode, dom, dumpErr) = try TestPaths.run(chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                                                                    "--enable-logging=stderr", "--v=0", "--dump-dom", probe.absoluteString])
        XCTAssertEqual(dumpCode, 0, dumpErr)
        XCTAssertEqual(Self.section(dom, from: "<tbody id=\"pb\">", to: "</tbody>").components(separatedBy: "<tr>").count - 1, 1, "the clicked pair alone")
        let found = Self.section(dom, from: "<pre id=\"probe\">", to: "</pre>").components(separatedBy: "|")
        XCTAssertEqual(found.count, 5, found.joined(separator: "|"))
        guard found.count == 5 else { return }
        let numbers = found[0].split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
        XCTAssertEqual(numbers.count, 2, found[0])
        XCTAssertLessThanOrEqual(numbers.first ?? .max, 1280, "heatmap right edge: \(found[0])")
        XCTAssertLessThanOrEqual(numbers.last ?? .max, 1280, "page width: \(found[0])")
        XCTAssertEqual(found[1], "pairs 1–50 of \(report.result.pairs.filter { !$0.detected }.count)", "filtered to undetected pairs")
        XCTAssertTrue(found[2].hasPrefix("n3 sees n10: "), found[2])
        XCTAssertEqual(found[3], "pairs 1–1 of 1", "a click shows the pair in the table")
        XCTAssertEqual(found[4], "n3/n10")
        XCTAssertFalse(dumpErr.split(separator: "\n").contains { $0.contains("CONSOLE") || $0.contains("Uncaught") })

        try FileManager.default.createDirectory(at: ReadableReportTests.artefacts, withIntermediateDirectories: true)
        let keep = ReadableReportTests.artefacts.appendingPathComponent("synthetic-150.png")
        try? FileManager.default.removeItem(at: keep)
        try? FileManager.default.copyItem(at: shot, to: keep)
        try? FileManager.default.removeItem(at: keep.deletingPathExtension().appendingPathExtension("html"))
        try? FileManager.default.copyItem(at: page, to: keep.deletingPathExtension().appendingPathExtension("html"))
    }

    // MARK: helpers

    static func section(_ s: String, from: String, to: String) -> String {
        guard let a = s.range(of: from), let b = s.range(of: to, range: a.upperBound..<s.endIndex) else { return "" }
        return String(s[a.upperBound..<b.lowerBound])
    }

    /// A result as the analyser would give for `devices` nodes named n1...: devices in alphabetical
    /// order, every continuity class present, some pairs undetected, RSSI series for every pair
    /// below 100%. Deterministic.
    /// `spread`: continuity spread over every class instead of mostly 100% (the largest heatmap).
    static func synthetic(devices count: Int, cetotal: Int, spread: Bool = false) -> AnalysisReport {
        let folders = (1...count).map { "n\($0)" }.sorted()
        let devices = folders.enumerated().map { i, folder in
            AnalysisResult.Device(index: i + 1, folder: folder, label: "\(i + 1) - Linux - Linux 6.1", shortName: String(folder.suffix(6)), model: "Linux",
                                  os: "Linux", osVersion: "6.1", shift: 0, rows: 1000, malformedLines: 0, measureRows: 900, readRows: 50, shareRows: 0,
                                  batterySource: nil, batteryFirst: nil, batteryLast: nil, problems: [])
        }
        var pairs = [AnalysisResult.PairMetrics]()
        var windowsByPair = [AnalysisResult.PairWindows]()
        var detectedPairs = [[String]]()
        var charts = ChartData()
        let ceSeconds = Double(cetotal * 30)
        for (o, observer) in devices.enumerated() {
            for (d, observed) in devices.enumerated() where d != o {
                let h = (o * 31 + d * 17) % 100
                let windows = h == 0 ? 0 : spread ? [cetotal, cetotal - 1, cetotal * 92 / 100, cetotal * 85 / 100, cetotal * 6 / 10, cetotal * 3 / 10, cetotal / 10][h % 7]
                    : h <= 10 ? cetotal * h * 9 / 100 : h <= 20 ? cetotal - (h - 10) : cetotal
                let detected = h != 0
                var p = AnalysisResult.PairMetrics(observer: observer.folder, observed: observed.folder, detected: detected, heraldWindows: windows,
                                                   strictWindows: windows, strictScorePct: 100 * Double(windows) / Double(cetotal),
                                                   rssiSamples: windows * 12, longestGap: detected ? Double((cetotal - windows) * 30 + 3 + (o + d) % 7) : ceSeconds)
                if detected {
                    p.timeToFirstDetection = 2
                    p.rssiMedian = -50 - Double((o + d) % 40)
                    p.intervalP50 = 2.5
                    p.intervalP95 = 4
                    detectedPairs.append([observer.label, observed.label])
                }
                if detected && windows < cetotal && h <= 20 {
                    charts.rssiSeries["\(observer.folder)\u{1F}\(observed.folder)"] = (0..<cetotal).filter { ($0 * 37) % cetotal < windows }
                        .map { ($0, -60 - Double(($0 * 13 + o) % 25)) }
                }
                pairs.append(p)
                windowsByPair.append(.init(observer: observer.label, observed: observed.label, detected: detected, windows: windows, scorePct: p.strictScorePct))
            }
        }
        let achieved = pairs.reduce(0) { $0 + $1.strictWindows }
        let maxpairs = count * (count - 1)
        func mode(_ name: AnalysisMode) -> AnalysisResult.Mode {
            .init(mode: name, phonescount: count, maxpairs: maxpairs, achieveddetections: detectedPairs.count, detectionpct: 100 * Double(detectedPairs.count) / Double(maxpairs),
                  maxwindows: maxpairs * cetotal, achievedwindows: achieved, continuitypct: 100 * Double(achieved) / Double(maxpairs * cetotal),
                  deltacewindowspct: 100 - 100 * Double(achieved) / Double(maxpairs * cetotal), windowsFirstHour: 0, windowsLastHour: 0, longevity: 0,
                  pairs: windowsByPair, detectedPairs: detectedPairs)
        }
        charts.intervalHistogram = (0..<2400).map { UInt32($0 < 200 ? 1000 - $0 * 4 : 0) }
        // The run over time: rows, reads and battery per node (the third node stops for a while),
        // pairs per window, positions on a grid and one partial node with a gap.
        let origin = LogTime.parse(text: "2026-01-01 00:00:00")!
        charts.timeline = Timeline(from: origin, to: origin + Double(cetotal * 30 + 120))
        let buckets = charts.timeline.count
        charts.nodeSeries = devices.indices.map { i in
            var s = NodeSeries(buckets: buckets)
            for k in 0..<buckets {
                s.rssiRows[k] = i == 2 && k > buckets / 3 && k < buckets / 2 ? 0 : UInt32(900 + (k * 7 + i * 13) % 60)
                s.reads[k] = k < 3 ? UInt32(count) : UInt32((k + i) % 5 == 0 ? 1 : 0)
                if k % 2 == 0 { s.battery[k] = Float(100 - Double(k) * 20 / Double(buckets) - Double(i % 5)) }
            }
            return s
        }
        var above = [Int](repeating: 0, count: cetotal + 1) // above[w]: pairs with more than w windows
        for p in pairs where p.strictWindows > 0 { above[min(cetotal, p.strictWindows) - 1] += 1 }
        for w in stride(from: cetotal - 1, through: 0, by: -1) { above[w] += above[w + 1] }
        charts.windowPairs = (0..<cetotal).map { b in UInt32(above[(b * 37) % cetotal]) }
        let columns = max(1, Int(Double(count).squareRoot().rounded(.up)))
        for (i, d) in devices.enumerated() {
            var node = ReportContext.Node()
            node.position = (Double(i % columns) * 2, Double(i / columns) * 2)
            node.state = i == 2 ? .partial : .complete
            if i == 2 { node.gaps = [.init(from: origin + 3 * 3600, to: origin + 4 * 3600, reason: "agent restarted")] }
            charts.context.nodes[d.folder] = node
        }
        charts.context.radio = ["kind": .string("sim"), "referencePower": .number(-59), "pathLossExponent": .number(2)]
        let result = AnalysisResult(
            input: InputDescription(path: "/tmp/synthetic-\(count)", kind: "bundle", runId: "synthetic-\(count)", plan: "synthetic"),
            parameters: .init(ceStart: "2026-01-01 00:01:00", ceEnd: "2026-01-01 08:01:00", filterStart: "2026-01-01 00:00:00", filterEnd: "2026-01-01 08:02:00", cetotal: cetotal),
            devices: devices, herald: mode(.herald), strict: mode(.strict), pairs: pairs, thresholds: AnalysisThresholds(),
            checks: ["n10 sees n1", "n2 sees n1"].map { .init(name: "timeToFirstRead", subject: $0, value: 130, limit: 120, passed: false, message: "130.00s, expected at most 120.00s") },
            passed: false, problems: ["n10: detection.csv is empty", "n2: detection.csv is empty"], elapsedSeconds: 1.5, bytesRead: 123_456_789)
        return AnalysisReport(result: result, charts: charts)
    }
}
