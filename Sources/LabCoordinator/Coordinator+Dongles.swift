import Foundation
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import Logging

/// The lab's dongles: every dongle an agent reports is kept by its address (SQLite), with its
/// health (LAVA's good, bad, maintenance, retired, and unknown) and its history. Pre-flight
/// checks before a run and health checks (on demand, or every `healthCheckEvery`) check
/// dongles together (DongleRules.judge); a dongle that fails `quarantineAfter` checks in a row,
/// or is the outlier of that many runs, is quarantined with the evidence and never selected
/// until the operator releases it.
extension Coordinator {
    // MARK: The registry

    /// An agent reports its dongle (registration, heartbeat, a check): new, moved, or seen again.
    func noteDongle(_ reported: LabWire.DongleInfo, agent: String) {
        var info = reported
        info.agent = agent
        let key = DongleRecord.key(info)
        let t = now
        let change: (DongleRecord, [LabWire.DongleEvent])? = withLock { s in
            guard var r = s.dongles[key] else {
                let r = DongleRecord(id: key, info: info, at: t)
                s.dongles[key] = r
                let where_ = [info.host.map { "host \($0)" }, "agent \(agent)", info.adapter, info.usb.map { "USB port \($0.port)" }].compactMap { $0 }.joined(separator: ", ")
                return (r, [LabWire.DongleEvent(kind: .registered, at: t, ok: true, message: "first seen: \(where_)")])
            }
            var events = [LabWire.DongleEvent]()
            let old = r.info
            let (here, there) = (DongleRecord.place(info), DongleRecord.place(old))
            if here != there, r.isClone {
                // Known clones: their reports alternate; nothing new to say.
            } else if here != there, r.previousPlace == here, let seen = r.previousSeen, t - seen <= DongleRecord.cloneWindow {
                // Reported here, then there, then here again within the window: not a dongle
                // that moves but two that share one address. Neither can be told apart from the
                // other (plans, manifests and history go by address), so neither is selected.
                r.health = .bad
                r.healthSince = t
                r.healthReason = "\(DongleRecord.cloneReason) \(key): at \(here) and at \(there); give one a new address (btmgmt public-addr, where its controller allows it) or unplug it, then release"
                events.append(LabWire.DongleEvent(kind: .health, at: t, ok: false, message: "bad: \(r.healthReason ?? "")"))
            } else if old.host != info.host || old.agent != info.agent || (info.usb != nil && old.usb?.port != info.usb?.port) {
                let from = [old.host, old.agent, old.usb?.port].compactMap { $0 }.joined(separator: "/")
                let to = [info.host, info.agent, info.usb?.port].compactMap { $0 }.joined(separator: "/")
                events.append(LabWire.DongleEvent(kind: .moved, at: t, ok: true, message: "now \(to) (was \(from))"))
            }
            if here != there {
                r.previousPlace = there
                r.previousSeen = r.lastSeen
            }
            // Fields a later look may not have (identity read once) are kept.
            if info.manufacturer == nil, old.manufacturer != nil {
                info.manufacturer = old.manufacturer; info.manufacturerName = old.manufacturerName
                info.hciVersion = old.hciVersion; info.hciRevision = old.hciRevision
                info.lmpVersion = old.lmpVersion; info.lmpSubversion = old.lmpSubversion
            }
            let due = t - r.lastSeen >= 60
            guard info != old || due || !events.isEmpty else { r.lastSeen = t; s.dongles[key] = r; return nil }
            r.info = info
            r.lastSeen = t
            s.dongles[key] = r
            return (r, events)
        }
        if let (r, events) = change { persistDongle(r, events) }
    }

    /// A dongle's history, newest first; a store that cannot give it is logged (the record is
    /// then judged and shown without it).
    func dongleHistory(_ key: String, limit: Int) -> [LabWire.DongleEvent] {
        do { return try store.dongleEvents(key, limit: limit) } catch {
            logger.error("cannot read dongle \(key)'s history: \(error)", metadata: ["dongle": .string(key)])
            return []
        }
    }

    func persistDongle(_ r: DongleRecord, _ events: [LabWire.DongleEvent]) {
        do { try store.saveDongle(r, events: events) } catch { logger.error("cannot save dongle \(r.id): \(error)", metadata: ["dongle": .string(r.info.name), "dongleId": .string(r.id)]) }
        for e in events where ![.preflight, .check, .run].contains(e.kind) {
            logger.notice("dongle \(r.info.name) (\(r.id)): \(e.kind): \(e.message)", metadata: ["dongle": .string(r.info.name), "dongleId": .string(r.id)])
        }
    }

    /// Applies an outcome to a dongle's record; returns the dongle's name when it was quarantined by it.
    @discardableResult
    func apply(_ outcome: DongleRules.Outcome, to key: String) -> String? {
        let recent = dongleHistory(key, limit: 100)
        let t = now
        let k = config.quarantineAfter
        let result: (DongleRecord, [LabWire.DongleEvent], Bool)? = withLock { s in
            guard var r = s.dongles[key] else { return nil }
            let before = r.health
            let events = DongleRules.apply(outcome, to: &r, at: t, quarantineAfter: k, recent: recent)
            s.dongles[key] = r
            return (r, events, before != .bad && r.health == .bad)
        }
        guard let (r, events, quarantined) = result else { return nil }
        persistDongle(r, events)
        return quarantined ? r.info.name : nil
    }

    /// The record key of a dongle named by the operator: its address (any case), its key, or
    /// its name when that is unique.
    func dongleKey(_ ref: String) throws -> String {
        try withLock { s in
            if let a = LabWire.normalisedAddress(ref), s.dongles[a] != nil { return a }
            if s.dongles[ref] != nil { return ref }
            let named = s.dongles.values.filter { $0.info.name == ref }
            if named.count == 1 { return named[0].id }
            if named.count > 1 {
                throw LabRefusal(.conflict, "\(named.count) dongles are named \(ref) (\(named.map(\.id).sorted().joined(separator: ", "))): give the address")
            }
            throw LabRefusal(.notFound, "no dongle \(ref) (dongles: \(s.dongles.values.map(\.info.name).sorted().joined(separator: ", ")))")
        }
    }

    /// The operator sets a dongle's health: quarantine (bad), release (unknown: checked again
    /// before use), maintenance, retired.
    func setHealth(_ ref: String, _ request: LabWire.HealthRequest) throws -> LabWire.DongleView {
        guard ref.utf8.count <= 128 else { throw LabRefusal(.invalid, "dongle name too long") }
        let reason = request.reason.map { String($0.prefix(500)) }
        if let r = reason, r.unicodeScalars.contains(where: { $0.value < 0x20 }) { throw LabRefusal(.invalid, "reason holds control characters") }
        let key = try dongleKey(ref)
        let t = now
        let updated: (DongleRecord, LabWire.DongleEvent)? = withLock { s in
            guard var r = s.dongles[key] else { return nil }
            let was = r.health
            r.health = request.health
            r.healthSince = t
            r.healthReason = reason.map { "set by the operator: \($0)" } ?? "set by the operator"
            if request.health == .unknown { r.failures = 0; r.outliers = 0 }
            s.dongles[key] = r
            let verb = request.health == .unknown && was == .bad ? "released" : request.health == .bad ? "quarantined" : "set to \(request.health.rawValue)"
            return (r, LabWire.DongleEvent(kind: .health, at: t, ok: request.health.selectable,
                                           message: "\(request.health.rawValue): \(verb) by the operator (was \(was.rawValue))\(reason.map { ": \($0)" } ?? "")"))
        }
        guard let (r, e) = updated else { throw LabRefusal(.notFound, "no dongle \(ref)") }
        persistDongle(r, [e])
        return dongleViews(history: 20).first { $0.id == r.id }!
    }

    /// Every dongle with its agent's liveness, the run it is busy with, and its newest history.
    func dongleViews(history: Int) -> [LabWire.DongleView] {
        let agentStates = Dictionary(agentViews.map { ($0.info.name, $0.state.rawValue) }, uniquingKeysWith: { a, _ in a })
        let (records, busy) = withLock { s -> ([DongleRecord], [String: String]) in
            var busy = [String: String]()
            for r in s.runs.values where !r.state.isFinal { for n in r.nodes { busy[n.agent] = r.id } }
            return (s.dongles.values.sorted { ($0.info.host ?? "", $0.info.name, $0.id) < ($1.info.host ?? "", $1.info.name, $1.id) }, busy)
        }
        return records.map { r in
            var v = LabWire.DongleView(id: r.id, info: r.info, health: r.health, failures: r.failures, outliers: r.outliers,
                                       firstSeen: r.firstSeen, lastSeen: r.lastSeen,
                                       history: history > 0 ? dongleHistory(r.id, limit: history) : [])
            v.healthReason = r.healthReason
            v.healthSince = r.healthSince
            v.agentState = r.info.agent.flatMap { agentStates[$0] }
            v.busyWith = r.info.agent.flatMap { busy[$0] }
            return v
        }
    }

    /// The record of the dongle an agent drives, if it reported one.
    func dongleRecord(of agent: LabWire.AgentInfo) -> DongleRecord? {
        guard let d = agent.dongle else { return nil }
        return withLock { s in s.dongles[DongleRecord.key(d)] }
    }

    // MARK: Checks

    /// A dongle to check, on its agent.
    struct CheckCandidate: Sendable {
        var name: String
        var key: String?
        var agent: String
        var url: String
        var host: String?
    }

    /// Checks dongles together (the pre-flight of a run, or a health check): each agent
    /// advertises its beacon and scans; the coordinator polls until every dongle has heard every
    /// other or `bound` has passed, stops them all and judges. `run` names the run for the
    /// history. Returns the verdicts in the candidates' order.
    func runChecks(_ candidates: [CheckCandidate], bound: Double, id: String, kind: LabWire.DongleEventKind, run: String?) async -> (verdicts: [LabWire.PreflightVerdict], quarantined: [String]) {
        var rng = SystemRandomNumberGenerator()
        var beacons = [UInt32]()
        while beacons.count < candidates.count {
            let b = UInt32.random(in: 1...UInt32.max, using: &rng)
            if !beacons.contains(b) { beacons.append(b) }
        }
        let began = now
        // The check's id, and the run whose pre-flight it is, on each of its log lines.
        var ids: Logger.Metadata = ["check": .string(id)]
        if let run { ids["run"] = .string(run) }
        withLock { s in for c in candidates { s.checking.insert(c.agent) } }
        defer { withLock { s in for c in candidates { s.checking.remove(c.agent) } } }
        // Setting a dongle up (power, advertising, discovery) can take bluetoothd many seconds
        // when a host sets up several at once: the first answer may take up to the bound.
        // A revoked agent is not called (no credential goes to it); it fails the check.
        let links = candidates.map { c -> (any AgentLink)? in
            do { return try link(agent: c.agent, url: c.url, chosenAt: began, timeout: max(30, bound + 15)) } catch { return nil }
        }
        // Start: each agent finds, powers and starts its dongle advertising and scanning.
        var reports = [LabWire.PreflightReport?](repeating: nil, count: candidates.count)
        var errors = [String?](repeating: nil, count: candidates.count)
        await withTaskGroup(of: (Int, LabWire.PreflightReport?, String?).self) { group in
            for (i, c) in candidates.enumerated() {
                let request = LabWire.PreflightRequest(id: id, beacon: beacons[i], peers: beacons.enumerated().filter { $0.offset != i }.map(\.element), bound: bound)
                let link = links[i]
                group.addTask {
                    guard let link else { return (i, nil, "not called: a bad agent URL \(HTTPService.escaped(c.url)), or the agent was revoked") }
                    do {
                        let r = try await link.startPreflight(request)
                        return (i, r.sanitised(agent: c.agent), nil)
                    } catch { return (i, nil, LabWire.cleanText("\(error)", max: 500) ?? "failed") }
                }
            }
            for await (i, r, e) in group { reports[i] = r; errors[i] = e }
        }
        // A poll or stop that fails keeps the agent's last findings; the failure is logged.
        func take(_ i: Int, _ result: Result<LabWire.PreflightReport?, Error>, _ what: String) {
            switch result {
            case .success(let r): if let r, r.id == id { reports[i] = r }
            case .failure(let e): logger.warning("\(kind) \(id): \(what) of \(candidates[i].agent) failed: \(LabWire.cleanText("\(e)", max: 500) ?? "failed")",
                                                 metadata: ids.merging(["agent": .string(candidates[i].agent)]) { $1 })
            }
        }
        // Listen: until every working dongle heard every other one, or the bound.
        let active = candidates.indices.filter { reports[$0] != nil && reports[$0]?.problem == nil }
        func complete() -> Bool {
            active.allSatisfy { i in active.allSatisfy { j in i == j || (reports[i]?.seen.contains { $0.beacon == beacons[j] } ?? false) } }
        }
        if active.count >= 2 {
            while !complete() && now - began < bound && !Task.isCancelled {
                // Cancellation ends the polling (the loop's condition).
                try? await config.clock.sleep(for: 0.5)
                await withTaskGroup(of: (Int, Result<LabWire.PreflightReport?, Error>).self) { group in
                    for i in active {
                        let link = links[i]
                        let agent = candidates[i].agent
                        group.addTask { await (i, Self.preflightCall(link, agent: agent) { try await $0.preflightStatus() }) }
                    }
                    for await (i, r) in group { take(i, r, "poll") }
                }
            }
        }
        // Stop every one of them and take the final findings.
        await withTaskGroup(of: (Int, Result<LabWire.PreflightReport?, Error>).self) { group in
            for i in candidates.indices where errors[i] == nil {
                let link = links[i]
                let agent = candidates[i].agent
                group.addTask { await (i, Self.preflightCall(link, agent: agent) { try await $0.stopPreflight() }) }
            }
            for await (i, r) in group { take(i, r, "stop") }
        }
        let entries = candidates.indices.map { i in
            DongleRules.Entry(name: candidates[i].name, id: candidates[i].key, agent: candidates[i].agent, beacon: beacons[i], report: reports[i], error: errors[i],
                              host: reports[i]?.dongle?.host ?? candidates[i].host)
        }
        let verdicts = DongleRules.judge(entries, bound: bound)
        var quarantined = [String]()
        // The dongles' records: what the agents saw of them, and the outcome.
        for (i, v) in verdicts.enumerated() {
            if let d = reports[i]?.dongle { noteDongle(d, agent: candidates[i].agent) }
            guard let key = reports[i]?.dongle.map(DongleRecord.key) ?? candidates[i].key else { continue }
            let evidence = Self.evidence(reports[i], v)
            let message = v.ok ? "passed: heard \(v.saw.count), heard by \(v.seenBy.count)\(v.seconds.map { String(format: ", the last after %.1f s", $0) } ?? "")"
                : "failed: \(v.reason ?? "no reason")\(v.blame ? "" : " (not counted against it)")"
            if let q = apply(.check(kind: kind, ok: v.ok, blame: v.blame, message: message, run: run, evidence: evidence), to: key) {
                logger.warning("dongle \(q) quarantined: it failed \(config.quarantineAfter) checks in a row (\(v.reason ?? ""))", metadata: ids.merging(["dongle": .string(q)]) { $1 })
                quarantined.append(q)
            }
        }
        let outcomes = verdicts.map { "\($0.dongle) \($0.ok ? "ok" : "failed (\($0.reason ?? ""))")" }.joined(separator: ", ")
        logger.info("\(kind) \(id) of \(candidates.count) dongles in \(String(format: "%.1f", now - began)) s: \(outcomes)", metadata: ids)
        return (verdicts, quarantined)
    }

    /// A poll or stop of an agent's check (nil: the agent is not called).
    private static func preflightCall(_ link: (any AgentLink)?, agent: String, _ call: @Sendable (any AgentLink) async throws -> LabWire.PreflightReport) async -> Result<LabWire.PreflightReport?, Error> {
        guard let link else { return .success(nil) }
        do { return .success(try await call(link).sanitised(agent: agent)) } catch { return .failure(error) }
    }

    static func evidence(_ r: LabWire.PreflightReport?, _ v: LabWire.PreflightVerdict) -> String? {
        var e: [String: Any] = ["saw": v.saw, "seenBy": v.seenBy]
        if let r {
            e["present"] = r.present; e["powered"] = r.powered; e["advertising"] = r.advertising; e["scanning"] = r.scanning
            e["elapsed"] = (r.elapsed * 10).rounded() / 10
            if let p = r.problem { e["problem"] = p }
            if let a = r.poweredAfter { e["poweredAfter"] = (a * 10).rounded() / 10 }
            if let a = r.advertisingAfter { e["advertisingAfter"] = (a * 10).rounded() / 10 }
        }
        if let w = v.warnings { e["warnings"] = w }
        return DongleRules.evidenceJSON(e)
    }

    /// A health check: every free dongle that may be selected (or the ones named, whatever
    /// their health but retired), checked together.
    func checkDongles(_ request: LabWire.CheckRequest) async throws -> LabWire.CheckResult {
        let bound = request.bound ?? AgentSelection.defaultPreflight
        guard bound.isFinite, bound >= 1, bound <= 600 else { throw LabRefusal(.invalid, "bound must be 1 to 600 seconds") }
        if let names = request.dongles {
            guard names.count <= 1000 else { throw LabRefusal(.invalid, "at most 1000 dongles") }
        }
        let wanted = try request.dongles.map { try Set($0.map { try dongleKey($0) }) }
        let alive = Dictionary(agentViews.filter { $0.state == .alive }.map { ($0.info.name, $0.info) }, uniquingKeysWith: { a, _ in a })
        let (records, busy) = withLock { s -> ([DongleRecord], Set<String>) in
            var busy = s.checking
            for r in s.runs.values where !r.state.isFinal { for n in r.nodes { busy.insert(n.agent) } }
            return (s.dongles.values.sorted { $0.id < $1.id }, busy)
        }
        var candidates = [CheckCandidate]()
        var left = [String]()
        for r in records {
            if let wanted { guard wanted.contains(r.id) else { continue } } else { guard r.health.selectable else { continue } }
            guard r.health != .retired else { left.append("\(r.info.name) (retired)"); continue }
            guard let agent = r.info.agent, let info = alive[agent], info.radio == .bluez, info.dongle.map(DongleRecord.key) == r.id else {
                left.append("\(r.info.name) (its agent is not alive)"); continue
            }
            guard !busy.contains(agent) else { left.append("\(r.info.name) (busy)"); continue }
            candidates.append(CheckCandidate(name: r.info.name, key: r.id, agent: agent, url: info.url, host: r.info.host))
        }
        guard !candidates.isEmpty else {
            throw LabRefusal(.conflict, "no dongle to check\(left.isEmpty ? "" : ": \(left.joined(separator: ", "))")")
        }
        let id = "check-\(Self.stamp(now))-\(String(format: "%04x", UInt16.random(in: 0...UInt16.max)))"
        let (verdicts, quarantined) = await runChecks(candidates, bound: bound, id: id, kind: .check, run: nil)
        return LabWire.CheckResult(id: id, verdicts: verdicts, quarantined: quarantined,
                                   message: left.isEmpty ? nil : "not checked: \(left.joined(separator: ", "))")
    }

    // MARK: A run's pre-flight

    /// Before arming a run with radio bluez: checks its dongles and spares together; a node
    /// whose dongle fails takes the next spare that passed. Returns nil (the run has ended, with
    /// the reasons) when too few passed.
    func preflight(_ record: RunRecord, _ plan: Plan) async -> RunRecord? {
        var r = record
        let bound = plan.agents.preflight ?? config.preflightBound
        guard plan.radio.kind == .bluez, bound > 0, r.preflight == nil else { return r }
        let spares = r.spares ?? []
        let candidates = r.nodes.map { CheckCandidate(name: $0.dongle?.name ?? $0.agent, key: $0.dongle.map(DongleRecord.key), agent: $0.agent, url: $0.agentURL, host: $0.dongle?.host) }
            + spares.map { CheckCandidate(name: $0.dongle?.name ?? $0.agent, key: $0.dongle.map(DongleRecord.key), agent: $0.agent, url: $0.agentURL, host: $0.dongle?.host) }
        let (verdicts, _) = await runChecks(candidates, bound: bound, id: "\(r.id.prefix(50))-pf", kind: .preflight, run: r.id)
        if Task.isCancelled { return nil }
        r.preflight = verdicts
        var passedSpares = spares.indices.filter { verdicts[r.nodes.count + $0].ok }
        var leftOut = [String]()
        var unfilled = [String]()
        for i in r.nodes.indices where !verdicts[i].ok {
            leftOut.append("\(verdicts[i].dongle) on \(r.nodes[i].agent): \(verdicts[i].reason ?? "failed")")
            guard !passedSpares.isEmpty else { unfilled.append(r.nodes[i].name); continue }
            let s = spares[passedSpares.removeFirst()]
            logger.warning("run \(r.id): node \(r.nodes[i].name) moves from \(r.nodes[i].agent) to spare \(s.agent) (\(verdicts[i].dongle) failed its check)",
                           metadata: ["run": .string(r.id), "node": .string(r.nodes[i].name), "agent": .string(s.agent), "dongle": .string(verdicts[i].dongle)])
            r.nodes[i].agent = s.agent
            r.nodes[i].agentURL = s.agentURL
            r.nodes[i].dongle = s.dongle
            r.nodes[i].dongleHealth = s.dongleHealth
            r.nodes[i].message = "on a spare: \(verdicts[i].dongle) failed its pre-flight check (\(verdicts[i].reason ?? ""))"
        }
        for (j, s) in spares.enumerated() where !verdicts[r.nodes.count + j].ok {
            leftOut.append("spare \(verdicts[r.nodes.count + j].dongle) on \(s.agent): \(verdicts[r.nodes.count + j].reason ?? "failed")")
        }
        if !unfilled.isEmpty {
            let passed = verdicts.filter(\.ok).count
            let message = "pre-flight: \(passed) of \(candidates.count) dongles passed and the plan needs \(r.nodes.count) (nodes without one: \(unfilled.joined(separator: ", "))); left out: \(leftOut.joined(separator: "; "))"
            _ = await endBeforeStart(r, state: .failed, message: message)
            return nil
        }
        if !leftOut.isEmpty { logger.warning("run \(r.id): pre-flight left out \(leftOut.joined(separator: "; "))", metadata: ["run": .string(r.id)]) }
        r.spares = nil // the spares not taken are free again
        update(r)
        return r
    }

    // MARK: After a run

    /// After gathering a run with radio bluez: each node's dongle gets the run in its history
    /// (with its recoveries), and the run's outliers (a node that detected no other, or that no
    /// other detected) count towards quarantine; an outlier node is not `complete`.
    func judgeRun(_ r: inout RunRecord, detected: Set<String>) {
        let nodes = r.nodes.filter { $0.dongle != nil && $0.state.isGathered }.map(\.name)
        let outliers = DongleRules.outliers(nodes: nodes, detected: detected)
        for i in r.nodes.indices {
            guard let d = r.nodes[i].dongle else { continue }
            let key = DongleRecord.key(d)
            for rec in r.nodes[i].recoveries ?? [] {
                apply(.recovery(ok: rec.ok, message: "\(rec.action) \(rec.ok ? "worked" : "failed"): \(rec.detail ?? "") (because \(rec.reason))", run: r.id), to: key)
            }
            guard nodes.contains(r.nodes[i].name) else { continue }
            if let why = outliers[r.nodes[i].name] {
                r.nodes[i].state = .partial
                r.nodes[i].message = [r.nodes[i].message, "its dongle looks faulty: \(why)"].compactMap { $0 }.joined(separator: "; ")
                if let q = apply(.run(outlier: true, message: "outlier of node \(r.nodes[i].name): \(why)", run: r.id, evidence: nil), to: key) {
                    logger.warning("dongle \(q) quarantined: the outlier of \(config.quarantineAfter) runs in a row",
                                   metadata: ["run": .string(r.id), "node": .string(r.nodes[i].name), "dongle": .string(q)])
                }
            } else {
                apply(.run(outlier: false, message: "node \(r.nodes[i].name) \(r.nodes[i].state.rawValue)", run: r.id, evidence: nil), to: key)
            }
        }
    }
}
