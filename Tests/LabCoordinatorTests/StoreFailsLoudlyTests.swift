import Foundation
import GRDB
import LabPlan
import XCTest
@testable import LabCoordinator

/// A row the coordinator cannot read back is a named error, never a run or an agent that silently
/// vanishes from the listings (and is then never resumed).
final class StoreFailsLoudlyTests: XCTestCase {
    func store(_ name: String, damage sql: String) throws -> (URL, CoordinatorStore) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("store-\(UUID().uuidString)")
        let url = dir.appendingPathComponent("coordinator.sqlite")
        _ = try CoordinatorStore(url: url) // the schema, migrated
        let raw = try DatabaseQueue(path: url.path)
        try raw.write { try $0.execute(sql: sql) }
        try raw.close()
        return (dir, try CoordinatorStore(url: url))
    }

    func testARunThatDoesNotDecodeIsNamed() throws {
        let (dir, s) = try store("run", damage: "INSERT INTO run(id, state, created, record) VALUES ('night-42', 'complete', 1, '{\"id\": 5}')")
        defer { try? FileManager.default.removeItem(at: dir) }
        XCTAssertThrowsError(try s.runs()) { error in
            XCTAssertTrue("\(error)".hasPrefix("coordinator.sqlite: run \"night-42\" does not decode"), "\(error)")
        }
        // The coordinator refuses to start on it rather than forget the run.
        var config = Coordinator.Config(results: dir)
        config.insecure = true
        XCTAssertThrowsError(try Coordinator(config: config)) { error in
            XCTAssertTrue("\(error)".contains("run \"night-42\" does not decode"), "\(error)")
        }
    }

    func testAnAgentThatDoesNotDecodeIsNamed() throws {
        let (dir, s) = try store("agent", damage: "INSERT INTO agent(name, info, lastSeen) VALUES ('n1', 'not json', 0)")
        defer { try? FileManager.default.removeItem(at: dir) }
        XCTAssertThrowsError(try s.agents()) { error in
            XCTAssertTrue("\(error)".hasPrefix("coordinator.sqlite: agent \"n1\" does not decode"), "\(error)")
        }
    }

    /// Node states are an enum whose raw values are the strings stored and sent before: a stored
    /// run from before decodes to the same states, and a state outside them is named, not guessed.
    func testNodeStatesKeepTheirStringsAndAnUnknownOneIsNamed() throws {
        let node = { (state: String) in
            "{\"name\": \"n1\", \"agent\": \"a1\", \"agentURL\": \"http://127.0.0.1:1\", \"state\": \"\(state)\", \"files\": []}"
        }
        let record = { (state: String) in
            "{\"id\": \"night-43\", \"plan\": \"p\", \"planText\": \"\", \"state\": \"complete\", \"created\": 1, \"duration\": 60, \"warmup\": 0, \"nodes\": [\(node(state))]}"
        }
        for state in ["selected", "idle", "armed", "running", "finished", "failed", "complete", "partial", "lost"] {
            let r = try JSONDecoder().decode(RunRecord.self, from: Data(record(state).utf8))
            XCTAssertEqual(r.nodes.first?.state.rawValue, state)
            let again = try JSONEncoder().encode(r.nodes[0])
            XCTAssertTrue(String(decoding: again, as: UTF8.self).contains("\"state\":\"\(state)\""), "the wire keeps the string")
        }
        XCTAssertEqual(RunRecord.NodeState.allCases.map(\.manifestState.rawValue),
                       ["lost", "lost", "lost", "lost", "lost", "lost", "complete", "partial", "lost"])
        let bad = record("gathered-ish").replacingOccurrences(of: "'", with: "''")
        let (dir, s) = try store("run", damage: "INSERT INTO run(id, state, created, record) VALUES ('night-43', 'complete', 1, '\(bad)')")
        defer { try? FileManager.default.removeItem(at: dir) }
        XCTAssertThrowsError(try s.runs()) { error in
            XCTAssertTrue("\(error)".hasPrefix("coordinator.sqlite: run \"night-43\" does not decode"), "\(error)")
            XCTAssertTrue("\(error)".contains("gathered-ish"), "the value is named: \(error)")
        }
    }

    /// A dongle's history kinds and a node's recovery actions keep their strings on the wire and
    /// in stored rows; one outside them does not decode.
    func testDongleEventKindsAndRecoveryActionsKeepTheirStrings() throws {
        for kind in ["registered", "moved", "check", "preflight", "run", "recovery", "health"] {
            let e = try JSONDecoder().decode(LabWire.DongleEvent.self, from: Data("{\"kind\": \"\(kind)\", \"at\": 1, \"ok\": true, \"message\": \"m\"}".utf8))
            XCTAssertEqual(e.kind.rawValue, kind)
        }
        XCTAssertThrowsError(try JSONDecoder().decode(LabWire.DongleEvent.self, from: Data("{\"kind\": \"reboot\", \"at\": 1, \"ok\": true, \"message\": \"m\"}".utf8)))
        for action in ["power-cycle", "usb-reset"] {
            let r = try JSONDecoder().decode(LabWire.Recovery.self, from: Data("{\"at\": 1, \"action\": \"\(action)\", \"ok\": true, \"reason\": \"r\"}".utf8))
            XCTAssertEqual(r.action.rawValue, action)
            XCTAssertTrue(String(decoding: try JSONEncoder().encode(r), as: UTF8.self).contains("\"action\":\"\(action)\""))
        }
        XCTAssertThrowsError(try JSONDecoder().decode(LabWire.Recovery.self, from: Data("{\"at\": 1, \"action\": \"replug\", \"ok\": true, \"reason\": \"r\"}".utf8)))
    }
}
