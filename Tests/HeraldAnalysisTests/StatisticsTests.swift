import XCTest
@testable import HeraldAnalysis
import HeraldCore

final class StatisticsTests: XCTestCase {
    func testWilsonKnownValues() {
        let a = Stats.wilson(12, 12)
        XCTAssertEqual(a.lo * 100, 75.75, accuracy: 0.05)
        XCTAssertEqual(a.hi, 1)
        let b = Stats.wilson(72, 72)
        XCTAssertEqual(b.lo * 100, 94.93, accuracy: 0.05)
        let c = Stats.wilson(5, 10)
        XCTAssertEqual(c.lo, 0.2366, accuracy: 0.0005)
        XCTAssertEqual(c.hi, 0.7634, accuracy: 0.0005)
        XCTAssertEqual(Stats.wilson(0, 0), Stats.Interval(0, 1))
        XCTAssertEqual(Stats.wilson(0, 20).lo, 0)
    }

    func testNewcombeMatchesThePaper() {
        // Newcombe (1998), example (a): 56/70 against 48/80, difference 0.2000, method 10: 0.0524 to 0.3339.
        let i = Stats.newcombe(k1: 48, n1: 80, k2: 56, n2: 70)
        XCTAssertEqual(i.lo, 0.0524, accuracy: 0.0005)
        XCTAssertEqual(i.hi, 0.3339, accuracy: 0.0005)
        let same = Stats.newcombe(k1: 10, n1: 10, k2: 10, n2: 10)
        XCTAssertTrue(same.contains(0))
    }

    func testQuantiles() {
        XCTAssertEqual(Stats.normalQuantile(0.975), 1.959964, accuracy: 1e-5)
        XCTAssertEqual(Stats.normalQuantile(0.8), 0.841621, accuracy: 1e-5)
        XCTAssertEqual(Stats.tQuantile(0.975, df: 1), 12.7062, accuracy: 1e-3)
        XCTAssertEqual(Stats.tQuantile(0.975, df: 4), 2.7764, accuracy: 1e-3)
        XCTAssertEqual(Stats.tQuantile(0.975, df: 9), 2.2622, accuracy: 1e-3)
        XCTAssertEqual(Stats.tQuantile(0.975, df: 30), 2.0423, accuracy: 1e-3)
        XCTAssertEqual(Stats.tQuantile(0.025, df: 9), -2.2622, accuracy: 1e-3)
        XCTAssertEqual(Stats.tCDF(0, df: 5), 0.5, accuracy: 1e-12)
    }

    func testPredictionInterval() {
        let pi = Stats.predictionInterval([1, 2, 3, 4, 5])!
        let half = 2.7764 * 1.58114 * (1.2).squareRoot()
        XCTAssertEqual(pi.lo, 3 - half, accuracy: 1e-3)
        XCTAssertEqual(pi.hi, 3 + half, accuracy: 1e-3)
        XCTAssertNil(Stats.predictionInterval([1]))
    }

    func testHolm() {
        let adj = Stats.holm([0.01, 0.04, 0.03, 0.005])
        XCTAssertEqual(adj[0], 0.03, accuracy: 1e-12)
        XCTAssertEqual(adj[1], 0.06, accuracy: 1e-12)
        XCTAssertEqual(adj[2], 0.06, accuracy: 1e-12)
        XCTAssertEqual(adj[3], 0.02, accuracy: 1e-12)
    }

    func testPower() {
        XCTAssertEqual(Stats.unitsPerArm(p1: 0.95, p2: 0.90), 212)
        // 359.3, rounded up.
        XCTAssertEqual(Stats.unitsPerArm(p1: 0.99, p2: 0.97), 360)
        // Means: about 16 s^2 / d^2.
        XCTAssertEqual(Stats.unitsPerArm(sd: 1, delta: 1), 16)
        XCTAssertEqual(Stats.unitsPerArm(sd: 1, delta: 0.01, cap: 50), 50)
        XCTAssertNil(Stats.unitsPerArm(sd: 1, delta: 0))
        XCTAssertEqual(Stats.zeroFailureUpperBound(100), 0.0295, accuracy: 1e-4)
    }

    func testBootstrapIsSeededAndCoversAKnownRatio() {
        // 20 devices, each 18 pairs; 90 % of pairs hit on average.
        var g = SeededGenerator(seed: 7)
        let run = (0..<20).map { i in StatUnit(hits: Double(15 + Int(g.next() % 5)), possible: 18, device: i) }
        let b = ClusterBootstrap(resamples: 1000, seed: 3)
        let e1 = b.estimate([run], pooling: .ratio, scale: 100)!
        let e2 = b.estimate([run], pooling: .ratio, scale: 100)!
        XCTAssertEqual(e1.ci, e2.ci)
        XCTAssertTrue(e1.ci.contains(e1.estimate))
        XCTAssertLessThan(e1.ci.width, 10)
        XCTAssertGreaterThan(e1.ci.width, 0)
        // The same arm against itself: 0 inside, p large.
        let d = b.difference(baseline: [run], level: [run], pooling: .ratio, scale: 100)!
        XCTAssertEqual(d.delta, 0)
        XCTAssertTrue(d.ci.contains(0))
        XCTAssertGreaterThan(d.p, 0.5)
        // A clear shift: every device 5 samples lower.
        let lower = run.map { StatUnit(hits: $0.hits - 5, possible: 18, device: $0.device) }
        let d2 = b.difference(baseline: [run], level: [lower], pooling: .ratio, scale: 100)!
        XCTAssertLessThan(d2.ci.hi, 0)
        XCTAssertLessThan(d2.p, 0.01)
        // Medians over per-pair values; paired differences.
        let m = b.estimate([[StatUnit(values: [1, 2, 3], device: 0), StatUnit(values: [4, 5], device: 1)]], pooling: .median)!
        XCTAssertEqual(m.estimate, 3)
        // Pairs weigh as often as both their devices are drawn: a pair of two devices drawn
        // twice each counts four times.
        let one = ClusterBootstrap.Prepared([[StatUnit(hits: 1, possible: 1, device: 0, partner: 1), StatUnit(hits: 0, possible: 1, device: 1, partner: 0)]])
        var counts = [2, 0], weights = [0.0, 0.0]
        var gen = SeededGenerator(seed: 1)
        one.draw(&gen, counts: &counts, weights: &weights)
        XCTAssertEqual(weights.reduce(0, +), Double(counts[0] * counts[1] * 2))
        XCTAssertEqual(one.statistic(.ratio, weights: [4, 0], scale: 100), 100)
        XCTAssertEqual(one.statistic(.ratio, weights: [1, 1], scale: 100), 50)
        let p = b.pairedDifference([0.9, 1.1, 1.0, 0.95, 1.05])!
        XCTAssertEqual(p.delta, 1, accuracy: 1e-12)
        XCTAssertGreaterThan(p.ci.lo, 0.9)
    }

    func testPrintedLabelsEscapeControlCharacters() {
        XCTAssertEqual(Format.label("a\u{1b}[31mb\nc"), "a\\x1B[31mb\\x0Ac")
        XCTAssertEqual(Format.label("100ms"), "100ms")
    }

    func testUndetectedPairsFailOnlyWhenThePlanAsksForEveryPair() {
        let mode = AnalysisResult.Mode(mode: .strict, phonescount: 2, maxpairs: 2, achieveddetections: 1, detectionpct: 50, maxwindows: 4, achievedwindows: 2,
                                       continuitypct: 50, deltacewindowspct: 50, windowsFirstHour: 0, windowsLastHour: 0, longevity: 0, pairs: [], detectedPairs: [])
        let seen = AnalysisResult.PairMetrics(observer: "a", observed: "b", detected: true, heraldWindows: 2, strictWindows: 2, strictScorePct: 100,
                                              timeToFirstDetection: 1, timeToFirstRead: 2, rssiSamples: 10, longestGap: 5)
        var missed = seen
        (missed.observer, missed.observed, missed.detected, missed.timeToFirstDetection, missed.timeToFirstRead) = ("b", "a", false, nil, nil)
        missed.strictScorePct = 0
        var t = AnalysisThresholds()
        t.continuityPct = 0
        t.pairContinuityPct = 0
        let strict = Verdict.checks(strict: mode, pairs: [seen, missed], thresholds: t)
        XCTAssertTrue(strict.contains { !$0.passed && $0.subject == "b sees a" && $0.name == "detected" })
        t.detectionPct = 40
        let lenient = Verdict.checks(strict: mode, pairs: [seen, missed], thresholds: t)
        XCTAssertTrue(lenient.allSatisfy(\.passed), "\(lenient.filter { !$0.passed }.map(\.message))")
        t.detectionPct = 60
        XCTAssertEqual(Verdict.checks(strict: mode, pairs: [seen, missed], thresholds: t).filter { !$0.passed }.map(\.name), ["detection"])
    }
}
