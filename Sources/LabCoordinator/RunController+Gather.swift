import Foundation
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabLink
import LabPlan
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// Gathering: every node's files fetched and verified, made durable, the manifest and report
/// written, the run recorded as ended, and only then the agents told to drop their copies.
extension RunController {
    /// The Herald files a node folder may hold: an agent's file list naming anything else is refused.
    static let heraldFiles: Set<String> = ["contacts.csv", "detection.csv", "statistics.csv", "battery.csv", "log.txt"]

    /// `failure`: why the run is ending early (a node failed), kept as the run's message and state.
    func gather(_ r: inout RunRecord, _ plan: Plan, failure: String? = nil) async {
        let bundle = config.results.appendingPathComponent(r.id)
        let nodesDir = bundle.appendingPathComponent("nodes")
        do { try FileManager.default.createDirectory(at: nodesDir, withIntermediateDirectories: true) } catch {
            return failKeepingCopies(&r, "cannot create the bundle folder \(nodesDir.path): \(error.localizedDescription)")
        }
        // Nodes gathered already (a run gathered again) keep their verified files.
        let todo = r.nodes.indices.filter { !r.nodes[$0].state.isGathered }
        let record = r
        let outcomes = await withTaskGroup(of: (Int, LabWire.FileList?, LabWire.ClockSample?, GatherRefusal?).self) { group in
            for i in todo {
                let n = record.nodes[i]
                group.addTask { [self] in
                    let (list, clock, error) = await gatherNode(record.id, n, chosenAt: record.created, into: nodesDir.appendingPathComponent(n.name))
                    return (i, list, clock, error)
                }
            }
            var out = [(Int, LabWire.FileList?, LabWire.ClockSample?, GatherRefusal?)]()
            for await x in group { out.append(x) }
            return out
        }
        var diskProblem: String?
        for (i, list, clock, error) in outcomes.sorted(by: { $0.0 < $1.0 }) {
            if let clock { r.nodes[i].clockAfter = clock }
            let offset = LabWire.ClockSample.best([r.nodes[i].clockBefore, r.nodes[i].clockAfter].compactMap { $0 })?.offset ?? 0
            guard let list else {
                r.nodes[i].state = .lost
                r.nodes[i].message = error?.message
                if let error {
                    if error.diskFull { diskProblem = error.message } else if !error.notCalled { agentError(r.nodes[i].agent, "gathering run \(r.id): \(error.message)") }
                }
                continue
            }
            if let f = list.failure, list.files.isEmpty {
                r.nodes[i].state = .lost
                r.nodes[i].message = "the node failed and logged nothing: \(f)"
                continue
            }
            r.nodes[i].files = list.files
            r.nodes[i].recoveries = list.recoveries.map { Array($0.prefix(1000)) }
            r.nodes[i].agentStartedAt = list.startedAt
            if let st = list.startedAt { r.nodes[i].startedAt = st - offset }
            if let st = list.startedAt, let at = list.startAt, !list.resumed { r.nodes[i].lateBy = st - at }
            r.nodes[i].gaps = list.gaps.map { $0.map { LabWire.Gap(from: $0.from - offset, to: $0.to - offset, reason: $0.reason) } }
            var why = [String]()
            if let f = list.failure { why.append("the node failed: \(f)") }
            if list.resumed { why.append("the agent restarted during the run") }
            if let g = list.gaps, !g.isEmpty { why.append("\(g.count) gap(s) in the logs: " + g.map { String(format: "%.1f s (%@)", $0.to - $0.from, $0.reason) }.joined(separator: ", ")) }
            if list.aborted == true { why.append("stopped before the planned end") }
            if let w = list.writeError { why.append("log writes failed: \(w)") }
            r.nodes[i].state = why.isEmpty ? .complete : .partial
            r.nodes[i].message = why.isEmpty ? nil : why.joined(separator: "; ")
        }
        if let diskProblem { return failKeepingCopies(&r, "\(diskProblem) (gather again once there is room)") }
        do { try writeManifest(r, plan, bundle: bundle) } catch {
            return failKeepingCopies(&r, "cannot write the bundle's manifest: \(error)")
        }
        let judged = r.nodes.map(\.state)
        var notes = [String]()
        if let failure { notes.append(failure) }
        if let left = r.preflight?.filter({ !$0.ok }), !left.isEmpty {
            notes.append("pre-flight left out " + left.map { "\($0.dongle) (\($0.reason ?? "failed"))" }.joined(separator: ", "))
        }
        // The report. The analyser never traps on what agents send; a failure is noted, not fatal.
        do {
            let report = try Analyser.analyse(bundle)
            try ReportWriter.write(report, to: bundle.appendingPathComponent("report"))
            r.passed = report.result.input.aborted == true ? nil : report.result.passed
            r.headline = Summary.text(report.result, mode: .strict)
            let infra = Regression.infrastructure(report.result)
            r.infra = infra.isEmpty ? nil : infra
            if plan.radio.kind == .bluez {
                // The dongles' side of the run: their history, and the run's outliers.
                let detected = Set(report.result.pairs.filter(\.detected).map { "\(($0.observer as NSString).lastPathComponent)\u{1F}\(($0.observed as NSString).lastPathComponent)" })
                judgeRun(&r, detected: detected)
                if r.nodes.map(\.state) != judged {
                    do { try writeManifest(r, plan, bundle: bundle) } catch { notes.append("cannot rewrite the manifest with the outliers: \(error)") }
                }
            }
            do {
                let history = try HistoryStore(url: config.results.appendingPathComponent("history.sqlite"))
                try history.record(report.result, reportPath: bundle.appendingPathComponent("report").path)
            } catch { logger.error("run \(r.id): not recorded in the history: \(error)", metadata: ["run": .string(r.id)]) }
            if let shared = config.recordRun {
                do { try shared(report.result, bundle) } catch {
                    logger.error("run \(r.id): not queued for the shared history: \(error)", metadata: ["run": .string(r.id)])
                }
            }
        } catch {
            notes.append("analysis failed: \(error)")
        }
        // The archive.
        do { r.bundleSha256 = try archive(r.id) } catch { notes.append("cannot write \(r.id).tar.gz: \(error)") }
        let gathered = r.nodes.filter { $0.state.isGathered }
        if gathered.isEmpty { notes.append("no node could be gathered") }
        // A node with nothing gathered fails the run (docs/API.md): the bundle lacks it.
        let lost = r.nodes.filter { $0.state == .lost }
        if !lost.isEmpty && !gathered.isEmpty { notes.append("lost: " + lost.map { "\($0.name) (\($0.message ?? "nothing gathered"))" }.joined(separator: ", ")) }
        r.bundle = bundle.path
        r.state = failure != nil || gathered.isEmpty || !lost.isEmpty ? .failed : (r.abortRequested == true ? .aborted : .complete)
        // An aborted run has no verdict (issue 40): its logs stop early by request.
        if r.abortRequested == true { r.passed = nil }
        r.message = notes.isEmpty ? nil : notes.joined(separator: "; ")
        // Recorded as ended, durably, before any agent may delete: a crash here gathers again.
        do { try save(r) } catch {
            logger.error("run \(r.id): cannot record the end of the run (\(error)); agents keep their copies", metadata: ["run": .string(r.id)])
            return
        }
        ended(r)
        // The run's air tickets attach nothing more.
        await tellAir(.ended(run: r.id, at: now))
        for n in gathered {
            guard let c = linkOrSkip(n, of: r, "release") else { continue }
            do throws(LinkError) { try await c.release(r.id) } catch {
                if let status = error.status { agentError(n.agent, "release of run \(r.id): HTTP \(status)") } else { agentError(n.agent, "release of run \(r.id) failed: \(error)") }
            }
        }
        // Nodes whose files never arrived: their agents keep them; a failed run that never got
        // anything releases nothing.
        logger.notice("run \(r.id) \(r.state.rawValue): \(bundle.path) (\(r.nodes.map { "\($0.name) \($0.state)" }.joined(separator: ", ")))\(r.message.map { "; \($0)" } ?? "")",
                      metadata: ["run": .string(r.id)])
    }

    /// Ends the run as failed without telling any agent to release: they keep their copies for
    /// `herald-lab runs gather`.
    func failKeepingCopies(_ r: inout RunRecord, _ reason: String) {
        r.state = .failed
        r.message = "\(reason); nothing was released: the agents keep their copies"
        r.agentsKeepCopies = true
        update(r)
        logger.error("run \(r.id) failed: \(r.message!)", metadata: ["run": .string(r.id)])
    }

    /// `<id>.tar.gz` beside the bundle, written to a temporary name, checked, fsynced, renamed;
    /// returns its SHA-256.
    @discardableResult
    func archive(_ id: String) throws -> String {
        let final = config.results.appendingPathComponent("\(id).tar.gz")
        let tmp = config.results.appendingPathComponent(".\(id).tar.gz.tmp")
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        guard SafeName.isValid(id) else { throw LabRefusal(.failed, "run id \(OutsideText.line(id)) \(SafeName.problem(with: id) ?? "is invalid")") }
        // `--` ends tar's options: the run id is an operand whatever it holds.
        tar.arguments = ["-czf", tmp.path, "-C", config.results.path, "--", id]
        let err = Pipe()
        tar.standardError = err
        try tar.run()
        let message = err.fileHandleForReading.readDataToEndOfFile()
        tar.waitUntilExit()
        guard tar.terminationStatus == 0 else {
            try? FileManager.default.removeItem(at: tmp)
            throw LabRefusal(.failed, "tar exited with \(tar.terminationStatus): \(String(decoding: message.prefix(300), as: UTF8.self))")
        }
        try Durable.syncFile(tmp)
        let sha = try SHA256.hash(fileAt: tmp).sha256
        guard rename(tmp.path, final.path) == 0 else { throw LabRefusal(.failed, "cannot rename \(tmp.path)") }
        try Durable.syncDirectory(config.results)
        return sha
    }

    /// Fetches one node's file list and files, verifying each SHA-256, retrying with backoff.
    func gatherNode(_ runId: String, _ n: RunRecord.Node, chosenAt: Double, into dir: URL) async -> (LabWire.FileList?, LabWire.ClockSample?, GatherRefusal?) {
        let c: any AgentLink
        do { c = try link(n, chosenAt: chosenAt, timeout: 30) } catch { return (nil, nil, GatherRefusal(message: "\(error)", notCalled: true)) }
        let deadline = now + config.gatherPatience
        var delay = 0.2
        var lastError = "agent \(n.agent) at \(n.agentURL) unreachable"
        var clock: LabWire.ClockSample?
        while now < deadline && !Task.isCancelled {
            if clock == nil { clock = await self.clock(of: n, over: c).0 }
            do {
                let list = try await c.files(of: runId)
                try Self.check(list, runId: runId, node: n.name)
                try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
                try Self.ensureSpace(for: list, in: dir)
                for f in list.files {
                    try await download(c, runId: runId, file: f, to: dir)
                }
                try Durable.syncDirectory(dir)
                try Durable.syncDirectory(dir.deletingLastPathComponent())
                return (list, clock, nil)
            } catch let e as GatherRefusal {
                logger.error("run \(runId): \(n.name) from \(n.agent): \(e.message)", metadata: ["run": .string(runId), "node": .string(n.name), "agent": .string(n.agent)])
                return (nil, clock, e)
            } catch {
                lastError = "\(error)"
            }
            // Cancellation ends the retries (the loop's condition).
            try? await config.clock.sleep(for: delay)
            delay = min(delay * 2, 5)
        }
        logger.error("gave up gathering \(n.name) from \(n.agent) (\(n.agentURL)): \(lastError)", metadata: ["run": .string(runId), "node": .string(n.name), "agent": .string(n.agent)])
        return (nil, clock, GatherRefusal(message: lastError))
    }

    /// A problem retrying cannot fix: the agent's answer is not acceptable, or the disk is full.
    struct GatherRefusal: Error {
        var message: String
        /// The results disk, not the agent, is the problem: the run fails and agents keep their copies.
        var diskFull = false
        /// The agent is not called at all (revoked): nothing was asked of it.
        var notCalled = false
    }

    /// An agent's file list is checked before anything is written: its run and node, names from
    /// the Herald set only (never a path), sizes and checksums that make sense.
    static func check(_ list: LabWire.FileList, runId: String, node: String) throws {
        guard list.runId == runId, list.node == node else {
            throw GatherRefusal(message: "the agent answered for run \(list.runId) node \(list.node), expected run \(runId) node \(node)")
        }
        if let problem = list.problem { throw GatherRefusal(message: "the agent's file list was refused: \(problem); nothing was written") }
        var seen = Set<String>()
        for f in list.files {
            guard heraldFiles.contains(f.name), seen.insert(f.name).inserted else {
                throw GatherRefusal(message: "the agent's file list names \"\(f.name.prefix(80))\", which is not one of the Herald files (or appears twice); nothing was written")
            }
            guard f.bytes >= 0, f.bytes <= 1 << 40, f.sha256.count == 64, f.sha256.allSatisfy(\.isHexDigit) else {
                throw GatherRefusal(message: "the agent's file list gives \(f.name) an impossible size or checksum")
            }
        }
    }

    /// Refuses to start when the results disk cannot hold the files.
    static func ensureSpace(for list: LabWire.FileList, in dir: URL) throws {
        var s = statvfs()
        guard statvfs(dir.path, &s) == 0 else { return }
        let free = Int64(s.f_bavail) * Int64(s.f_frsize)
        let need = list.files.reduce(Int64(0)) { $0 + $1.bytes } + 64 * 1024
        guard free >= need else {
            throw GatherRefusal(message: "the results disk is full: \(need) bytes needed for \(list.node), \(free) free at \(dir.path)", diskFull: true)
        }
    }

    /// Fetches one file into `dir`, resuming a partial copy with a byte range, hashing as it
    /// streams; the file gets its name only once its size and SHA-256 match the agent's and it
    /// is on disk (fsync).
    func download(_ c: any AgentLink, runId: String, file: LabWire.FileInfo, to dir: URL) async throws {
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
            do {
                if try await c.fetchFile(run: runId, name: file.name, from: have, appendingTo: part, hasher: &hasher) == .whole { // the agent ignored the range
                    hasher = SHA256()
                    try hasher.update(contentsOf: part)
                }
            } catch {
                var s = statvfs()
                if statvfs(dir.path, &s) == 0, Int64(s.f_bavail) * Int64(s.f_frsize) < file.bytes - have {
                    throw GatherRefusal(message: "the results disk is full while writing \(file.name) (\(error))", diskFull: true)
                }
                throw error
            }
        }
        let bytes = ((try? fm.attributesOfItem(atPath: part.path))?[.size] as? NSNumber)?.int64Value ?? -1
        let sha = hasher.finalizeHex()
        guard sha == file.sha256, bytes == file.bytes else {
            try? fm.removeItem(at: part)
            throw LinkError(status: nil, message: "\(file.name): checksum mismatch (\(bytes) bytes, expected \(file.bytes)); fetching again")
        }
        try Durable.syncFile(part)
        guard rename(part.path, target.path) == 0 else { throw LinkError(status: nil, message: "cannot rename \(part.path) to \(file.name)") }
    }

    func writeManifest(_ r: RunRecord, _ plan: Plan, bundle: URL) throws {
        let startAt = r.startAt ?? r.created
        var nodes = [Manifest.Node]()
        let views = registry.views
        var delays = [Double]()
        for (i, n) in r.nodes.enumerated() {
            let spec = plan.nodes[i]
            var m = Manifest.Node(name: n.name, identifier: spec.identifier, shortName: spec.shortName, osVersion: n.status?.kernel ?? "unknown", position: spec.position, radio: "air")
            m.bluezVersion = n.status?.bluez
            m.dongle = n.dongle
            m.dongleHealth = n.dongleHealth
            m.recoveries = n.recoveries?.isEmpty == false ? n.recoveries : nil
            let best = LabWire.ClockSample.best([n.clockBefore, n.clockAfter].compactMap { $0 })
            m.clockOffset = best?.offset ?? 0
            m.clockRoundTrip = best?.roundTrip
            m.startedAt = n.startedAt.map { Date(timeIntervalSince1970: $0) }
            if let late = n.lateBy {
                m.startDelayMs = late * 1000
                delays.append(abs(late) * 1000)
            }
            m.state = n.state.manifestState
            m.message = n.message
            m.gaps = n.gaps.map { $0.map { Manifest.Gap(from: Date(timeIntervalSince1970: $0.from), to: Date(timeIntervalSince1970: $0.to), reason: $0.reason) } }
            if let v = views.first(where: { $0.info.name == n.agent }) {
                m.agent = Manifest.AgentInfo(name: v.info.name, url: n.agentURL, tags: v.info.tags, version: v.info.version)
                m.controller = v.info.controller
                m.radio = v.info.radio == .sim ? "air" : v.info.radio.rawValue
            }
            for f in n.files { m.files[f.name] = Manifest.FileEntry(bytes: f.bytes, sha256: f.sha256) }
            nodes.append(m)
        }
        var manifest = Manifest(runId: r.id, createdAt: Date(timeIntervalSince1970: now), mode: .lab, seed: plan.seed, plan: plan, planText: r.planText,
                                contactEvent: plan.contactEvent(startingAt: Date(timeIntervalSince1970: startAt)), nodes: nodes)
        manifest.startAt = r.startAt.map { Date(timeIntervalSince1970: $0) }
        manifest.preflight = r.preflight
        if r.abortRequested == true { manifest.aborted = true }
        manifest.lab = config.lab
        if !delays.isEmpty {
            let s = delays.sorted()
            func pct(_ q: Double) -> Double { s[max(0, min(s.count - 1, Int((q * Double(s.count)).rounded(.up)) - 1))] }
            manifest.startSkew = Manifest.Skew(p50Ms: pct(0.5), p99Ms: pct(0.99), maxMs: s.last!)
        }
        try manifest.write(to: bundle.appendingPathComponent("manifest.json"))
    }
}
