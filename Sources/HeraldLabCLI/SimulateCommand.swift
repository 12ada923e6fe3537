import ArgumentParser
import Foundation
import HeraldAnalysis
import HeraldCore
import LabNode
import LabPlan

/// `herald-lab simulate PLAN [--out DIR] [--seed N]`
struct SimulateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Run every node of a plan in one process on virtual time and write a results bundle; a study plan runs every level in its seeded interleaved order into OUT/<study>/ and compares the levels."
    )

    @Argument(help: "Plan file (YAML).")
    var plan: String

    @Option(help: "Bundle folder (default: results/<plan>-sim-s<seed>).")
    var out: String?

    @Option(help: "Seed of every random generator (default: the plan's seed).")
    var seed: UInt64?

    @Option(name: .customLong("max-duration"), help: "Simulate at most this long (a duration such as 30s or 2m); a shorter run ends the contact event early.")
    var maxDuration: String?

    @Option(help: "Threads that hand scan reports to the nodes, 1 to 8 (default: both cores); the bundle is the same for any number.")
    var threads: Int?

    @Flag(help: "Print no progress.")
    var quiet = false

    @Option(help: ArgumentHelp("What was simulated as JSON to FILE (--json alone or --json -: standard output, instead of the text): the bundle, plan, seed, nodes and the simulation's figures; for a study, compare's effects (compare.json).", valueName: "FILE"))
    var json: String?

    /// --json of one run.
    struct Simulated: Encodable {
        var bundle, plan: String
        var seed: UInt64
        var nodes: Int
        var simulatedSeconds, wallSeconds: Double
        var advertisingEvents, reportsDelivered: Int
    }

    func run() throws {
        var (plan, text) = try loadPlanWithText(self.plan)
        if let maxDuration {
            guard let cap = Plan.parseDuration(maxDuration), cap > 0, cap <= PlanLimits.maximumDuration else {
                log("herald-lab simulate: --max-duration \"\(maxDuration.prefix(64))\": expected a duration such as 30s, 2m or 1h, more than 0 and at most 7 days")
                throw ExitCode(2)
            }
            if plan.duration > cap {
                plan.duration = cap
                if plan.warmup >= cap { plan.warmup = 0 }
            }
        }
        if let threads, !(1...8).contains(threads) {
            log("herald-lab simulate: --threads \(threads): expected 1 to 8")
            throw ExitCode(2)
        }
        if plan.study != nil { return try runStudy(text: text) }
        let seed = self.seed ?? plan.seed
        let out = URL(fileURLWithPath: self.out ?? "results/\(plan.name)-sim-s\(seed)")
        let sim = Simulation(plan: plan, planText: text, seed: seed, output: out, threads: threads)
        if !quiet { log("simulating \(plan.name): \(plan.nodes.count) nodes for \(formatDuration(plan.duration)) (seed \(seed))") }
        var lastPrinted = Date.distantPast
        let result: Simulation.Result
        if let problem = plan.rangeProblems.first {
            log("herald-lab simulate: \(self.plan): \(problem)")
            throw ExitCode(2)
        }
        do {
            result = try sim.run { fraction in
                guard !quiet, Date().timeIntervalSince(lastPrinted) >= 1 || fraction >= 1 else { return }
                lastPrinted = Date()
                log(String(format: "  %3.0f%%  %@ of %@ simulated", fraction * 100, formatDuration(plan.duration * fraction), formatDuration(plan.duration)))
            }
        } catch let error as SimulationError {
            log("herald-lab simulate: \(error)")
            throw ExitCode(2)
        }
        if let json {
            let e = JSONEncoder()
            e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            e.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
            let data = try e.encode(Simulated(bundle: result.bundle.path, plan: plan.name, seed: seed, nodes: plan.nodes.count, simulatedSeconds: result.simulatedSeconds,
                                              wallSeconds: result.wallSeconds, advertisingEvents: result.advertisingEvents, reportsDelivered: result.reportsDelivered))
            try CLIConventions.writeJSON(data, to: json, command: "simulate")
            if json == "-" { return }
        }
        let rate = result.simulatedSeconds / 3600 / max(result.wallSeconds, 1e-6)
        print("bundle: \(result.bundle.path)")
        print(String(format: "simulated %@ x %d nodes in %.2f s wall: %.2f simulated hours per wall second (%.1f node-hours/s); %d adverts, %d reports; peak memory %.0f MB",
                     formatDuration(result.simulatedSeconds), plan.nodes.count, result.wallSeconds, rate, rate * Double(plan.nodes.count),
                     result.advertisingEvents, result.reportsDelivered, peakMemoryMB()))
        print("next: herald-lab analyse \(CLIConventions.shellQuoted(result.bundle.path))")
    }
}

extension SimulateCommand {
    /// A study: each run simulated and analysed in order, study.json beside them, then compare.
    func runStudy(text: String) throws {
        let base: Plan, runs: [StudyRun]
        do { (base, runs) = try Plan.expandStudy(yaml: text, source: self.plan, seed: seed) } catch {
            log(error.description)
            throw ExitCode(2)
        }
        if maxDuration != nil || threads.map({ !(1...8).contains($0) }) == true {
            if maxDuration != nil { log("herald-lab simulate: --max-duration does not apply to a study (set duration in the plan)") }
            else { log("herald-lab simulate: --threads \(threads!): expected 1 to 8") }
            throw ExitCode(2)
        }
        for r in runs { if let problem = r.plan.rangeProblems.first { log("herald-lab simulate: \(self.plan) (\(r.folder)): \(problem)"); throw ExitCode(2) } }
        let study = StudySimulation(plan: base, planText: text, runs: runs, output: URL(fileURLWithPath: out ?? "results"), threads: threads)
        if FileManager.default.fileExists(atPath: study.folder.appendingPathComponent("study.json").path) {
            log("herald-lab simulate: \(study.folder.path) already holds a study; give another --out")
            throw ExitCode(2)
        }
        let started = Date()
        if !quiet {
            log("study \(Format.label(base.study?.name ?? base.name)): \(runs.count) runs of \(base.nodes.count) nodes for \(formatDuration(base.duration)) each, into \(study.folder.path)")
        }
        do {
            try study.run { run, result in
                let report = try Analyser.analyse(result.bundle)
                try ReportWriter.write(report, to: result.bundle.appendingPathComponent("report"))
                if !quiet { log(String(format: "  %@  block %d  level %@  seed %llu  (%.1f s)", run.folder, run.block + 1, Format.label(run.level), run.seed, result.wallSeconds)) }
            }
        } catch let error as SimulationError {
            log("herald-lab simulate: \(error)")
            throw ExitCode(2)
        } catch let error as Durable.Failure {
            log("herald-lab simulate: \(error)")
            throw ExitCode(2)
        }
        let done = "study: \(study.folder.path) (\(runs.count) runs in \(String(format: "%.1f", Date().timeIntervalSince(started))) s)"
        if json == "-" { log(done) } else { print(done) } // standard output holds the JSON alone
        try compareStudy(study.folder, runs: runs, title: "Study \(base.study?.name ?? base.name)", command: "simulate", json: json)
    }
}

/// The end of a study (simulate STUDY, run STUDY): its levels compared, compare.json and
/// study.html written durably beside study.json, the comparison printed.
func compareStudy(_ folder: URL, runs: [StudyRun], title: String, command: String, json: String? = nil) throws {
    guard let design = try loadStudyFolder(folder.path, command: command), design.levels.count >= 2 else {
        let next = "next: herald-lab compare \(CLIConventions.shellQuoted(folder.path))"
        if json == "-" { log(next) } else { print(next) }
        return
    }
    let outcome = Comparison.compare(design)
    let effects = try Comparison.json(outcome)
    try Durable.write(effects, to: folder.appendingPathComponent("compare.json"))
    let order = runs.map { StudyReport.OrderedRun(index: $0.index, block: $0.block, level: $0.level, seed: $0.seed, bundle: $0.folder) }
    try Durable.write(Data(StudyReport.html(outcome, title: title, order: order).utf8), to: folder.appendingPathComponent("study.html"))
    if let json {
        try CLIConventions.writeJSON(effects, to: json, command: command)
        if json == "-" { return }
    }
    print(Comparison.text(outcome))
    print("report: \(folder.appendingPathComponent("study.html").path)")
}

/// Peak resident memory of this process, MB (getrusage).
func peakMemoryMB() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_maxrss) / 1024
}

func log(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}
