import XCTest
import LabNode
import LabPlan
import HeraldCore
@testable import HeraldAnalysis

/// A manifest.json that does not decode stops the analysis with the field and the problem: a bundle
/// is never analysed without its clock offsets, windows and thresholds.
final class ManifestDecodeTests: XCTestCase {
    /// plans/smoke.yaml for 20 s, no warm-up, simulated into `folder`.
    func simulateSmoke(into folder: URL) throws {
        var plan = try Plan.load(path: TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path)
        plan.duration = 20; plan.warmup = 0
        _ = try Simulation(plan: plan, planText: "", output: folder).run()
    }

    func testAManifestThatDoesNotDecodeIsANamedError() throws {
        let tmp = TestPaths.temp("manifest-decode")
        defer { try? FileManager.default.removeItem(at: tmp) }
        try simulateSmoke(into: tmp)
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

    /// A node state or a bundle mode the coordinator never writes is not guessed at: the analyser
    /// reads the same enums (HeraldCore's BundleNodeState and BundleMode) the coordinator writes.
    func testAnUnknownNodeStateOrModeIsANamedErrorAndTheKnownOnesRoundTrip() throws {
        let tmp = TestPaths.temp("manifest-enums")
        defer { try? FileManager.default.removeItem(at: tmp) }
        try simulateSmoke(into: tmp)
        let url = tmp.appendingPathComponent("manifest.json")
        let original = try Data(contentsOf: url)
        let written = try XCTUnwrap(JSONSerialization.jsonObject(with: original) as? [String: Any])
        XCTAssertEqual(written["mode"] as? String, BundleMode.simulate.rawValue, "the wire's strings are the enums' raw values")
        XCTAssertEqual(Set((written["nodes"] as? [[String: Any]] ?? []).compactMap { $0["state"] as? String }), [BundleNodeState.complete.rawValue])

        for state in BundleNodeState.allCases {
            var json = try XCTUnwrap(JSONSerialization.jsonObject(with: original) as? [String: Any])
            var nodes = try XCTUnwrap(json["nodes"] as? [[String: Any]])
            nodes[0]["state"] = state.rawValue
            json["nodes"] = nodes
            json["mode"] = "lab"
            try JSONSerialization.data(withJSONObject: json).write(to: url)
            let report = try Analyser.analyse(tmp)
            XCTAssertEqual(report.charts.context.nodes["alpha"]?.state, state)
            XCTAssertEqual(report.charts.context.mode, .lab)
        }

        var json = try XCTUnwrap(JSONSerialization.jsonObject(with: original) as? [String: Any])
        var nodes = try XCTUnwrap(json["nodes"] as? [[String: Any]])
        nodes[1]["state"] = "gathered-ish\u{1b}[2J"
        json["nodes"] = nodes
        try JSONSerialization.data(withJSONObject: json).write(to: url)
        XCTAssertThrowsError(try Analyser.analyse(tmp)) { error in
            let text = "\(error)"
            XCTAssertTrue(text.hasPrefix("manifest.json: does not decode: nodes[1].state: "), text)
            XCTAssertTrue(text.contains("is not a node state (complete, partial, lost)"), text)
            XCTAssertFalse(text.contains("\u{1b}"), "the value is escaped: \(text)")
        }
        json = try XCTUnwrap(JSONSerialization.jsonObject(with: original) as? [String: Any])
        json["mode"] = "replay"
        try JSONSerialization.data(withJSONObject: json).write(to: url)
        XCTAssertThrowsError(try Analyser.analyse(tmp)) { error in
            XCTAssertEqual("\(error)", "manifest.json: does not decode: mode: \"replay\" is not a bundle mode (simulate, lab)")
        }
        XCTAssertThrowsError(try JSONDecoder().decode([BundleMode].self, from: Data("[\"replay\"]".utf8)), "LabPlan's Manifest decodes the same enum")
        XCTAssertEqual(try JSONDecoder().decode([BundleNodeState].self, from: Data("[\"complete\",\"partial\",\"lost\"]".utf8)), BundleNodeState.allCases)
    }
}
