import Foundation
import XCTest
import HeraldCore
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

/// SIGTERM, as systemd stops a unit, ends each service through swift-service-lifecycle's graceful
/// shutdown: what it holds is persisted, then it exits 0.
final class ServiceShutdownTests: XCTestCase {
    var lab: LabProcesses?
    override func tearDown() { lab?.stopAll(); lab = nil }

    /// Sends `signal` to the service `name` and waits (at most `seconds`) for it to exit.
    func stop(_ lab: LabProcesses, _ name: String, _ signal: Int32, seconds: TimeInterval = 15) throws -> Process {
        let p = try XCTUnwrap(lab.processes[name], "\(name) was started")
        kill(p.processIdentifier, signal)
        let deadline = Date().addingTimeInterval(seconds)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        XCTAssertFalse(p.isRunning, "\(name) still runs \(seconds) s after signal \(signal):\n\(lab.log(name).suffix(2000))")
        if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() }
        return p
    }

    func testSIGTERMMidRunPersistsTheAgentsRunWhichItResumesAndEveryServiceExitsZero() throws {
        let lab = try LabProcesses.make(agents: 2)
        self.lab = lab
        let id = try lab.submit(LabProcesses.plan("sigterm", nodes: 2, duration: "16s"))
        try lab.waitUntil(timeout: 20, "run running") { (lab.runRecord(id)?["state"] as? String) == "running" }
        let agent = try XCTUnwrap(lab.agent(of: "n1", in: id))
        try lab.waitForContacts(agent, run: id, moreThan: 5) // the sensors are writing
        let index = try XCTUnwrap(Int(agent.dropFirst(5)))
        let port = try XCTUnwrap(lab.ports[agent])

        let stopped = try stop(lab, agent, SIGTERM)
        XCTAssertEqual(stopped.terminationReason, .exit, lab.log(agent))
        XCTAssertEqual(stopped.terminationStatus, 0, "a graceful stop is a success:\n\(lab.log(agent).suffix(2000))")
        // The run it held is on disk as still running, to be resumed (not finished early, not lost).
        let state = lab.dir.appendingPathComponent("\(agent)/runs/\(id)/state.json")
        let persisted = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: state)) as? [String: Any])
        XCTAssertEqual(persisted["state"] as? String, "running", "\(persisted)")
        XCTAssertEqual(persisted["resumed"] as? Bool, true, "\(persisted)")

        Thread.sleep(forTimeInterval: 2) // down for 2 s of the run: the outage is the fault, not a wait
        try lab.startAgent(index, port: port)
        try lab.waitUntil(timeout: 60, "run complete") { (lab.runRecord(id)?["state"] as? String) == "complete" }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        XCTAssertEqual(m.nodes.first { $0.name == "n1" }?.state, BundleNodeState.partial, "the stopped node has a gap")
        XCTAssertEqual(m.nodes.first { $0.name == "n2" }?.state, BundleNodeState.complete)
        XCTAssertTrue(lab.log(agent).contains("resumed"), lab.log(agent))

        // The others: SIGTERM for an agent and the coordinator, SIGINT (Ctrl-C) for the air.
        let other = index == 1 ? "agent2" : "agent1"
        for (name, signal) in [(other, SIGTERM), ("coordinator", SIGTERM), ("air", SIGINT)] {
            let p = try stop(lab, name, signal)
            XCTAssertEqual(p.terminationReason, .exit, "\(name): \(lab.log(name).suffix(1000))")
            XCTAssertEqual(p.terminationStatus, 0, "\(name): \(lab.log(name).suffix(1000))")
        }
    }
}
