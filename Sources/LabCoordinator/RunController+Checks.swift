import Foundation
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import Logging

/// Dongle checks (the run controller's, as they call agents): pre-flight checks before a run and
/// health checks (on demand, or every `healthCheckEvery`) check dongles together
/// (DongleRules.judge); their outcomes go to the DongleService's records.
extension RunController {
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
        dongles.setChecking(candidates.map(\.agent), true)
        defer { dongles.setChecking(candidates.map(\.agent), false) }
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
            if let d = reports[i]?.dongle { dongles.note(d, agent: candidates[i].agent) }
            guard let key = reports[i]?.dongle.map(DongleRecord.key) ?? candidates[i].key else { continue }
            let evidence = Self.evidence(reports[i], v)
            let message = v.ok ? "passed: heard \(v.saw.count), heard by \(v.seenBy.count)\(v.seconds.map { String(format: ", the last after %.1f s", $0) } ?? "")"
                : "failed: \(v.reason ?? "no reason")\(v.blame ? "" : " (not counted against it)")"
            if let q = dongles.apply(.check(kind: kind, ok: v.ok, blame: v.blame, message: message, run: run, evidence: evidence), to: key) {
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
        let wanted = try request.dongles.map { try Set($0.map { try dongles.key($0) }) }
        let alive = Dictionary(registry.views.filter { $0.state == .alive }.map { ($0.info.name, $0.info) }, uniquingKeysWith: { a, _ in a })
        var busy = dongles.checking
        let records = dongles.withState { s in s.dongles.values.sorted { $0.id < $1.id } }
        withLock { s in for r in s.runs.values where !r.state.isFinal { for n in r.nodes { busy.insert(n.agent) } } }
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
                dongles.apply(.recovery(ok: rec.ok, message: "\(rec.action) \(rec.ok ? "worked" : "failed"): \(rec.detail ?? "") (because \(rec.reason))", run: r.id), to: key)
            }
            guard nodes.contains(r.nodes[i].name) else { continue }
            if let why = outliers[r.nodes[i].name] {
                r.nodes[i].state = .partial
                r.nodes[i].message = [r.nodes[i].message, "its dongle looks faulty: \(why)"].compactMap { $0 }.joined(separator: "; ")
                if let q = dongles.apply(.run(outlier: true, message: "outlier of node \(r.nodes[i].name): \(why)", run: r.id, evidence: nil), to: key) {
                    logger.warning("dongle \(q) quarantined: the outlier of \(config.quarantineAfter) runs in a row",
                                   metadata: ["run": .string(r.id), "node": .string(r.nodes[i].name), "dongle": .string(q)])
                }
            } else {
                dongles.apply(.run(outlier: false, message: "node \(r.nodes[i].name) \(r.nodes[i].state.rawValue)", run: r.id, evidence: nil), to: key)
            }
        }
    }
}
