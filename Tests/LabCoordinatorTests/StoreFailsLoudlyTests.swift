import Foundation
import GRDB
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
}
