import ArgumentParser
import Foundation
import HeraldAnalysis
import LabHistory

/// `herald-lab compare BUNDLE... | STUDY`
struct CompareCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compare",
        abstract: "Compare runs by the settings that differ (or a study's levels): each metric's difference from the baseline with its 95 % interval and a verdict (better, worse, same, inconclusive with repeats advised).",
        discussion: "Devices are the independent units (cluster bootstrap, seeded); the family of metrics is held to a 5 % family-wise error (Holm). A check that each arm got its devices, pairs and windows comes before any verdict. docs/STATISTICS.md explains the methods."
    )

    @Argument(help: "A study folder (with study.json), or bundles (two or more; node groups of one bundle are arms too); the first level is the baseline.")
    var bundles: [String]

    @Option(help: "Write the effects as JSON to this file (- for standard output).")
    var json: String?

    @Option(help: "Bootstrap resamples (100 to 100000).")
    var resamples: Int = 2000

    @Option(help: "Seed of the bootstrap.")
    var seed: UInt64 = 1

    func run() throws {
        guard (100...100_000).contains(resamples) else { log("herald-lab compare: --resamples \(resamples): expected 100 to 100000"); throw ExitCode(2) }
        var design: Comparison.Design
        if bundles.count == 1, let study = try loadStudyFolder(bundles[0], command: "compare") {
            design = study
        } else {
            guard bundles.count >= 1 else { log("herald-lab compare: give a study folder or at least two bundles"); throw ExitCode(2) }
            var runs = [AnalysisResult]()
            for b in bundles {
                do { runs.append(try SummaryLoader.load(URL(fileURLWithPath: b))) } catch {
                    log("herald-lab compare: \(Format.label(b)): \(error)")
                    throw ExitCode(2)
                }
            }
            switch Comparison.design(runs) {
            case .success(let d): design = d
            case .failure(let e): log("herald-lab compare: \(e)"); throw ExitCode(2)
            }
        }
        guard design.levels.count >= 2 else {
            log("herald-lab compare: one level only (\(Format.label(design.levels.first?.name ?? "-"))); nothing to compare")
            throw ExitCode(2)
        }
        design.resamples = resamples
        design.seed = seed
        let outcome = Comparison.compare(design)
        if let json {
            do {
                let data = try Comparison.json(outcome)
                if json == "-" { FileHandle.standardOutput.write(data); print("") ; return }
                try data.write(to: URL(fileURLWithPath: json), options: .atomic)
            } catch {
                log("herald-lab compare: cannot write \(Format.label(json)): \(error.localizedDescription)")
                throw ExitCode(2)
            }
        }
        print(Comparison.text(outcome))
    }
}

/// `herald-lab regress BUNDLE --baseline BUNDLE|latest`
struct RegressCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "regress",
        abstract: "Compare a run with a baseline; print what regressed; exit 1 on a regression, 0 otherwise (2 on bad input)."
    )

    @Argument(help: "The run to judge (bundle).")
    var bundle: String

    @Option(help: "Baseline bundle, or `latest` for the newest earlier run of the same plan in the history.")
    var baseline: String

    @Option(help: "Percentage points a metric may fall below the baseline (default: the plan's regressionTolerancePct).")
    var tolerance: Double?

    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).")
    var results: String?

    func run() throws {
        if let t = tolerance, !(t.isFinite && t >= 0 && t <= 100) {
            log("herald-lab regress: --tolerance \(t): expected percentage points from 0 to 100")
            throw ExitCode(2)
        }
        let current: AnalysisResult
        do { current = try SummaryLoader.load(URL(fileURLWithPath: bundle)) } catch {
            log("herald-lab regress: \(bundle): \(error)")
            throw ExitCode(2)
        }
        let base: AnalysisResult
        if baseline == "latest" {
            let dir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
            guard let plan = current.input.plan else { log("herald-lab regress: \(bundle) names no plan; give --baseline BUNDLE"); throw ExitCode(2) }
            do {
                let store = try HistoryStore(url: dir.appendingPathComponent("history.sqlite"))
                guard let run = try store.latest(plan: plan, excludingPath: current.input.path) else {
                    log("herald-lab regress: no earlier run of plan \(plan) in \(dir.path)/history.sqlite; analyse a baseline first or give --baseline BUNDLE")
                    throw ExitCode(2)
                }
                base = try store.summary(of: run)
                print("baseline: \(run.runId) (\(run.path), recorded \(run.recordedAt))")
            } catch let e as ExitCode { throw e } catch {
                log("herald-lab regress: history: \(error)")
                throw ExitCode(2)
            }
        } else {
            do { base = try SummaryLoader.load(URL(fileURLWithPath: baseline)) } catch {
                log("herald-lab regress: baseline \(baseline): \(error)")
                throw ExitCode(2)
            }
        }
        let tol = tolerance ?? current.thresholds.regressionTolerancePct
        guard tol.isFinite, tol >= 0, tol <= 100 else {
            log("herald-lab regress: \(tolerance != nil ? "--tolerance" : "regressionTolerancePct of \(bundle)") \(tol): expected percentage points from 0 to 100")
            throw ExitCode(2)
        }
        let (regressions, compared) = Regression.compare(current: current, baseline: base, tolerance: tol)
        for f in compared.prefix(3) { print(String(format: "%@: %.4f -> %.4f (%+.4f)", f.metric, f.baseline, f.current, f.delta)) }
        if regressions.isEmpty {
            print(String(format: "no regression (tolerance %.2f points, %d figures compared)", tol, compared.count))
            return
        }
        print(String(format: "REGRESSION: %d of %d figures fell more than %.2f points:", regressions.count, compared.count, tol))
        for f in regressions { print(String(format: "  %@: %.4f -> %.4f (%+.4f)", f.metric, f.baseline, f.current, f.delta)) }
        throw ExitCode(1)
    }
}

/// `herald-lab history [--plan NAME]`
struct HistoryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "Show the recorded runs and the trend of each headline metric."
    )

    @Option(help: "Only runs of this plan.")
    var plan: String?

    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).")
    var results: String?

    func run() throws {
        let dir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
        let runs: [HistoryStore.Run]
        do { runs = try HistoryStore(url: dir.appendingPathComponent("history.sqlite")).runs(plan: plan) } catch {
            log("herald-lab history: \(error)")
            throw ExitCode(2)
        }
        guard !runs.isEmpty else { print("no runs recorded\(plan.map { " for plan \($0)" } ?? "") in \(dir.path)/history.sqlite"); return }
        func arrow(_ a: Double?, _ b: Double) -> String {
            guard let a else { return " " }
            return b > a + 1e-9 ? "↑" : (b < a - 1e-9 ? "↓" : "=")
        }
        print("recorded             plan            run                          detection%   continuity%   herald cont.%  longevity  verdict")
        var prev: HistoryStore.Run?
        for r in runs {
            let p = prev.flatMap { $0.plan == r.plan ? $0 : nil }
            print(String(format: "%@  %@  %@  %8.2f %@   %9.4f %@   %9.4f %@   %7.4f    %@",
                         r.recordedAt, r.plan.padding(toLength: 14, withPad: " ", startingAt: 0), r.runId.padding(toLength: 27, withPad: " ", startingAt: 0),
                         r.detectionPct, arrow(p?.detectionPct, r.detectionPct), r.continuityPct, arrow(p?.continuityPct, r.continuityPct),
                         r.heraldContinuityPct, arrow(p?.heraldContinuityPct, r.heraldContinuityPct), r.longevity, r.passed ? "pass" : "FAIL"))
            prev = r
        }
    }
}

/// A study folder's design, or nil when `path` is not a folder with study.json (exit 2 on a bad one).
func loadStudyFolder(_ path: String, command: String) throws -> Comparison.Design? {
    let folder = URL(fileURLWithPath: path)
    do {
        guard let index = try StudyIndex.load(folder) else { return nil }
        return try Comparison.design(study: folder, index: index)
    } catch {
        log("herald-lab \(command): \(Format.label(path)): \(error)")
        throw ExitCode(2)
    }
}
