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
}
