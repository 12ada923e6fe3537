import Foundation
import XCTest
import HeraldCore
import LabLink
import LabNet
import LabPlan
import LabTestSupport
import RadioAir
import RadioSim
import HeraldRadio
import LabNode
@testable import LabAgent
@testable import LabCoordinator

/// The coordinator's rules against real agents, in memory (issue 22): the coordinator reaches
/// each `Agent` through `LocalAgentLink` and each agent heartbeats through `LocalCoordinatorLink`;
/// no HTTP, no sockets between them. The agents' radios are simulated on an air, as in the other
/// harness tests. `FaultyLink` sits in front of an agent's link to skew its clock, turn its air
/// address into a dead one, corrupt what a fetch writes, or make it vanish, and records what the
/// coordinator asked.
final class InMemoryLabTests: XCTestCase {
    var lab: MemoryLab?
    override func tearDown() async throws { await lab?.stop(); lab = nil }

    func plan(_ name: String, nodes: Int, duration: String = "4s") -> String { MemoryLab.plan(name, nodes: nodes, duration: duration) }

    func testAllNodesArmStartAtOneInstantAndAreGatheredWithTheirChecksums() async throws {
        // agent2's clock runs 5 s ahead: its heartbeats say so, and its start comes in its own clock.
        let lab = try await MemoryLab.make(agents: 3, skews: ["agent2": 5], virtual: true)
        self.lab = lab
        let r = try await lab.runToEnd(plan("barrier", nodes: 3))
        XCTAssertEqual(r.state, .complete, r.message ?? "")
        XCTAssertEqual(r.nodes.map(\.state), [.complete, .complete, .complete], "\(r.nodes.map { $0.message ?? "" })")
        let startAt = try XCTUnwrap(r.startAt)
        for n in r.nodes {
            let link = lab.links[n.agent]!
            XCTAssertEqual(link.arms, 1, "\(n.agent) armed once")
            let sent = try XCTUnwrap(link.starts.first, "\(n.agent) got a start")
            XCTAssertEqual(sent.runId, r.id)
            let offset = try XCTUnwrap(n.clockBefore?.offset)
            XCTAssertEqual(sent.startAt, startAt + offset, accuracy: 1e-9, "one instant, in \(n.agent)'s clock")
            XCTAssertEqual(offset, n.agent == "agent2" ? 5 : 0, accuracy: 0.001, "\(n.agent)'s measured offset")
            XCTAssertEqual(link.probes, 0, "\(n.agent)'s clock came from its heartbeats: no probe")
        }
        // Gathered: every file on disk as the manifest lists it, and the agents released their copies.
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(r.id)/manifest.json"))
        for n in m.nodes {
            XCTAssertEqual(n.files.keys.sorted(), ["battery.csv", "contacts.csv", "detection.csv", "log.txt", "statistics.csv"])
            for (name, entry) in n.files {
                let (sha, bytes) = try SHA256.hash(fileAt: lab.results.appendingPathComponent("\(r.id)/nodes/\(n.name)/\(name)"))
                XCTAssertEqual(sha, entry.sha256, "\(n.name)/\(name)")
                XCTAssertEqual(bytes, entry.bytes, "\(n.name)/\(name)")
            }
        }
        // Releases follow the run's recorded end.
        _ = try await lab.waitFor("every agent to release its copy", timeout: 10) { lab.agents.values.allSatisfy { $0.status.held == [] } ? true : nil }
    }

    /// Issue 39 item 5: coordinator, agents and their radios in one process on one virtual time.
    /// A two-minute plan of three nodes is armed, started at one instant, run with the nodes
    /// hearing each other on one simulated medium, and gathered, with the same rules as over
    /// HTTP; it takes the time its work takes, not two minutes (printed; speed is not asserted).
    func testATwoMinutePlanRunsInVirtualTimeFromArmingToGathering() async throws {
        let began = Date()
        let lab = try await MemoryLab.make(agents: 3, virtual: true, heartbeatInterval: 1)
        self.lab = lab
        let time = try XCTUnwrap(lab.time)
        let from = time.seconds
        let r = try await lab.runToEnd(plan("virtual", nodes: 3, duration: "2m"), timeout: 900)
        XCTAssertEqual(r.state, .complete, r.message ?? "")
        XCTAssertEqual(r.nodes.map(\.state), [.complete, .complete, .complete], "\(r.nodes.map { $0.message ?? "" })")
        let startAt = try XCTUnwrap(r.startAt)
        XCTAssertGreaterThanOrEqual(time.seconds - from, 120, "two minutes of virtual time went by")
        for n in r.nodes {
            let link = lab.links[n.agent]!
            XCTAssertEqual(link.arms, 1, "\(n.agent) armed once")
            XCTAssertEqual(try XCTUnwrap(link.starts.first, "\(n.agent) got a start").startAt, startAt, accuracy: 1e-9, "one instant")
            XCTAssertEqual(try XCTUnwrap(n.startedAt), startAt, accuracy: 1e-9, "\(n.agent) started at the instant, in virtual time")
        }
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(r.id)/manifest.json"))
        XCTAssertEqual(m.nodes.map(\.name), ["n1", "n2", "n3"])
        for n in m.nodes {
            XCTAssertEqual(n.files.keys.sorted(), ["battery.csv", "contacts.csv", "detection.csv", "log.txt", "statistics.csv"], n.name)
            for (name, entry) in n.files {
                let (sha, bytes) = try SHA256.hash(fileAt: lab.results.appendingPathComponent("\(r.id)/nodes/\(n.name)/\(name)"))
                XCTAssertEqual(sha, entry.sha256, "\(n.name)/\(name)")
                XCTAssertEqual(bytes, entry.bytes, "\(n.name)/\(name)")
            }
            // The nodes heard each other on the shared medium: RSSI rows in each contacts.csv.
            let contacts = try String(contentsOf: lab.results.appendingPathComponent("\(r.id)/nodes/\(n.name)/contacts.csv"), encoding: .utf8)
            XCTAssertGreaterThan(contacts.split(separator: "\n").count, 10, "\(n.name) logged its peers")
        }
        print("virtual-time lab: a 2-minute plan of 3 nodes, armed to gathered, in \(String(format: "%.2f", Date().timeIntervalSince(began))) s of test time")
    }

    func testAnAgentWhoseHeartbeatsCarryNoClockIsProbedAndOneWhoseClockSteppedToo() async throws {
        // agent1's coordinator stamps never reach it (as with a coordinator from before heartbeat
        // clocks): no samples. agent2's clock steps 2 s ahead after the lab is up: its samples
        // from before and after the step contradict each other, so they are not used. agent3's
        // heartbeats suffice. The two probed get their offsets from the probes.
        let lab = try await MemoryLab.make(agents: 3, skews: ["agent1": 3], stampless: ["agent1"], virtual: true)
        self.lab = lab
        XCTAssertNil(lab.coordinator.registry.heartbeatClock(agent: "agent1", url: MemoryLab.url("agent1")))
        lab.links["agent2"]!.clockSkew = 2
        _ = try await lab.waitFor("agent2's samples after its step", timeout: 20) {
            lab.coordinator.registry.withRecords { s in s["agent2"]!.clocks.contains { abs($0.sample.offset - 2) < 0.001 } } ? true : nil
        }
        XCTAssertNil(lab.coordinator.registry.heartbeatClock(agent: "agent2", url: MemoryLab.url("agent2")), "samples across the step do not agree")
        let r = try await lab.runToEnd(plan("probed", nodes: 3))
        XCTAssertEqual(r.state, .complete, r.message ?? "")
        for n in r.nodes {
            let link = lab.links[n.agent]!
            XCTAssertEqual(try XCTUnwrap(n.clockBefore?.offset), ["agent1": 3, "agent2": 2, "agent3": 0][n.agent]!, accuracy: 0.001, n.agent)
            if n.agent == "agent3" { XCTAssertEqual(link.probes, 0, n.agent) } else { XCTAssertGreaterThan(link.probes, 0, n.agent) }
        }
    }

    func testAnAgentThatRefusesArmingFailsTheRunOnceAndTheArmedOnesAreReleased() async throws {
        let lab = try await MemoryLab.make(agents: 3)
        self.lab = lab
        // agent3 is told of an air where nothing listens: its radio cannot start, it refuses (422).
        lab.links["agent3"]!.deadAir = true
        let r = try await lab.runToEnd(plan("refused", nodes: 3))
        XCTAssertEqual(r.state, .failed)
        let message = r.message ?? ""
        XCTAssertTrue(message.hasPrefix("arming failed: agent agent3"), message)
        XCTAssertTrue(message.contains("HTTP 422: agent agent3 cannot start its radio"), message)
        XCTAssertFalse(message.contains("agent agent1") || message.contains("agent agent2"), message)
        XCTAssertEqual(lab.links["agent3"]!.arms, 1, "a refusal is not retried")
        XCTAssertNil(r.startAt, "no start was given")
        XCTAssertTrue(lab.links.values.allSatisfy { $0.starts.isEmpty })
        // The run is recorded as failed first, then the armed ones are told to release.
        _ = try await lab.waitFor("every agent idle, holding nothing", timeout: 10) {
            lab.agents.values.allSatisfy { $0.status.held == [] && $0.status.state == .idle } ? true : nil
        }
    }

    func testAFileWhoseBytesDoNotMatchIsFetchedAgainAndOneThatNeverMatchesLosesTheNode() async throws {
        let lab = try await MemoryLab.make(agents: 2, gatherPatience: 3, virtual: true)
        self.lab = lab
        lab.links["agent1"]!.corrupt = ["contacts.csv": 1]       // the first fetch is damaged
        lab.links["agent2"]!.corrupt = ["log.txt": Int.max]      // every fetch is damaged
        let r = try await lab.runToEnd(plan("checksums", nodes: 2))
        let byAgent = Dictionary(uniqueKeysWithValues: r.nodes.map { ($0.agent, $0) })
        XCTAssertEqual(byAgent["agent1"]?.state, .complete, byAgent["agent1"]?.message ?? "")
        XCTAssertEqual(lab.links["agent1"]!.fetches.filter { $0 == "contacts.csv" }.count, 2, "fetched again after the mismatch")
        let n1 = try XCTUnwrap(byAgent["agent1"])
        let contacts = lab.results.appendingPathComponent("\(r.id)/nodes/\(n1.name)/contacts.csv")
        XCTAssertEqual(try SHA256.hash(fileAt: contacts).sha256, n1.files.first { $0.name == "contacts.csv" }?.sha256)
        let n2 = try XCTUnwrap(byAgent["agent2"])
        XCTAssertEqual(n2.state, .lost)
        XCTAssertTrue(n2.message?.contains("log.txt: checksum mismatch") == true, n2.message ?? "")
        XCTAssertGreaterThan(lab.links["agent2"]!.fetches.filter { $0 == "log.txt" }.count, 1, "retried within the patience")
        XCTAssertFalse(FileManager.default.fileExists(atPath: lab.results.appendingPathComponent("\(r.id)/nodes/\(n2.name)/log.txt").path),
                       "a file that never matched gets no name")
        XCTAssertEqual(r.state, .failed)
        XCTAssertTrue(r.message?.contains("lost: \(n2.name)") == true, r.message ?? "")
        _ = try await lab.waitFor("the gathered node's release", timeout: 10) { lab.agents["agent1"]!.status.held == [] ? true : nil }
        XCTAssertEqual(lab.agents["agent2"]!.status.held, [r.id], "the lost node's agent keeps its copy")
    }

    /// An agent whose clock turns absurd once its run has started (its heartbeat stamps and its
    /// probe answers 5e10 s off, issue 36): those samples are unusable, so the run is gathered with
    /// the clocks measured while they were sane, completes, and the coordinator's metrics render.
    func testAnAgentWhoseClockTurnsAbsurdMidRunIsGatheredWithItsClockFromArming() async throws {
        let lab = try await MemoryLab.make(agents: 2, virtual: true)
        self.lab = lab
        let id = try lab.coordinator.submit(planText: plan("absurd", nodes: 2), source: "absurd").id
        // Its node running on its agent: the start was taken before the clock turns (a start
        // still in flight would be sent 5e10 s early, another test's matter).
        let running = try await lab.waitFor("the run running on every agent", timeout: 30) {
            lab.coordinator.run(id).flatMap { r in r.state == .running && r.nodes.allSatisfy { lab.agents[$0.agent]?.status.state == .running } ? r : nil }
        }
        let hostile = try XCTUnwrap(running.nodes.first?.agent)
        lab.links[hostile]!.clockSkew = 5e10
        let r = try await lab.waitFor("the run's end", timeout: 60) { lab.coordinator.run(id).flatMap { $0.state.isFinal ? $0 : nil } }
        XCTAssertEqual(r.state, .complete, r.message ?? "")
        let node = try XCTUnwrap(r.nodes.first { $0.agent == hostile })
        // After the run its clock is either none or what its earlier, sane heartbeats said: the
        // absurd stamps made no sample at all.
        XCTAssertLessThan(abs(node.clockAfter?.offset ?? 0), 0.01, "\(String(describing: node.clockAfter))")
        XCTAssertEqual(try XCTUnwrap(node.clockBefore).offset, 0, accuracy: 0.01)
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(r.id)/manifest.json"))
        XCTAssertTrue(m.nodes.allSatisfy { abs($0.clockOffset) < 1 }, "\(m.nodes.map(\.clockOffset))")
        lab.coordinator.collectMetrics()
        XCTAssertTrue(String(decoding: lab.coordinator.metrics.metrics.exposition(), as: UTF8.self).contains("heraldlab_run_start_delay_seconds"))
    }

    func testAPausedAgentIsPartialAndAnAgentThatVanishesMidRunIsLost() async throws {
        let lab = try await MemoryLab.make(agents: 3, gatherPatience: 2, virtual: true)
        self.lab = lab
        let id = try lab.coordinator.submit(planText: plan("gaps", nodes: 3, duration: "6s"), source: "gaps").id
        // Every node has run 2.5 s: a 2 s pause lies wholly within the run.
        let running = try await lab.waitFor("the nodes 2.5 s into the run", timeout: 30) {
            lab.agents.values.allSatisfy { a in
                let s = a.status
                return s.state == .running && (s.startedAt ?? .infinity) <= lab.now - 2.5
            } ? lab.coordinator.run(id) : nil
        }
        let agentOf = Dictionary(uniqueKeysWithValues: running.nodes.map { ($0.name, $0.agent) })
        // n1's agent process pauses for 2 s (as its stall watchdog reports it); n2's agent vanishes.
        let paused = lab.agents[agentOf["n1"]!]!
        let t = lab.now
        paused.scheduler.sync { paused.lifecycle.stalled(from: t - 2, to: t) }
        lab.links[agentOf["n2"]!]!.vanished = true
        await lab.agents[agentOf["n2"]!]!.stop()
        let r = try await lab.waitFor("the run's end", timeout: 60) { lab.coordinator.run(id).flatMap { $0.state.isFinal ? $0 : nil } }
        let byName = Dictionary(uniqueKeysWithValues: r.nodes.map { ($0.name, $0) })
        XCTAssertEqual(byName["n1"]?.state, .partial)
        XCTAssertTrue(byName["n1"]?.message?.contains("1 gap(s) in the logs: 2.0 s (agent process paused for 2.0 s)") == true, byName["n1"]?.message ?? "")
        XCTAssertEqual(byName["n1"]?.gaps?.count, 1)
        XCTAssertEqual(byName["n2"]?.state, .lost)
        XCTAssertTrue(byName["n2"]?.message?.contains("connection refused") == true, byName["n2"]?.message ?? "")
        XCTAssertEqual(byName["n3"]?.state, .complete, byName["n3"]?.message ?? "")
        XCTAssertEqual(r.state, .failed)
        XCTAssertTrue(r.message?.contains("lost: n2 (") == true, r.message ?? "")
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(id)/manifest.json"))
        XCTAssertEqual(m.nodes.map(\.state), [.partial, .lost, .complete])
        XCTAssertEqual(m.nodes.first?.gaps?.count, 1)
    }
}

/// A lab in one process: a coordinator and agents that reach each other through the in-memory
/// links, their nodes' radios simulated. On the wall clock (`make`), the radios are on an air
/// (AirServer over loopback TCP), as in the other harness tests. In virtual time
/// (`make(virtual: true)`), one `VirtualTime` is the coordinator's and every agent's clock and the
/// executor of every node, whose radios share one in-process `SimMedium` per run: a run of minutes
/// takes the time its work takes, and `waitFor` drives the time (settle, check, step).
final class MemoryLab: @unchecked Sendable {
    let dir: URL
    let air: AirServer?
    let time: VirtualTime?
    let coordinator: Coordinator
    private(set) var agents: [String: Agent] = [:]
    /// Each agent's link as the coordinator holds it, by agent name.
    private(set) var links: [String: FaultyLink] = [:]
    var results: URL { coordinator.config.results }
    /// The lab's time: virtual, or the wall clock's.
    var now: Double { time?.seconds ?? Date().timeIntervalSince1970 }

    private init(dir: URL, air: AirServer?, time: VirtualTime?, coordinator: Coordinator) {
        self.dir = dir; self.air = air; self.time = time; self.coordinator = coordinator
    }

    static func url(_ agent: String) -> String { "http://\(agent).in-memory:8701" }

    /// A plan of `nodes` nodes in a row, with a 1-s warm-up.
    static func plan(_ name: String, nodes: Int, duration: String = "4s") -> String {
        var text = "name: \(name)\nduration: \(duration)\nwarmup: 1s\nnodes:\n"
        for i in 0..<nodes { text += "  - {name: n\(i + 1), position: [\(i), 0]}\n" }
        return text
    }

    /// `skews`: how far ahead of the coordinator's each agent's clock runs (its heartbeats' stamps,
    /// probes and starts, as `FaultyLink.clockSkew`); `stampless`: agents whose heartbeat answers
    /// lose the coordinator's stamps. `virtual`: in virtual time, its radios on one medium; the
    /// timeouts of `waitFor` are then virtual seconds. Returns once every other agent's heartbeats
    /// give its clock.
    static func make(agents count: Int, gatherPatience: Double = 10, skews: [String: Double] = [:], stampless: Set<String> = [],
                     virtual: Bool = false, heartbeatInterval: Double = 0.2) async throws -> MemoryLab {
        // A plain lab: a lab CA another test of this process left trusted would make the agents
        // dial the air with TLS.
        LabTrust.forget()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("memorylab-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var config = Coordinator.Config(results: dir.appendingPathComponent("results"))
        let air: AirServer?, time: VirtualTime?
        if virtual {
            air = nil
            // A whole second, so that the logs' instants read alike in every run of the test.
            let t = VirtualTime(start: Date().timeIntervalSince1970.rounded(.down))
            time = t
            config.clock = t.clock
        } else {
            let server = AirServer(token: "air-secret", logger: LogCapture.quiet())
            config.air = LabWire.AirAddress(host: "127.0.0.1", port: try server.start(host: "127.0.0.1", port: 0))
            air = server
            time = nil
        }
        config.gatherPatience = gatherPatience
        config.missingAfter = 30
        let board = LinkBoard(time: time)
        config.agentLinks = { board.link($0.url.absoluteString) }
        let coordinator = try Coordinator(config: config, logger: LogCapture.quiet())
        coordinator.startUnserved()
        let lab = MemoryLab(dir: dir, air: air, time: time, coordinator: coordinator)
        let media = time.map(SharedMedia.init)
        for i in 1...count {
            let name = "agent\(i)"
            var c = Agent.Config(name: name, dataDirectory: dir.appendingPathComponent(name))
            c.token = "air-secret"
            c.heartbeatInterval = heartbeatInterval
            if let time, let media {
                c.clock = time.clock
                c.scheduler = time
                c.makeRadio = { try media.radio(for: $0) }
                // A pause of the test process is no pause of virtual time.
                c.stallThreshold = .infinity
            }
            let link = FaultyLink(nil, deadAirPort: try Self.closedPort())
            link.clockSkew = skews[name] ?? 0
            let agent = Agent(config: c, logger: LogCapture.quiet(),
                              coordinatorLink: SkewedCoordinatorLink(LocalCoordinatorLink(coordinator, agent: name), clock: link, stampless: stampless.contains(name), time: time))
            try await agent.startUnserved(url: url(name))
            link.inner = LocalAgentLink(agent)
            board.set(url(name), link)
            lab.agents[name] = agent
            lab.links[name] = link
        }
        _ = try await lab.waitFor("\(count) agents registered", timeout: 20) {
            coordinator.agentViews.filter { $0.state == .alive && $0.status != nil }.count == count ? true : nil
        }
        // Which way a clock is taken at arming depends on whether the heartbeats suffice yet:
        // the tests wait for that, not for a guessed time.
        _ = try await lab.waitFor("every agent's clock from its heartbeats", timeout: 20) {
            (1...count).map { "agent\($0)" }.allSatisfy { stampless.contains($0) || coordinator.registry.heartbeatClock(agent: $0, url: url($0)) != nil } ? true : nil
        }
        return lab
    }

    /// A loopback port where nothing listens (bound, then closed).
    static func closedPort() throws -> UInt16 {
        let probe = AirServer(token: "x", logger: LogCapture.quiet())
        let port = try probe.start(host: "127.0.0.1", port: 0)
        probe.stop()
        return port
    }

    /// Submits `plan` and waits for the run's end.
    func runToEnd(_ plan: String, timeout: Double = 60) async throws -> RunRecord {
        let id = try coordinator.submit(planText: plan, source: "plan").id
        return try await waitFor("run \(id) to end", timeout: timeout) { self.coordinator.run(id).flatMap { $0.state.isFinal ? $0 : nil } }
    }

    /// Polls `value` until it is not nil (a condition, not a tuned sleep); fails after `timeout`.
    /// In virtual time it drives the time: once the lab is quiescent, `value` is looked at, then
    /// time moves to the next instant something waits for (never past the timeout, in virtual
    /// seconds).
    func waitFor<T>(_ what: String, timeout: Double, _ value: () -> T?) async throws -> T {
        if let time {
            let deadline = time.seconds + timeout
            while true {
                await time.settle()
                if let v = value() { return v }
                guard time.seconds < deadline else { break }
                time.step(notPast: deadline)
            }
            throw TimedOut(what: what, seconds: timeout)
        }
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let v = value() { return v }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        throw TimedOut(what: what, seconds: timeout)
    }

    struct TimedOut: Error, CustomStringConvertible {
        var what: String, seconds: Double
        var description: String { "waited \(Int(seconds)) s for \(what)" }
    }

    func stop() async {
        await coordinator.stop()
        for a in agents.values { await a.stop() }
        time?.cancelSleepers()
        air?.stop()
        try? FileManager.default.removeItem(at: dir)
    }
}

/// The simulated media of a virtual-time lab, one per run, made on the lab's executor when the
/// run's first node attaches its radio; the nodes of every agent share it, in virtual time.
// Invariant (unchecked Sendable): `media` and the media in it are touched only on the virtual
// time's executor (`radio(for:)` is called by an agent's `begin`, on it; it checks).
final class SharedMedia: @unchecked Sendable {
    private let time: VirtualTime
    private var media: [String: SimMedium] = [:]
    init(_ time: VirtualTime) { self.time = time }

    func radio(for a: NodeAssignment) throws -> NodeRadio {
        time.assertOnExecutor()
        let medium: SimMedium
        if let m = media[a.runId] { medium = m } else {
            medium = SimMedium(scheduler: time, parameters: Simulation.parameters(a.radio), seed: 39, lanes: 1)
            media[a.runId] = medium
        }
        let transport = medium.addNode(name: a.node.name, x: a.node.position.x, y: a.node.position.y)
        return NodeRadio(transport: transport) { medium.schedulePower(node: transport.index, off: 0, on: nil) }
    }
}

/// The coordinator's links by agent URL; a URL no agent has is unreachable.
/// In virtual time each link counts its calls as work in flight (`VirtualTime.working`).
final class LinkBoard: @unchecked Sendable {
    private let lock = NSLock()
    private var links: [String: FaultyLink] = [:]
    private let time: VirtualTime?
    init(time: VirtualTime? = nil) { self.time = time }
    func set(_ url: String, _ link: FaultyLink) { lock.withLock { links[url] = link } }
    func link(_ url: String) -> any AgentLink {
        let link = lock.withLock { links[url] } ?? FaultyLink(nil, deadAirPort: 1)
        guard let time else { return link }
        return CountedAgentLink(inner: link, time: time)
    }
}

/// An agent link whose every call is work in flight for the lab's virtual time.
struct CountedAgentLink: AgentLink {
    let inner: any AgentLink
    let time: VirtualTime
    func status() async throws(LinkError) -> LabWire.AgentStatus { try await time.working { () async throws(LinkError) in try await inner.status() } }
    func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] {
        try await time.working { () async throws(LinkError) in try await inner.clockSamples(count: count, settle: settle) }
    }
    func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { try await time.working { () async throws(LinkError) in try await inner.arm(request) } }
    func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { try await time.working { () async throws(LinkError) in try await inner.start(request) } }
    func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport {
        try await time.working { () async throws(LinkError) in try await inner.startPreflight(request) }
    }
    func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { try await time.working { () async throws(LinkError) in try await inner.preflightStatus() } }
    func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { try await time.working { () async throws(LinkError) in try await inner.stopPreflight() } }
    func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { try await time.working { () async throws(LinkError) in try await inner.stopRun(run) } }
    func files(of run: String) async throws(LinkError) -> LabWire.FileList { try await time.working { () async throws(LinkError) in try await inner.files(of: run) } }
    func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
        let time = self.time
        time.begin()
        defer { time.end() }
        return try await inner.fetchFile(run: run, name: name, from: offset, appendingTo: destination, hasher: &hasher)
    }
    func release(_ run: String) async throws(LinkError) { try await time.working { () async throws(LinkError) in try await inner.release(run) } }
}

/// An agent's link with faults a lab meets (a clock off, an air it cannot reach, bytes damaged on
/// the way, an agent gone), and a record of what was asked.
final class FaultyLink: AgentLink, @unchecked Sendable {
    private var _inner: LocalAgentLink?
    private let deadAirPort: UInt16
    private let lock = NSLock()
    private var _clockSkew = 0.0, _deadAir = false, _vanished = false
    private var _corrupt: [String: Int] = [:]
    private var _arms = 0, _probes = 0, _starts: [LabWire.StartRequest] = [], _fetches: [String] = []
    private var _twistStatus: (@Sendable (inout LabWire.AgentStatus) -> Void)?
    private var _twistFiles: (@Sendable (inout LabWire.FileList) -> Void)?
    private var _heartbeats = 0

    init(_ inner: LocalAgentLink?, deadAirPort: UInt16) { _inner = inner; self.deadAirPort = deadAirPort }

    /// The agent behind it (set once the agent is made: its heartbeats use this link's skew).
    var inner: LocalAgentLink? { get { lock.withLock { _inner } } set { lock.withLock { _inner = newValue } } }
    /// How many times its clock was probed.
    var probes: Int { lock.withLock { _probes } }

    /// The agent's clock is this far ahead of the coordinator's (seconds).
    var clockSkew: Double { get { lock.withLock { _clockSkew } } set { lock.withLock { _clockSkew = newValue } } }
    /// Arm requests name an air port where nothing listens.
    var deadAir: Bool { get { lock.withLock { _deadAir } } set { lock.withLock { _deadAir = newValue } } }
    /// Every call fails as an unreachable agent's does.
    var vanished: Bool { get { lock.withLock { _vanished } } set { lock.withLock { _vanished = newValue } } }
    /// How many fetches of each file name arrive damaged (one byte changed).
    var corrupt: [String: Int] { get { lock.withLock { _corrupt } } set { lock.withLock { _corrupt = newValue } } }
    var arms: Int { lock.withLock { _arms } }
    /// The start requests as the coordinator sent them (before any clock skew).
    var starts: [LabWire.StartRequest] { lock.withLock { _starts } }
    var fetches: [String] { lock.withLock { _fetches } }
    /// Rewrites what the agent says of itself, in its status answers and its heartbeats, as a
    /// hostile enrolled agent would (HostileAgentTests).
    var twistStatus: (@Sendable (inout LabWire.AgentStatus) -> Void)? { get { lock.withLock { _twistStatus } } set { lock.withLock { _twistStatus = newValue } } }
    /// Rewrites the agent's file lists.
    var twistFiles: (@Sendable (inout LabWire.FileList) -> Void)? { get { lock.withLock { _twistFiles } } set { lock.withLock { _twistFiles = newValue } } }
    /// Heartbeats the agent sent through this link's clock (SkewedCoordinatorLink).
    var heartbeats: Int { lock.withLock { _heartbeats } }
    func twisted(_ status: LabWire.AgentStatus) -> LabWire.AgentStatus {
        var s = status
        let twist = lock.withLock { _heartbeats += 1; return _twistStatus }
        twist?(&s)
        return s
    }

    private func reach() throws(LinkError) -> LocalAgentLink {
        guard let inner, !vanished else { throw LinkError(status: nil, message: "connection refused") }
        return inner
    }

    func status() async throws(LinkError) -> LabWire.AgentStatus {
        var s = try await reach().status()
        twistStatus?(&s)
        return s
    }
    func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] {
        let skew = lock.withLock { _probes += 1; return _clockSkew }
        return try await reach().clockSamples(count: count, settle: settle).map { LabWire.ClockSample(offset: $0.offset + skew, roundTrip: $0.roundTrip) }
    }
    func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus {
        let link = try reach()
        var request = request
        lock.withLock {
            _arms += 1
            if _deadAir { request.air?.port = deadAirPort }
        }
        return try await link.arm(request)
    }
    func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus {
        let link = try reach()
        let skew = lock.withLock { _starts.append(request); return _clockSkew }
        return try await link.start(LabWire.StartRequest(runId: request.runId, startAt: request.startAt - skew))
    }
    func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { try await reach().startPreflight(request) }
    func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { try await reach().preflightStatus() }
    func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { try await reach().stopPreflight() }
    func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { try await reach().stopRun(run) }
    func files(of run: String) async throws(LinkError) -> LabWire.FileList {
        var list = try await reach().files(of: run)
        twistFiles?(&list)
        return list
    }
    func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
        let link = try reach()
        let damage = lock.withLock { () -> Bool in
            _fetches.append(name)
            guard let left = _corrupt[name], left > 0 else { return false }
            _corrupt[name] = left - 1
            return true
        }
        guard damage else { return try await link.fetchFile(run: run, name: name, from: offset, appendingTo: destination, hasher: &hasher) }
        // The real bytes into a scratch file, then written on with their first byte changed.
        let scratch = destination.deletingLastPathComponent().appendingPathComponent(".\(UUID().uuidString).scratch")
        FileManager.default.createFile(atPath: scratch.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: scratch) }
        var ignored = SHA256()
        let part = try await link.fetchFile(run: run, name: name, from: offset, appendingTo: scratch, hasher: &ignored)
        do {
            var bytes = try Data(contentsOf: scratch)
            if !bytes.isEmpty { bytes[bytes.startIndex] ^= 0xFF } else { bytes = Data([0x21]) }
            let out = try FileHandle(forWritingTo: destination)
            defer { try? out.close() }
            if part == .whole { try out.truncate(atOffset: 0) } else { try out.seekToEnd() }
            try out.write(contentsOf: bytes)
            hasher.update(bytes)
        } catch { throw LinkError(error) }
        return part
    }
    func release(_ run: String) async throws(LinkError) { try await reach().release(run) }
}

/// An agent's link to the coordinator with its clock `clock.clockSkew` ahead: its own stamps of
/// each heartbeat are shifted so. `stampless`: the coordinator's stamps are dropped from the
/// answers, as a coordinator from before heartbeat clocks gives none.
/// In virtual time (`time`), each call is work in flight.
struct SkewedCoordinatorLink: CoordinatorLink {
    let inner: LocalCoordinatorLink
    let clock: FaultyLink
    let stampless: Bool
    let time: VirtualTime?
    init(_ inner: LocalCoordinatorLink, clock: FaultyLink, stampless: Bool, time: VirtualTime? = nil) {
        self.inner = inner; self.clock = clock; self.stampless = stampless; self.time = time
    }
    var address: String { inner.address }
    func register(_ info: LabWire.AgentInfo) async throws(LinkError) {
        time?.begin()
        defer { time?.end() }
        try await inner.register(info)
    }
    func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer {
        time?.begin()
        defer { time?.end() }
        let answer = try await inner.heartbeat(agent: name, clock.twisted(status))
        let skew = clock.clockSkew
        return HeartbeatAnswer(sent: answer.sent + skew, answered: answer.answered + skew, reply: stampless ? nil : answer.reply)
    }
}
