import ArgumentParser
import Foundation
import HeraldAnalysis
import HeraldCore
import LabCoordinator
import LabHTTP
import LabNode
import LabPlan

/// `herald-lab run STUDY --coordinator URL [--out DIR]`: a study on a lab. The study expands as
/// `simulate STUDY` expands it (Plan.expandStudy: seeded, interleaved blocks); each run is
/// submitted in order, followed to its end and its bundle fetched into `DIR/<study>/<run>/`;
/// study.json (simulate's, plus each run's coordinator run id, how it ended, and which agent
/// and dongle ran each node) is rewritten durably after every run. A crossover pins the first
/// run's node-to-agent assignment to every later run. A run that fails is recorded and the
/// study goes on; the study then exits 2. The lab is checked against every run's needs
/// (`AgentNeeds.fit`) before the first submission; a run the coordinator refuses stops the
/// study, and a study none of whose runs was taken writes nothing.
extension RunCommand {
    /// What a lab run of the study left: the coordinator's id, how it ended, who ran what.
    struct LabRunOutcome {
        var runId: String?
        var state = "failed"
        var message: String?
        var nodes: [StudySimulation.Record.NodeRun]?
    }

    func runStudy(text: String) async throws {
        let source = plan ?? "plan"
        let base: Plan, runs: [StudyRun]
        do { (base, runs) = try Plan.expandStudy(yaml: text, source: source) } catch {
            log(error.description)
            throw ExitCode(2)
        }
        if junit != nil || summary != nil {
            log("herald-lab run: --junit and --summary do not apply to a study (each run's report is in its folder; compare.json sums them up)")
            throw ExitCode(2)
        }
        for r in runs { if let problem = r.plan.rangeProblems.first { log("herald-lab run: \(source) (\(r.folder)): \(problem)"); throw ExitCode(2) } }
        let personas = base.nodes.filter { $0.persona != nil }
        if !personas.isEmpty {
            log("herald-lab run: \(source): \(personas.map { "\($0.name) (\($0.persona!.rawValue))" }.joined(separator: ", ")): personas are simulated phones; a lab runs Linux nodes only (herald-lab simulate runs the study)")
            throw ExitCode(2)
        }
        let design = base.study?.labDesign ?? .crossover
        let study = StudySimulation(plan: base, planText: text, runs: runs, output: URL(fileURLWithPath: out))
        let index = study.folder.appendingPathComponent("study.json")
        if FileManager.default.fileExists(atPath: index.path) {
            log("herald-lab run: \(study.folder.path) already holds a study; give another --out")
            throw ExitCode(2)
        }
        let client = try options.client()
        // The coordinator is reached, and the lab checked against what every run needs, before
        // anything is submitted or written (issue 40: a lab too small for the study once had
        // every run refused, and a study.json written for a study that never ran).
        let agentViews: [Coordinator.AgentView]
        do {
            let (status, body, _) = try await client.request(CoordinatorAPI.agents.method, CoordinatorAPI.agents.path())
            guard status == 200 else {
                let message = (try? JSONDecoder().decode([String: String].self, from: body))?["error"] ?? String(decoding: body.prefix(500), as: UTF8.self)
                log("herald-lab run: the coordinator at \(coordinator) refused (HTTP \(status)): \(OutsideText.escaped(message))")
                throw ExitCode(2)
            }
            do { agentViews = try JSONDecoder().decode([Coordinator.AgentView].self, from: body) } catch {
                log("herald-lab run: the coordinator at \(coordinator) answered \(CoordinatorAPI.agents) with something that is not a list of agents (\(OutsideText.escaped("\(error)", limit: 300))); nothing submitted")
                throw ExitCode(2)
            }
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab run: cannot reach the coordinator at \(coordinator): \(error)")
            throw ExitCode(2)
        }
        let needs = Plan.needs(of: runs)
        // Busy agents and unusable dongles only narrow the lab: when they cannot be read, the
        // coordinator's own refusal still stops the study at its first run.
        let active: [RunRecord] = (try? await client.call(CoordinatorAPI.runs.method, CoordinatorAPI.runs.path(), as: [RunRecord].self)) ?? []
        let dongleViews: [LabWire.DongleView] = needs.contains { $0.radio == .bluez }
            ? ((try? await client.call(CoordinatorAPI.dongles.method, CoordinatorAPI.dongles.path(query: "history=0"), as: [LabWire.DongleView].self)) ?? []) : []
        let offers = Self.offers(agents: agentViews, runs: active, dongles: dongleViews)
        for n in needs {
            let fit = n.fit(offers)
            if let reason = fit.reason {
                log("herald-lab run: \(source): study \(Format.label(base.study?.name ?? base.name)) \(OutsideText.escaped(reason)); nothing submitted, nothing written (`herald-lab plan check \(CLIConventions.shellQuoted(source))` says what the study needs, `herald-lab agents` what the lab has)")
                throw ExitCode(2)
            }
        }
        let name = Format.label(base.study?.name ?? base.name)
        print("study \(name): \(runs.count) runs of \(base.nodes.count) nodes for \(formatDuration(base.duration)) each, into \(study.folder.path)")
        print(design.description)
        do {
            try Durable.refuseLink(study.folder)
            for r in runs { try Durable.refuseLink(study.folder.appendingPathComponent(r.folder)) }
        } catch {
            log("herald-lab run: \(error)")
            throw ExitCode(2)
        }
        // The study's folder is made at its first run taken: a study that never ran leaves nothing.
        let started = Date()
        var outcomes = [LabRunOutcome]()
        func save() throws {
            var record = study.record(done: outcomes.count)
            record.mode = .lab
            record.coordinator = coordinator
            record.crossover = design.isCrossover
            record.design = design.description
            for (i, o) in outcomes.enumerated() {
                record.runs[i].runId = o.runId
                record.runs[i].state = o.state
                record.runs[i].message = o.message
                record.runs[i].nodes = o.nodes
                record.runs[i].dongles = o.nodes.map { Dictionary($0.compactMap { n in n.dongle?.id.map { (n.node, $0) } }, uniquingKeysWith: { a, _ in a }) }
            }
            let enc = JSONEncoder()
            enc.outputFormatting = [.prettyPrinted, .sortedKeys]
            try FileManager.default.createDirectory(at: study.folder, withIntermediateDirectories: true)
            try Durable.write(try enc.encode(record), to: index)
        }
        // A crossover: the agents (and their dongles) the first run was given, node by node.
        var pins: [String]?
        var pinnedDongles = [String: String?]()
        // Set when the coordinator refuses a run: the study stops there (the next runs would be
        // refused for the same reason).
        var stoppedAt: StudyRun?
        for r in runs {
            var outcome = LabRunOutcome()
            let runText: String
            if design.isCrossover, let pins {
                do { runText = try Plan.pinning(yaml: r.yaml, agents: pins, source: source) } catch {
                    log(error.description)
                    throw ExitCode(2)
                }
            } else {
                runText = r.yaml
            }
            print("\(r.folder): block \(r.block + 1), level \(Format.label(r.level)), seed \(r.seed)\(pins != nil ? ", on the first run's agents" : "")")
            let submitted: RunRecord
            do { submitted = try await Self.submit(client, text: runText, name: "\(base.study?.name ?? base.name)-\(r.folder)") } catch {
                if case SubmitFailure.unreachable = error {
                    log("herald-lab run: \(error); " + (outcomes.isEmpty ? "nothing was run, nothing written" : "study.json keeps the \(outcomes.count) runs before it"))
                    throw ExitCode(2)
                }
                log("herald-lab run: \(r.folder): \(error)")
                guard outcomes.contains(where: { $0.runId != nil }) else {
                    log("herald-lab run: the study stopped at its first run: nothing was run, nothing written")
                    throw ExitCode(2)
                }
                outcome.message = "not run: \(error)"
                outcomes.append(outcome)
                try save()
                stoppedAt = r
                break
            }
            outcome.runId = submitted.id
            outcome.nodes = submitted.nodes.map { .init(node: $0.name, agent: $0.agent, dongle: $0.dongle) }
            if design.isCrossover {
                if pins == nil {
                    pins = submitted.nodes.map(\.agent)
                    for n in submitted.nodes { pinnedDongles[n.name] = n.dongle?.id }
                    print("pinned for every run: " + submitted.nodes.map { n in OutsideText.escaped("\(n.name) -> \(n.agent)" + (n.dongle.map { " (dongle \($0.name) \($0.id ?? "-"))" } ?? "")) }.joined(separator: ", "))
                } else {
                    // The agent is pinned by name; its dongle must be the one it had.
                    let moved = submitted.nodes.filter { n in pinnedDongles[n.name].map { $0 != n.dongle?.id } ?? true }
                    if !moved.isEmpty {
                        let what = moved.map { n in "\(n.name): agent \(n.agent) now drives \(n.dongle?.id ?? "no dongle"), not the pinned \((pinnedDongles[n.name] ?? nil) ?? "none")" }
                        outcome.message = "pinned dongle lost: " + what.joined(separator: "; ")
                        // Said as it went: a run that could not be stopped is not called stopped.
                        var stopped = "the run was stopped"
                        do {
                            let (status, _, _) = try await client.request(CoordinatorAPI.abort.method, CoordinatorAPI.abort.path(submitted.id), body: nil)
                            if status >= 300 { stopped = "stopping the run failed (HTTP \(status)): abort it with herald-lab runs abort \(submitted.id)" }
                        } catch {
                            stopped = "stopping the run failed (\(OutsideText.escaped("\(error)"))): abort it with herald-lab runs abort \(submitted.id)"
                        }
                        log("herald-lab run: \(r.folder) (run \(submitted.id)): \(OutsideText.escaped(outcome.message!)); \(stopped) (a crossover runs every level on the same dongles)")
                        outcomes.append(outcome)
                        try save()
                        continue
                    }
                }
            }
            print("dashboard: \(client.base.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")))\(Coordinator.dashboardPath(run: submitted.id))"); fflush(nil)
            let final: RunRecord
            do { final = try await follow(client, submitted) } catch {
                outcome.message = "the coordinator stopped answering while the run went on"
                outcomes.append(outcome)
                try save()
                throw error
            }
            outcome.state = final.state.rawValue
            outcome.nodes = final.nodes.map { .init(node: $0.name, agent: $0.agent, dongle: $0.dongle) }
            if final.state == .complete || final.state == .aborted {
                do {
                    let bundle = try await Self.fetchBundle(client, final, into: study.folder, folder: r.folder, options: options.pasteable)
                    print("bundle: \(bundle.path)")
                    if final.state == .aborted { outcome.message = "aborted; the bundle holds what the nodes logged until then" }
                } catch {
                    outcome.state = RunRecord.State.failed.rawValue
                    outcome.message = "\(error)"
                }
            } else {
                outcome.message = final.message ?? "the run \(final.state.rawValue)"
            }
            if outcome.state != RunRecord.State.complete.rawValue {
                log("herald-lab run: \(r.folder) (run \(final.id)) \(outcome.state): \(OutsideText.escaped(outcome.message ?? "")); the study goes on")
            }
            outcomes.append(outcome)
            try save()
        }
        print("study: \(study.folder.path) (\(outcomes.count) of \(runs.count) runs in \(String(format: "%.1f", Date().timeIntervalSince(started))) s)")
        try compareStudy(study.folder, runs: runs, title: "Study \(base.study?.name ?? base.name)", command: "run")
        let incomplete = zip(runs, outcomes).filter { $0.1.state != RunRecord.State.complete.rawValue }
        if !incomplete.isEmpty || stoppedAt != nil {
            let notSubmitted = runs.count - outcomes.count
            let listed: String = incomplete.map { "\($0.0.folder) \($0.1.state)" }.joined(separator: ", ")
            var stopped = ""
            if let r = stoppedAt {
                let plural = notSubmitted == 1 ? "" : "s"
                stopped = "; the coordinator refused \(r.folder), so the study stopped there" + (notSubmitted > 0 ? " (\(notSubmitted) run\(plural) not submitted)" : "")
            }
            let count = incomplete.count + notSubmitted
            log("herald-lab run: \(count) of \(runs.count) runs did not complete: \(listed)\(stopped); study.json records them, and compare gives no verdict on arms that lost runs")
            throw ExitCode(2)
        }
    }

    /// The lab as `run STUDY` checks it (`AgentNeeds.fit`): the coordinator's agents, busy when
    /// a run that has not ended holds them (node or spare), their dongles unusable when the
    /// coordinator's health says so (quarantined, maintenance, retired).
    static func offers(agents: [Coordinator.AgentView], runs: [RunRecord], dongles: [LabWire.DongleView]) -> [AgentOffer] {
        let active = runs.filter { !$0.state.isFinal }
        let busyNames = Set(active.flatMap { $0.nodes.map(\.agent) + ($0.spares ?? []).map(\.agent) })
        let busyURLs = Set(active.flatMap { $0.nodes.map(\.agentURL) + ($0.spares ?? []).map(\.agentURL) })
        let health = Dictionary(dongles.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        return agents.map { v in
            var unusable: String?
            if let d = v.info.dongle, let h = health[DongleRecord.key(d)], !h.health.selectable {
                unusable = "dongle \(h.info.name) (\(h.id)) is \(h.health.rawValue)\(h.healthReason.map { ": \($0)" } ?? "")"
            }
            return AgentOffer(info: v.info, alive: v.state == .alive, busy: busyNames.contains(v.info.name) || busyURLs.contains(v.info.url), unusable: unusable)
        }
    }
}
