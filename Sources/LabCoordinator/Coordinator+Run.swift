import Foundation
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabPlan

extension Coordinator {
    func client(_ url: String, timeout: TimeInterval = 5) -> LabClient? {
        URL(string: url).map { LabClient(base: $0, token: config.token, timeout: timeout) }
    }

    /// Runs a run from wherever it is to its end: arm, start together, watch, gather.
    func drive(_ id: String) async {
        guard var r = run(id), let plan = try? Plan.parse(yaml: r.planText, source: r.plan) else { return }
        if r.state == .arming {
            if r.startAt == nil {
                guard let armed = await arm(r, plan) else { return }
                r = armed
            } else {
                r.state = .running
                update(r)
            }
        }
        if r.state == .running {
            await ensureStarted(&r)
            await watch(&r)
            if Task.isCancelled { return }
            r.state = .gathering
            update(r)
        }
        if r.state == .gathering {
            await gather(&r, plan)
        }
    }

    // MARK: Clock

    /// Clock probes over one kept-alive connection (plain socket: sub-millisecond round trips on a
    /// LAN); falls back to the HTTP client when that fails.
    func probe(_ c: LabClient, count: Int) async -> [LabWire.ClockSample] {
        let base = c.base, token = c.token
        let fast = await ClockProbe.probe(base, token: token, count: count)
        if !fast.isEmpty { return fast.map { LabWire.ClockSample(offset: $0.offset, roundTrip: $0.roundTrip) } }
        var out = [LabWire.ClockSample]()
        for _ in 0..<count {
            let t0 = now
            guard let reply: LabWire.ClockReply = try? await c.call("POST", "/v1/clock", Empty()) else { continue }
            let t3 = now
            out.append(LabWire.ClockSample(t0: t0, t1: reply.received, t2: reply.sent, t3: t3))
        }
        return out
    }

    // MARK: Arming and the start barrier

    func arm(_ record: RunRecord, _ plan: Plan) async -> RunRecord? {
        var r = record
        let seed = plan.seed
        let runId = record.id
        let nodesToArm = record.nodes
        let results = await withTaskGroup(of: (Int, LabWire.ClockSample?, String?).self) { group in
            for (i, node) in nodesToArm.enumerated() {
                let spec = plan.nodes[i]
                let air = record.air
                group.addTask { [self] in
                    guard let c = client(node.agentURL) else { return (i, nil, "bad agent URL \(node.agentURL)") }
                    var lastError = ""
                    for attempt in 0..<3 {
                        if attempt > 0 { try? await Task.sleep(nanoseconds: UInt64(0.5 * Double(attempt) * 1e9)) }
                        let samples = await probe(c, count: 8)
                        guard let best = LabWire.ClockSample.best(samples) else { lastError = "no answer to clock probes"; continue }
                        var nodeSeed = SeededGenerator(seed: seed, stream: "agent/\(spec.name)")
                        let assignment = NodeAssignment(runId: runId, plan: plan, node: spec, seed: nodeSeed.next())
                        do {
                            let _: LabWire.AgentStatus = try await c.call("POST", "/v1/arm", LabWire.ArmRequest(assignment: assignment, air: air))
                            return (i, best, nil)
                        } catch { lastError = "\(error)" }
                    }
                    return (i, nil, lastError)
                }
            }
            var out = [(Int, LabWire.ClockSample?, String?)]()
            for await x in group { out.append(x) }
            return out
        }
        if Task.isCancelled { return nil }
        var failures = [String]()
        for (i, sample, error) in results {
            r.nodes[i].clockBefore = sample
            if let error { failures.append("\(r.nodes[i].agent): \(error)"); r.nodes[i].message = error } else { r.nodes[i].state = "armed" }
        }
        if !failures.isEmpty {
            r.state = .failed
            r.message = "arming failed: " + failures.joined(separator: "; ")
            update(r)
            log("coordinator: run \(r.id) failed: \(r.message!)")
            for n in r.nodes { if let c = client(n.agentURL) { _ = try? await c.request("POST", "/v1/runs/\(r.id)/release") } }
            return nil
        }
        // The barrier: everyone is armed; all start at one instant, in each agent's own clock.
        let startAt = now + config.startMargin + 0.002 * Double(r.nodes.count)
        r.startAt = startAt
        r.state = .running
        update(r)
        await sendStarts(r)
        log("coordinator: run \(r.id) armed on \(r.nodes.count) agents; starting at \(HeraldTimestamp.iso8601(Date(timeIntervalSince1970: startAt)))")
        return r
    }

    func sendStarts(_ r: RunRecord, only: Set<String>? = nil) async {
        guard let startAt = r.startAt else { return }
        await withTaskGroup(of: Void.self) { group in
            for n in r.nodes where only?.contains(n.name) ?? true {
                let offset = n.clockBefore?.offset ?? 0
                group.addTask { [self] in
                    guard let c = client(n.agentURL) else { return }
                    for attempt in 0..<3 {
                        if (try? await c.call("POST", "/v1/start", LabWire.StartRequest(runId: r.id, startAt: startAt + offset), as: LabWire.AgentStatus.self)) != nil { return }
                        try? await Task.sleep(nanoseconds: UInt64(0.3 * Double(attempt + 1) * 1e9))
                    }
                    log("coordinator: agent \(n.agent) did not take the start of run \(r.id)")
                }
            }
        }
    }

    /// After a coordinator restart: agents still armed without a start get it again.
    func ensureStarted(_ r: inout RunRecord) async {
        var missing = Set<String>()
        for n in r.nodes {
            guard let c = client(n.agentURL) else { continue }
            if let s: LabWire.AgentStatus = try? await c.call("GET", "/v1/status"), s.runId == r.id, s.state == .armed, s.startAt == nil { missing.insert(n.name) }
        }
        if !missing.isEmpty { await sendStarts(r, only: missing) }
    }

    // MARK: Watching

    func watch(_ r: inout RunRecord) async {
        guard let startAt = r.startAt else { return }
        let end = startAt + r.duration + 1.5
        var lastSave = 0.0
        while now < end && !Task.isCancelled {
            let statuses = withLock { agentsStatus() }
            var changed = false
            for i in r.nodes.indices {
                guard let s = statuses[r.nodes[i].agent], s.runId == r.id else { continue }
                r.nodes[i].status = s
                r.nodes[i].state = s.state.rawValue
                if r.nodes[i].startedAt == nil, let st = s.startedAt {
                    r.nodes[i].startedAt = st - (r.nodes[i].clockBefore?.offset ?? 0)
                }
                changed = true
            }
            if changed { withLock { runs[r.id] = r } }
            if now - lastSave > 5 { update(r); lastSave = now }
            try? await Task.sleep(nanoseconds: UInt64(min(0.5, max(0.05, end - now)) * 1e9))
        }
        update(r)
    }

    /// Latest heartbeat status per agent (call with the lock held).
    func agentsStatus() -> [String: LabWire.AgentStatus] {
        var out = [String: LabWire.AgentStatus]()
        for (name, a) in agents { if let s = a.status { out[name] = s } }
        return out
    }

    // MARK: Gathering

    func gather(_ r: inout RunRecord, _ plan: Plan) async {
        let bundle = config.results.appendingPathComponent(r.id)
        let nodesDir = bundle.appendingPathComponent("nodes")
        try? FileManager.default.createDirectory(at: nodesDir, withIntermediateDirectories: true)
        let record = r
        let outcomes = await withTaskGroup(of: (Int, LabWire.FileList?, LabWire.ClockSample?, String?).self) { group in
            for (i, n) in record.nodes.enumerated() {
                group.addTask { [self] in
                    let (list, clock, error) = await gatherNode(record.id, n, into: nodesDir.appendingPathComponent(n.name))
                    return (i, list, clock, error)
                }
            }
            var out = [(Int, LabWire.FileList?, LabWire.ClockSample?, String?)]()
            for await x in group { out.append(x) }
            return out
        }
        for (i, list, clock, error) in outcomes {
            r.nodes[i].clockAfter = clock
            if let list {
                r.nodes[i].files = list.files
                r.nodes[i].state = list.resumed ? "partial" : "complete"
                // The actual start in coordinator time, by the clock measured after the run (independent
                // of the estimate the start instant was converted with, so the skew shows its error too).
                if let st = list.startedAt { r.nodes[i].startedAt = st - ((clock ?? r.nodes[i].clockBefore)?.offset ?? 0) }
                if list.resumed { r.nodes[i].message = "agent restarted during the run: logs have a gap" }
            } else {
                // Whatever reached us is kept; a node without verified files is lost.
                r.nodes[i].state = "lost"
                r.nodes[i].message = error
            }
        }
        do {
            try writeManifest(r, plan, bundle: bundle)
        } catch {
            r.state = .failed
            r.message = "cannot write the bundle: \(error)"
            update(r)
            return
        }
        // The report.
        do {
            let report = try Analyser.analyse(bundle)
            try ReportWriter.write(report, to: bundle.appendingPathComponent("report"))
            r.passed = report.result.passed
            r.headline = Summary.text(report.result, mode: "strict")
            if let history = try? HistoryStore(url: config.results.appendingPathComponent("history.sqlite")) {
                try? history.record(report.result, reportPath: bundle.appendingPathComponent("report").path)
            }
        } catch {
            r.message = "analysis failed: \(error)"
        }
        // The archive, then the agents may drop their copies.
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        tar.arguments = ["-czf", config.results.appendingPathComponent("\(r.id).tar.gz").path, "-C", config.results.path, r.id]
        do { try tar.run(); tar.waitUntilExit() } catch { r.message = "cannot write \(r.id).tar.gz: \(error)" }
        for n in r.nodes where n.state == "complete" || n.state == "partial" {
            guard let c = client(n.agentURL) else { continue }
            _ = try? await c.request("POST", "/v1/runs/\(r.id)/release")
        }
        r.bundle = bundle.path
        r.state = .complete
        update(r)
        log("coordinator: run \(r.id) complete: \(bundle.path) (\(r.nodes.map { "\($0.name) \($0.state)" }.joined(separator: ", ")))")
    }

    /// Fetches one node's file list and files, verifying each SHA-256, retrying with backoff.
    func gatherNode(_ runId: String, _ n: RunRecord.Node, into dir: URL) async -> (LabWire.FileList?, LabWire.ClockSample?, String?) {
        guard let c = client(n.agentURL, timeout: 30) else { return (nil, nil, "bad agent URL") }
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let deadline = now + config.gatherPatience
        var delay = 0.2
        var lastError = "agent \(n.agent) unreachable"
        var clock: LabWire.ClockSample?
        while now < deadline && !Task.isCancelled {
            if clock == nil { clock = LabWire.ClockSample.best(await probe(c, count: 8)) }
            do {
                let list: LabWire.FileList = try await c.call("GET", "/v1/runs/\(runId)/files")
                for f in list.files {
                    try await download(c, runId: runId, file: f, to: dir)
                }
                return (list, clock, nil)
            } catch {
                lastError = "\(error)"
            }
            try? await Task.sleep(nanoseconds: UInt64(delay * 1e9))
            delay = min(delay * 2, 5)
        }
        log("coordinator: gave up gathering \(n.name) from \(n.agent): \(lastError)")
        return (nil, clock, lastError)
    }

    /// Fetches one file into `dir`, resuming a partial copy with a byte range, hashing as it
    /// streams; the file gets its name only once its size and SHA-256 match the agent's.
    func download(_ c: LabClient, runId: String, file: LabWire.FileInfo, to dir: URL) async throws {
        let target = dir.appendingPathComponent(file.name)
        if let (sha, bytes) = try? SHA256.hash(fileAt: target), sha == file.sha256, bytes == file.bytes { return }
        let part = dir.appendingPathComponent(".\(file.name).part")
        let fm = FileManager.default
        if !fm.fileExists(atPath: part.path) { fm.createFile(atPath: part.path, contents: nil) }
        var have = ((try? fm.attributesOfItem(atPath: part.path))?[.size] as? NSNumber)?.int64Value ?? 0
        if have > file.bytes { try Data().write(to: part); have = 0 }
        var hasher = SHA256()
        if have > 0 { try hasher.update(contentsOf: part) } // what is already there; then ask for the rest
        if have < file.bytes {
            let url = c.base.appendingPathComponent("v1/runs/\(runId)/files/\(file.name)")
            var headers = ["Authorization": "Bearer \(c.token ?? "")"]
            if have > 0 { headers["Range"] = "bytes=\(have)-" }
            let result = try FileDownload.get(url, headers: headers, appendingTo: part, hasher: &hasher, timeout: 60)
            if result.status == 200, have > 0 { // the agent ignored the range: the file was rewritten whole
                hasher = SHA256()
                try hasher.update(contentsOf: part)
            }
        }
        let bytes = ((try? fm.attributesOfItem(atPath: part.path))?[.size] as? NSNumber)?.int64Value ?? -1
        let sha = hasher.finalizeHex()
        guard sha == file.sha256, bytes == file.bytes else {
            try? fm.removeItem(at: part)
            throw LabClient.Failure(status: nil, message: "\(file.name): checksum mismatch (\(bytes) bytes, expected \(file.bytes)); fetching again")
        }
        if fm.fileExists(atPath: target.path) { try fm.removeItem(at: target) }
        try fm.moveItem(at: part, to: target)
    }

    func writeManifest(_ r: RunRecord, _ plan: Plan, bundle: URL) throws {
        let startAt = r.startAt ?? r.created
        var nodes = [Manifest.Node]()
        let views = agentViews
        var skews = [Double]()
        for (i, n) in r.nodes.enumerated() {
            let spec = plan.nodes[i]
            var m = Manifest.Node(name: n.name, identifier: spec.identifier, shortName: spec.shortName, osVersion: "6.1", position: spec.position, radio: "air")
            let best = LabWire.ClockSample.best([n.clockBefore, n.clockAfter].compactMap { $0 })
            m.clockOffset = best?.offset ?? 0
            m.clockRoundTrip = best?.roundTrip
            m.startedAt = n.startedAt.map { Date(timeIntervalSince1970: $0) }
            if let s = n.startedAt { skews.append(abs(s - startAt) * 1000) }
            m.state = Manifest.NodeState(rawValue: n.state) ?? .lost
            if let v = views.first(where: { $0.info.name == n.agent }) {
                m.agent = Manifest.AgentInfo(name: v.info.name, url: v.info.url, tags: v.info.tags, version: v.info.version)
                m.controller = v.info.controller
                m.radio = v.info.radio == "sim" ? "air" : v.info.radio
            }
            for f in n.files { m.files[f.name] = Manifest.FileEntry(bytes: f.bytes, sha256: f.sha256) }
            nodes.append(m)
        }
        var manifest = Manifest(runId: r.id, createdAt: Date(), mode: "lab", seed: plan.seed, plan: plan, planText: r.planText,
                                contactEvent: plan.contactEvent(startingAt: Date(timeIntervalSince1970: startAt)), nodes: nodes)
        if !skews.isEmpty {
            let s = skews.sorted()
            func pct(_ q: Double) -> Double { s[max(0, min(s.count - 1, Int((q * Double(s.count)).rounded(.up)) - 1))] }
            manifest.startSkew = Manifest.Skew(p50Ms: pct(0.5), p99Ms: pct(0.99), maxMs: s.last!)
        }
        try manifest.write(to: bundle.appendingPathComponent("manifest.json"))
    }
}
