import XCTest
import HeraldAnalysis
import LabNode
import LabPlan

/// Calibration of compare's verdicts on the simulator (seeded, deterministic): an A/A
/// comparison (two node groups with the same settings, crowded and far from saturated) must
/// call a metric better or worse in at most 2 of 40 seeds (5 %, family-wise over the metrics);
/// a known effect (advertising every 100 ms against every 1 s) must be found, with its interval
/// excluding 0, in at least 36 of 40.
final class CalibrationTests: XCTestCase {
    static let seeds: [UInt64] = Array(1...40)

    /// 24 crowded nodes for 40 s: about 40 % of pairs are read (and so detected) by the end.
    static func plan(_ groups: String, advert: String = "1s") throws -> Plan {
        try Plan.parse(yaml: """
        name: calibration
        duration: 40s
        warmup: 5s
        nodes: {count: 24, prefix: n, grid: {columns: 6, spacing: 1m}}
        sensor: {advertInterval: \(advert)}
        radio: {kind: sim, crowding: on}
        groups:
        \(groups)
        """)
    }

    func outcomes(_ plan: Plan, name: String) throws -> [Comparison.Outcome] {
        let tmp = TestPaths.temp("calibration-\(name)")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var out = [Comparison.Outcome]()
        for seed in Self.seeds {
            let bundle = tmp.appendingPathComponent("s\(seed)")
            _ = try Simulation(plan: plan, planText: "", seed: seed, output: bundle, threads: 1).run()
            let result = try Analyser.analyse(bundle).result
            guard case .success(var design) = Comparison.design([result]) else { XCTFail("no design"); return [] }
            design.resamples = 500
            design.seed = seed
            out.append(Comparison.compare(design))
            try? FileManager.default.removeItem(at: bundle)
        }
        return out
    }

    /// Runs `plans` in order as separate runs (seeds `seed * plans.count + k`), analyses each and
    /// compares them as a study does (500 resamples, seeded by `seed`); nil when no design.
    func study(_ plans: [Plan], seed: UInt64, in tmp: URL) throws -> Comparison.Outcome? {
        try studies(plans, seed: seed, in: tmp).map { Comparison.compare($0) }
    }

    /// The design `study` compares (the runs simulated once, to compare more than one way).
    func studies(_ plans: [Plan], seed: UInt64, in tmp: URL) throws -> Comparison.Design? {
        var results = [AnalysisResult]()
        for (k, p) in plans.enumerated() {
            let bundle = tmp.appendingPathComponent("s\(seed)-\(k)")
            _ = try Simulation(plan: p, planText: "", seed: seed * UInt64(plans.count) + UInt64(k), output: bundle, threads: 1).run()
            results.append(try Analyser.analyse(bundle).result)
            try? FileManager.default.removeItem(at: bundle)
        }
        guard case .success(var design) = Comparison.design(results) else { return nil }
        design.resamples = 500
        design.seed = seed
        return design
    }

    /// Two levels of the crowded plan that differ only in their variant label (separate runs, no groups).
    static func aaLevels() throws -> (Plan, Plan) {
        let base = try plan("  - {name: x}\n  - {name: y}")
        var a = base, b = base
        a.groups = nil
        b.groups = nil
        for i in a.nodes.indices { a.nodes[i].group = nil; a.nodes[i].sensor = nil; b.nodes[i].group = nil; b.nodes[i].sensor = nil }
        a.variant = "A"
        b.variant = "A2"
        return (a, b)
    }

    func testAnAAComparisonCallsNothingInAtLeast95PercentOfSeeds() throws {
        let outcomes = try outcomes(try Self.plan("  - {name: A}\n  - {name: A2}"), name: "aa")
        XCTAssertEqual(outcomes.count, 40)
        var falseCalls = 0
        var perMetric = [String: Int]()
        var detection = [Double]()
        for o in outcomes {
            XCTAssertTrue(o.checkPassed, o.check.joined(separator: "; "))
            let called = o.effects.filter { $0.verdict == .better || $0.verdict == .worse }
            if !called.isEmpty { falseCalls += 1 }
            for e in called { perMetric[e.metric, default: 0] += 1 }
            if let d = o.effects.first(where: { $0.metric == "detectionPct" })?.baselineEstimate { detection.append(d) }
        }
        print("calibration A/A: \(falseCalls) of \(outcomes.count) seeds called a metric better or worse \(perMetric.sorted { $0.key < $1.key }); detection \(detection.min() ?? 0)-\(detection.max() ?? 0) %")
        XCTAssertLessThanOrEqual(falseCalls, 2, "family-wise false calls in 40 A/A comparisons: \(perMetric)")
        // Not saturated: a calibration on saturated figures would prove nothing.
        XCTAssertLessThan(detection.max() ?? 100, 90)
    }

    /// An A/A study of separate runs (two levels that differ only in their variant label),
    /// crowded and not saturated, one run a level (seconds of debug time per seed: the
    /// known-effect check below has two). With fewer than 3 runs a level devices are drawn
    /// run by run, so this checks that run-to-run noise does not then pass for an effect.
    func testAnAAStudyOfSeparateRunsCallsNothingInAtLeast95PercentOfSeeds() throws {
        let (a, b) = try Self.aaLevels()
        let tmp = TestPaths.temp("calibration-aa-runs")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var falseCalls = 0
        var perMetric = [String: Int]()
        for seed in Self.seeds {
            guard var design = try studies([a, b], seed: seed, in: tmp) else { return XCTFail("no design") }
            let o = Comparison.compare(design)
            XCTAssertEqual(o.factor, "variant")
            XCTAssertEqual(o.pairing, "unpaired")
            if seed == 1 {
                // One run a level cannot be paired: every device of a run shares its noise
                // (paired anyway, this A/A called a difference in 11 of 40 seeds).
                design.pairByNode()
                let asked = Comparison.compare(design)
                XCTAssertEqual(asked.pairing, "unpaired")
                XCTAssertTrue(asked.effects.contains { $0.note?.contains("a paired comparison needs 3 runs a level") == true }, "\(asked.effects.map(\.note))")
            }
            let called = o.effects.filter { $0.verdict == .better || $0.verdict == .worse }
            if !called.isEmpty { falseCalls += 1 }
            for e in called { perMetric[e.metric, default: 0] += 1 }
        }
        print("calibration A/A study, separate runs: \(falseCalls) of \(Self.seeds.count) seeds called a metric better or worse \(perMetric.sorted { $0.key < $1.key })")
        XCTAssertLessThanOrEqual(falseCalls, 2, "\(perMetric)")
    }

    /// The paired path (a crossover: every level on the same devices) on an A/A study of three
    /// runs a level in blocks A,B / B,A / A,B, each simulated node the same device in every run:
    /// compared paired per node, it calls a metric better or worse in at most 1 of 20 seeds
    /// (six runs a seed: 40 seeds take over 6 minutes here; they gave 0 of 40 when measured).
    func testAPairedAAStudyCallsNothingInAtLeast95PercentOfSeeds() throws {
        let seeds = Array(Self.seeds.prefix(20))
        let (a, b) = try Self.aaLevels()
        let tmp = TestPaths.temp("calibration-aa-paired")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var pairedFalseCalls = 0
        var pairedPerMetric = [String: Int]()
        for seed in seeds {
            guard var design = try studies([a, b, b, a, a, b], seed: seed, in: tmp) else { return XCTFail("no design") }
            design.pairByNode()
            let paired = Comparison.compare(design)
            XCTAssertEqual(paired.pairing, "paired per dongle")
            XCTAssertTrue(paired.method.hasPrefix("paired per dongle"), paired.method)
            let pairedCalled = paired.effects.filter { $0.verdict == .better || $0.verdict == .worse }
            if !pairedCalled.isEmpty { pairedFalseCalls += 1 }
            for e in pairedCalled { pairedPerMetric[e.metric, default: 0] += 1 }
        }
        print("calibration A/A study, paired per node, 3 runs a level: \(pairedFalseCalls) of \(seeds.count) seeds called a metric better or worse \(pairedPerMetric.sorted { $0.key < $1.key })")
        XCTAssertLessThanOrEqual(pairedFalseCalls, 1, "paired: \(pairedPerMetric)")
    }

    /// The worked study's effect at a smaller scale: 16 nodes for 15 s, two runs of each level
    /// per seed in blocks A,B / B,A (separate runs, as a study runs them). The crowding model is off here: with it,
    /// reads are the bottleneck and a 15-s run detects too few pairs to time their first
    /// detection (the worked study, 90 s, shows the effect with crowding on).
    func testAKnownEffectIsFoundInAtLeast90PercentOfSeeds() throws {
        func plan(_ advert: String) throws -> Plan {
            try Plan.parse(yaml: """
            name: calibration-effect
            duration: 15s
            warmup: 2s
            nodes: {count: 16, prefix: n, grid: {columns: 4, spacing: 2m}}
            sensor: {advertInterval: \(advert)}
            radio: {kind: sim}
            """)
        }
        let slow = try plan("1s"), fast = try plan("100ms")
        let tmp = TestPaths.temp("calibration-effect")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var found = [String: Int]()
        for seed in Self.seeds {
            guard let o = try study([slow, fast, fast, slow], seed: seed, in: tmp) else { return XCTFail("no design") }
            XCTAssertEqual(o.factor, "sensor.advertInterval")
            XCTAssertEqual(o.baseline, "1")
            for e in o.effects where ["intervalMedian", "timeToFirstDetection"].contains(e.metric) {
                guard let ci = e.ci95 else { continue }
                if e.verdict == .better, ci[1] < 0 { found[e.metric, default: 0] += 1 }
            }
        }
        print("calibration 100 ms against 1 s: found better (interval below 0) in \(found.sorted { $0.key < $1.key }) of \(Self.seeds.count) seeds")
        XCTAssertGreaterThanOrEqual(found["intervalMedian"] ?? 0, 36)
        XCTAssertGreaterThanOrEqual(found["timeToFirstDetection"] ?? 0, 36)
    }
}
