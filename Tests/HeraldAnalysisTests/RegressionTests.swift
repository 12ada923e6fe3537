import XCTest
import HeraldAnalysis
import LabHistory
import LabNode
import LabPlan

/// Regression against history, on seeded simulated nights of one noisy plan: a large drop
/// beyond the noise is a regression. The 20 nights of noise (flagged at most once; a paused node
/// is `infra`; too little history is inconclusive; one bundle is one history row) are a
/// calibration loop: `herald-lab-bench calibrate --only nights` (make test-calibration).
final class RegressionTests: XCTestCase {
    static let yaml = """
    name: nightly
    duration: 40s
    warmup: 5s
    nodes: {count: 24, prefix: n, grid: {columns: 6, spacing: 1m}}
    sensor: {advertInterval: 1s}
    radio: {kind: sim, crowding: on}
    thresholds: {regressionTolerancePct: 2}
    """

    func night(_ plan: Plan, seed: UInt64, in dir: URL, pause: Bool = false, reportLoss: Double? = nil) throws -> AnalysisResult {
        let bundle = dir.appendingPathComponent("night-\(seed)\(pause ? "-paused" : "")\(reportLoss != nil ? "-lossy" : "")")
        var p = plan
        if let reportLoss { p.radio.reportLoss = reportLoss }
        if pause { p.nodes[0].power = [PowerInterval(off: 10, on: 20)] }
        _ = try Simulation(plan: p, planText: Self.yaml, seed: seed, output: bundle, threads: 1).run()
        if pause {
            // What a lab's manifest says of an agent paused for 10 s of 40: a gap of its node.
            let url = bundle.appendingPathComponent("manifest.json")
            var m = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
            var nodes = m["nodes"] as! [[String: Any]]
            nodes[0]["gaps"] = [["from": "2026-01-01T00:00:10Z", "to": "2026-01-01T00:00:20Z", "reason": "agent paused"]]
            m["nodes"] = nodes
            try JSONSerialization.data(withJSONObject: m).write(to: url)
        }
        return try Analyser.analyse(bundle).result
    }

    /// The rules of regress against history on a few nights (the false-alarm rate over 20 nights
    /// is the calibration tier's): fewer than 3 earlier runs are inconclusive; a night with a node
    /// paused for a quarter of the run is `infra`, naming the node and why, and is never a
    /// baseline once recorded; the same bundle recorded twice is one history row.
    func testTooLittleHistoryIsInconclusiveAPausedNodeIsInfraAndOneBundleIsOneRow() throws {
        let tmp = TestPaths.temp("rules")
        defer { try? FileManager.default.removeItem(at: tmp) }
        let plan = try Plan.parse(yaml: Self.yaml)
        let store = try HistoryStore(url: tmp.appendingPathComponent("history.sqlite"))
        for seed in UInt64(1)...4 {
            let r = try night(plan, seed: seed, in: tmp)
            try store.record(r, reportPath: "")
            let history = try store.baseline(like: r, last: 10).map { try store.summary(of: $0) }
            let j = Regression.judge(current: r, history: history, tolerancePct: 2)
            if seed <= 3 {
                XCTAssertEqual(j.verdict, .inconclusive, "night \(seed) has \(history.count - 1) earlier runs")
                XCTAssertTrue(j.reasons.first?.contains("at least 3") == true, "\(j.reasons)")
            } else {
                XCTAssertNotEqual(j.verdict, .inconclusive, Regression.text(j))
                XCTAssertNotEqual(j.verdict, .infra, "no faults were made: \(Regression.text(j))")
            }
        }
        let paused = try night(plan, seed: 21, in: tmp, pause: true)
        let history = try store.baseline(like: paused, last: 10).map { try store.summary(of: $0) }
        XCTAssertEqual(history.count, 4)
        let j = Regression.judge(current: paused, history: history, tolerancePct: 2)
        XCTAssertEqual(j.verdict, .infra)
        XCTAssertTrue(j.reasons.contains { $0.contains("n1") && $0.contains("agent paused") }, "\(j.reasons)")
        XCTAssertTrue(Regression.text(j).contains("infra:"))
        // Recorded, a faulty run is never a baseline.
        try store.record(paused, reportPath: "")
        let next = try night(plan, seed: 22, in: tmp)
        XCTAssertFalse(try store.baseline(like: next, last: 10).contains { $0.runId.contains("paused") })
        // The same bundle recorded twice is one row.
        let before = try store.runs(plan: "nightly").count
        try store.record(next, reportPath: "")
        try store.record(next, reportPath: "")
        XCTAssertEqual(try store.runs(plan: "nightly").count, before + 1)
    }

    func testALargeDropBeyondTheNoiseIsARegression() throws {
        let tmp = TestPaths.temp("drop")
        defer { try? FileManager.default.removeItem(at: tmp) }
        let plan = try Plan.parse(yaml: Self.yaml)
        let history = try (UInt64(1)...5).map { try night(plan, seed: $0, in: tmp) }
        var worse = plan
        worse.radio.reportLoss = 0.8
        let bundle = tmp.appendingPathComponent("worse")
        _ = try Simulation(plan: worse, planText: "", seed: 9, output: bundle, threads: 1).run()
        let j = Regression.judge(current: try Analyser.analyse(bundle).result, history: history, tolerancePct: 2)
        XCTAssertEqual(j.verdict, .regression, Regression.text(j))
        XCTAssertTrue(j.findings.contains { $0.metric == "samplesPerPairMinute" && $0.regressed }, Regression.text(j))
    }

    /// A night with a faulty node that also regressed everywhere else (issue 38): judged on the
    /// nodes without faults and the pairs between them, it is a regression (exit 1), the fault
    /// noted, not `infra` (exit 3) that hides it.
    func testInfraCannotHideARegressionAmongTheNodesThatRan() throws {
        let tmp = TestPaths.temp("infra-regress")
        defer { try? FileManager.default.removeItem(at: tmp) }
        let plan = try Plan.parse(yaml: Self.yaml)
        let history = try (UInt64(1)...5).map { try night(plan, seed: $0, in: tmp) }
        let both = try night(plan, seed: 9, in: tmp, pause: true, reportLoss: 0.8)
        let j = Regression.judge(current: both, history: history, tolerancePct: 2)
        XCTAssertEqual(j.verdict, .regression, Regression.text(j))
        XCTAssertTrue(j.reasons.contains { $0.contains("n1") && $0.contains("agent paused") }, "\(j.reasons)")
        XCTAssertTrue(j.method.contains("judged on the 23 of 24 nodes without faults"), j.method)
        XCTAssertTrue(Regression.text(j).contains("infra noted"), Regression.text(j))
        // The same fault on a night without the regression stays infra.
        let paused = try night(plan, seed: 10, in: tmp, pause: true)
        XCTAssertEqual(Regression.judge(current: paused, history: history, tolerancePct: 2).verdict, .infra)
    }

    /// The plan's own power schedule is the test's condition: a node the plan switches off for
    /// good ends `partial` in the manifest, and that is not an infrastructure fault (issue 38).
    func testAPlannedPowerOffIsNotInfra() throws {
        let tmp = TestPaths.temp("planned-off")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var plan = try Plan.parse(yaml: Self.yaml)
        plan.nodes[0].power = [PowerInterval(off: 20, on: nil)]
        let bundle = tmp.appendingPathComponent("off")
        _ = try Simulation(plan: plan, planText: Self.yaml, seed: 3, output: bundle, threads: 1).run()
        let m = try Manifest.read(from: bundle.appendingPathComponent("manifest.json"))
        XCTAssertEqual(m.nodes.first?.state, .partial, "the manifest says what the logs show")
        let r = try Analyser.analyse(bundle).result
        XCTAssertEqual(Regression.infrastructure(r), [], "a planned power-off is no fault")
    }
}
