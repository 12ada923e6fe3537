import XCTest
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// The coordinator's rules for dongles: pre-flight verdicts, run outliers, quarantine after K
/// failures with the evidence, selection that never picks a quarantined dongle, and checks run
/// through stub agents over HTTP, kept in SQLite across a restart.
final class DongleHealthTests: XCTestCase {
    // MARK: Pre-flight verdicts

    func report(_ agent: String, seen: [UInt32], problem: String? = nil) -> LabWire.PreflightReport {
        var r = LabWire.PreflightReport(id: "c1", agent: agent)
        r.present = problem?.hasPrefix("not present") != true
        r.powered = r.present
        r.advertising = problem == nil
        r.scanning = problem == nil
        r.problem = problem
        r.advertisingAfter = 0.8
        r.seen = seen.enumerated().map { LabWire.PreflightReport.Sighting(beacon: $1, after: 1.5 + Double($0), rssi: -60) }
        return r
    }

    func entry(_ n: Int, seen: [Int], problem: String? = nil, error: String? = nil) -> DongleRules.Entry {
        DongleRules.Entry(name: "d\(n)", id: "F0:00:00:00:00:0\(n)", agent: "a\(n)", beacon: UInt32(100 + n),
                          report: error == nil ? report("a\(n)", seen: seen.map { UInt32(100 + $0) }, problem: problem) : nil, error: error)
    }

    func testAMuteDongleAmongWorkingOnesFailsAndIsBlamed() {
        // d3 hears everybody; nobody hears d3.
        let v = DongleRules.judge([entry(1, seen: [2, 4]), entry(2, seen: [1, 4]), entry(3, seen: [1, 2, 4]), entry(4, seen: [1, 2])], bound: 30)
        XCTAssertEqual(v.map(\.ok), [true, true, false, true])
        XCTAssertEqual(v[2].reason, "none of the 3 other dongles heard it within 30 s, while they heard each other (it is not advertising)")
        XCTAssertTrue(v[2].blame)
        XCTAssertEqual(v[2].saw, ["d1", "d2", "d4"])
        XCTAssertEqual(v[2].seenBy, [])
        XCTAssertEqual(v[0].saw, ["d2", "d4"])
        XCTAssertEqual(v[0].seenBy, ["d2", "d3", "d4"])
        XCTAssertEqual(v[0].warnings, ["did not hear d3 within 30 s"], "a missing pair with a dongle that fails is only a warning")
        XCTAssertEqual(v[0].seconds, 2.5, "d1 heard the two it heard after 2.5 s")
        XCTAssertEqual(v[2].seconds, 3.5, "d3 heard all three, the last after 3.5 s")
    }

    func testADeafDongleAndStageFailures() {
        let v = DongleRules.judge([entry(1, seen: [2, 3]), entry(2, seen: [1, 3]), entry(3, seen: []),
                                   entry(4, seen: [], problem: "not present: adapter F0:00:00:00:00:04 is not there; bluetoothd has hci0"),
                                   entry(5, seen: [], error: "HTTP 409: busy")], bound: 20)
        XCTAssertEqual(v.map(\.ok), [true, true, false, false, false])
        XCTAssertEqual(v[2].reason, "it heard none of the 2 other dongles within 20 s, while they heard each other (its scan finds nothing)")
        XCTAssertTrue(v[2].blame)
        XCTAssertEqual(v[3].reason, "not present: adapter F0:00:00:00:00:04 is not there; bluetoothd has hci0")
        XCTAssertTrue(v[3].blame, "a missing dongle is its own failure")
        XCTAssertEqual(v[4].reason, "the agent did not take the check: HTTP 409: busy")
        XCTAssertFalse(v[4].blame, "an agent that could not check is not the dongle's fault")
    }

    /// One bluetoothd serves all of a host's dongles: when every dongle of a host fails the same
    /// stage, the host is at fault and no dongle is blamed; one failing among working ones is.
    func testAStageEveryDongleOfAHostFailsBlamesTheHostNotTheDongles() {
        func on(_ e: DongleRules.Entry, _ host: String) -> DongleRules.Entry { var e = e; e.host = host; return e }
        var stuck = report("a1", seen: [], problem: "cannot advertise: timed out: RegisterAdvertisement")
        stuck.present = true; stuck.powered = true
        var entries = [1, 2, 3].map { n -> DongleRules.Entry in
            var e = on(entry(n, seen: []), "hostA")
            e.report = stuck
            return e
        }
        entries += [on(entry(4, seen: [5, 6]), "hostB"), on(entry(5, seen: [4, 6]), "hostB"), on(entry(6, seen: [4, 5]), "hostB")]
        var v = DongleRules.judge(entries, bound: 30)
        XCTAssertEqual(v.map(\.ok), [false, false, false, true, true, true])
        XCTAssertEqual(v.map(\.blame), [false, false, false, false, false, false])
        XCTAssertEqual(v[0].reason, "cannot advertise: timed out: RegisterAdvertisement; every other dongle of host hostA failed as far: its bluetoothd or kernel is at fault, not this dongle")
        // d2 alone cannot advertise on hostA: its own failure.
        entries[0] = on(entry(1, seen: [3, 4]), "hostA")
        entries[2] = on(entry(3, seen: [1, 4]), "hostA")
        v = DongleRules.judge(entries, bound: 30)
        XCTAssertEqual(v[1].ok, false)
        XCTAssertEqual(v[1].blame, true)
        XCTAssertEqual(v[1].reason, "cannot advertise: timed out: RegisterAdvertisement")
        // Alone on its host: judged against the dongles elsewhere.
        let alone = DongleRules.judge([on(entries[1], "hostC"), entries[3], entries[4]], bound: 30)
        XCTAssertTrue(alone[0].blame)
    }

    func testNobodyHearsAnybodyBlamesNoOneAndTwoDonglesCannotTell() {
        let all = DongleRules.judge([entry(1, seen: []), entry(2, seen: []), entry(3, seen: [])], bound: 30)
        XCTAssertEqual(all.map(\.ok), [false, false, false])
        XCTAssertEqual(all.map(\.blame), [false, false, false])
        XCTAssertEqual(all[0].reason, "no dongle heard any other within 30 s: the room, bluetoothd or every dongle is at fault, not one of them")
        let two = DongleRules.judge([entry(1, seen: [2]), entry(2, seen: [])], bound: 30)
        XCTAssertEqual(two.map(\.ok), [false, false])
        XCTAssertEqual(two.map(\.blame), [false, false])
        XCTAssertEqual(two[1].reason, "d2 and d1 did not both hear each other within 30 s: cannot tell which one is at fault")
        // Two of four silent: too many to blame one.
        let half = DongleRules.judge([entry(1, seen: [2]), entry(2, seen: [1]), entry(3, seen: [1, 2]), entry(4, seen: [])], bound: 30)
        XCTAssertEqual(half.map(\.ok), [true, true, false, false])
        XCTAssertEqual(half.map(\.blame), [false, false, false, false])
        XCTAssertEqual(half[2].reason, "2 of 4 dongles heard nobody or were heard by nobody within 30 s: too many to blame one; the room or bluetoothd is at fault")
        let pair = DongleRules.judge([entry(1, seen: [2]), entry(2, seen: [1])], bound: 30)
        XCTAssertEqual(pair.map(\.ok), [true, true])
        let alone = DongleRules.judge([entry(1, seen: [])], bound: 30)
        XCTAssertTrue(alone[0].ok, "a single dongle has nobody to hear")
    }

    func testRunOutliers() {
        var detected = Set<String>()
        func add(_ a: String, _ b: String) { detected.insert("\(a)\u{1F}\(b)") }
        for a in ["n1", "n2", "n4"] { for b in ["n1", "n2", "n4"] where a != b { add(a, b) } }
        add("n3", "n1") // n3 detects n1, nobody detects n3
        XCTAssertEqual(DongleRules.outliers(nodes: ["n1", "n2", "n3", "n4"], detected: detected),
                       ["n3": "none of the 3 other nodes detected it, while they detected each other"])
        XCTAssertEqual(DongleRules.outliers(nodes: ["n1", "n2"], detected: []), [:], "two nodes cannot tell")
        XCTAssertEqual(DongleRules.outliers(nodes: ["n1", "n2", "n3"], detected: []), [:], "nobody detected anybody: no one to blame")
        XCTAssertEqual(DongleRules.outliers(nodes: ["n1", "n2", "n4", "n5"], detected: detected),
                       ["n5": "detected none of the 3 other nodes and none detected it"])
        // Three of five detecting nobody is the room (or bluetoothd), not three dongles.
        let poor: Set<String> = ["n2\u{1F}n1", "n2\u{1F}n3", "n2\u{1F}n4", "n2\u{1F}n5", "n4\u{1F}n2"]
        XCTAssertEqual(DongleRules.outliers(nodes: ["n1", "n2", "n3", "n4", "n5"], detected: poor), [:])
    }

    // MARK: Quarantine

    func record() -> DongleRecord {
        DongleRecord(id: "F0:00:00:00:00:03", info: LabWire.DongleInfo(id: "F0:00:00:00:00:03", name: "d3", present: true), at: 1000)
    }

    func testKFailedChecksInARowQuarantineWithTheEvidence() throws {
        var r = record()
        var history = [LabWire.DongleEvent]()
        func apply(_ o: DongleRules.Outcome, at t: Double) {
            let e = DongleRules.apply(o, to: &r, at: t, quarantineAfter: 2, recent: history)
            history = e.reversed() + history
        }
        apply(.check(kind: .check, ok: true, blame: false, message: "passed", run: nil, evidence: nil), at: 1001)
        XCTAssertEqual(r.health, .good, "a passing check makes an unknown dongle good")
        apply(.check(kind: .preflight, ok: false, blame: false, message: "failed: nobody heard anybody", run: "r1", evidence: nil), at: 1002)
        XCTAssertEqual(r.failures, 0, "a failure that blames no dongle does not count")
        apply(.check(kind: .check, ok: false, blame: true, message: "failed: nobody heard it", run: nil, evidence: #"{"seenBy":[]}"#), at: 1003)
        XCTAssertEqual(r.health, .good)
        XCTAssertEqual(r.failures, 1)
        apply(.check(kind: .preflight, ok: false, blame: true, message: "failed: nobody heard it", run: "r2", evidence: #"{"seenBy":[]}"#), at: 1004)
        XCTAssertEqual(r.health, .bad)
        XCTAssertEqual(r.healthSince, 1004)
        XCTAssertEqual(r.healthReason, "quarantined: failed 2 checks in a row (last: failed: nobody heard it)")
        let q = try XCTUnwrap(history.first)
        XCTAssertEqual(q.kind, .health)
        XCTAssertFalse(q.ok)
        let evidence = try XCTUnwrap(JSONSerialization.jsonObject(with: Data((q.evidence ?? "").utf8)) as? [[String: String]])
        XCTAssertEqual(evidence.map { $0["kind"] }, ["preflight", "check"], "the two failures, newest first")
        XCTAssertEqual(evidence.first?["run"], "r2")
        XCTAssertEqual(evidence.first?["evidence"], #"{"seenBy":[]}"#)
        // Passing checks do not release it: the operator does.
        apply(.check(kind: .check, ok: true, blame: false, message: "passed", run: nil, evidence: nil), at: 1005)
        XCTAssertEqual(r.health, .bad)
        XCTAssertEqual(r.failures, 0)
    }

    func testOutlierRunsQuarantineAndAGoodRunResetsTheCount() {
        var r = record()
        _ = DongleRules.apply(.run(outlier: true, message: "outlier", run: "r1", evidence: nil), to: &r, at: 1, quarantineAfter: 2, recent: [])
        _ = DongleRules.apply(.run(outlier: false, message: "fine", run: "r2", evidence: nil), to: &r, at: 2, quarantineAfter: 2, recent: [])
        XCTAssertEqual(r.outliers, 0)
        _ = DongleRules.apply(.run(outlier: true, message: "outlier", run: "r3", evidence: nil), to: &r, at: 3, quarantineAfter: 2, recent: [])
        let events = DongleRules.apply(.run(outlier: true, message: "outlier of node n3", run: "r4", evidence: nil), to: &r, at: 4, quarantineAfter: 2, recent: [])
        XCTAssertEqual(r.health, .bad)
        XCTAssertEqual(r.healthReason, "quarantined: the outlier of 2 runs in a row (last: outlier of node n3)")
        XCTAssertEqual(events.map(\.kind), [.run, .health])
    }

    // MARK: Selection and checks through agents

    var results: URL!
    var stubs: [StubAgent] = []

    override func setUpWithError() throws {
        results = FileManager.default.temporaryDirectory.appendingPathComponent("dongle-health-\(UUID().uuidString)")
    }

    override func tearDown() async throws {
        for s in stubs { await s.http.stop() }
        try? FileManager.default.removeItem(at: results)
    }

    func coordinator(quarantineAfter: Int = 2, agentLinks: AgentLinkFactory? = nil) throws -> Coordinator {
        var config = Coordinator.Config(results: results)
        config.insecure = true
        config.quarantineAfter = quarantineAfter
        if let agentLinks { config.agentLinks = agentLinks }
        config.missingAfter = 600
        return try Coordinator(config: config, logger: LogCapture.quiet())
    }

    /// A bluez agent named aN at `url`, driving dongle dN (address F0:..:0N), of make `maker`.
    func register(_ c: Coordinator, _ n: Int, url: String, maker: Int = 2) {
        var d = LabWire.DongleInfo(id: "F0:00:00:00:00:0\(n)", name: "d\(n)", present: true)
        d.manufacturer = maker
        d.manufacturerName = maker == 2 ? "Intel" : "Realtek"
        d.lmpVersion = 9
        d.lmpSubversion = 8870 + n
        d.host = n <= 3 ? "hostA" : "hostB"
        var info = LabWire.AgentInfo(name: "a\(n)", url: url, tags: [], radio: .bluez, adapter: d.id, controller: nil, port: 1)
        info.dongle = d
        c.registry.withRecords { s in s[info.name] = AgentRegistry.AgentRecord(info: info, lastSeen: c.now, persistedSeen: c.now, status: nil) }
        c.noteDongle(d, agent: info.name)
    }

    func plan(_ agents: String, nodes: Int) throws -> Plan {
        try Plan.parse(yaml: "name: p\nduration: 1m\nnodes: [\((1...nodes).map { "n\($0)" }.joined(separator: ", "))]\nradio: {kind: bluez}\nagents: \(agents)\n")
    }

    /// Clone dongles share one address. A dongle reported at a second place is a move; reported
    /// at the first place again soon after, it is two dongles: bad, with both places, and never
    /// selected. A move back long after is still a move.
    func testTwoDonglesWithOneAddressAreFoundOutAndNeverSelected() throws {
        let c = try coordinator()
        for n in 1...3 { register(c, n, url: "http://127.0.0.1:\(9000 + n)") }
        func report(_ n: Int, by agent: String, host: String) {
            var d = LabWire.DongleInfo(id: "F0:00:00:00:00:0\(n)", name: "d\(n)", present: true)
            d.host = host
            c.noteDongle(d, agent: agent)
        }
        let d2 = "F0:00:00:00:00:02"
        report(2, by: "a5", host: "hostB")
        XCTAssertEqual(c.dongles.withState { s in s.dongles[d2]?.health }, .unknown, "reported at a second place: a move")
        c.dongles.withState { s in s.dongles[d2]?.previousSeen? -= DongleRecord.cloneWindow + 1 }
        report(2, by: "a2", host: "hostA")
        XCTAssertEqual(c.dongles.withState { s in s.dongles[d2]?.health }, .unknown, "back at its first place long after: a move too")
        XCTAssertEqual(c.dongleHistory(d2, limit: 10).filter { $0.kind == .moved }.count, 2)

        let d1 = "F0:00:00:00:00:01"
        report(1, by: "a5", host: "hostB")
        report(1, by: "a1", host: "hostA")
        let r = try XCTUnwrap(c.dongles.withState { s in s.dongles[d1] })
        XCTAssertEqual(r.health, .bad)
        XCTAssertTrue(r.isClone)
        XCTAssertEqual(r.healthReason, "clone: two controllers report address F0:00:00:00:00:01: at hostA/a1 and at hostB/a5; "
                       + "give one a new address (btmgmt public-addr, where its controller allows it) or unplug it, then release")
        let events = c.dongleHistory(d1, limit: 10)
        XCTAssertEqual(events.first?.kind, .health)
        XCTAssertEqual(events.first?.ok, false)
        XCTAssertThrowsError(try c.runs.select(plan("{dongles: [d1, d3]}", nodes: 2))) { e in
            XCTAssertTrue("\(e)".contains("dongle d1 (F0:00:00:00:00:01) is bad: clone"), "\(e)")
        }
        // Their reports go on alternating: nothing more is written to the history.
        for _ in 0..<3 { report(1, by: "a5", host: "hostB"); report(1, by: "a1", host: "hostA") }
        XCTAssertEqual(c.dongleHistory(d1, limit: 10).count, events.count)
    }

    func testSelectionSkipsQuarantinedDonglesAndPrefersGoodOnes() throws {
        let c = try coordinator()
        for n in 1...5 { register(c, n, url: "http://127.0.0.1:\(9000 + n)", maker: n <= 3 ? 2 : 93) }
        c.dongles.withState { s in
            s.dongles["F0:00:00:00:00:05"]?.health = .good
            s.dongles["F0:00:00:00:00:02"]?.health = .bad
            s.dongles["F0:00:00:00:00:02"]?.healthReason = "quarantined: failed 2 checks in a row"
        }
        let s = try c.runs.select(plan("{count: 3, spares: 1}", nodes: 3))
        XCTAssertEqual(s.chosen.map(\.name), ["a5", "a1", "a3"], "good first, never the quarantined a2")
        XCTAssertEqual(s.spares.map(\.name), ["a4"])
        XCTAssertEqual(try c.runs.select(plan("{manufacturer: Intel}", nodes: 2)).chosen.map(\.name), ["a1", "a3"])
        XCTAssertEqual(try c.runs.select(plan("{firmware: [8874, 0x22a7]}", nodes: 2)).chosen.map(\.name), ["a1", "a4"])
        XCTAssertThrowsError(try c.runs.select(plan("{manufacturer: Intel}", nodes: 3))) { e in
            XCTAssertTrue("\(e)".contains("not selectable: dongle d2 (F0:00:00:00:00:02) is bad: quarantined: failed 2 checks in a row"), "\(e)")
        }
        XCTAssertThrowsError(try c.runs.select(plan("{dongles: [d1, d2]}", nodes: 2))) { e in
            XCTAssertTrue("\(e)".contains("dongle d2 (F0:00:00:00:00:02) is bad"), "\(e)")
        }
        XCTAssertEqual(try c.runs.select(plan("{dongles: [d4, d1]}", nodes: 2)).chosen.map(\.name), ["a4", "a1"])
        XCTAssertThrowsError(try c.runs.select(plan("{dongles: [d9, d1]}", nodes: 2))) { e in
            XCTAssertTrue("\(e)".contains("names dongle d9, which no alive agent drives"), "\(e)")
        }
        // Released: selectable again (unknown, checked before use).
        _ = try c.setHealth("d2", LabWire.HealthRequest(health: .unknown, reason: "replaced the hub"))
        XCTAssertEqual(try c.runs.select(plan("{manufacturer: Intel}", nodes: 3)).chosen.map(\.name), ["a1", "a2", "a3"])
        for state in [LabWire.DongleHealth.maintenance, .retired] {
            _ = try c.setHealth("F0:00:00:00:00:01", LabWire.HealthRequest(health: state, reason: nil))
            XCTAssertThrowsError(try c.runs.select(plan("{manufacturer: Intel}", nodes: 3)), "\(state) is never selected")
        }
    }

    /// After a run: every node's dongle gets the run and its radio's recoveries in its history;
    /// the run's outlier is not `complete`, and two outlier runs in a row quarantine its dongle.
    func testARunsOutlierIsPartialAndItsDongleIsQuarantinedAfterTwo() throws {
        let c = try coordinator()
        for n in 1...4 { register(c, n, url: "http://127.0.0.1:\(9000 + n)") }
        func run(_ id: String) -> RunRecord {
            var r = RunRecord(id: id, plan: "p", planText: "", state: .gathering, created: 0, duration: 60, warmup: 0, air: nil, nodes: [])
            r.nodes = (1...4).map { n in
                RunRecord.Node(name: "n\(n)", agent: "a\(n)", agentURL: "", state: .complete, files: [],
                               dongle: c.dongles.withState { s in s.dongles["F0:00:00:00:00:0\(n)"]?.info })
            }
            r.nodes[1].recoveries = [LabWire.Recovery(at: 5, action: .powerCycle, ok: true, reason: "3 calls to the adapter failed in a row", detail: "adapter /org/bluez/hci1 powered and ready again after 2.1 s")]
            return r
        }
        var detected = Set<String>()
        for a in ["n1", "n2", "n4"] { for b in ["n1", "n2", "n4"] where a != b { detected.insert("\(a)\u{1F}\(b)") } }
        detected.insert("n3\u{1F}n1")
        var r1 = run("r1")
        c.runs.judgeRun(&r1, detected: detected)
        XCTAssertEqual(r1.nodes.map(\.state), [.complete, .complete, .partial, .complete])
        XCTAssertEqual(r1.nodes[2].message, "its dongle looks faulty: none of the 3 other nodes detected it, while they detected each other")
        var views = c.dongleViews(history: 10)
        XCTAssertEqual(views[1].history.map(\.kind), [.run, .recovery, .registered])
        XCTAssertEqual(views[1].history[1].message, "power-cycle worked: adapter /org/bluez/hci1 powered and ready again after 2.1 s (because 3 calls to the adapter failed in a row)")
        XCTAssertEqual(views[2].outliers, 1)
        XCTAssertEqual(views[2].health, .unknown)
        var r2 = run("r2")
        c.runs.judgeRun(&r2, detected: detected)
        views = c.dongleViews(history: 10)
        XCTAssertEqual(views[2].health, .bad)
        XCTAssertEqual(views[2].healthReason, "quarantined: the outlier of 2 runs in a row (last: outlier of node n3: none of the 3 other nodes detected it, while they detected each other)")
        XCTAssertEqual(views[0].health, .unknown, "a run is not a check: it neither makes a dongle good nor bad")
    }

    /// Five stub agents answer checks over HTTP; d3's beacon is heard by nobody. Two checks
    /// quarantine it (K = 2); the record, its evidence and history survive a restart.
    func testChecksThroughAgentsQuarantineTheMuteDongleAndSurviveARestart() async throws {
        let world = StubWorld(mute: ["a3"])
        var c: Coordinator? = try coordinator()
        for n in 1...5 {
            let stub = try await StubAgent.start(name: "a\(n)", world: world)
            stubs.append(stub)
            register(c!, n, url: stub.url)
        }
        let first = try await c!.checkDongles(LabWire.CheckRequest(dongles: nil, bound: 5))
        XCTAssertEqual(first.verdicts.map(\.ok), [true, true, false, true, true])
        XCTAssertEqual(first.verdicts[2].reason, "none of the 4 other dongles heard it within 5 s, while they heard each other (it is not advertising)")
        XCTAssertEqual(first.quarantined, [])
        XCTAssertEqual(world.stops.value, 5, "every check was stopped")
        let second = try await c!.checkDongles(LabWire.CheckRequest(dongles: nil, bound: 5))
        XCTAssertEqual(second.quarantined, ["d3"])
        // Quarantined dongles are no longer checked unless named.
        let third = try await c!.checkDongles(LabWire.CheckRequest(dongles: nil, bound: 5))
        XCTAssertEqual(third.verdicts.map(\.dongle), ["d1", "d2", "d4", "d5"])
        await c!.stop()
        c = nil

        let restarted = try coordinator()
        let views = restarted.dongleViews(history: 50)
        XCTAssertEqual(views.map(\.info.name), ["d1", "d2", "d3", "d4", "d5"])
        let d3 = try XCTUnwrap(views.first { $0.info.name == "d3" })
        XCTAssertEqual(d3.health, .bad)
        XCTAssertEqual(d3.failures, 2)
        XCTAssertTrue(d3.healthReason?.hasPrefix("quarantined: failed 2 checks in a row") == true, "\(d3.healthReason ?? "")")
        XCTAssertEqual(d3.history.map(\.kind), [.health, .check, .check, .registered])
        XCTAssertTrue(d3.history[0].evidence?.contains("not advertising") == true, d3.history[0].evidence ?? "")
        XCTAssertTrue(d3.history[1].evidence?.contains(#""seenBy":[]"#) == true, d3.history[1].evidence ?? "")
        XCTAssertEqual(views.first { $0.info.name == "d1" }?.health, .good)
        XCTAssertEqual(views.first { $0.info.name == "d1" }?.history.map(\.kind), [.check, .check, .health, .check, .registered])
    }

    /// A run's pre-flight in memory (the coordinator reaches its agents through StubDongleLinks,
    /// no HTTP): a1 and a2 are chosen (name order), a3 is the spare; d1 is heard by nobody, fails its check and is quarantined (K = 1), and the spare
    /// d3 takes its node; the stubs then refuse to arm, which ends the run before its start.
    func testARunsPreflightQuarantinesTheFailingDongleAndTheSpareTakesItsNode() async throws {
        let world = StubWorld(mute: ["a1"])
        let links = Dictionary(uniqueKeysWithValues: (1...3).map { ("http://a\($0).in-memory:1", StubDongleLink(dongle: StubDongle(name: "a\($0)", world: world))) })
        let c = try coordinator(quarantineAfter: 1, agentLinks: { links[$0.url.absoluteString]! })
        for n in 1...3 { register(c, n, url: "http://a\(n).in-memory:1") }
        // The run driver runs the run submitted (RunDriver); no HTTP, no other background work.
        c.startUnserved(background: false)
        let plan = "name: p\nduration: 1m\nnodes: [n1, n2]\nradio: {kind: bluez}\nagents: {spares: 1, preflight: 3s}\n"
        let id = try c.submit(planText: plan, source: "p").id
        let deadline = Date().addingTimeInterval(30)
        while c.run(id)?.state.isFinal != true && Date() < deadline { try await Task.sleep(nanoseconds: 50_000_000) }
        let r = try XCTUnwrap(c.run(id))
        XCTAssertEqual(r.state, .failed)
        XCTAssertEqual(r.preflight?.map(\.dongle), ["d1", "d2", "d3"])
        XCTAssertEqual(r.preflight?.map(\.ok), [false, true, true])
        XCTAssertEqual(r.nodes.map(\.agent), ["a3", "a2"], "the spare took n1")
        XCTAssertEqual(r.nodes.first?.dongle?.name, "d3")
        XCTAssertTrue(r.message?.hasPrefix("arming failed: agent a3") == true, r.message ?? "")
        XCTAssertTrue(r.message?.contains("HTTP 422: agent a3 is a stub") == true, r.message ?? "")
        XCTAssertEqual(world.stops.value, 3, "every check was stopped")
        let d1 = try XCTUnwrap(c.dongleViews(history: 10).first { $0.info.name == "d1" })
        XCTAssertEqual(d1.health, .bad)
        XCTAssertTrue(d1.healthReason?.hasPrefix("quarantined: failed 1 checks in a row") == true, d1.healthReason ?? "")
        XCTAssertEqual(c.dongleViews(history: 10).first { $0.info.name == "d3" }?.health, .good)
        await c.stop()
    }
}

/// A stub agent in memory (`AgentLink`): it answers dongle checks from a StubWorld and refuses
/// to arm (it runs no node), as an agent whose radio cannot start does (422).
struct StubDongleLink: AgentLink {
    let dongle: StubDongle
    func refuse<T>() throws(LinkError) -> T { throw LinkError(status: 422, message: "agent \(dongle.name) is a stub: it runs no node") }
    func status() async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: dongle.name, state: .idle) }
    func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] { [LabWire.ClockSample(offset: 0, roundTrip: 0.0001)] }
    func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { try refuse() }
    func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { try refuse() }
    func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { dongle.start(request) }
    func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { dongle.poll() }
    func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { dongle.stop() }
    func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { try refuse() }
    func files(of run: String) async throws(LinkError) -> LabWire.FileList { try refuse() }
    func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart { try refuse() }
    func release(_ run: String) async throws(LinkError) {}
}

/// What the stub agents hear: every beacon registered by a check, except those of mute agents.
final class StubWorld: @unchecked Sendable {
    let mute: Set<String>
    private let lock = NSLock()
    private var beacons: [String: UInt32] = [:]
    let stops = Counter()
    init(mute: Set<String>) { self.mute = mute }
    func advertise(_ agent: String, _ beacon: UInt32) { lock.withLock { beacons[agent] = beacon } }
    func heard(by agent: String) -> [UInt32] {
        lock.withLock { beacons.filter { $0.key != agent && !mute.contains($0.key) }.map(\.value).sorted() }
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.withLock { n += 1 } }
    var value: Int { lock.withLock { n } }
}

/// A stub agent's dongle checks, from a StubWorld: what StubAgent answers over HTTP and
/// StubDongleLink in memory.
final class StubDongle: @unchecked Sendable {
    let name: String
    let world: StubWorld
    private var current: LabWire.PreflightRequest?
    private let lock = NSLock()
    init(name: String, world: StubWorld) { self.name = name; self.world = world }

    func start(_ r: LabWire.PreflightRequest) -> LabWire.PreflightReport {
        lock.withLock { current = r }
        world.advertise(name, r.beacon)
        return report(r, final: false)
    }
    func poll() -> LabWire.PreflightReport { report(lock.withLock { current! }, final: false) }
    func stop() -> LabWire.PreflightReport {
        world.stops.add()
        return report(lock.withLock { current! }, final: true)
    }

    func report(_ r: LabWire.PreflightRequest, final: Bool) -> LabWire.PreflightReport {
        var p = LabWire.PreflightReport(id: r.id, agent: name)
        p.present = true; p.powered = true; p.advertising = true; p.scanning = true
        p.seen = world.heard(by: name).filter { r.peers.contains($0) }.map { LabWire.PreflightReport.Sighting(beacon: $0, after: 1, rssi: -50) }
        p.finished = final
        return p
    }
}

/// An agent that only answers dongle checks, from a StubWorld.
final class StubAgent: @unchecked Sendable {
    let http: HTTPService
    var url = ""

    private init(name: String, world: StubWorld) {
        http = HTTPService(name: name, authenticate: nil, logger: LogCapture.quiet())
        let dongle = StubDongle(name: name, world: world)
        http.serve { r in
            let api = r.routes()
            api.on(AgentAPI.startPreflight) { request, _, _ in dongle.start(request) }
            api.on(AgentAPI.preflightStatus) { _, _, _ in dongle.poll() }
            api.on(AgentAPI.stopPreflight) { _, _, _ in dongle.stop() }
        }
    }

    static func start(name: String, world: StubWorld) async throws -> StubAgent {
        let a = StubAgent(name: name, world: world)
        let port = try await a.http.start(host: "127.0.0.1", port: 0)
        a.url = "http://127.0.0.1:\(port)"
        return a
    }
}
