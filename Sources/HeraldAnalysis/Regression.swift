import Foundation

/// Regression that knows noise (docs/STATISTICS.md). A run is judged against the last runs of
/// the same plan, variant, settings and testbed: a metric regresses only when it is worse than
/// the baseline's mean by more than its tolerance AND beyond the one-sided prediction interval
/// of the baseline runs (Student t, Bonferroni over the metrics, so a night of noise alone is
/// flagged in at most 5 % of nights). With one baseline bundle, the noise is the within-run
/// device bootstrap (Holm over the metrics). A run with infrastructure faults is `infra`.
public enum Regression {
    public enum Verdict: String, Codable, Sendable { case none, regression, inconclusive, infra }

    public struct Finding: Codable, Sendable {
        public var metric: String
        public var label: String
        public var baseline: Double?
        public var current: Double?
        public var delta: Double?
        /// How far worse it may be (points, or the metric's unit).
        public var tolerance: Double?
        /// The noise band on the worse side: the prediction bound (history) or the interval of
        /// the difference (one baseline bundle).
        public var bound: Double?
        public var regressed: Bool
        public var note: String?
    }

    public struct Judgement: Codable, Sendable {
        public var verdict: Verdict
        public var method: String
        public var baselineRuns: [String]
        public var findings: [Finding]
        /// What is missing for a verdict (inconclusive), or the infrastructure faults (infra).
        public var reasons: [String]
        /// Nodes whose continuity fell beyond their own noise, grouped, at most a screenful.
        public var nodeDrops: [String]
        /// The alert of this plan, variant, settings and testbed (regress against history):
        /// opened, still open since a night, or closed by this night; nil: none.
        public var alert: String?
        /// Change points of the plan's nightly series, newest night included (E-Divisive,
        /// `ChangePoints`): where a level moved, so a regression can be dated (regress against
        /// history); nil: not searched.
        public var changePoints: [String]?
    }

    /// Runs of history a verdict needs at least (a prediction interval from fewer says little).
    public static let minimumHistory = 3
    public static let family = 0.05
    /// Family-wise false-alarm rate per night against history. Stricter than `family`: with the
    /// alert memory (LabHistory.RegressionMemory) a false alarm keeps its nights out of the
    /// baseline for good, which trims the baseline's low tail, so alarms must be rarer to keep a
    /// normal stretch at most about one alert in 20 nights (issue 38).
    public static let historyFamily = 0.02

    /// The metric of a whole run (every pair), as compare pools it.
    public static func value(_ r: AnalysisResult, _ m: Metric, selection: PairSelection = .all) -> Double? {
        m.pooling.statistic(RunMetrics.units(r, m, selection: selection), scale: RunMetrics.scale(m))
    }

    /// Tolerance of a metric: percentages in points (the plan's regressionTolerancePct), rates
    /// and times relative (10 % of the baseline, or the tolerance in percent if larger).
    public static func tolerance(_ m: Metric, baseline: Double, tolerancePct: Double) -> Double {
        m.isPercentage ? tolerancePct : max(0.1, tolerancePct / 100) * abs(baseline)
    }

    /// Infrastructure faults of a run: what the manifest records and devices the analysis flagged.
    public static func infrastructure(_ r: AnalysisResult) -> [String] {
        var out = r.input.infrastructure ?? []
        for d in r.devices where d.flagged && !out.contains(where: { $0.hasPrefix("node \(d.folder):") }) {
            out.append("node \(d.folder): \(d.problems.joined(separator: "; "))")
        }
        return out
    }

    /// Judges `current` against earlier runs (newest last or first; order does not matter).
    /// The devices (folders) of `r` whose nodes had no fault: an infra night is judged on these
    /// and the pairs between them, against the same pairs of the baseline runs (issue 38).
    public static func healthyDevices(_ r: AnalysisResult, infra: [String]) -> Set<String> {
        Set(r.devices.map(\.folder).filter { f in !infra.contains { $0.hasPrefix("node \(f.prefix(64)):") } })
    }

    public static func judge(current: AnalysisResult, history: [AnalysisResult], tolerancePct: Double) -> Judgement {
        let infra = infrastructure(current)
        let usable = history.filter { infrastructure($0).isEmpty }
        let names = usable.map { $0.input.runId ?? $0.input.path }
        // A night with faulty nodes is judged on the nodes that ran well and the pairs between
        // them, and so is its baseline: a firmware that wedges some dongles still shows what it
        // did to the others.
        let healthy = healthyDevices(current, infra: infra)
        let partial = !infra.isEmpty && healthy.count < current.devices.count
        let selection = partial ? PairSelection(devices: healthy) : .all
        let on = partial ? "; judged on the \(healthy.count) of \(current.devices.count) nodes without faults and the pairs between them" : ""
        let method = "prediction interval of the last \(usable.count) runs (mean - t s √(1+1/n), one-sided, Bonferroni over \(Metric.allCases.count) metrics at \(historyFamily)) and worse than the mean by more than the tolerance\(on)"
        var findings = [Finding]()
        var regressed = false
        let t = usable.count >= 2 ? Stats.tQuantile(1 - historyFamily / Double(Metric.allCases.count), df: Double(usable.count - 1)) : .nan
        for m in Metric.allCases {
            let values = usable.compactMap { value($0, m, selection: selection) }
            var f = Finding(metric: m.rawValue, label: m.label, current: value(current, m, selection: selection), regressed: false)
            guard values.count >= minimumHistory, let mean = Stats.mean(values), let sd = Stats.sd(values), let cur = f.current else {
                f.note = f.current == nil ? "no data in this run" : "\(values.count) baseline value\(values.count == 1 ? "" : "s")"
                findings.append(f)
                continue
            }
            let n = Double(values.count)
            let half = t * sd * (1 + 1 / n).squareRoot()
            let tol = tolerance(m, baseline: mean, tolerancePct: tolerancePct)
            f.baseline = mean
            f.delta = cur - mean
            f.tolerance = tol
            f.bound = m.higherIsBetter ? mean - half : mean + half
            let beyondNoise = m.higherIsBetter ? cur < f.bound! - 1e-12 : cur > f.bound! + 1e-12
            let beyondTolerance = m.higherIsBetter ? cur < mean - tol - 1e-12 : cur > mean + tol + 1e-12
            f.regressed = beyondNoise && beyondTolerance
            if beyondNoise && !beyondTolerance { f.note = "beyond the noise, within the tolerance" }
            if beyondTolerance && !beyondNoise { f.note = "worse by more than the tolerance, within the noise" }
            if sd == 0 { f.note = [f.note, "no variance in the baseline runs"].compactMap { $0 }.joined(separator: "; ") }
            regressed = regressed || f.regressed
            findings.append(f)
        }
        var reasons = [String]()
        var verdict: Verdict
        if !infra.isEmpty {
            // Faults do not hide a regression among the nodes that ran well: it is one, with
            // the faults noted; without one the night is infra (not judged clean).
            // A fault of the whole run (an abort) leaves nothing to judge it on.
            let wholeRun = infra.contains { !$0.hasPrefix("node ") }
            verdict = !wholeRun && regressed && usable.count >= minimumHistory && healthy.count >= 2 ? .regression : .infra
            reasons = infra
        } else if usable.count < minimumHistory {
            verdict = .inconclusive
            reasons.append("\(usable.count) earlier run\(usable.count == 1 ? "" : "s") of this plan, variant, settings and testbed without infrastructure faults\(history.count > usable.count ? " (\(history.count - usable.count) more with faults, left out)" : ""); at least \(minimumHistory) are needed")
        } else {
            verdict = regressed ? .regression : .none
        }
        let drops = verdict == .inconclusive ? [] : nodeDrops(current: current, history: usable, tolerancePct: tolerancePct)
        return Judgement(verdict: verdict, method: method, baselineRuns: names, findings: findings, reasons: reasons, nodeDrops: drops)
    }

    /// Nodes (as observers) whose strict continuity fell beyond their own prediction interval
    /// (Bonferroni over the nodes) and by more than the tolerance: at most 20 lines.
    static func nodeDrops(current: AnalysisResult, history: [AnalysisResult], tolerancePct: Double) -> [String] {
        guard history.count >= minimumHistory else { return [] }
        let nodes = current.devices.map(\.folder)
        let t = Stats.tQuantile(1 - family / Double(max(1, nodes.count)), df: Double(history.count - 1))
        var drops = [(String, Double)]()
        for node in nodes {
            func continuity(_ r: AnalysisResult) -> Double? {
                var h = 0.0, p = 0.0
                for pair in r.pairs where pair.observer == node { h += Double(pair.strictWindows); p += Double(r.parameters.cetotal) }
                return p > 0 ? 100 * h / p : nil
            }
            let values = history.compactMap(continuity)
            guard values.count >= minimumHistory, let cur = continuity(current), let mean = Stats.mean(values), let sd = Stats.sd(values) else { continue }
            let bound = mean - t * sd * (1 + 1 / Double(values.count)).squareRoot()
            if cur < bound - 1e-12, cur < mean - tolerancePct - 1e-12 { drops.append((node, cur - mean)) }
        }
        guard !drops.isEmpty else { return [] }
        let sorted = drops.sorted { $0.1 < $1.1 }
        var lines = ["\(sorted.count) node\(sorted.count == 1 ? "" : "s") saw less than their own noise allows (continuity as observer, points):"]
        var line = " "
        for (node, d) in sorted.prefix(120) {
            let item = " \(Format.label(node)) \(Format.signed(d))"
            if line.count + item.count > 96 { lines.append(line); line = " " }
            line += item
            if lines.count >= 19 { break }
        }
        if line.count > 1 { lines.append(line) }
        if sorted.count > 120 || lines.count >= 20 { lines.append("  … and more (report.html has every pair)") }
        return Array(lines.prefix(21))
    }

    /// Judges `current` against one baseline bundle with the within-run noise (device bootstrap).
    public static func judge(current: AnalysisResult, baseline: AnalysisResult, tolerancePct: Double, bootstrap: ClusterBootstrap = ClusterBootstrap(resamples: 2000, seed: 1)) -> Judgement {
        let infra = infrastructure(current)
        var findings = [Finding]()
        var ps = [Double]()
        for m in Metric.allCases {
            var f = Finding(metric: m.rawValue, label: m.label, baseline: value(baseline, m), current: value(current, m), regressed: false)
            // A run with infrastructure faults is not judged: its figures are shown, not weighed.
            if !infra.isEmpty { f.note = "not judged (infrastructure faults)"; findings.append(f); ps.append(1); continue }
            if let d = bootstrap.difference(baseline: [RunMetrics.units(baseline, m)], level: [RunMetrics.units(current, m)], pooling: m.pooling, scale: RunMetrics.scale(m), stream: m.rawValue) {
                f.delta = d.delta
                f.tolerance = tolerance(m, baseline: f.baseline ?? 0, tolerancePct: tolerancePct)
                f.bound = m.higherIsBetter ? d.ci.hi : d.ci.lo
                ps.append(d.p)
            } else { f.note = "no data"; ps.append(1) }
            findings.append(f)
        }
        let adjusted = Stats.holm(ps)
        var regressed = false
        for (i, m) in Metric.allCases.enumerated() {
            guard let delta = findings[i].delta, let tol = findings[i].tolerance, let bound = findings[i].bound else { continue }
            let worseBeyondNoise = adjusted[i] < family && (m.higherIsBetter ? bound < 0 : bound > 0)
            let worseBeyondTolerance = m.higherIsBetter ? delta < -tol - 1e-12 : delta > tol + 1e-12
            findings[i].regressed = worseBeyondNoise && worseBeyondTolerance
            regressed = regressed || findings[i].regressed
        }
        let verdict: Verdict = !infra.isEmpty ? .infra : (regressed ? .regression : .none)
        return Judgement(verdict: verdict, method: "one baseline run: device bootstrap of the difference (\(bootstrap.resamples) resamples), Holm over \(Metric.allCases.count) metrics at \(family), and worse by more than the tolerance",
                         baselineRuns: [baseline.input.runId ?? baseline.input.path], findings: findings, reasons: infra, nodeDrops: [])
    }

    public static func text(_ j: Judgement) -> String {
        var lines = ["baseline: \(j.baselineRuns.count) run\(j.baselineRuns.count == 1 ? "" : "s")\(j.baselineRuns.isEmpty ? "" : " (" + j.baselineRuns.suffix(10).map(Format.label).joined(separator: ", ") + ")")"]
        lines.append(Format.pad("metric", 24) + Format.pad("baseline", 11) + Format.pad("this run", 11) + Format.pad("change", 11) + Format.pad("tolerance", 11) + Format.pad("noise bound", 13) + "")
        for f in j.findings {
            func n(_ v: Double?) -> String { v.map(Format.number) ?? "–" }
            lines.append(Format.pad(f.label, 24) + Format.pad(n(f.baseline), 11) + Format.pad(n(f.current), 11) + Format.pad(f.delta.map(Format.signed) ?? "–", 11)
                         + Format.pad(f.tolerance.map { "±" + Format.number($0) } ?? "–", 11) + Format.pad(n(f.bound), 13)
                         + (f.regressed ? "REGRESSED" : "") + (f.note.map { "  (\($0))" } ?? ""))
        }
        lines.append(contentsOf: j.nodeDrops)
        if let a = j.alert { lines.append("alert: " + Format.label(a)) }
        for c in j.changePoints ?? [] { lines.append("change point: " + Format.label(c)) }
        switch j.verdict {
        case .none: lines.append("no regression (\(j.method))")
        case .regression:
            lines.append("REGRESSION: \(j.findings.filter(\.regressed).map(\.label).joined(separator: ", ")) (\(j.method))")
            if !j.reasons.isEmpty { lines.append("infra noted (the faulty nodes were left out, not the regression): " + j.reasons.prefix(10).map(Format.label).joined(separator: "; ")) }
        case .inconclusive: lines.append("inconclusive: " + j.reasons.map(Format.label).joined(separator: "; "))
        case .infra: lines.append("infra: this run had infrastructure faults and no regression among the nodes without them; it is not judged clean: " + j.reasons.prefix(10).map(Format.label).joined(separator: "; "))
        }
        return lines.joined(separator: "\n")
    }
}
