import XCTest
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// The coordinator's identity rules without sockets (issue 19): whom it calls with what, which
/// registrations and heartbeats are fresh, which URL an agent may register, and that two
/// submissions never take one agent.
final class IdentityRulesTests: XCTestCase {
    var dirs: [URL] = []
    var coordinators: [Coordinator] = []
    override func tearDown() async throws {
        for c in coordinators { await c.stop() }
        for d in dirs { try? FileManager.default.removeItem(at: d) }
    }

    let operatorToken = "operator-token-0123456789"

    func coordinator(tls: Bool = false, log: LogCapture? = nil) throws -> Coordinator {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("idrules-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("cred"), withIntermediateDirectories: true)
        dirs.append(dir)
        var config = Coordinator.Config(results: dir)
        config.token = operatorToken
        config.credentials = CredentialsFolder(url: dir.appendingPathComponent("cred"))
        if tls {
            // As `herald-lab ca init` makes them: a CA, and the coordinator's certificate it issues (a
            // CA certificate cannot serve TLS: swift-nio-ssl takes an EC server certificate only with
            // digitalSignature in its key usage).
            let p = { (name: String) in dir.appendingPathComponent("cred/\(name)").path }
            let (cert, key) = (p("cert.pem"), p("key.pem"))
            try LabCA.create(commonName: "test lab", days: 1, certificate: p("ca.pem"), key: p("ca-key.pem"))
            try LabCA.issue(caCertificate: p("ca.pem"), caKey: p("ca-key.pem"), commonName: "coordinator", names: ["127.0.0.1"], days: 1,
                            certificate: cert, key: key)
            config.tls = try TLSContext(certificate: cert, key: key)
        }
        let c = try Coordinator(config: config, logger: log?.logger("herald-lab.coordinator") ?? LogCapture.quiet())
        coordinators.append(c)
        return c
    }

    /// Enrols `name` as of `t` (what `herald-lab agents enrol` records, without a CA).
    @discardableResult
    func enrol(_ c: Coordinator, _ name: String, at t: Double) throws -> IdentityStore.Credential {
        let rec = IdentityStore.Credential(name: name, tokenHash: CredentialHash.of("agent-\(name)-\(t)"), coordinatorToken: "coordinator-calls-\(name)-\(t)",
                                           issuedAt: t, revokedAt: nil, hosts: ["127.0.0.1"])
        try XCTUnwrap(c.identities.store).saveCredential(rec)
        c.identities.add(rec)
        return rec
    }

    let boot = "boot-0000-aaaa"
    func info(_ name: String, _ url: String, boot: String, _ sequence: UInt64) -> LabWire.AgentInfo {
        var i = LabWire.AgentInfo(name: name, url: url, tags: [], radio: .sim, adapter: nil, controller: nil)
        i.boot = boot
        i.sequence = sequence
        return i
    }
    func beat(_ name: String, boot: String, _ sequence: UInt64) -> LabWire.AgentStatus {
        var s = LabWire.AgentStatus(name: name, state: .idle)
        s.boot = boot
        s.sequence = sequence
        return s
    }
    func agent(_ name: String) -> HTTPService.Principal { HTTPService.Principal(role: .agent, name: name) }
    let op = HTTPService.Principal(role: .operator, name: "operator")

    func status(_ error: Error) -> Int { (error as? LabRefusal)?.kind.status ?? 0 }

    // MARK: 1. Credentials never cross over

    func testARevokedAgentIsCalledWithNothingNotEvenTheLabToken() throws {
        let c = try coordinator()
        let t0 = Date().timeIntervalSince1970 - 100
        let first = try enrol(c, "a1", at: t0)
        XCTAssertEqual(try c.credentialForCalling("a1", chosenAt: t0 + 1), first.coordinatorToken, "an enrolled agent is called with its own credential")
        XCTAssertEqual(try c.credentialForCalling("shared1"), operatorToken, "a name never enrolled (shared-token lab): the lab token")
        try c.revoke("a1")
        for chosen in [nil, t0 + 1] as [Double?] {
            XCTAssertThrowsError(try c.credentialForCalling("a1", chosenAt: chosen), "revoked: never the lab token") { e in
                XCTAssertTrue("\(e)".hasPrefix("revoked: agent a1 was revoked"), "\(e)")
                XCTAssertTrue("\(e)".contains("herald-lab agents enrol a1"), "the way to recover is named: \(e)")
            }
        }
        // Re-enrolled under the same name: a run that chose the old one calls nobody; later runs the new one.
        let second = try enrol(c, "a1", at: t0 + 50)
        XCTAssertThrowsError(try c.credentialForCalling("a1", chosenAt: t0 + 1)) { e in XCTAssertTrue("\(e)".contains("enrolled again"), "\(e)") }
        XCTAssertEqual(try c.credentialForCalling("a1", chosenAt: t0 + 60), second.coordinatorToken)
        // The old credential opens nothing; the new one is a1.
        let auth = Coordinator.authenticator(operatorToken: operatorToken, identities: c.identities)
        XCTAssertNil(auth("agent-a1-\(t0)"))
        XCTAssertEqual(auth("agent-a1-\(t0 + 50)"), agent("a1"))
    }

    func testHeartbeatClockStampsSentWithAnotherAgentsOrARevokedCredentialMakeNoSample() throws {
        let c = try coordinator()
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "a1", at: t0)
        try enrol(c, "a2", at: t0)
        try c.register(info("a1", "http://127.0.0.1:8701", boot: boot, 1), principal: agent("a1"), peerHost: "127.0.0.1")
        let reply = try c.heartbeat("a1", beat("a1", boot: boot, 2), principal: agent("a1"))
        // a2's credential, a1's name, stamps fitting a1's pending exchange: refused before anything is taken.
        var forged = beat("a1", boot: boot, 3)
        forged.clock = LabWire.HeartbeatClock(sequence: 2, sent: reply.received + 50, answered: reply.sent + 50)
        XCTAssertThrowsError(try c.heartbeat("a1", forged, principal: agent("a2"))) { XCTAssertEqual(status($0), 403) }
        XCTAssertTrue(c.registry.withRecords { s in s["a1"]!.clocks.isEmpty }, "another agent's credential makes no sample for a1")
        XCTAssertNotNil(c.registry.withRecords { s in s["a1"]!.clockPending }, "nor spends a1's pending exchange")
        // a1's own: one sample, offset 0 (its own stamps, one clock).
        var own = beat("a1", boot: boot, 3)
        own.clock = LabWire.HeartbeatClock(sequence: 2, sent: reply.received - 0.0001, answered: reply.sent + 0.0001)
        let next = try c.heartbeat("a1", own, principal: agent("a1"))
        XCTAssertEqual(c.registry.withRecords { s in s["a1"]!.clocks.map(\.sample.offset) }, [0])
        // Revoked: the next stamps are refused with the heartbeat.
        try c.revoke("a1")
        var late = beat("a1", boot: boot, 4)
        late.clock = LabWire.HeartbeatClock(sequence: 3, sent: next.received, answered: next.sent)
        XCTAssertThrowsError(try c.heartbeat("a1", late, principal: agent("a1"))) { XCTAssertEqual(status($0), 403) }
        XCTAssertLessThanOrEqual(c.registry.withRecords { s in s["a1"]?.clocks.count ?? 0 }, 1, "no sample from a revoked credential")
    }

    func run(_ c: Coordinator, nodes: [(String, String)], created: Double) throws -> (RunRecord, Plan) {
        var yaml = "name: idrules\nduration: 5s\nwarmup: 1s\nnodes:\n"
        for (i, n) in nodes.enumerated() { yaml += "  - {name: \(n.0), position: [\(i), 0]}\n" }
        let plan = try Plan.parse(yaml: yaml, source: "idrules")
        let r = RunRecord(id: "idrules-\(UUID().uuidString.prefix(8))", plan: plan.name, planText: yaml, state: .arming, created: created, duration: plan.duration,
                          warmup: plan.warmup, air: nil,
                          nodes: nodes.map { RunRecord.Node(name: $0.0, agent: $0.1, agentURL: "http://192.0.2.1:8701", state: .selected, files: []) })
        try c.save(r)
        return (r, plan)
    }

    func testAnAgentRevokedBeforeArmingIsNotCalledAndItsNodeIsLostAsRevoked() async throws {
        let c = try coordinator()
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "a1", at: t0)
        try enrol(c, "a2", at: t0)
        let (r, plan) = try run(c, nodes: [("n1", "a1"), ("n2", "a2")], created: t0 + 1)
        // a1 revoked, a2 revoked and enrolled anew, both after the run chose them: neither is
        // called (nothing here could answer: a call would time out, not refuse).
        try c.revoke("a1")
        try c.revoke("a2")
        try enrol(c, "a2", at: t0 + 50)
        let armed = await c.runs.arm(r, plan)
        XCTAssertNil(armed, "the run does not start")
        let after = try XCTUnwrap(c.run(r.id))
        XCTAssertEqual(after.state, .failed)
        XCTAssertEqual(after.nodes.map(\.state), [.lost, .lost])
        XCTAssertTrue(after.nodes[0].message?.hasPrefix("revoked: agent a1 was revoked") == true, after.nodes[0].message ?? "")
        XCTAssertTrue(after.nodes[1].message?.hasPrefix("revoked: agent a2 was enrolled again") == true, after.nodes[1].message ?? "")
        XCTAssertNil(after.nodes[0].clockBefore, "not even a clock probe")
        XCTAssertTrue(after.message?.contains("revoked") == true, after.message ?? "")
    }

    func testAnAgentRevokedMidRunLosesItsNodeAsRevokedAndTheOthersGoOn() async throws {
        let c = try coordinator()
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "a1", at: t0)
        try enrol(c, "a2", at: t0)
        var (r, _) = try run(c, nodes: [("n1", "a1"), ("n2", "a2")], created: t0 + 1)
        r.state = .running
        r.nodes = r.nodes.map { var n = $0; n.state = .running; return n }
        XCTAssertFalse(c.runs.markNotCalled(&r), "nobody revoked: nothing changes")
        try c.revoke("a2")
        XCTAssertTrue(c.runs.markNotCalled(&r))
        XCTAssertEqual(r.nodes.map(\.state), [.running, .lost], "the run goes on with n1")
        XCTAssertTrue(r.nodes[1].message?.hasPrefix("revoked:") == true, r.nodes[1].message ?? "")
        // Gathering asks it nothing (no credential is sent: the refusal comes before any call).
        let (list, clock, refusal) = await c.runs.gatherNode(r.id, r.nodes[1], chosenAt: r.created, into: dirs[0].appendingPathComponent("x"))
        XCTAssertNil(list)
        XCTAssertNil(clock, "not even a clock probe")
        XCTAssertEqual(refusal?.notCalled, true)
        XCTAssertTrue(refusal?.message.hasPrefix("revoked:") == true, refusal?.message ?? "")
    }

    func testInATLSLabAnAgentRegistersOnlyAnHTTPSURLOnAHostItsCertificateNames() {
        let hosts = ["n1.lab", "10.77.0.11", "fd00:77::11"]
        XCTAssertNil(IdentityService.callableProblem("n1", at: "http://n9.lab:1", tlsLab: false, enrolledHosts: hosts), "a plain lab checks nothing")
        XCTAssertNil(IdentityService.callableProblem("n1", at: "https://n1.lab:8701", tlsLab: true, enrolledHosts: hosts))
        XCTAssertNil(IdentityService.callableProblem("n1", at: "https://N1.LAB:8701", tlsLab: true, enrolledHosts: hosts))
        XCTAssertNil(IdentityService.callableProblem("n1", at: "https://[fd00:77:0::11]:8701", tlsLab: true, enrolledHosts: hosts), "IPv6 compared canonically")
        XCTAssertNil(IdentityService.callableProblem("n1", at: "https://10.77.0.11:8701", tlsLab: true, enrolledHosts: hosts))
        for bad in ["http://n1.lab:8701", "http://10.77.0.11:8701", "ftp://n1.lab", "https://n3.lab:8701", "https://10.77.0.13:8701", "https://n1.lab.evil:1", "nonsense"] {
            XCTAssertNotNil(IdentityService.callableProblem("n1", at: bad, tlsLab: true, enrolledHosts: hosts), bad)
        }
        XCTAssertNotNil(IdentityService.callableProblem("n1", at: "https://n1.lab:1", tlsLab: true, enrolledHosts: []), "a certificate naming no host")
        XCTAssertNotNil(IdentityService.callableProblem("s1", at: "http://s1:1", tlsLab: true, enrolledHosts: nil), "a name never enrolled: https too")
        XCTAssertNil(IdentityService.callableProblem("s1", at: "https://s1:1", tlsLab: true, enrolledHosts: nil))
    }

    func testInATLSLabAnAgentCannotRegisterWhereAnotherIsAliveOrOffItsHosts() throws {
        let c = try coordinator(tls: true)
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "a1", at: t0)
        try enrol(c, "a2", at: t0)
        try c.register(info("a1", "https://127.0.0.1:8701", boot: boot, 1), principal: agent("a1"), peerHost: "127.0.0.1")
        XCTAssertThrowsError(try c.register(info("a2", "https://127.0.0.1:8701", boot: boot, 1), principal: agent("a2"), peerHost: "127.0.0.1"), "a1's URL") { e in
            XCTAssertEqual(status(e), 409)
            XCTAssertTrue("\(e)".contains("agent a1 is alive"), "\(e)")
        }
        XCTAssertThrowsError(try c.register(info("a2", "http://127.0.0.1:8702", boot: boot, 2), principal: agent("a2"), peerHost: "127.0.0.1"), "plain http") { XCTAssertEqual(status($0), 403) }
        XCTAssertThrowsError(try c.register(info("a2", "https://127.0.0.2:8702", boot: boot, 3), principal: agent("a2"), peerHost: "127.0.0.2"), "a host its certificate does not name") { XCTAssertEqual(status($0), 403) }
        try c.register(info("a2", "https://127.0.0.1:8702", boot: boot, 4), principal: agent("a2"), peerHost: "127.0.0.1")
    }

    // MARK: 5. Freshness

    func testAReplayedHeartbeatDoesNotKeepAStoppedAgentAlive() throws {
        let c = try coordinator()
        try c.register(info("a1", "http://10.0.0.5:8701", boot: boot, 1), principal: op, peerHost: "10.0.0.5")
        try c.heartbeat("a1", beat("a1", boot: boot, 2), principal: op)
        // The agent stops; its last heartbeat was captured and is replayed 70 times.
        c.registry.withRecords { s in s["a1"]?.lastSeen -= 100 }
        var refused = 0
        for _ in 0..<70 {
            do { try c.heartbeat("a1", beat("a1", boot: boot, 2), principal: op) } catch { XCTAssertEqual(status(error), 409); refused += 1 }
        }
        XCTAssertEqual(refused, 70)
        XCTAssertEqual(c.agentViews.first { $0.info.name == "a1" }?.state, .lost, "the replays kept nothing alive")
        XCTAssertThrowsError(try c.heartbeat("a1", beat("a1", boot: boot, 1), principal: op), "an older counter") { XCTAssertEqual(status($0), 409) }
        XCTAssertThrowsError(try c.register(info("a1", "http://10.0.0.5:8701", boot: boot, 1), principal: op, peerHost: "10.0.0.5"), "a replayed registration") { XCTAssertEqual(status($0), 409) }
        // The agent restarts: a new boot registers; the old boot's heartbeats no longer count.
        try c.register(info("a1", "http://10.0.0.5:8701", boot: "boot-0000-bbbb", 1), principal: op, peerHost: "10.0.0.5")
        XCTAssertThrowsError(try c.heartbeat("a1", beat("a1", boot: boot, 3), principal: op)) { XCTAssertEqual(status($0), 404) }
        try c.heartbeat("a1", beat("a1", boot: "boot-0000-bbbb", 2), principal: op)
        XCTAssertEqual(c.agentViews.first { $0.info.name == "a1" }?.state, .alive)
        // Without boot and counter: refused.
        XCTAssertThrowsError(try c.heartbeat("a1", LabWire.AgentStatus(name: "a1", state: .idle), principal: op)) { XCTAssertEqual(status($0), 400) }
        XCTAssertThrowsError(try c.register(LabWire.AgentInfo(name: "a2", url: "http://10.0.0.6:1", tags: [], radio: .sim, adapter: nil, controller: nil), principal: op, peerHost: nil)) { XCTAssertEqual(status($0), 400) }
    }

    // MARK: 6. A name alive at one host is not taken from another

    func testASecondAgentPresentingAnAliveNameFromAnotherHostIsRefusedAndShown() throws {
        let c = try coordinator()
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "n1", at: t0)
        try c.register(info("n1", "http://10.77.0.11:8701", boot: boot, 1), principal: agent("n1"), peerHost: "10.77.0.11")
        XCTAssertThrowsError(try c.register(info("n1", "http://10.77.0.13:8701", boot: "boot-0000-cccc", 1), principal: agent("n1"), peerHost: "10.77.0.13")) { e in
            XCTAssertEqual(status(e), 409)
            XCTAssertTrue("\(e)".contains("second agent presenting this name from 10.77.0.13"), "\(e)")
        }
        let view = try XCTUnwrap(c.agentViews.first { $0.info.name == "n1" })
        XCTAssertEqual(view.info.url, "http://10.77.0.11:8701", "the first keeps its URL")
        XCTAssertTrue(view.lastError?.contains("second agent presenting this name") == true, "the operator sees it: \(view.lastError ?? "")")
        // The same host on another port (the agent restarted) is itself.
        try c.register(info("n1", "http://10.77.0.11:8702", boot: "boot-0000-dddd", 1), principal: agent("n1"), peerHost: "10.77.0.11")
        // Once the first is quiet, the name may move.
        c.registry.withRecords { s in s["n1"]?.lastSeen -= 100 }
        try c.register(info("n1", "http://10.77.0.13:8701", boot: "boot-0000-cccc", 2), principal: agent("n1"), peerHost: "10.77.0.13")
    }

    /// The coordinator's log (issue 22): one line per event, its level saying how much it
    /// matters, the agent as metadata, and an agent's text escaped in message and metadata.
    func testRegistrationsRefusalsAndRevocationsAreLoggedWithTheAgent() throws {
        let log = LogCapture()
        let c = try coordinator(log: log)
        let t0 = Date().timeIntervalSince1970 - 100
        try enrol(c, "n1", at: t0)
        var first = info("n1", "http://10.77.0.11:8701", boot: boot, 1)
        // A tag that would forge a log line is refused where it enters, escaped in the refusal.
        first.tags = ["lab\u{1B}[2J\ncoordinator: run forged"]
        XCTAssertThrowsError(try c.register(first, principal: agent("n1"), peerHost: "10.77.0.11")) { e in
            XCTAssertEqual(status(e), 400)
            XCTAssertTrue("\(e)".hasPrefix("400 tags[0]: "), "\(e)")
            XCTAssertFalse("\(e)".unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "\(e)")
        }
        first.tags = ["lab"]
        try c.register(first, principal: agent("n1"), peerHost: "10.77.0.11")
        XCTAssertThrowsError(try c.register(info("n1", "http://10.77.0.13:8701", boot: "boot-0000-cccc", 1), principal: agent("n1"), peerHost: "10.77.0.13"))
        try c.revoke("n1")
        let entries = log.all.filter { $0.message.contains("n1") }
        XCTAssertEqual(entries.map(\.level), [.info, .warning, .notice], "\(log.lines)")
        XCTAssertTrue(entries.allSatisfy { $0.label == "herald-lab.coordinator" && $0.metadata["agent"] == "n1" }, "\(log.lines)")
        XCTAssertTrue(entries[0].message.hasPrefix("agent n1 registered from 10.77.0.11 at http://10.77.0.11:8701"), entries[0].message)
        XCTAssertTrue(entries[1].message.contains("second agent presenting this name from 10.77.0.13"), entries[1].message)
        XCTAssertTrue(entries[2].message.hasPrefix("agent n1 revoked"), entries[2].message)
        for line in log.lines {
            XCTAssertFalse(line.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, line)
            XCTAssertTrue(line.hasPrefix("1970-01-01T00:00:00.000Z "), line)
        }
        XCTAssertTrue(log.lines.contains { $0.hasPrefix("1970-01-01T00:00:00.000Z info herald-lab.coordinator: agent n1 registered from") }, "\(log.lines)")
        XCTAssertTrue(log.lines.contains { $0.contains("(radio sim, tags lab)") && $0.hasSuffix(" agent=n1") }, "\(log.lines)")
    }

    /// A plan naming its agents is refused at submission when one of them has another radio
    /// (issue 22: a simulated plan named bluez agents and ran its whole duration for nothing).
    func testAPlanNamingAnAgentWithAnotherRadioIsRefusedAtSubmission() throws {
        let c = try coordinator()
        try c.register(info("s1", "http://192.0.2.61:8701", boot: "boot-s1-0000", 1), principal: op, peerHost: nil)
        var b = info("b1", "http://192.0.2.62:8701", boot: "boot-b1-0000", 1)
        b.radio = .bluez
        try c.register(b, principal: op, peerHost: nil)
        let plan = "name: mixed\nduration: 5s\nwarmup: 1s\nagents: {names: [s1, b1]}\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
        XCTAssertThrowsError(try c.submit(planText: plan, source: "mixed")) { e in
            XCTAssertEqual(status(e), 409)
            XCTAssertTrue("\(e)".contains("agent b1 was installed with radio bluez"), "\(e)")
        }
        XCTAssertTrue(c.withLock { s in s.runs.isEmpty }, "nothing was armed")
    }

    func testTwentyPairsOfSimultaneousSubmissionsNeverBothTakeAnAgent() async throws {
        let c = try coordinator()
        for i in 1...40 {
            // TEST-NET addresses: arming them waits for timeouts, long after both submissions.
            try c.register(info("p\(i)", "http://192.0.2.\(i):8701", boot: "boot-p\(i)-0000", 1), principal: op, peerHost: nil)
        }
        var bothAccepted = 0, accepted = 0, refused = 0
        for i in 1...20 {
            let plan = "name: pair\(i)\nduration: 5s\nwarmup: 1s\nagents: {names: [p\(2 * i - 1), p\(2 * i)]}\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
            let results = ResultsBox()
            DispatchQueue.concurrentPerform(iterations: 2) { k in
                do { _ = try c.submit(planText: plan, source: "pair\(i)-\(k)"); results.add(true) } catch {
                    XCTAssertTrue("\(error)".contains("busy"), "\(error)")
                    results.add(false)
                }
            }
            let got = results.all
            if got.allSatisfy({ $0 }) { bothAccepted += 1 }
            accepted += got.filter { $0 }.count
            refused += got.filter { !$0 }.count
        }
        print("20 pairs submitted at the same instant: \(accepted) accepted, \(refused) refused as busy, \(bothAccepted) pairs both accepted")
        XCTAssertEqual(bothAccepted, 0)
        XCTAssertEqual(accepted, 20)
    }
}

final class ResultsBox: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [Bool] = []
    func add(_ v: Bool) { lock.withLock { values.append(v) } }
    var all: [Bool] { lock.withLock { values } }
}
