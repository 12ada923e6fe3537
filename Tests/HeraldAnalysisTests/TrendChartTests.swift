import XCTest
@testable import HeraldAnalysis

/// The dashboard's trend chart: values, the noise band where there is one, regressions marked,
/// labels escaped.
final class TrendChartTests: XCTestCase {
    func testBandRegressionsAndEscapedLabels() {
        let points = [
            TrendChart.Point(label: "night-1", value: 99),
            TrendChart.Point(label: "night-2", value: 98.5, bandLow: 97, bandHigh: 100),
            TrendChart.Point(label: "night-3 <script>", value: 90, bandLow: 97.2, bandHigh: 100.1, regressed: true),
            TrendChart.Point(label: "night-4", value: nil),
        ]
        let svg = TrendChart.svg(title: "detection % <b>", points: points)
        XCTAssertTrue(svg.hasPrefix("<svg"))
        XCTAssertTrue(svg.hasSuffix("</svg>"))
        XCTAssertEqual(svg.components(separatedBy: "<circle").count - 1, 3, "one point per run with a value")
        XCTAssertEqual(svg.components(separatedBy: "class=\"regressed\"").count - 1, 1)
        XCTAssertTrue(svg.contains("<title>noise band (the regression check&#39;s bound)</title>"), "the band, over the runs that have one")
        XCTAssertTrue(svg.contains("night-3 &lt;script&gt;: 90.00 (regression)"))
        XCTAssertFalse(svg.contains("<script>"))
        XCTAssertFalse(svg.contains("<b>"))
        XCTAssertFalse(TrendChart.svg(title: "t", points: [TrendChart.Point(label: "a", value: 1)]).contains("noise band"), "no band without history")
    }

    /// Issue 40: a run with infrastructure faults is marked (a grey ring), outside the line, the
    /// band and the y-scale: its fall to 0 does not squash the clean runs' scale.
    func testAnInfraRunIsMarkedAndOutsideTheLineTheBandAndTheScale() {
        let clean = [
            TrendChart.Point(label: "night-1", value: 99),
            TrendChart.Point(label: "night-2", value: 98, bandLow: 97, bandHigh: 100),
            TrendChart.Point(label: "night-4", value: 98.5, bandLow: 97, bandHigh: 100),
        ]
        var withInfra = clean
        withInfra.insert(TrendChart.Point(label: "night-3", value: 0, bandLow: 10, bandHigh: 20, infra: "node n2: state partial"), at: 2)
        let svg = TrendChart.svg(title: "detection %", points: withInfra)
        XCTAssertEqual(svg.components(separatedBy: "class=\"infra\"").count - 1, 1, "the infra run is marked")
        XCTAssertTrue(svg.contains("night-3: 0.00 (infra: node n2: state partial; not in the line, the band or the scale)"), svg)
        XCTAssertEqual(svg.components(separatedBy: "<circle").count - 1, 4)
        // The y-scale is the clean runs': each clean point lies where it lies without the infra run.
        func cy(_ svg: String, _ label: String) -> String? {
            guard let t = svg.range(of: "<title>\(label):") else { return nil }
            let circle = svg[..<t.lowerBound]
            guard let c = circle.range(of: "cy=\"", options: .backwards) else { return nil }
            return String(circle[c.upperBound...].prefix(while: { $0 != "\"" }))
        }
        let reference = TrendChart.svg(title: "detection %", points: [clean[0], clean[1], TrendChart.Point(label: "gap", value: nil), clean[2]])
        for label in ["night-1", "night-2", "night-4"] {
            XCTAssertNotNil(cy(svg, label))
            XCTAssertEqual(cy(svg, label), cy(reference, label), "\(label): the scale leaves the infra run and its band out")
        }
        XCTAssertEqual(svg.components(separatedBy: "noise band").count, reference.components(separatedBy: "noise band").count, "no band at the infra run")
    }

    /// Issue 40: by date when every run has one (ticks are dates, a point's hover names its run
    /// and when, a click opens its page), and the y axis never leaves the metric's domain.
    func testByDateWithLinksAndAnAxisInsideTheDomain() {
        let day = 86_400.0, start = 1_795_000_000.0
        let points = (0..<5).map { k in
            TrendChart.Point(label: "night-\(k)", value: 100 - Double(k % 2) * 0.2, bandLow: 99, bandHigh: 100.6, at: start + Double(k) * day * 1.5, link: "/runs/night-\(k)")
        }
        let svg = TrendChart.svg(title: "detection %", points: points, domain: 0...100)
        XCTAssertTrue(svg.contains("recorded (UTC)"), "a date axis")
        XCTAssertTrue(svg.contains("<a href=\"/runs/night-2\"><circle"), "a point opens its run's page")
        XCTAssertTrue(svg.contains("night-2 (\(AnalysisTime.format(start + 3 * day)) UTC): "), "the hover names the run and when")
        // The axis labels stay inside 0-100: no tick at 100.x.
        let ticks = svg.matches(of: /text-anchor="end">([0-9.]+)<\/text>/).compactMap { Double($0.output.1) }
        XCTAssertFalse(ticks.isEmpty, svg)
        XCTAssertTrue(ticks.allSatisfy { $0 <= 100 }, "\(ticks)")
        // The x positions follow the dates: the gap between runs 1 and 2 equals that between 3 and 4.
        let xs = svg.matches(of: /<circle cx="([0-9.]+)"/).compactMap { Double($0.output.1) }
        XCTAssertEqual(xs.count, 5)
        XCTAssertEqual(xs[2] - xs[1], xs[4] - xs[3], accuracy: 0.2)
        // One run (or runs recorded in one second) still by date, an hour either side.
        XCTAssertTrue(TrendChart.svg(title: "t", points: [TrendChart.Point(label: "a", value: 1, at: start)]).contains("recorded (UTC)"))
        // Without dates for every run, by place.
        XCTAssertTrue(TrendChart.svg(title: "t", points: [TrendChart.Point(label: "a", value: 1), TrendChart.Point(label: "b", value: 2, at: start)]).contains("run (oldest first)"))
    }
}
