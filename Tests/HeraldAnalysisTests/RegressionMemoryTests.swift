import XCTest
import HeraldAnalysis
import LabHistory
import LabNode
import LabPlan

/// regress against history remembers (issue 38): a drop that persists is flagged every night
/// until the level returns or an operator accepts it, and flagged nights are not baselines.
/// Nights are one simulated smoke run, copied under other run ids, with every pair's windows
/// cut by a fifth on the worse nights (a 20-point drop in continuity; tolerance 2 points).
final class RegressionMemoryTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = TestPaths.temp("memory") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func nights() throws -> (AnalysisResult) {
        let path = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        let out = tmp.appendingPathComponent("base")
        _ = try Simulation(plan: try Plan.load(path: path), planText: "", seed: 1, output: out).run()
        return try Analyser.analyse(out).result
    }

    func night(_ base: AnalysisResult, _ id: String, worse: Bool = false) -> AnalysisResult {
        var r = base
        r.input.runId = id
        r.input.path = tmp.appendingPathComponent(id).path
        if worse {
            for k in r.pairs.indices {
                r.pairs[k].strictWindows = r.pairs[k].strictWindows * 4 / 5
                r.pairs[k].heraldWindows = r.pairs[k].heraldWindows * 4 / 5
            }
        }
        return r
    }

    func testAPersistentDropStaysFlaggedUntilAcceptedAndFlaggedNightsAreNoBaseline() throws {
        let base = try nights()
        let store = try HistoryStore(url: tmp.appendingPathComponent("history.sqlite"))
        var verdicts = [Regression.Verdict]()
        for k in 1...4 {
            verdicts.append(try RegressionMemory.judge(current: night(base, "n\(k)"), store: store, last: 10, tolerancePct: 2).verdict)
        }
        XCTAssertEqual(verdicts, [.inconclusive, .inconclusive, .inconclusive, .none], "3 earlier nights before a verdict")
        var alerts = [String?]()
        for k in 1...3 {
            let j = try RegressionMemory.judge(current: night(base, "w\(k)", worse: true), store: store, last: 10, tolerancePct: 2)
            XCTAssertEqual(j.verdict, .regression, "worse night \(k): \(Regression.text(j))")
            alerts.append(j.alert)
        }
        XCTAssertTrue(alerts[0]?.hasPrefix("regressed: opened by this night") == true, alerts[0] ?? "")
        XCTAssertTrue(alerts[0]?.contains("interleaved A/B") == true, "a confirmation run is suggested")
        XCTAssertTrue(alerts[2]?.hasPrefix("regressed since w1") == true, alerts[2] ?? "")
        XCTAssertEqual(try store.baseline(like: night(base, "next"), last: 10).map(\.runId), ["n1", "n2", "n3", "n4"], "flagged nights are no baseline")
        // Judged again, a night does not open a second alert.
        _ = try RegressionMemory.judge(current: night(base, "w3", worse: true), store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(try store.alerts(plan: "smoke").count, 1)

        // An operator accepts the new level: its nights become the baseline, and the next worse
        // night is the normal one.
        let accepted = try store.accept(plan: "smoke", variant: nil, testbed: nil, by: "ops@lab", reason: "firmware 2.1 trades continuity for power")
        XCTAssertEqual(accepted.map(\.state), [.accepted])
        XCTAssertEqual(accepted.first?.closedBy, "ops@lab")
        XCTAssertEqual(accepted.first?.reason, "firmware 2.1 trades continuity for power")
        let after = try RegressionMemory.judge(current: night(base, "w4", worse: true), store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(after.verdict, .none, Regression.text(after))
        XCTAssertEqual(after.baselineRuns, ["w1", "w2", "w3"])
        XCTAssertTrue(try store.accept(plan: "smoke", variant: nil, testbed: nil, by: "x", reason: "y").isEmpty, "nothing left to accept")
    }

    func testANightBackAtTheOldLevelClosesTheAlert() throws {
        let base = try nights()
        let store = try HistoryStore(url: tmp.appendingPathComponent("history.sqlite"))
        for k in 1...3 { _ = try RegressionMemory.judge(current: night(base, "n\(k)"), store: store, last: 10, tolerancePct: 2) }
        XCTAssertEqual(try RegressionMemory.judge(current: night(base, "w1", worse: true), store: store, last: 10, tolerancePct: 2).verdict, .regression)
        let back = try RegressionMemory.judge(current: night(base, "n4"), store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(back.verdict, .none)
        XCTAssertTrue(back.alert?.hasPrefix("returned") == true, back.alert ?? "")
        XCTAssertEqual(try store.alerts(plan: "smoke").map(\.state), [.returned])
        XCTAssertEqual(try store.baseline(like: night(base, "n5"), last: 10).map(\.runId), ["n1", "n2", "n3", "n4"], "the flagged night stays out")
    }

    /// The nightly series is searched for change points (E-Divisive): after 8 normal nights and
    /// 5 worse ones, the judgement dates the drop to the first worse night.
    func testThePersistentDropIsDatedByAChangePoint() throws {
        let base = try nights()
        let store = try HistoryStore(url: tmp.appendingPathComponent("history.sqlite"))
        for k in 1...8 { _ = try RegressionMemory.judge(current: night(base, "n\(k)"), store: store, last: 10, tolerancePct: 2) }
        var j: Regression.Judgement?
        for k in 1...5 { j = try RegressionMemory.judge(current: night(base, "w\(k)", worse: true), store: store, last: 10, tolerancePct: 2) }
        let changes = j?.changePoints ?? []
        XCTAssertTrue(changes.contains { $0.hasPrefix("continuity % (strict)") && $0.contains("from run w1 (night 9 of 13)") }, "\(changes)")
        XCTAssertTrue(Regression.text(j!).contains("change point: "), Regression.text(j!))
    }
}
