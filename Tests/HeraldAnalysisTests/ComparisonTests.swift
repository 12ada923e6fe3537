import XCTest
import HeraldAnalysis
import LabNode
import LabPlan

/// compare's design and verdicts on a few seeded simulations, every commit: what must hold for
/// every seed (the factor, the baseline, paired or not and why, the design check), and one seed
/// of the known effect and of an A/A study. How often verdicts are right over 20-40 seeds is the
/// calibration tier's (`herald-lab-bench calibrate`, make test-calibration).
final class ComparisonTests: XCTestCase {
    static func crowded(variant: String) throws -> Plan {
        var p = try Plan.parse(yaml: """
        name: calibration
        duration: 40s
        warmup: 5s
        nodes: {count: 24, prefix: n, grid: {columns: 6, spacing: 1m}}
        sensor: {advertInterval: 1s}
        radio: {kind: sim, crowding: on}
        """)
        p.variant = variant
        return p
    }

    static func effectPlan(_ advert: String) throws -> Plan {
        try Plan.parse(yaml: """
        name: calibration-effect
        duration: 15s
        warmup: 2s
        nodes: {count: 16, prefix: n, grid: {columns: 4, spacing: 2m}}
        sensor: {advertInterval: \(advert)}
        radio: {kind: sim}
        """)
    }

    /// Separate runs of `plans` (seeds `seed * plans.count + k`), designed as a study compares them.
    func design(_ plans: [Plan], seed: UInt64) throws -> Comparison.Design {
        let tmp = TestPaths.temp("comparison")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var results = [AnalysisResult]()
        for (k, p) in plans.enumerated() {
            let bundle = tmp.appendingPathComponent("r\(k)")
            _ = try Simulation(plan: p, planText: "", seed: seed * UInt64(plans.count) + UInt64(k), output: bundle, threads: 1).run()
            results.append(try Analyser.analyse(bundle).result)
        }
        guard case .success(var d) = Comparison.design(results) else { throw XCTSkip("no design") }
        d.resamples = 500
        d.seed = seed
        return d
    }

    func testAKnownEffectIsFoundWithItsIntervalBelowZero() throws {
        let slow = try Self.effectPlan("1s"), fast = try Self.effectPlan("100ms")
        let o = Comparison.compare(try design([slow, fast, fast, slow], seed: 1))
        XCTAssertTrue(o.checkPassed, o.check.joined(separator: "; "))
        XCTAssertEqual(o.factor, "sensor.advertInterval")
        XCTAssertEqual(o.baseline, "1")
        XCTAssertEqual(o.pairing, "unpaired")
        for metric in ["intervalMedian", "timeToFirstDetection"] {
            let e = try XCTUnwrap(o.effects.first { $0.metric == metric }, metric)
            XCTAssertEqual(e.verdict, .better, "\(metric): \(e.ci95 ?? [])")
            XCTAssertLessThan(try XCTUnwrap(e.ci95)[1], 0, metric)
        }
    }

    func testOneRunALevelIsComparedUnpairedEvenWhenPairingIsAskedFor() throws {
        var d = try design([Self.crowded(variant: "A"), Self.crowded(variant: "A2")], seed: 1)
        let o = Comparison.compare(d)
        XCTAssertTrue(o.checkPassed, o.check.joined(separator: "; "))
        XCTAssertEqual(o.factor, "variant")
        XCTAssertEqual(o.pairing, "unpaired")
        d.pairByNode()
        let asked = Comparison.compare(d)
        XCTAssertEqual(asked.pairing, "unpaired")
        XCTAssertTrue(asked.effects.contains { $0.note?.contains("a paired comparison needs 3 runs a level") == true }, "\(asked.effects.map(\.note))")
    }

    func testThreeRunsALevelOnTheSameDevicesArePairedPerDongle() throws {
        let a = try Self.crowded(variant: "A"), b = try Self.crowded(variant: "A2")
        var d = try design([a, b, b, a, a, b], seed: 1)
        d.pairByNode()
        let o = Comparison.compare(d)
        XCTAssertTrue(o.checkPassed, o.check.joined(separator: "; "))
        XCTAssertEqual(o.pairing, "paired per dongle")
        XCTAssertTrue(o.method.hasPrefix("paired per dongle"), o.method)
        XCTAssertFalse(o.effects.isEmpty)
        for e in o.effects where e.verdict == .better || e.verdict == .worse {
            XCTAssertNotNil(e.ci95, "\(e.metric): a verdict without its interval")
        }
    }
}
