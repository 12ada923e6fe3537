import XCTest
import LabNode
import LabPlan
@testable import HeraldAnalysis

/// A manifest.json that does not decode stops the analysis with the field and the problem: a bundle
/// is never analysed without its clock offsets, windows and thresholds.
final class ManifestDecodeTests: XCTestCase {
    func testAManifestThatDoesNotDecodeIsANamedError() throws {
        let tmp = TestPaths.temp("manifest-decode")
        defer { try? FileManager.default.removeItem(at: tmp) }
        var plan = try Plan.load(path: TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path)
        plan.duration = 20; plan.warmup = 0
        _ = try Simulation(plan: plan, planText: "", output: tmp).run()
        XCTAssertNoThrow(try Analyser.analyse(tmp), "the bundle as written analyses")

        let url = tmp.appendingPathComponent("manifest.json")
        var json = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        var nodes = try XCTUnwrap(json["nodes"] as? [[String: Any]])
        nodes[1]["clockOffset"] = "0.25 s"
        json["nodes"] = nodes
        try JSONSerialization.data(withJSONObject: json).write(to: url)
        XCTAssertThrowsError(try Analyser.analyse(tmp)) { error in
            XCTAssertEqual("\(error)".prefix(48), "manifest.json: does not decode: nodes[1].clockOf", "\(error)")
        }
        json.removeValue(forKey: "nodes")
        json["contactEvent"] = ["start": "2026-01-01 00:00:00"]
        try JSONSerialization.data(withJSONObject: json).write(to: url)
        XCTAssertThrowsError(try Analyser.analyse(tmp)) { error in
            XCTAssertEqual("\(error)", "manifest.json: does not decode: contactEvent: required field end is missing")
        }
    }
}
