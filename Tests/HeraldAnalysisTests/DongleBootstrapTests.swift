import XCTest
@testable import HeraldAnalysis
import HeraldCore

/// Issue 38, items 1, 4 and 5: the dongle is the resampling unit across the runs of a level
/// (drawn once for all its runs, a run drawn k times weighing k), the interval keeps its
/// coverage, times are censored at the run's end, and a paired row's columns are the paired
/// statistic's.
final class DongleBootstrapTests: XCTestCase {
    /// A normal draw from the seeded generator (Box-Muller).
    static func normal(_ g: inout SeededGenerator) -> Double {
        let u1 = max(1e-12, Double(g.next() >> 11) / Double(1 << 53)), u2 = Double(g.next() >> 11) / Double(1 << 53)
        return (-2 * log(u1)).squareRoot() * cos(2 * Double.pi * u2)
    }

    /// An arm of `runs` runs on the same `dongles` dongles: every ordered pair i->j of a run
    /// holds mu + run effect + observer effect a_i + target effect b_j + pair noise, as a
    /// ratio of `value` to 1 (the pooled ratio is then the weighted mean). Dongle effects
    /// persist across runs. `offset`: device numbers of run r are r * offset + i (offset 0:
    /// the same dongle keeps its number in every run; 1000: every run has its own dongles,
    /// which is how the old bootstrap saw them).
    static func arm(_ g: inout SeededGenerator, runs: Int, dongles: Int, dongleSD: Double, pairSD: Double, runSD: Double, offset: Int = 0) -> ClusterBootstrap.Arm {
        let a = (0..<dongles).map { _ in dongleSD * normal(&g) }, b = (0..<dongles).map { _ in dongleSD * normal(&g) }
        return (0..<runs).map { r in
            let run = runSD * normal(&g)
            var units = [StatUnit]()
            for i in 0..<dongles {
                for j in 0..<dongles where j != i {
                    units.append(StatUnit(hits: run + a[i] + b[j] + pairSD * normal(&g), possible: 1, device: r * offset + i, partner: r * offset + j))
                }
            }
            return units
        }
    }

    /// (a) 5 dongles in 6 runs, strong dongle effects and no run effect: the interval must not
    /// shrink like 1/sqrt(runs x dongles). It stays about as wide as one run's (the dongle
    /// sample has not grown), where giving each run its own dongles (the old bootstrap) makes
    /// it 2-4 times narrower.
    func testRepeatRunsOfTheSameDonglesDoNotNarrowTheInterval() {
        var g = SeededGenerator(seed: 38)
        let six = Self.arm(&g, runs: 6, dongles: 5, dongleSD: 1, pairSD: 0.2, runSD: 0)
        let asOld = six.enumerated().map { (r, run) in run.map { u in StatUnit(hits: u.hits, possible: 1, device: r * 1000 + u.device, partner: u.partner.map { r * 1000 + $0 }) } }
        let b = ClusterBootstrap(resamples: 1000, seed: 5)
        let sixRuns = b.estimate(six, pooling: .ratio)!.ci.width
        let oneRun = b.estimate([six[0]], pooling: .ratio)!.ci.width
        let separate = b.estimate(asOld, pooling: .ratio)!.ci.width
        print("widths: 6 runs \(sixRuns), one run \(oneRun), each run's dongles new \(separate)")
        XCTAssertGreaterThan(sixRuns, 0.8 * oneRun, "6 runs of the same 5 dongles: \(sixRuns) against one run's \(oneRun)")
        XCTAssertGreaterThan(sixRuns, 2 * separate, "the same dongle counted as 6 dongles: \(separate)")
        // The difference of two such arms (an A/A) is no narrower either.
        let other = Self.arm(&g, runs: 6, dongles: 5, dongleSD: 1, pairSD: 0.2, runSD: 0)
        let d6 = b.difference(baseline: six, level: other, pooling: .ratio)!.ci.width
        let d1 = b.difference(baseline: [six[0]], level: [other[0]], pooling: .ratio)!.ci.width
        XCTAssertGreaterThan(d6, 0.8 * d1, "\(d6) against \(d1)")
    }

    /// A run drawn k times weighs k (not k squared): each drawn run's pairs weigh its count
    /// times the pair counts of the dongles, which are drawn once for every run.
    func testADrawnRunWeighsItsCountAndDonglesAreDrawnOnceForAllRuns() {
        var g = SeededGenerator(seed: 2)
        let arm = Self.arm(&g, runs: 3, dongles: 4, dongleSD: 1, pairSD: 1, runSD: 1)
        let p = ClusterBootstrap.Prepared(arm)
        XCTAssertEqual(p.runCount, 3)
        XCTAssertEqual(p.deviceCount, 4, "one device per dongle, not per run")
        XCTAssertEqual(p.strata.count, 1)
        var runCounts = [0, 0, 0], counts = [0, 0, 0, 0], weights = [Double](repeating: 0, count: p.hits.count)
        var sawTwice = false
        for _ in 0..<200 {
            p.draw(&g, runCounts: &runCounts, counts: &counts, weights: &weights)
            XCTAssertEqual(runCounts.reduce(0, +), 3)
            XCTAssertEqual(counts.reduce(0, +), 4)
            var pairs = 0
            for i in 0..<4 { for j in 0..<4 where j != i { pairs += counts[i] * counts[j] } }
            for r in 0..<3 {
                let w = p.unitRun.indices.filter { p.unitRun[$0] == r }.reduce(0.0) { $0 + weights[$1] }
                XCTAssertEqual(w, Double(runCounts[r] * pairs), "run \(r) drawn \(runCounts[r]) times")
                if runCounts[r] == 2 && pairs > 0 { sawTwice = true }
            }
        }
        XCTAssertTrue(sawTwice)
        // Runs of different dongles keep their sizes: each run's dongles are drawn within it.
        let separate = ClusterBootstrap.Prepared([arm[0], arm[1].map { var u = $0; u.device += 10; u.partner = u.partner.map { $0 + 10 }; return u }])
        XCTAssertEqual(separate.strata.map(\.count), [4, 4])
        var two = [1, 1], eight = [Int](repeating: 0, count: 8), w8 = [Double](repeating: 0, count: separate.hits.count)
        for _ in 0..<50 {
            separate.draw(&g, runCounts: &two, counts: &eight, weights: &w8)
            XCTAssertEqual(two, [1, 1], "2 runs: each kept once")
            XCTAssertEqual(eight[0..<4].reduce(0, +), 4)
            XCTAssertEqual(eight[4..<8].reduce(0, +), 4)
        }
    }

    /// (b) Coverage: 400 seeded arms of 4 runs on 8 dongles with dongle effects (and a small
    /// run effect); the 95 % interval holds the true mean (0) in 92-98 % of them. Giving each
    /// run its own dongles (the old bootstrap) covers far less.
    func testTheIntervalKeepsItsCoverageWhenDonglesDiffer() {
        var g = SeededGenerator(seed: 95)
        let b = ClusterBootstrap(resamples: 200, seed: 1)
        var covered = 0, coveredAsOld = 0
        let trials = 400
        for t in 0..<trials {
            let arm = Self.arm(&g, runs: 4, dongles: 8, dongleSD: 1, pairSD: 1, runSD: 0.2)
            if b.estimate(arm, pooling: .ratio, stream: "\(t)")!.ci.contains(0) { covered += 1 }
            if t < 100 {
                let asOld = arm.enumerated().map { (r, run) in run.map { u in StatUnit(hits: u.hits, possible: 1, device: r * 100 + u.device, partner: u.partner.map { r * 100 + $0 }) } }
                if b.estimate(asOld, pooling: .ratio, stream: "\(t)")!.ci.contains(0) { coveredAsOld += 1 }
            }
        }
        let rate = Double(covered) / Double(trials)
        print("coverage: \(covered) of \(trials) with the dongles drawn once; \(coveredAsOld) of 100 with each run's dongles new")
        XCTAssertGreaterThanOrEqual(rate, 0.92, "coverage \(covered) of \(trials)")
        XCTAssertLessThanOrEqual(rate, 0.98, "coverage \(covered) of \(trials)")
        XCTAssertLessThan(coveredAsOld, 85, "each run's dongles as new ones: \(coveredAsOld) of 100")
    }

    /// Compare numbers a level's devices by their identity across runs: the same dongle is the
    /// same device in every run, whatever its node is called in each.
    func testCompareKeysDevicesByTheirDongleAcrossRuns() {
        var one = ScaledReportTests.synthetic(devices: 4, cetotal: 10).result
        var two = one
        let folders = one.devices.map(\.folder)
        one.input.units = Dictionary(uniqueKeysWithValues: folders.enumerated().map { ($1, "dongle D\($0)") })
        // The second run put the dongles on the nodes in the reverse order.
        two.input.units = Dictionary(uniqueKeysWithValues: folders.enumerated().map { ($1, "dongle D\(folders.count - 1 - $0)") })
        let level = Comparison.Level(name: "x", runs: [Comparison.RunRef(result: one, label: "1", settings: [:]), Comparison.RunRef(result: two, label: "2", settings: [:])])
        let arm = Comparison.arm(level, .continuityStrictPct)
        XCTAssertEqual(Set(arm[0].map(\.device)), Set(0..<4))
        XCTAssertEqual(Set(arm[1].map(\.device)), Set(0..<4))
        XCTAssertEqual(ClusterBootstrap.Prepared(arm).deviceCount, 4)
        // Node n in run 1 is dongle Dn; in run 2 it is D(3-n): run 2's first folder is run 1's last.
        let first1 = arm[0].first { $0.partner != nil }!.device, devices2 = Set(arm[1].map(\.device))
        XCTAssertTrue(devices2.contains(first1))
        func key(_ run: [StatUnit], observerFolder: String, _ result: AnalysisResult) -> Int {
            let i = result.pairs.firstIndex { $0.observer == observerFolder }!
            return run[i].device
        }
        XCTAssertEqual(key(arm[0], observerFolder: folders[0], one), key(arm[1], observerFolder: folders[3], two))
        // Without identities (simulated runs), the node is the device.
        let plain = ScaledReportTests.synthetic(devices: 4, cetotal: 10).result
        let nodes = Comparison.arm(Comparison.Level(name: "y", runs: [.init(result: plain, label: "1", settings: [:]), .init(result: plain, label: "2", settings: [:])]), .detectionPct)
        XCTAssertEqual(ClusterBootstrap.Prepared(nodes).deviceCount, 4)
    }

    /// A lab manifest names each node's device across runs: its dongle's address, else the
    /// dongle's label, else its agent.
    func testTheManifestNamesEachNodesDevice() throws {
        let json = #"{"nodes": [{"name": "n1", "dongle": {"id": "AA:BB", "name": "d1"}, "agent": {"name": "a1"}}, {"name": "n2", "agent": {"name": "a2"}}, {"name": "n3", "dongle": {"name": "label"}}, {"name": "n4", "agent": null}]}"#
        let m = try JSONDecoder().decode(BundleManifest.self, from: Data(json.utf8))
        XCTAssertEqual(m.nodes?.map(\.unit), ["dongle AA:BB", "agent a2", "dongle label", nil])
    }

    /// (c) Censored times: a pair never detected counts as not detected by the end of the run,
    /// so the median is over every pair, and it is censored when more than half had none.
    func testTimesToFirstDetectionAreCensoredAtTheRunsEnd() {
        var r = ScaledReportTests.synthetic(devices: 4, cetotal: 10).result
        let end = RunMetrics.observedSeconds(r)
        XCTAssertEqual(end, 8 * 3600 + 120)
        for i in r.pairs.indices { r.pairs[i].timeToFirstDetection = i < 5 ? Double(i + 1) : nil }
        // 5 of 12 pairs detected at 1-5 s, 7 never: the median (6th and 7th values) is censored.
        let units = RunMetrics.units(r, .timeToFirstDetection)
        XCTAssertEqual(units.count, 12, "every pair, not only those detected")
        XCTAssertEqual(units.filter(\.censored).count, 7)
        XCTAssertTrue(units.filter(\.censored).allSatisfy { $0.values == [end] })
        XCTAssertTrue(Pooling.median.censored(units))
        XCTAssertEqual(Pooling.median.statistic(units), end)
        let value = RunMetrics.compute(r, bootstrap: ClusterBootstrap(resamples: 200, seed: 1)).first { $0.metric == .timeToFirstDetection }!
        XCTAssertEqual(value.censored, true)
        XCTAssertTrue(RunMetrics.table([value]).contains("> \(Format.number(end))"), RunMetrics.table([value]))
        // 7 of 12 detected: the median is the mean of the 6th and 7th times, a number.
        for i in r.pairs.indices { r.pairs[i].timeToFirstDetection = i < 7 ? Double(i + 1) : nil }
        let seven = RunMetrics.units(r, .timeToFirstDetection)
        XCTAssertFalse(Pooling.median.censored(seven))
        XCTAssertEqual(Pooling.median.statistic(seven), 6.5)
        // Exactly half detected: the median sits between a time and the end, censored.
        for i in r.pairs.indices { r.pairs[i].timeToFirstDetection = i < 6 ? Double(i + 1) : nil }
        XCTAssertTrue(Pooling.median.censored(RunMetrics.units(r, .timeToFirstDetection)))
    }

    /// A firmware that detects fewer pairs no longer looks faster: 12 pairs all detected at 5 s
    /// against 4 detected at 1 s and 8 never. Over detected pairs only, B was 4 s faster; censored,
    /// B's median is above the run's length and B is worse.
    func testDetectingFewerPairsDoesNotLookFaster() {
        let end = 60.0
        func run(_ times: [Double?]) -> [StatUnit] {
            var k = 0, out = [StatUnit]()
            for i in 0..<4 { for j in 0..<4 where j != i {
                let t = times[k]; k += 1
                out.append(StatUnit(values: [t ?? end], device: i, partner: j, censored: t == nil))
            } }
            return out
        }
        let a = run(Array(repeating: 5, count: 12)), bRun = run([1, 1, 1, 1] + Array(repeating: nil, count: 8))
        let b = ClusterBootstrap(resamples: 500, seed: 1)
        let d = b.difference(baseline: [a], level: [bRun], pooling: .median)!
        XCTAssertGreaterThan(d.delta, 0, "B detects fewer pairs: its censored median is later")
        XCTAssertEqual(d.level?.censored, true)
        XCTAssertEqual(d.baseline?.censored, false)
        XCTAssertEqual(d.level!.estimate - d.baseline!.estimate, d.delta, accuracy: 1e-12)
    }

    /// (d) One statistic per row: a crossover's arm columns are the paired statistic (the mean
    /// over the paired dongles of each one's mean figure), so level - baseline = the difference,
    /// and each interval is from the same resamples.
    func testAPairedRowsColumnsAreThePairedStatistic() {
        // Dongle "c" ran only the level, "d" only the baseline: neither is paired.
        let baseline: [[String: Double]] = [["a": 10, "b": 20, "d": 100], ["a": 12, "b": 22, "e": 7], ["a": 11, "b": 21, "e": 9]]
        let level: [[String: Double]] = [["a": 13, "b": 25, "c": 50, "e": 8], ["a": 15, "b": 23, "e": 10], ["a": 14, "b": 24]]
        let b = ClusterBootstrap(resamples: 500, seed: 4)
        let (d, units) = b.crossoverDifference(baseline: baseline, level: level)!
        XCTAssertEqual(units, 3)
        let base = d.baseline!, lev = d.level!
        // Paired dongles a, b, e: baseline means 11, 21, 8; level means 14, 24, 9.
        XCTAssertEqual(base.estimate, (11 + 21 + 8) / 3, accuracy: 1e-12)
        XCTAssertEqual(lev.estimate, (14 + 24 + 9) / 3, accuracy: 1e-12)
        XCTAssertEqual(lev.estimate - base.estimate, d.delta, accuracy: 1e-12)
        XCTAssertTrue(base.ci.contains(base.estimate) && lev.ci.contains(lev.estimate))
        // Not the unpaired pool (which would count dongles c and d and every pair).
        XCTAssertNotEqual(base.estimate, Stats.mean(baseline.flatMap(\.values))!)
    }

    /// The expansion: sqrt(n/(n-1)) t_{0.975,n-1} / z_{0.975}.
    func testExpansionFactor() {
        XCTAssertEqual(ClusterBootstrap.expansion(units: 5), (1.25).squareRoot() * 2.7764 / 1.96, accuracy: 1e-3)
        XCTAssertEqual(ClusterBootstrap.expansion(units: 1), 1)
        XCTAssertLessThan(ClusterBootstrap.expansion(units: 1000), 1.002)
    }
}
