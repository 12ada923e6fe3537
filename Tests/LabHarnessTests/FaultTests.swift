import Foundation
import XCTest
import LabPlan
import HeraldCore
import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// Faults a lab meets, on loopback (the multi-host versions are in `make test-lab`).
final class FaultTests: XCTestCase {
    var lab: LabProcesses?
    override func tearDown() { lab?.stopAll(); lab = nil }

    func plan(_ name: String, nodes: Int, duration: String) -> String { LabProcesses.plan(name, nodes: nodes, duration: duration) }

    func nodeAgent(_ lab: LabProcesses, _ id: String, _ node: String) -> String {
        ((lab.runRecord(id)?["nodes"] as? [[String: Any]]) ?? []).first { $0["name"] as? String == node }?["agent"] as? String ?? ""
    }

    func rows(_ lab: LabProcesses, _ id: String, _ node: String) throws -> [Date] {
        let text = try String(contentsOf: lab.results.appendingPathComponent("\(id)/nodes/\(node)/contacts.csv"), encoding: .utf8)
        return text.split(separator: "\n").dropFirst().compactMap { HeraldTimestamp.parse(String($0.prefix(28))) }
    }

    func testAgentsBoundToAWildcardAddressAreCalledWhereTheyRegisteredFrom() throws {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        try lab.startAir()
        try lab.startCoordinator()
        for i in 1...2 {
            try lab.start("agent\(i)", ["agent", "--name", "agent\(i)", "--host", "0.0.0.0", "--token-file", lab.tokenFile.path,
                                        "--data", lab.dir.appendingPathComponent("agent\(i)").path, "--coordinator", lab.coordinatorURL])
        }
        try lab.waitUntil(timeout: 20, "agents registered") { (try? lab.aliveAgents()) == 2 }
        let id = try lab.submit(plan("wild", nodes: 2, duration: "6s"))
        try lab.waitUntil(timeout: 60, "run complete") { (lab.runRecord(id)?["state"] as? String) == "complete" }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        XCTAssertEqual(m.nodes.map(\.state), [.complete, .complete])
        for n in m.nodes {
            XCTAssertEqual(n.agent?.url.hasPrefix("http://127.0.0.1:"), true, "called at the registration's address, not 0.0.0.0: \(n.agent?.url ?? "")")
        }
        XCTAssertTrue(lab.log("coordinator").contains("it announced http://0.0.0.0:"), lab.log("coordinator"))
    }

    func testAPausedAgentLeavesAGapInsteadOfRowsWithWrongTimes() throws {
        let lab = try LabProcesses.make(agents: 3)
        self.lab = lab
        let id = try lab.submit(plan("pause", nodes: 3, duration: "24s"))
        try lab.waitUntil(timeout: 20, "run running") { (lab.runRecord(id)?["state"] as? String) == "running" }
        let agent = nodeAgent(lab, id, "n1")
        // Paused once n1 has logged for 5 s (the rate over the 4 s before the pause is compared
        // below), not after a fixed 6 s; then paused for 8 s: the pause is the fault, not a wait.
        try lab.waitForContacts(agent, run: id, spanning: 5)
        let pid = lab.processes[agent]!.processIdentifier
        kill(pid, SIGSTOP)
        let stoppedAt = Date()
        Thread.sleep(forTimeInterval: 8)
        kill(pid, SIGCONT)
        let continuedAt = Date()
        try lab.waitUntil(timeout: 60, "run complete") { ["complete", "failed"].contains(lab.runRecord(id)?["state"] as? String) }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        let n1 = try XCTUnwrap(m.nodes.first { $0.name == "n1" })
        XCTAssertEqual(n1.state, .partial, n1.message ?? "")
        let gap = try XCTUnwrap(n1.gaps?.first, "the pause is recorded")
        XCTAssertEqual(gap.from.timeIntervalSince1970, stoppedAt.timeIntervalSince1970, accuracy: 1.0)
        XCTAssertEqual(gap.to.timeIntervalSince1970, continuedAt.timeIntervalSince1970, accuracy: 1.0)
        XCTAssertTrue(gap.reason.contains("paused"), gap.reason)
        XCTAssertEqual(m.nodes.filter { $0.name != "n1" }.map(\.state), [.complete, .complete])
        let times = try rows(lab, id, "n1")
        let inside = times.filter { $0 > gap.from.addingTimeInterval(0.5) && $0 < gap.to.addingTimeInterval(-0.5) }
        XCTAssertEqual(inside.count, 0, "no row is stamped inside the pause")
        // Before the pause, n1 logged at some rate; the second after it must not carry a burst of replayed rows.
        let before = times.filter { $0 > gap.from.addingTimeInterval(-4) && $0 <= gap.from }.count
        let burst = times.filter { $0 >= gap.to && $0 < gap.to.addingTimeInterval(1) }.count
        XCTAssertGreaterThan(before, 0)
        XCTAssertLessThanOrEqual(Double(burst), Double(before) / 4 * 3 + 5, "rows in the second after SIGCONT (\(burst)) against \(before) in the 4 s before the pause")
        XCTAssertTrue(try String(contentsOf: lab.results.appendingPathComponent("\(id)/nodes/n1/log.txt"), encoding: .utf8).contains("gap in the logs"))
    }

    func testOneAgentNeverRunsTwoNodes() throws {
        let lab = try LabProcesses.make(agents: 1)
        self.lab = lab
        // A second name registered at the same URL is the same slot.
        let agentURL = "http://127.0.0.1:\(lab.ports["agent1"]!)"
        let twin = #"{"name":"twin","url":"\#(agentURL)","tags":[],"radio":"sim","version":"x","boot":"twin-boot-1","sequence":1}"#
        XCTAssertEqual(lab.call("POST", "/v1/agents/register", body: Data(twin.utf8)).0, 200)
        let (s, d) = lab.call("POST", "/v1/runs", body: Data(plan("two", nodes: 2, duration: "5s").utf8))
        XCTAssertEqual(s, 409, String(decoding: d, as: UTF8.self))
        XCTAssertTrue(String(decoding: d, as: UTF8.self).contains("only 1 are alive and free"), String(decoding: d, as: UTF8.self))
        // The agent itself refuses a second node of a run it holds.
        let p = try Plan.parse(yaml: plan("two", nodes: 2, duration: "5s"), source: "two")
        let c = LabClient(base: URL(string: agentURL)!, token: lab.token, timeout: 5)
        func arm(_ node: NodeSpec) -> Int {
            let body = try! LabJSON.encoder.encode(LabWire.ArmRequest(assignment: NodeAssignment(runId: "two-1", plan: p, node: node), air: LabWire.AirAddress(host: "127.0.0.1", port: UInt16(lab.airAddress.split(separator: ":")[1])!)))
            let box = ResultBox<Int>(), sem = DispatchSemaphore(value: 0)
            Task { box.value = (try? await c.request("POST", "/v1/arm", body: body))?.0; sem.signal() }
            sem.wait()
            return box.value ?? 0
        }
        XCTAssertEqual(arm(p.nodes[0]), 200)
        XCTAssertEqual(arm(p.nodes[0]), 200, "the same assignment again is fine")
        XCTAssertEqual(arm(p.nodes[1]), 409, "another node of the same run is refused")
    }

    func testARadioThatCannotStartFailsTheRunAtOnceAndReleasesTheAgents() throws {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        // No air on the coordinator; one agent points at a port nothing listens on.
        try lab.start("coordinator", ["coordinator", "--token-file", lab.tokenFile.path, "--results", lab.results.path])
        try lab.start("agent1", ["agent", "--name", "agent1", "--token-file", lab.tokenFile.path, "--data", lab.dir.appendingPathComponent("agent1").path,
                                 "--coordinator", lab.coordinatorURL, "--air", "127.0.0.1:1"])
        try lab.start("agent2", ["agent", "--name", "agent2", "--token-file", lab.tokenFile.path, "--data", lab.dir.appendingPathComponent("agent2").path,
                                 "--coordinator", lab.coordinatorURL, "--air", "127.0.0.1:1"])
        try lab.waitUntil(timeout: 20, "agents registered") { (try? lab.aliveAgents()) == 2 }
        let planFile = lab.dir.appendingPathComponent("noradio.yaml")
        try plan("noradio", nodes: 2, duration: "10m").write(to: planFile, atomically: true, encoding: .utf8)
        let started = Date()
        let (code, output) = try lab.cli(["run", planFile.path, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertLessThan(Date().timeIntervalSince(started), 30, "fails at arming, not after the plan's 10 minutes")
        XCTAssertTrue(output.contains("cannot start its radio"), output)
        for i in 1...2 {
            let s = LabClientSync(url: "http://127.0.0.1:\(lab.ports["agent\(i)"]!)", token: lab.token)
            XCTAssertEqual(s.status("GET", "/v1/runs"), 200)
        }
        let runs = try FileManager.default.contentsOfDirectory(atPath: lab.dir.appendingPathComponent("agent1/runs").path)
        XCTAssertEqual(runs, [], "nothing armed is left on the agent")
    }

    func testNodesReattachToTheAirAfterItWasGoneAndRecordTheGap() throws {
        let lab = try LabProcesses.make(agents: 2)
        self.lab = lab
        let id = try lab.submit(plan("airgone", nodes: 2, duration: "30s"))
        try lab.waitUntil(timeout: 20, "run running") { (lab.runRecord(id)?["state"] as? String) == "running" }
        // The air is killed once both nodes log (not after a fixed 6 s), and stays away for 6 s:
        // the outage is the fault, not a wait.
        for n in ["n1", "n2"] { try lab.waitForContacts(nodeAgent(lab, id, n), run: id, moreThan: 10) }
        let airPort = lab.ports["air"]!
        lab.kill9("air")
        let killedAt = Date()
        Thread.sleep(forTimeInterval: 6)
        try lab.start("air", ["air", "--token-file", lab.tokenFile.path], port: airPort)
        let restartedAt = Date()
        try lab.waitUntil(timeout: 60, "run complete") { ["complete", "failed"].contains(lab.runRecord(id)?["state"] as? String) }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        for n in m.nodes {
            XCTAssertEqual(n.state, .partial, "\(n.name): \(n.message ?? "")")
            let gap = try XCTUnwrap(n.gaps?.first { $0.reason.contains("air") }, "\(n.name) records the lost air")
            XCTAssertEqual(gap.from.timeIntervalSince1970, killedAt.timeIntervalSince1970, accuracy: 1.5)
            XCTAssertGreaterThanOrEqual(gap.to.timeIntervalSince1970, restartedAt.timeIntervalSince1970 - 0.5)
            let times = try rows(lab, id, n.name)
            XCTAssertGreaterThan(times.filter { $0 > gap.to.addingTimeInterval(1) }.count, 5, "\(n.name) logs again once reattached")
            XCTAssertEqual(times.filter { $0 > gap.from.addingTimeInterval(0.5) && $0 < gap.to.addingTimeInterval(-0.5) }.count, 0, "no rows while the air was gone")
            let log = try String(contentsOf: lab.results.appendingPathComponent("\(id)/nodes/\(n.name)/log.txt"), encoding: .utf8)
            XCTAssertTrue(log.contains("radio lost") && log.contains("radio back"), log.suffix(2000).description)
        }
    }

    func testAbortStopsTheNodesAndGathersWhatTheyLogged() throws {
        let lab = try LabProcesses.make(agents: 2)
        self.lab = lab
        let id = try lab.submit(plan("abort", nodes: 2, duration: "10m"))
        try lab.waitUntil(timeout: 20, "run running") { (lab.runRecord(id)?["state"] as? String) == "running" }
        // Aborted once both nodes have logged more than 5 contacts (what the bundle must hold).
        for n in ["n1", "n2"] { try lab.waitForContacts(nodeAgent(lab, id, n), run: id, moreThan: 5) }
        let (code, output) = try lab.cli(["runs", "abort", id, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(code, 0, output)
        let abortedAt = Date()
        try lab.waitUntil(timeout: 60, "run aborted") { (lab.runRecord(id)?["state"] as? String) == "aborted" }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        XCTAssertEqual(m.nodes.map(\.state), [.partial, .partial], "stopped early: partial")
        XCTAssertTrue(m.nodes.allSatisfy { $0.message?.contains("stopped before the planned end") == true })
        // Issue 40: an aborted run has no verdict (not the FAIL of its short logs).
        XCTAssertEqual(m.aborted, true, "the manifest says it was aborted")
        XCTAssertFalse(lab.runRecord(id)?["passed"] is Bool, "no verdict: \(lab.runRecord(id) ?? [:])")
        XCTAssertTrue((lab.runRecord(id)?["headline"] as? String)?.contains("verdict: none (the run was aborted") == true, "\(lab.runRecord(id) ?? [:])")
        for n in m.nodes {
            let times = try rows(lab, id, n.name)
            XCTAssertGreaterThan(times.count, 5, "what was logged is in the bundle")
            XCTAssertLessThan(times.max()!.timeIntervalSince1970, abortedAt.timeIntervalSince1970 + 3, "nothing after the abort")
        }
        // Releases follow the run's recorded end (nothing is deleted before that is durable).
        for i in 1...2 {
            let runs = lab.dir.appendingPathComponent("agent\(i)/runs")
            try lab.waitUntil(timeout: 10, "agent\(i) released its copy once gathered") { ((try? FileManager.default.contentsOfDirectory(atPath: runs.path)) ?? ["?"]).isEmpty }
        }
        let (listCode, list) = try lab.cli(["runs", "list", "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(listCode, 0)
        XCTAssertTrue(list.contains("\(id)  aborted"), list)
        let (agentsCode, agents) = try lab.cli(["agents", "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path])
        XCTAssertEqual(agentsCode, 0)
        XCTAssertTrue(agents.contains("agent1") && agents.contains("alive") && agents.contains("http://127.0.0.1:"), agents)
    }
}
