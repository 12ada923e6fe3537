import Foundation
import XCTest
@testable import HeraldAnalysis

/// Issue 36: no Double-to-integer conversion of the analyser or its report can trap. Each
/// formatter, bin and quantile is fed 1e300, -1e300, NaN, ±infinity and a negative value, and
/// answers what a reader can use: the saturated value, or – where a number would mislead.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5]
    let imax = String(Int.max), imin = String(Int.min)

    // MARK: report formatters (HTMLReport+Summary, +Charts, +Run, +Tables)

    func testDurationText() {
        XCTAssertEqual(Self.hostile.map(HTMLReport.seconds), ["1e+300 s", "-1e+300 s", "–", "–", "–", "-5 s"])
        // Ordinary values as before.
        XCTAssertEqual([0.25, 90, 150, 7200, 5400, 1.5].map(HTMLReport.seconds), ["250 ms", "90 s", "150 s", "2 h 00 min", "1 h 30 min", "1.500 s"])
        XCTAssertEqual(HTMLReport.seconds(9e15), "2500000000000 h 00 min", "hours beyond Int32 are written whole")
    }

    func testRunTimeText() {
        XCTAssertEqual(Self.hostile.map(HTMLReport.runTimeText), ["2562047788015215:30:07", "−2562047788015215:30:08", "–", "–", "–", "−0:00:05"])
        XCTAssertEqual(HTMLReport.runTimeText(3723), "1:02:03")
        XCTAssertEqual(HTMLReport.runTimeText(-3723.4), "−1:02:03")
    }

    func testAxisLabels() {
        XCTAssertEqual(Self.hostile.map { HTMLReport.timeLabel($0, span: 60, step: 10) }, ["\(imax) s", "\(imin) s", "0 s", "\(imax) s", "\(imin) s", "-5 s"])
        XCTAssertEqual(HTMLReport.timeLabel(1e300, span: 1e300, step: 2_592_000), "\(Int.max / 86400) d")
        XCTAssertEqual(Self.hostile.map { HTMLReport.valueLabel($0, step: 1) }, [imax, imin, "–", "–", "–", "-5"])
        XCTAssertEqual(HTMLReport.valueLabel(-0.25, step: 0.1), "-0.2")
        XCTAssertEqual(Self.hostile.map(HTMLReport.widthText), ["\(imax) h", "\(imin) s", "–", "–", "–", "-5 s"])
        XCTAssertEqual([30.0, 120, 7200].map(HTMLReport.widthText), ["30 s", "2 min", "2 h"])
    }

    func testWholeFiguresOfThePairsTable() {
        XCTAssertEqual(Self.hostile.map(HTMLReport.whole), [imax, imin, nil, nil, nil, "-5"])
        XCTAssertEqual(HTMLReport.whole(-47.6), "-48")
    }

    /// A point far outside the frame is drawn at the saturated pixel, never a trap; points that
    /// are not finite break the line.
    func testPathOfPointsFarOutsideTheFrame() {
        let f = HTMLReport.Frame()
        let line = HTMLReport.Line(name: "l", color: "#000", points: [(0, 0), (1e300, 0.5), (-1e300, 1), (.nan, 1), (0, .infinity)])
        let path = HTMLReport.path(f, line)
        XCTAssertTrue(path.contains("d=\"M64 162L\(imax) 87 \(imin) 12\""), path)
        let far = HTMLReport.Frame(xMin: 0, xMax: 1e-300)
        XCTAssertTrue(HTMLReport.path(far, HTMLReport.Line(name: "l", color: "#000", points: [(1e300, 0)])).contains("d=\"M\(imax) 162l0 0\""))
    }

    // MARK: buckets, bins and quantiles

    func testTimelineBucketsOfHostileWindows() {
        let wide = Timeline(from: 0, to: 1e300)
        XCTAssertEqual(wide.count, Timeline.maximumBuckets * 4)
        XCTAssertEqual(wide.index(5e299), wide.count - 1)
        XCTAssertEqual(wide.index(0), 0)
        XCTAssertNil(wide.index(.nan))
        XCTAssertEqual(Timeline(from: -.greatestFiniteMagnitude, to: .greatestFiniteMagnitude).count, Timeline.maximumBuckets * 4)
        XCTAssertEqual(Timeline(from: -.greatestFiniteMagnitude, to: .greatestFiniteMagnitude).index(0), Timeline.maximumBuckets * 4 - 1)
        for (a, b) in [(0.0, Double.infinity), (-Double.infinity, 0), (.nan, .nan), (5, -1e300)] { XCTAssertEqual(Timeline(from: a, to: b).count, 0, "\(a) to \(b)") }
        var t = Timeline(from: 0, to: 90)
        t.width = .nan
        XCTAssertEqual(t.index(45), 0, "a width that is not a number puts every time in the first bucket")
    }

    func testQuantileIndexOfHostileFractions() {
        let s = [1.0, 2, 3]
        XCTAssertEqual(Self.hostile.map { Stats.quantile(sorted: s, $0) }, [3, 1, 1, 3, 1, 1])
        XCTAssertEqual(Stats.quantile(sorted: s, 0.5), 2)
        XCTAssertEqual(Stats.quantile(sorted: s, 0.75), 2.5)
        // The guarded conversions of the power calculations.
        XCTAssertEqual(Stats.unitsPerArm(sd: 1e300, delta: 1e-300, cap: 50), 50)
        XCTAssertEqual(Stats.unitsPerArm(sd: 1, delta: 1e300), 2)
        XCTAssertNil(Stats.unitsPerArm(sd: .nan, delta: 1))
        XCTAssertNil(Stats.unitsPerArm(sd: 1, delta: .infinity))
        XCTAssertNil(Stats.unitsPerArm(p1: .nan, p2: 0.5))
        XCTAssertNil(Stats.unitsPerArm(p1: 1e300, p2: 0.5))
        XCTAssertEqual(Stats.unitsPerArm(p1: 1e-300, p2: 2e-300), Int(Int32.max))
    }

    func testPairAccumulatorQuantilesOfHostileFractions() {
        let a = PairAccumulator(ceSeconds: 60, bins: 2)
        a.addSample(at: 0, rssi: -50, bin: 0)
        a.addSample(at: 1, rssi: -60, bin: 0)
        a.addSample(at: 3, rssi: -70, bin: 0)
        // Intervals 1 s and 2 s: a fraction beyond 1 is the longest, one below 0 or NaN the first bucket's edge.
        let intervals = Self.hostile.map { a.intervalPercentile($0)! }
        XCTAssertEqual(intervals[0], 2); XCTAssertEqual(intervals[3], 2)
        for i in [1, 2, 4, 5] { XCTAssertEqual(intervals[i], 1.05, accuracy: 1e-9, "\(Self.hostile[i])") }
        XCTAssertEqual(a.intervalPercentile(0.5)!, 1.05, accuracy: 1e-9)
        // RSSI: none beyond the last sample, the lowest for a fraction below 0.
        XCTAssertEqual(Self.hostile.map { a.rssiPercentile($0) }, [nil, -70, -70, nil, -70, -70])
        XCTAssertEqual(a.rssiPercentile(1), -50)
        // Samples at hostile times are counted, their intervals in the last bucket (1e300 s, then
        // 2e300 s) or, not a number, the first.
        a.addSample(at: 1e300, rssi: nil, bin: 1)
        a.addSample(at: -1e300, rssi: nil, bin: 1)
        a.addSample(at: .nan, rssi: nil, bin: 0)
        XCTAssertEqual(a.rssiSamples, 6)
        XCTAssertEqual(a.intervalHistogram.get(PairAccumulator.intervalBuckets - 1), 2)
        XCTAssertEqual(a.intervalHistogram.get(0), 1)
    }

    func testRCSVNumbers() {
        XCTAssertEqual(Self.hostile.map(RCSV.number), ["1e+300", "-1e+300", "NA", "inf", "-inf", "-5"])
        XCTAssertEqual([12.5, 100, 1e15, 0.1].map(RCSV.number), ["12.5", "100", "1e+15", "0.1"])
    }

    /// Analyser bins: a window from flags that is not a time is refused by name before any bin is counted.
    func testAnalyserRefusesHostileWindowsByName() throws {
        let dir = TestPaths.temp("hostile-window")
        defer { try? FileManager.default.removeItem(at: dir) }
        try TestPaths.write("a,b,c,d\n", to: dir.appendingPathComponent("A/detection.csv"))
        func problem(_ start: Double, _ end: Double) -> String {
            var o = AnalysisOptions()
            o.ceStart = start
            o.ceEnd = end
            do { _ = try Analyser.analyse(dir, options: o); return "analysed" } catch { return "\(error)" }
        }
        XCTAssertEqual(problem(.nan, 100), "--ce-start nan is not a time")
        XCTAssertEqual(problem(0, .infinity), "--ce-end inf is not a time")
        XCTAssertEqual(problem(-.infinity, 100), "--ce-start -inf is not a time")
        XCTAssertEqual(problem(1e300, 2e300), "--ce-start is out of range (years 1970 to 9999)")
        XCTAssertEqual(problem(-1e300, 100), "--ce-start is out of range (years 1970 to 9999)")
        XCTAssertEqual(problem(-5, 100), "--ce-start is out of range (years 1970 to 9999)")
        XCTAssertEqual(problem(0, InputLimits.latestTime), "--ce-end: the contact event lasts 2932896 days; at most 366")
    }

    // MARK: whole outputs

    /// A summary from outside with every figure hostile: report.html and every file beside it are
    /// written, with – or the saturated value where the figure was.
    func testReportOfAHostileSummaryIsWritten() throws {
        var report = ScaledReportTests.synthetic(devices: 4, cetotal: 20)
        for (i, x) in Self.hostile.enumerated() {
            report.result.pairs[i].longestGap = x
            report.result.pairs[i].rssiMedian = Self.hostile[(i + 1) % Self.hostile.count]
            report.result.pairs[i].timeToFirstDetection = x
            report.result.pairs[i].timeToFirstRead = x
            report.result.pairs[i].intervalP95 = x
        }
        report.result.pairs[6].timeToFirstRead = .greatestFiniteMagnitude
        report.result.thresholds.timeToFirstDetection = -5
        report.result.thresholds.timeToFirstRead = .nan
        report.result.input.sensor = ["scanOn": .number(1e300), "advertInterval": .number(-5), "scanOff": .number(.nan)]
        report.charts.context.duration = 1e300
        report.charts.context.warmup = -.infinity
        report.charts.rssiSeries = report.charts.rssiSeries.mapValues { $0.enumerated().map { ($0.element.0, $0.offset % 2 == 0 ? 1e300 : -.greatestFiniteMagnitude) } }
        let html = HTMLReport.render(report)
        XCTAssertTrue(html.hasSuffix("</html>\n"))
        XCTAssertTrue(html.contains("duration 1e+300 s, warm-up –"), "settings")
        XCTAssertTrue(html.contains("scanOn 1e+300 s"), "sensor settings")
        XCTAssertTrue(html.contains("advertInterval -5 s"))
        XCTAssertTrue(html.contains("first detection ≤ -5 s · first read ≤ –"), "thresholds")
        XCTAssertTrue(html.contains(",\(imax),\(imin),"), "the pairs' data: a gap of 1e300 s beside a median of -1e300")
        XCTAssertTrue(html.contains(",null,null,"), "a figure that is not a number is null in the data")
        let out = TestPaths.temp("hostile-report")
        defer { try? FileManager.default.removeItem(at: out) }
        try ReportWriter.write(report, to: out)
        for name in ["report.html", "summary.json", "pairs.csv", "junit.xml", "formal-summary.csv"] {
            XCTAssertTrue(FileManager.default.fileExists(atPath: out.appendingPathComponent(name).path), name)
        }
    }

    func testTrendChartOfHostileValues() {
        let points = Self.hostile.enumerated().map { TrendChart.Point(label: "run \($0.offset)", value: $0.element, bandLow: -$0.element, bandHigh: $0.element) }
        let svg = TrendChart.svg(title: "continuity", points: points)
        XCTAssertTrue(svg.hasPrefix("<svg"))
        XCTAssertTrue(svg.hasSuffix("</svg>"))
        XCTAssertEqual(svg.components(separatedBy: "<circle").count - 1, 3, "one point per finite value: 1e300, -1e300 and -5")
        XCTAssertTrue(svg.contains(">1</text>") && svg.contains(">6</text>"), "runs numbered 1 to 6")
    }
}
