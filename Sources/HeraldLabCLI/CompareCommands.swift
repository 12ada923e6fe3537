import ArgumentParser
import Foundation
import HeraldCore
import HeraldAnalysis
import LabHistory
import LabResults

/// `herald-lab compare BUNDLE... | STUDY`
struct CompareCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compare",
        abstract: "Compare runs by the settings that differ (or a study's levels): each metric's difference from the baseline with its 95 % interval and a verdict (better, worse, same, inconclusive with repeats advised).",
        discussion: "Devices are the independent units (cluster bootstrap, seeded); the family of metrics is held to a 5 % family-wise error (Holm). A check that each arm got its devices, pairs and windows comes before any verdict. docs/STATISTICS.md explains the methods. With --history postgres://… --lab A --lab B --plan P: two labs' nightly series of one plan from the shared results store (their last --last clean runs each; lab A the baseline), each night's devices (dongles) the units, nights resampled too."
    )

    @Argument(help: "A study folder (with study.json), or bundles (two or more; node groups of one bundle are arms too); the first level is the baseline. None with --history.")
    var bundles: [String] = []

    @OptionGroup var store: HistoryReadOptions

    @Option(help: "With --history: the plan whose nightly series are compared.")
    var plan: String?

    @Option(help: "With --history: only runs of this variant of the plan.")
    var variant: String?

    @Option(help: "With --history: each lab's last N clean runs (1 to 1000; default 30).")
    var last: Int?

    @Option(help: ArgumentHelp("Write the effects as JSON to FILE (--json alone or --json -: standard output, instead of the text).", valueName: "FILE"))
    var json: String?

    @Option(help: "Write the study report (forest plot, per-level figures, run order; self-contained HTML) to this file.")
    var html: String?

    @Option(help: "Bootstrap resamples (100 to 100000).")
    var resamples: Int = 2000

    @Option(help: "Seed of the bootstrap.")
    var seed: UInt64 = 1

    func run() async throws {
        guard (100...100_000).contains(resamples) else { log("herald-lab compare: --resamples \(resamples): expected 100 to 100000"); throw ExitCode(2) }
        var design: Comparison.Design
        var order = [StudyReport.OrderedRun]()
        var title = "Comparison"
        if store.history != nil {
            try store.check("compare", most: 2, least: 2)
            guard bundles.isEmpty else { log("herald-lab compare: give bundles or a study, or --history with --lab A --lab B --plan P, not both"); throw ExitCode(2) }
            guard let plan, !plan.isEmpty else { log("herald-lab compare: --plan: needed with --history (the plan whose nightly series are compared)"); throw ExitCode(2) }
            guard store.labs[0] != store.labs[1] else { log("herald-lab compare: --lab: two different labs (\(Format.label(store.labs[0])) twice)"); throw ExitCode(2) }
            if let last, !(1...1000).contains(last) { log("herald-lab compare: --last \(last): expected 1 to 1000"); throw ExitCode(2) }
            design = try await labsDesign(plan: plan)
            title = "Plan \(plan): lab \(store.labs[1]) against lab \(store.labs[0])"
        } else if plan != nil || variant != nil || last != nil {
            let given = [("--plan", plan != nil), ("--variant", variant != nil), ("--last", last != nil)].filter(\.1).map(\.0)
            log("herald-lab compare: \(given.joined(separator: ", ")) go\(given.count == 1 ? "es" : "") with --history postgres://USER@HOST/DB --lab A --lab B")
            throw ExitCode(2)
        } else if bundles.count == 1, let (study, index) = try loadStudy(bundles[0], command: "compare") {
            design = study
            title = "Study \(index.study)"
            order = index.runs.map { StudyReport.OrderedRun(index: $0.index, block: $0.block, level: $0.level, seed: $0.seed, bundle: $0.bundle) }
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
        if let html {
            do { try Data(StudyReport.html(outcome, title: title, order: order).utf8).write(to: URL(fileURLWithPath: html), options: .atomic) } catch {
                log("herald-lab compare: cannot write \(Format.label(html)): \(error.localizedDescription)")
                throw ExitCode(2)
            }
        }
        if let json {
            do {
                let data = try Comparison.json(outcome)
                if json == "-" { print(String(decoding: data, as: UTF8.self)); return }
                try data.write(to: URL(fileURLWithPath: json), options: .atomic)
            } catch {
                log("herald-lab compare: cannot write \(Format.label(json)): \(error.localizedDescription)")
                throw ExitCode(2)
            }
        }
        print(Comparison.text(outcome))
    }

    /// Two labs' nightly series of `plan` from the shared store (CrossLabComparison).
    func labsDesign(plan: String) async throws -> Comparison.Design {
        guard let shared = try await store.sharedStore("compare") else { throw ExitCode(2) }
        do {
            let design = try await CrossLabComparison.design(plan: plan, labs: store.labs, variant: variant, last: last ?? 30, reader: shared)
            await shared.close()
            return design
        } catch let e as CrossLabComparison.Problem {
            await shared.close()
            log("herald-lab compare: plan \(Format.label(plan)) in \(shared.location): \(e)")
            throw ExitCode(2)
        } catch {
            await shared.close()
            log("herald-lab compare: \(shared.location): \(error)")
            throw ExitCode(2)
        }
    }
}

/// `herald-lab regress BUNDLE --baseline ...` (judge, the default) and `herald-lab regress accept PLAN ...`.
struct RegressCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "regress",
        abstract: "Judge a run against its history (or one baseline run), knowing the noise: exit 0 no regression, 1 regression, 3 inconclusive or infra (2 on bad input); `regress accept PLAN` accepts the level an open alert flagged.",
        subcommands: [RegressJudgeCommand.self, RegressAcceptCommand.self],
        defaultSubcommand: RegressJudgeCommand.self)
}

/// `herald-lab regress [judge] BUNDLE --baseline history|latest|BUNDLE`
struct RegressJudgeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "judge",
        abstract: "Judge a run against its history (or one baseline run), knowing the noise: exit 0 no regression, 1 regression, 3 inconclusive or infra (2 on bad input).",
        discussion: """
        --baseline history: the last --last runs (default 10) of the same plan, variant, settings and testbed in history.sqlite; \
        a metric regresses when it is worse than their mean by more than its tolerance and beyond their prediction interval \
        (Bonferroni over the metrics). Fewer than 3 such runs: inconclusive (exit 3), saying what is missing. \
        --baseline latest or BUNDLE: one baseline run, with the within-run noise (device bootstrap, Holm over the metrics). \
        A run with infrastructure faults (nodes not complete, gaps, dongle recoveries) is judged on the nodes without faults and the pairs between them: a regression there is exit 1 with the faults noted, else `infra` (exit 3); an aborted run is `infra`. The last 60 healthy nights are searched for change points (E-Divisive), printed as `change point:` lines. \
        A baseline bundle of another plan is refused. docs/STATISTICS.md explains the methods. \
        With --history postgres://… (issue 41) the history is the shared results store's, and the run is judged as lab --lab \
        (default: this machine's name) against that lab's own runs only, never another lab's; its alerts are that lab's. \
        Against history, a flagged night opens an alert: every later night stays flagged (exit 1) until the level returns \
        or `herald-lab regress accept PLAN --by WHO --reason WHY` accepts it; flagged nights are not baselines until then.
        """
    )

    @Argument(help: "The run to judge (bundle).")
    var bundle: String

    @Option(help: "history (the last runs like this one), latest (the newest earlier run like this one), or a baseline bundle.")
    var baseline: String

    @Option(help: "Runs of history to judge against (2 to 100).")
    var last: Int = 10

    @Option(help: "Percentage points a percentage may fall (default: the plan's regressionTolerancePct); rates and times may worsen by this many percent, at least 10 %.")
    var tolerance: Double?

    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).")
    var results: String?

    @OptionGroup var store: HistoryReadOptions

    @Option(help: ArgumentHelp("Write the judgement as JSON to FILE (--json alone or --json -: standard output, instead of the text).", valueName: "FILE"))
    var json: String?

    func run() async throws {
        if let t = tolerance, !(t.isFinite && t >= 0 && t <= 100) {
            log("herald-lab regress: --tolerance \(t): expected percentage points from 0 to 100")
            throw ExitCode(2)
        }
        guard (2...100).contains(last) else { log("herald-lab regress: --last \(last): expected 2 to 100"); throw ExitCode(2) }
        try store.check("regress", most: 1)
        if store.history != nil, baseline != "history", baseline != "latest" {
            log("herald-lab regress: --history goes with --baseline history or latest (a baseline bundle is read from disk, not from the store)")
            throw ExitCode(2)
        }
        let current: AnalysisResult
        do { current = try SummaryLoader.load(URL(fileURLWithPath: bundle)) } catch {
            log("herald-lab regress: \(Format.label(bundle)): \(error)")
            throw ExitCode(2)
        }
        let tol = tolerance ?? current.thresholds.regressionTolerancePct
        guard tol.isFinite, tol >= 0, tol <= 100 else {
            log("herald-lab regress: regressionTolerancePct of \(Format.label(bundle)) \(tol): expected percentage points from 0 to 100")
            throw ExitCode(2)
        }
        let judgement: Regression.Judgement
        if let shared = try await store.sharedStore("regress") {
            do { judgement = try await judgeShared(current, store: shared, tolerance: tol) } catch {
                await shared.close()
                throw error
            }
            await shared.close()
        } else if baseline == "history" || baseline == "latest" {
            let dir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
            guard let plan = current.input.plan else { log("herald-lab regress: \(Format.label(bundle)) names no plan (not a bundle?); give --baseline BUNDLE"); throw ExitCode(2) }
            do {
                let store = try HistoryStore(url: dir.appendingPathComponent("history.sqlite"))
                if baseline == "latest" {
                    guard let run = try store.latest(like: current) else {
                        let others = try store.count(plan: plan)
                        log("herald-lab regress: no earlier run of plan \(Format.label(plan)) with this variant, these settings and this testbed in \(dir.path)/history.sqlite (\(others) run\(others == 1 ? "" : "s") of the plan in all); analyse a baseline first or give --baseline BUNDLE")
                        throw ExitCode(3)
                    }
                    judgement = Regression.judge(current: current, baseline: try store.summary(of: run), tolerancePct: tol)
                } else {
                    let runs = try store.baseline(like: current, last: last)
                    var history = try runs.map { try store.summary(of: $0) }
                    let alertOpen = try store.alerts(like: current).contains { $0.state == .regressed }
                    if history.count < Regression.minimumHistory && !alertOpen {
                        // Say what else the history holds, so the reason is plain.
                        let others = try store.count(plan: plan)
                        var j = Regression.judge(current: current, history: history, tolerancePct: tol)
                        if j.verdict == .inconclusive { j.reasons.append("\(others) run\(others == 1 ? "" : "s") of plan \(plan) in the history in all (other variants, settings or testbeds, faulty runs, or this one)") }
                        history = []
                        try emit(j)
                        return
                    }
                    judgement = try RegressionMemory.judge(current: current, store: store, last: last, tolerancePct: tol)
                }
            } catch let e as ExitCode { throw e } catch {
                log("herald-lab regress: history: \(error)")
                throw ExitCode(2)
            }
        } else {
            // A slip of a keyword (`histroy`) is not a folder to read.
            if !FileManager.default.fileExists(atPath: baseline) {
                log("herald-lab regress: --baseline \"\(OutsideText.escaped(String(baseline.prefix(200))))\": no such bundle, and not history or latest\(CLIConventions.didYouMean(baseline, among: ["history", "latest"]))")
                throw ExitCode(2)
            }
            let base: AnalysisResult
            do { base = try SummaryLoader.load(URL(fileURLWithPath: baseline)) } catch {
                log("herald-lab regress: baseline \(Format.label(baseline)): \(error)")
                throw ExitCode(2)
            }
            guard base.input.plan == current.input.plan else {
                log("herald-lab regress: baseline \(Format.label(baseline)) is a run of plan \(Format.label(base.input.plan ?? "(none)")), this run is of plan \(Format.label(current.input.plan ?? "(none)")): runs of different plans are not each other's baselines (refused)")
                throw ExitCode(2)
            }
            let a = Comparison.settings(base), b = Comparison.settings(current)
            let differ = Set(a.keys).union(b.keys).sorted().filter { a[$0] != b[$0] }
            if !differ.isEmpty {
                let warning = "warning: the baseline's settings differ in \(differ.map(Format.label).joined(separator: ", ")): a difference may be the settings'"
                if json == "-" { log(warning) } else { print(warning) } // standard output holds the JSON alone
            }
            judgement = Regression.judge(current: current, baseline: base, tolerancePct: tol)
        }
        try emit(judgement)
    }

    /// Against the shared store: the lab's own runs like this one (issue 41).
    func judgeShared(_ current: AnalysisResult, store shared: SharedResultsStore, tolerance tol: Double) async throws -> Regression.Judgement {
        let lab = store.lab
        guard let plan = current.input.plan else { log("herald-lab regress: \(Format.label(bundle)) names no plan (not a bundle?)"); throw ExitCode(2) }
        do {
            if baseline == "latest" {
                guard let run = try await shared.baseline(like: current, lab: lab, last: 1).last else {
                    let others = try await shared.count(lab: lab, plan: plan)
                    log("herald-lab regress: no earlier run of lab \(Format.label(lab)), plan \(Format.label(plan)) with this variant, these settings and this testbed in \(shared.location) (\(others) run\(others == 1 ? "" : "s") of the plan by that lab in all); give --baseline BUNDLE")
                    throw ExitCode(3)
                }
                return Regression.judge(current: current, baseline: try run.summary(), tolerancePct: tol)
            }
            let runs = try await shared.baseline(like: current, lab: lab, last: last)
            let alertOpen = try await SharedRegressionMemory.alertOpen(current: current, lab: lab, store: shared)
            if runs.count < Regression.minimumHistory && !alertOpen {
                let others = try await shared.count(lab: lab, plan: plan)
                var j = Regression.judge(current: current, history: try runs.map { try $0.summary() }, tolerancePct: tol)
                if j.verdict == .inconclusive { j.reasons.append("\(others) run\(others == 1 ? "" : "s") of plan \(plan) by lab \(lab) in the shared store in all (other variants, settings or testbeds, faulty runs, or this one); other labs' runs are never its baseline") }
                return j
            }
            return try await SharedRegressionMemory.judge(current: current, lab: lab, store: shared, last: last, tolerancePct: tol)
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab regress: history \(shared.location): \(error)")
            throw ExitCode(2)
        }
    }

    func emit(_ j: Regression.Judgement) throws {
        if json != "-" { print(Regression.text(j)) }
        if let json {
            let enc = JSONEncoder()
            enc.outputFormatting = [.prettyPrinted, .sortedKeys]
            enc.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
            do {
                let data = try enc.encode(j)
                if json == "-" { print(String(decoding: data, as: UTF8.self)) } else { try data.write(to: URL(fileURLWithPath: json), options: .atomic) }
            } catch {
                log("herald-lab regress: cannot write \(Format.label(json)): \(error.localizedDescription)")
                throw ExitCode(2)
            }
        }
        switch j.verdict {
        case .none: return
        case .regression: throw ExitCode(1)
        case .inconclusive, .infra: throw ExitCode(3)
        }
    }
}

/// `herald-lab history [--plan NAME] [--history postgres://… [--lab A --lab B]]`
struct HistoryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "Show the recorded runs and the trend of each headline metric.",
        discussion: "Arrows compare a run with its lab's previous clean run of the plan: aborted runs (no verdict) and runs with infrastructure faults (infra) have none and are not compared with. A --plan that names no plan in the history is exit 2. With --history postgres://… the shared results store is read instead of history.sqlite: every lab's runs, or those of each --lab (repeatable), each row naming its lab."
    )

    @Option(help: "Only runs of this plan.")
    var plan: String?

    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).")
    var results: String?

    @OptionGroup var store: HistoryReadOptions

    @Option(help: ArgumentHelp("The runs as JSON to FILE (--json alone or --json -: standard output, instead of the table): lab (from the shared store), recordedAt, runId, plan, variant, devices, headline figures, verdict (pass, fail or aborted), passed (null when aborted), infra, report and bundle paths.", valueName: "FILE"))
    var json: String?

    /// One history row for --json: the figures and where they came from, not the stored summary.
    struct Row: Encodable {
        /// The lab (the shared store's rows only).
        var lab: String?
        var recordedAt, runId, plan, variant, path, reportPath: String
        var devices: Int
        var detectionPct, continuityPct, heraldContinuityPct, longevity: Double
        /// nil for an aborted run, which has no verdict.
        var passed: Bool?
        var verdict: String
        var aborted: Bool
        /// Infrastructure faults; empty: none.
        var infra: String

        init(_ r: HistoryStore.Run, lab: String? = nil) {
            self.lab = lab
            recordedAt = r.recordedAt; runId = r.runId; plan = r.plan; variant = r.variant; path = r.path; reportPath = r.reportPath
            devices = r.devices; detectionPct = r.detectionPct; continuityPct = r.continuityPct; heraldContinuityPct = r.heraldContinuityPct; longevity = r.longevity
            passed = r.aborted ? nil : r.passed; verdict = r.verdict; aborted = r.aborted; infra = r.infra
        }
        func encode(to encoder: Encoder) throws {
            enum K: String, CodingKey { case lab, recordedAt, runId, plan, variant, path, reportPath, devices, detectionPct, continuityPct, heraldContinuityPct, longevity, passed, verdict, aborted, infra }
            var c = encoder.container(keyedBy: K.self)
            if let lab { try c.encode(lab, forKey: .lab) }
            try c.encode(recordedAt, forKey: .recordedAt); try c.encode(runId, forKey: .runId); try c.encode(plan, forKey: .plan); try c.encode(variant, forKey: .variant)
            try c.encode(path, forKey: .path); try c.encode(reportPath, forKey: .reportPath); try c.encode(devices, forKey: .devices)
            try c.encode(detectionPct, forKey: .detectionPct); try c.encode(continuityPct, forKey: .continuityPct); try c.encode(heraldContinuityPct, forKey: .heraldContinuityPct)
            try c.encode(longevity, forKey: .longevity); try c.encode(passed, forKey: .passed); try c.encode(verdict, forKey: .verdict); try c.encode(aborted, forKey: .aborted); try c.encode(infra, forKey: .infra)
        }
    }

    func run() async throws {
        try store.check("history")
        let dir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
        let reader = try await store.reader("history", results: dir)
        let labs = store.labs
        let runs: [LabRun]
        let rates: [HistoryStore.InfraRate]
        // The shared store's connection is closed on every way out (a connection left open is a
        // fault of postgres-nio's).
        do {
            (runs, rates) = try await read(reader, labs: labs)
        } catch {
            await (reader as? SharedResultsStore)?.close()
            throw error
        }
        await (reader as? SharedResultsStore)?.close()
        if let json {
            let e = JSONEncoder()
            e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            try CLIConventions.writeJSON(try e.encode(runs.map { Row($0.run, lab: reader.namesLabs ? $0.lab : nil) }), to: json, command: "history")
            if json == "-" { return }
        }
        guard !runs.isEmpty else { print("no runs recorded in \(Format.label(reader.historyName))"); return }
        for line in Self.table(runs, labs: reader.namesLabs) { print(line) }
        // The infra rate per testbed (every plan's runs), with its interval (issue 38).
        for line in Self.infraLines(rates) { print(line) }
    }

    /// The runs and infra rates of `labs`; a --lab or --plan naming nothing there is exit 2.
    func read(_ reader: any HistoryReading, labs: [String]) async throws -> ([LabRun], [HistoryStore.InfraRate]) {
        do {
            if reader.namesLabs, !labs.isEmpty {
                // A lab with no runs at all is a slip of its name: said, with the labs there are.
                let known = try await reader.historyLabs()
                for lab in labs where !known.contains(lab) {
                    log("herald-lab history: --lab \"\(OutsideText.escaped(String(lab.prefix(200))))\": no runs of that lab in \(reader.historyName)"
                        + (CLIConventions.suggestion(for: lab, among: known).map { "; did you mean '\(OutsideText.escaped($0))'?" } ?? (known.isEmpty ? " (no runs stored)" : " (labs: \(known.prefix(20).map { OutsideText.escaped($0) }.joined(separator: ", ")))")))
                    throw ExitCode(2)
                }
            }
            let runs = try await reader.historyRuns(labs: labs, plan: plan)
            if let plan, runs.isEmpty {
                let plans = try await reader.historyPlans(labs: labs)
                log("herald-lab history: --plan \"\(OutsideText.escaped(String(plan.prefix(200))))\": no plan by that name in \(reader.historyName)"
                    + (CLIConventions.suggestion(for: plan, among: plans).map { "; did you mean '\(OutsideText.escaped($0))'?" } ?? (plans.isEmpty ? " (no runs recorded)" : " (plans: \(plans.prefix(20).map { OutsideText.escaped($0) }.joined(separator: ", ")))")))
                throw ExitCode(2)
            }
            return (runs, try await reader.historyInfraRates(labs: labs, last: 30))
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab history: \(error)")
            throw ExitCode(2)
        }
    }

    /// One line per testbed: how many of its last runs had infrastructure faults.
    static func infraLines(_ rates: [HistoryStore.InfraRate]) -> [String] {
        rates.map { r in
            let ci = r.interval
            return "infra rate, testbed \(Format.label(r.testbed.isEmpty ? "(none)" : r.testbed)): \(r.infra) of its last \(r.runs) runs (\(Format.number(100 * r.rate)) %, 95 % CI \(Format.number(100 * ci.lo))-\(Format.number(100 * ci.hi)) %)"
        }
    }

    /// The table: run ids whole, arrows against the plan's previous clean run (neither aborted
    /// nor infra), aborted runs without a verdict, infra runs marked.
    static func table(_ runs: [HistoryStore.Run]) -> [String] {
        table(runs.map { LabRun(lab: "", run: $0) }, labs: false)
    }

    /// The table of one lab's runs or several labs' (`labs`: a lab column; each run's arrows
    /// against its own lab's previous clean run of the plan, never another lab's).
    static func table(_ rows: [LabRun], labs: Bool) -> [String] {
        func arrow(_ a: Double?, _ b: Double) -> String {
            guard let a else { return " " }
            return b > a + 1e-9 ? "↑" : (b < a - 1e-9 ? "↓" : "=")
        }
        let planWidth = max(14, rows.map { Format.label($0.run.plan).count }.max() ?? 0)
        let runWidth = max(27, rows.map { Format.label($0.run.runId).count }.max() ?? 0)
        let labWidth = max(10, rows.map { Format.label($0.lab).count }.max() ?? 0)
        func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
        let labHead = labs ? pad("lab", labWidth) + "  " : ""
        var lines = ["recorded             \(labHead)\(pad("plan", planWidth))  \(pad("run", runWidth))  detection%   continuity%   herald cont.%  longevity  verdict"]
        var previous = [String: HistoryStore.Run]()
        for row in rows {
            let r = row.run
            let key = "\(row.lab)\u{1F}\(r.plan)"
            let p = r.isClean ? previous[key] : nil
            let verdict = r.aborted ? "aborted (no verdict)" : (r.passed ? "pass" : "FAIL") + (r.infra.isEmpty ? "" : " (infra: \(Format.label(String(r.infra.prefix(120)))))")
            let labCell = labs ? pad(Format.label(row.lab), labWidth) + "  " : ""
            lines.append(String(format: "%@  %@%@  %@  %8.2f %@   %9.4f %@   %9.4f %@   %7.4f    %@",
                                Format.label(r.recordedAt), labCell, pad(Format.label(r.plan), planWidth), pad(Format.label(r.runId), runWidth),
                                r.detectionPct, arrow(p?.detectionPct, r.detectionPct), r.continuityPct, arrow(p?.continuityPct, r.continuityPct),
                                r.heraldContinuityPct, arrow(p?.heraldContinuityPct, r.heraldContinuityPct), r.longevity, verdict))
            if r.isClean { previous[key] = r }
        }
        return lines
    }
}

/// A study folder's design, or nil when `path` is not a folder with study.json (exit 2 on a bad one).
func loadStudyFolder(_ path: String, command: String) throws -> Comparison.Design? {
    try loadStudy(path, command: command)?.design
}

/// A study folder's design and its index, read once; nil when the folder holds no study.
func loadStudy(_ path: String, command: String) throws -> (design: Comparison.Design, index: StudyIndex)? {
    let folder = URL(fileURLWithPath: path)
    do {
        guard let index = try StudyIndex.load(folder) else { return nil }
        return (try Comparison.design(study: folder, index: index), index)
    } catch {
        log("herald-lab \(command): \(Format.label(path)): \(error)")
        throw ExitCode(2)
    }
}


/// `herald-lab regress accept PLAN --by WHO --reason WHY`: an operator accepts the level an open
/// regression alert flagged (a deliberate change), recorded with who and why.
struct RegressAcceptCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "accept",
        abstract: "Accept the level an open regression alert of PLAN flagged, with who and why (the alert closes; its nights become the baseline).")

    @Argument(help: "The plan's name.") var plan: String
    @Option(help: "Only this variant's alert.") var variant: String?
    @Option(help: "Only this testbed's alert.") var testbed: String?
    @Option(help: "Who accepts it (recorded).") var by: String
    @Option(help: "Why (recorded).") var reason: String
    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).") var results: String?
    @OptionGroup var store: HistoryReadOptions

    func run() async throws {
        try store.check("regress accept", most: 1)
        for (name, value) in [("plan", plan), ("--by", by), ("--reason", reason)] {
            guard !value.trimmingCharacters(in: .whitespaces).isEmpty, value.utf8.count <= 1000, !value.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
                log("herald-lab regress accept: \(name): expected 1 to 1000 characters of text without control characters")
                throw ExitCode(2)
            }
        }
        if let shared = try await store.sharedStore("regress accept") {
            // The shared store: lab --lab's alerts only (the operators' role: UPDATE on lab_alert).
            let lab = store.lab
            let n: Int
            do { n = try await shared.accept(lab: lab, plan: plan, variant: variant, testbed: testbed, by: by, reason: reason) } catch {
                await shared.close()
                log("herald-lab regress accept: \(shared.location): \(error)")
                throw ExitCode(2)
            }
            await shared.close()
            guard n > 0 else {
                log("herald-lab regress accept: no open alert of lab \(Format.label(lab)), plan \(Format.label(plan))\(variant.map { ", variant " + Format.label($0) } ?? "")\(testbed.map { ", testbed " + Format.label($0) } ?? "") in \(shared.location)")
                throw ExitCode(3)
            }
            print("accepted: \(n) alert\(n == 1 ? "" : "s") of lab \(Format.label(lab)), plan \(Format.label(plan)); by \(Format.label(by)): \(Format.label(reason))")
            return
        }
        let dir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
        let accepted: [HistoryStore.Alert]
        do {
            accepted = try HistoryStore(url: dir.appendingPathComponent("history.sqlite")).accept(plan: plan, variant: variant, testbed: testbed, by: by, reason: reason)
        } catch {
            log("herald-lab regress accept: history: \(error)")
            throw ExitCode(2)
        }
        guard !accepted.isEmpty else {
            log("herald-lab regress accept: no open alert of plan \(Format.label(plan))\(variant.map { ", variant " + Format.label($0) } ?? "")\(testbed.map { ", testbed " + Format.label($0) } ?? "") in \(dir.path)/history.sqlite")
            throw ExitCode(3)
        }
        for a in accepted {
            print("accepted: plan \(Format.label(a.plan)) variant \(Format.label(a.variant.isEmpty ? "-" : a.variant)) testbed \(Format.label(a.testbed.isEmpty ? "-" : a.testbed)): regressed since \(Format.label(a.openedRun)) (\(Format.label(a.metrics))); by \(Format.label(by)): \(Format.label(reason))")
        }
    }
}
