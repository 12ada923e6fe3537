import XCTest
import HeraldAnalysis
import LabNode
import LabPlan

/// Every shipped plan that runs on the simulated radio passes its own thresholds when
/// simulated (at most its first 3 minutes: the 8- and 12-hour plans cannot run in a unit
/// test; grid-100 runs whole). A study plan runs its baseline level.
final class ShippedPlansTests: XCTestCase {
    func testEveryShippedSimulatedPlanPassesItsOwnThresholds() throws {
        let dir = TestPaths.packageRoot.appendingPathComponent("plans")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".yaml") }.sorted()
        XCTAssertGreaterThanOrEqual(files.count, 10)
        let tmp = TestPaths.temp("shipped")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var checked = [String]()
        for file in files {
            let text = try Plan.readText(path: dir.appendingPathComponent(file).path)
            let expanded = try Plan.expandStudy(yaml: text, source: file)
            var plan = expanded.runs.first { $0.levelIndex == 0 }?.plan ?? expanded.plan
            guard plan.radio.kind == .sim else { continue }
            if plan.duration > 180 {
                plan.duration = 180
                if plan.warmup >= 120 { plan.warmup = 30 }
            }
            let bundle = tmp.appendingPathComponent(file)
            _ = try Simulation(plan: plan, planText: text, seed: plan.seed, output: bundle).run()
            let r = try Analyser.analyse(bundle).result
            let failed = r.checks.filter { !$0.passed }
            XCTAssertTrue(r.passed, "\(file): \(failed.count) checks failed, first: \(failed.first.map { "\($0.name) \($0.subject): \($0.message)" } ?? "-")")
            checked.append(file)
            try? FileManager.default.removeItem(at: bundle)
        }
        print("shipped plans simulated and passed: \(checked.joined(separator: ", "))")
        XCTAssertTrue(checked.contains("grid-100.yaml"))
    }
}
