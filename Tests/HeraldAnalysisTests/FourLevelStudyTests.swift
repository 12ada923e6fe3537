import XCTest
import LabNode
import LabPlan
@testable import HeraldAnalysis

/// A study of 4 levels reaching its verdicts (issue 38 item 3). In the integration tier: 12
/// simulated runs and 3 comparisons of 2,000 resamples take about 20 s of CPU in a debug build.
final class FourLevelStudyTests: XCTestCase {
    /// Issue 38 item 3: a study of 4 levels on a 25-node lab reaches verdicts when the effect is
    /// there: each comparison draws its own 2,000 resamples whatever the number of runs, so
    /// Holm over 3 comparisons and 10 metrics can act on the smallest p (1/2,001 x 30 < 0.05).
    func testAFourLevelStudyOnATwentyFiveNodeLabReachesItsVerdicts() throws {
        func plan(_ advert: String) throws -> Plan {
            try Plan.parse(yaml: "name: four-levels\nduration: 8s\nwarmup: 2s\nnodes: {count: 25, prefix: n, grid: {columns: 5, spacing: 2m}}\nsensor: {advertInterval: \(advert)}\nradio: {kind: sim}\n")
        }
        let levels = try ["1s", "500ms", "250ms", "100ms"].map(plan)
        // Three runs a level, interleaved in blocks.
        var runs = [Plan]()
        for block in 0..<3 { for k in 0..<4 { runs.append(levels[(k + block) % 4]) } }
        var d = try ComparisonTests.design(runs, seed: 7)
        d.resamples = ClusterBootstrap.minimumResamples
        let o = Comparison.compare(d)
        XCTAssertTrue(o.checkPassed, o.check.joined(separator: "; "))
        let median = o.effects.filter { $0.metric == "intervalMedian" }
        XCTAssertEqual(median.count, 3, "three levels against the baseline")
        for e in median { XCTAssertEqual(e.verdict, .better, "\(e.level): \(e.ci95 ?? []) p \(e.p ?? -1)") }
    }

}
