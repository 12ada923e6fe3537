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
/// study goes on; the study then exits 2.
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
        let design = base.study?.labDesign ?? .crossover
        let study = StudySimulation(plan: base, planText: text, runs: runs, output: URL(fileURLWithPath: out))
        let index = study.folder.appendingPathComponent("study.json")
        if FileManager.default.fileExists(atPath: index.path) {
            log("herald-lab run: \(study.folder.path) already holds a study; give another --out")
            throw ExitCode(2)
        }
        let client = try options.client()
        // The coordinator is reached before anything is written.
        do {
            let (status, body, _) = try await client.request(CoordinatorAPI.agents.method, CoordinatorAPI.agents.path())
            guard status == 200 else {
                let message = (try? JSONDecoder().decode([String: String].self, from: body))?["error"] ?? String(decoding: body.prefix(500), as: UTF8.self)
                log("herald-lab run: the coordinator at \(coordinator) refused (HTTP \(status)): \(OutsideText.escaped(message))")
                throw ExitCode(2)
            }
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab run: cannot reach the coordinator at \(coordinator): \(error)")
            throw ExitCode(2)
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
        try FileManager.default.createDirectory(at: study.folder, withIntermediateDirectories: true)
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
            try Durable.write(try enc.encode(record), to: index)
        }
        // A crossover: the agents (and their dongles) the first run was given, node by node.
        var pins: [String]?
        var pinnedDongles = [String: String?]()
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
                    log("herald-lab run: \(error); study.json keeps the \(outcomes.count) runs before it")
                    throw ExitCode(2)
                }
                outcome.message = "not run: \(error)"
                log("herald-lab run: \(r.folder): \(error)")
                outcomes.append(outcome)
                try save()
                continue
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
                        _ = try? await client.request(CoordinatorAPI.abort.method, CoordinatorAPI.abort.path(submitted.id), body: nil)
                        log("herald-lab run: \(r.folder) (run \(submitted.id)): \(OutsideText.escaped(outcome.message!)); the run was stopped (a crossover runs every level on the same dongles)")
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
        print("study: \(study.folder.path) (\(runs.count) runs in \(String(format: "%.1f", Date().timeIntervalSince(started))) s)")
        try compareStudy(study.folder, runs: runs, title: "Study \(base.study?.name ?? base.name)", command: "run")
        let incomplete = zip(runs, outcomes).filter { $0.1.state != RunRecord.State.complete.rawValue }
        if !incomplete.isEmpty {
            log("herald-lab run: \(incomplete.count) of \(runs.count) runs did not complete: " + incomplete.map { "\($0.0.folder) \($0.1.state)" }.joined(separator: ", ") + "; study.json records them, and compare gives no verdict on arms that lost runs")
            throw ExitCode(2)
        }
    }
}
