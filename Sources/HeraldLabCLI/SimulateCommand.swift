import ArgumentParser
import Foundation
import LabNode
import LabPlan

/// `herald-lab simulate PLAN [--out DIR] [--seed N]`
struct SimulateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Run every node of a plan in one process on virtual time and write a results bundle."
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
        let rate = result.simulatedSeconds / 3600 / max(result.wallSeconds, 1e-6)
        print("bundle: \(result.bundle.path)")
        print(String(format: "simulated %@ x %d nodes in %.2f s wall: %.2f simulated hours per wall second (%.1f node-hours/s); %d adverts, %d reports; peak memory %.0f MB",
                     formatDuration(result.simulatedSeconds), plan.nodes.count, result.wallSeconds, rate, rate * Double(plan.nodes.count),
                     result.advertisingEvents, result.reportsDelivered, peakMemoryMB()))
        print("next: herald-lab analyse \(result.bundle.path)")
    }
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
