import Foundation
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import Logging

/// A run's course (RunController): arm every agent (its clock, assignment), start them
/// together, watch them, then gather (Coordinator+Gather). Every step can be resumed after a
/// coordinator restart from the run's record.
extension RunController {
    /// The link to a node's agent (`Config.agentLinks`), with the credential the coordinator calls
    /// that agent with; throws `NotCallable` for an agent that is not called at all (revoked,
    /// enrolled again since the run chose it at `chosenAt`, a URL that is not one).
    func link(_ node: RunRecord.Node, chosenAt: Double, timeout: TimeInterval = 5) throws -> any AgentLink {
        try link(agent: node.agent, url: node.agentURL, chosenAt: chosenAt, timeout: timeout)
    }

    func link(agent: String, url: String, chosenAt: Double, timeout: TimeInterval) throws -> any AgentLink {
        guard let u = URL(string: url) else { throw IdentityService.NotCallable(agent: agent, reason: "bad agent URL \(HTTPService.escaped(url))") }
        return config.agentLinks(AgentAddress(url: u, token: try credentialForCalling(agent, chosenAt: chosenAt), timeout: timeout))
    }

    /// `link`, or nil with the reason logged (calls that are skipped for an agent not called).
    func linkOrSkip(_ node: RunRecord.Node, of run: RunRecord, _ what: String) -> (any AgentLink)? {
        do { return try link(node, chosenAt: run.created) } catch {
            logger.warning("run \(run.id): \(what) not sent to \(node.name) on agent \(node.agent): \(error)",
                           metadata: ["run": .string(run.id), "node": .string(node.name), "agent": .string(node.agent)])
            return nil
        }
    }

    /// Runs a run from wherever it is to its end: arm, start together, watch, gather.
    func drive(_ id: String) async {
        guard var r = run(id) else { return }
        let plan: Plan
        do { plan = try Plan.parse(yaml: r.planText, source: r.plan) } catch {
            r.state = .failed
            r.message = "the stored plan no longer parses: \(error)"
            update(r)
            return
        }
        if r.state == .arming {
            if r.startAt == nil {
                // Radio bluez: the dongles are checked first; spares stand in for failures.
                guard let checked = await preflight(r, plan) else { return }
                r = checked
                guard let armed = await arm(r, plan) else { return }
                r = armed
            } else {
                r.state = .running
                update(r)
            }
        }
        if r.state == .running {
            let owed = await ensureStarted(&r)
            let failure = await watch(&r, startsOwed: owed)
            if Task.isCancelled { return }
            if r.abortRequested == true || failure != nil { await stopAgents(r) }
            if let failure { r.message = failure }
            r.state = .gathering
            update(r)
        }
        if r.state == .gathering {
            await gather(&r, plan, failure: r.message)
        }
    }

    // MARK: Arming and the start barrier

    func arm(_ record: RunRecord, _ plan: Plan) async -> RunRecord? {
        var r = record
        let seed = plan.seed
        let runId = record.id
        let nodesToArm = record.nodes
        let began = now
        let results = await withTaskGroup(of: (Int, LabWire.ClockSample?, String?).self) { group in
            for (i, node) in nodesToArm.enumerated() {
                let spec = plan.nodes[i]
                // Plans are range-checked (durations at most 7 days): the sum is finite.
                // The ticket holds until the run's latest end (a start margin is well under 10 min).
                let air = airAddress(record.air, run: runId, node: spec.name, agent: node.agent, until: began + plan.warmup + plan.duration + 600)
                group.addTask { [self] in
                    let c: any AgentLink
                    do { c = try link(node, chosenAt: record.created) } catch { return (i, nil, "\(error)") }
                    var lastError = ""
                    for attempt in 0..<3 {
                        // Cancelled: the arm is tried at once and the run ends after the group.
                        if attempt > 0 { try? await config.clock.sleep(for: 0.5 * Double(attempt)) }
                        let (measured, problem) = await clock(of: node, over: c)
                        guard let best = measured else { lastError = problem ?? "no clock for \(node.agentURL)"; continue }
                        var nodeSeed = SeededGenerator(seed: seed, stream: "agent/\(spec.name)")
                        let assignment = NodeAssignment(runId: runId, plan: plan, node: spec, seed: nodeSeed.next())
                        do throws(LinkError) {
                            _ = try await c.arm(LabWire.ArmRequest(assignment: assignment, air: air))
                            return (i, best, nil)
                        } catch {
                            lastError = "\(error)"
                            // The agent answered and refused (its radio cannot start, it is busy): no retry helps.
                            if error.isRefusal { break }
                        }
                    }
                    return (i, nil, lastError)
                }
            }
            var out = [(Int, LabWire.ClockSample?, String?)]()
            for await x in group { out.append(x) }
            // In node order, not the order the agents answered in: the run's message names
            // the failures the same way every time.
            return out.sorted { $0.0 < $1.0 }
        }
        if Task.isCancelled { return nil }
        var failures = [String]()
        for (i, sample, error) in results {
            r.nodes[i].clockBefore = sample
            if let error {
                failures.append("agent \(r.nodes[i].agent) (\(r.nodes[i].agentURL)): \(error)")
                r.nodes[i].message = error
                if notCalled(r.nodes[i].agent, chosenAt: r.created) != nil { r.nodes[i].state = .lost }
                agentError(r.nodes[i].agent, error)
            } else { r.nodes[i].state = .armed }
        }
        if !failures.isEmpty {
            _ = await endBeforeStart(r, state: .failed, message: "arming failed: " + failures.joined(separator: "; "))
            return nil
        }
        if run(r.id)?.abortRequested == true {
            _ = await endBeforeStart(r, state: .cancelled, message: "aborted before the start")
            return nil
        }
        // The barrier: everyone is armed; all start at one instant, in each agent's own clock. The
        // margin covers sending the starts (about as long as arming took) and the slowest link.
        let armTime = now - began
        let worstRoundTrip = r.nodes.compactMap { $0.clockBefore?.roundTrip }.max() ?? 0
        let barrier = StartBarrier.compute(startMargin: config.startMargin, maxStartMargin: config.maxStartMargin, armTime: armTime,
                                           worstRoundTrip: worstRoundTrip, nodes: r.nodes.count)
        let margin = barrier.margin
        // A start further ahead than maxStartMargin holds every agent of the run idle for it:
        // the run is refused, naming the slowest clock, and its agents are released.
        guard barrier.bounded else {
            let slowest = r.nodes.max { ($0.clockBefore?.roundTrip ?? 0) < ($1.clockBefore?.roundTrip ?? 0) }
            let who = slowest.map { "agent \($0.agent) (\($0.agentURL)), round trip \(String(format: "%.3f", $0.clockBefore?.roundTrip ?? 0)) s" } ?? "no agent"
            _ = await endBeforeStart(r, state: .failed, message: "the start cannot be bounded: a margin of \(String(format: "%.1f", margin)) s is over \(String(format: "%.0f", config.maxStartMargin)) s (arming took \(String(format: "%.1f", armTime)) s; slowest clock: \(who))")
            return nil
        }
        let startAt = now + margin
        r.startAt = startAt
        r.state = .running
        update(r)
        await sendStarts(r)
        logger.notice("run \(r.id) armed on \(r.nodes.count) agents in \(String(format: "%.2f", armTime)) s; starting at \(HeraldTimestamp.iso8601(Date(timeIntervalSince1970: startAt))) (margin \(String(format: "%.2f", margin)) s, worst round trip \(String(format: "%.1f", worstRoundTrip * 1000)) ms; clocks: \(r.nodes.filter { $0.clockBefore?.from == .heartbeats }.count) from heartbeats, \(r.nodes.filter { $0.clockBefore?.from == .probes }.count) probed)", metadata: ["run": .string(r.id)])
        return r
    }

    /// Ends a run that never started (arming failed, cancelled, aborted early): every agent that
    /// may have armed is told to release it, so none is left busy.
    func endBeforeStart(_ record: RunRecord, state: RunRecord.State, message: String) async -> RunRecord {
        var r = record
        r.state = state
        r.message = message
        update(r)
        logger.warning("run \(r.id) \(state.rawValue): \(message)", metadata: ["run": .string(r.id)])
        await tellAir(.ended(run: r.id, at: now))
        let id = r.id
        await withTaskGroup(of: Void.self) { group in
            for n in r.nodes {
                group.addTask { [self, r] in
                    guard let c = linkOrSkip(n, of: r, "release") else { return }
                    do throws(LinkError) { try await c.release(id) } catch {
                        if let status = error.status {
                            if status != 404 { agentError(n.agent, "release of run \(id) refused: HTTP \(status) \(error.message)") }
                        } else { agentError(n.agent, "release of run \(id) failed: \(error)") }
                    }
                }
            }
        }
        return r
    }

    /// Sends each node (or those in `only`) its start, `attempts` times at most; returns the
    /// nodes that took it, and those that did not although their agent may yet (it did not
    /// answer, or not properly): the start is still owed to them. An agent that refuses it (4xx)
    /// is not asked again.
    @discardableResult
    func sendStarts(_ r: RunRecord, only: Set<String>? = nil, attempts: Int = 3) async -> (taken: Set<String>, owed: Set<String>) {
        guard let startAt = r.startAt else { return ([], []) }
        return await withTaskGroup(of: (node: String, taken: Bool?).self) { group in
            for n in r.nodes where only?.contains(n.name) ?? true {
                let offset = n.clockBefore?.offset ?? 0
                group.addTask { [self] in
                    guard let c = linkOrSkip(n, of: r, "the start") else { return (n.name, nil) }
                    var lastError = LinkError(status: nil, message: "not sent")
                    for attempt in 0..<max(1, attempts) {
                        // Cancelled: the start is tried at once, as before a cancellation was seen.
                        if attempt > 0 { try? await config.clock.sleep(for: 0.3 * Double(attempt)) }
                        do throws(LinkError) {
                            let s = try await c.start(LabWire.StartRequest(runId: r.id, startAt: startAt + offset))
                            if let m = s.message, s.runId == r.id { logger.info("agent \(n.agent): \(m)", metadata: ["run": .string(r.id), "node": .string(n.name), "agent": .string(n.agent)]) }
                            return (n.name, true)
                        } catch {
                            lastError = error
                            if error.isRefusal { break }
                        }
                    }
                    let owed = !lastError.isRefusal
                    agentError(n.agent, "did not take the start of run \(r.id): \(lastError)")
                    logger.error("agent \(n.agent) (\(n.agentURL)) did not take the start of run \(r.id): \(lastError)\(owed ? "; it is sent again while the run lasts" : "")",
                                 metadata: ["run": .string(r.id), "node": .string(n.name), "agent": .string(n.agent)])
                    return (n.name, owed ? false : nil)
                }
            }
            var taken = Set<String>(), owed = Set<String>()
            for await x in group {
                if x.taken == true { taken.insert(x.node) } else if x.taken == false { owed.insert(x.node) }
            }
            return (taken, owed)
        }
    }

    /// After a coordinator restart (and after arming): agents still armed without a start get it
    /// again. An agent whose status cannot be read gets it too: taking a start it already has
    /// changes nothing on an agent, while a start never sent leaves its node idle for the whole
    /// run. Returns the nodes that still have not taken it (for `watch` to send it again).
    func ensureStarted(_ r: inout RunRecord) async -> Set<String> {
        var missing = Set<String>()
        for n in r.nodes {
            guard let c = linkOrSkip(n, of: r, "a status request") else { continue }
            do throws(LinkError) {
                let s = try await c.status()
                if s.runId == r.id, s.state == .armed, s.startAt == nil { missing.insert(n.name) }
            } catch {
                logger.warning("run \(r.id): status of node \(n.name) on agent \(n.agent) unknown (\(error)); sending its start again",
                               metadata: ["run": .string(r.id), "node": .string(n.name), "agent": .string(n.agent), "error": .string("\(error)")])
                missing.insert(n.name)
            }
        }
        return missing.isEmpty ? [] : await sendStarts(r, only: missing).owed
    }

    /// Tells every agent to stop the run now (abort, or another node failed); each keeps what it logged.
    func stopAgents(_ r: RunRecord) async {
        await withTaskGroup(of: Void.self) { group in
            for n in r.nodes {
                group.addTask { [self] in
                    guard let c = linkOrSkip(n, of: r, "the stop") else { return }
                    do { _ = try await c.stopRun(r.id) } catch {
                        agentError(n.agent, "stop of run \(r.id) failed: \(error)")
                    }
                }
            }
        }
    }

    // MARK: Watching

    /// Follows the heartbeats until the planned end, an abort, or a node failing (returned).
    /// Nodes in `startsOwed` have not taken their start: it is sent again every 2 s until they
    /// take it, refuse it, or show in a heartbeat that they have it.
    func watch(_ r: inout RunRecord, startsOwed: Set<String> = []) async -> String? {
        guard let startAt = r.startAt else { return nil }
        let end = startAt + r.duration + 1.5
        var lastSave = 0.0
        var owed = startsOwed
        var nextStart = now + 2
        while now < end && !Task.isCancelled {
            if !owed.isEmpty, now >= nextStart {
                let sent = await sendStarts(r, only: owed, attempts: 1)
                for name in sent.taken.sorted() {
                    logger.notice("run \(r.id): node \(name) took its start on a later try", metadata: ["run": .string(r.id), "node": .string(name)])
                }
                owed = sent.owed
                nextStart = now + 2
            }
            // An abort arrives through the stored record; take it before writing ours back.
            if run(r.id)?.abortRequested == true { r.abortRequested = true; update(r); return nil }
            let statuses = registry.statuses
            var changed = markNotCalled(&r)
            for i in r.nodes.indices where r.nodes[i].state != .lost {
                guard let s = statuses[r.nodes[i].agent], s.runId == r.id else { continue }
                if s.startAt != nil || s.state != .armed { owed.remove(r.nodes[i].name) }
                r.nodes[i].status = s
                r.nodes[i].state = RunRecord.NodeState(agent: s.state)
                if r.nodes[i].startedAt == nil, let st = s.startedAt {
                    r.nodes[i].startedAt = st - (r.nodes[i].clockBefore?.offset ?? 0)
                }
                changed = true
                if s.state == .failed {
                    let reason = "node \(r.nodes[i].name) on agent \(r.nodes[i].agent) failed: \(s.message ?? "no reason given")"
                    update(r)
                    return reason
                }
            }
            if changed { withLock { s in s.runs[r.id] = r } }
            if now - lastSave > 5 { update(r); lastSave = now }
            // Cancellation ends the loop (its condition).
            try? await config.clock.sleep(for: min(0.5, max(0.05, end - now)))
        }
        update(r)
        return nil
    }

    /// Nodes whose agent is not called any more (revoked, enrolled again since the run chose it)
    /// are lost, with the reason as their message; the run goes on with the others. Returns
    /// whether any node changed.
    func markNotCalled(_ r: inout RunRecord) -> Bool {
        var changed = false
        for i in r.nodes.indices where r.nodes[i].state != .lost {
            guard let why = notCalled(r.nodes[i].agent, chosenAt: r.created) else { continue }
            r.nodes[i].state = .lost
            r.nodes[i].message = why
            changed = true
            logger.warning("run \(r.id): node \(r.nodes[i].name) lost: \(why)",
                           metadata: ["run": .string(r.id), "node": .string(r.nodes[i].name), "agent": .string(r.nodes[i].agent)])
        }
        return changed
    }
}
