import Foundation
import HeraldAnalysis

/// `regress` against history with a memory (issue 38): the night is judged against the nights
/// before any open alert, so a drop that persists is flagged on every night until the level
/// returns or an operator accepts it (`HistoryStore.accept`), and flagged nights never become a
/// baseline without that. The first flagged night opens the alert and suggests a confirmation run.
public enum RegressionMemory {
    /// Judges `current` (recorded in `store` first if it is not) against up to `last` earlier
    /// runs like it, and opens, keeps or closes the alert of its plan, variant, settings and testbed.
    public static func judge(current: AnalysisResult, store: HistoryStore, last: Int, tolerancePct: Double, at date: Date = Date()) throws -> Regression.Judgement {
        if try store.row(of: current) == nil { try store.record(current, reportPath: "", at: date) }
        guard let row = try store.row(of: current) else { throw HistoryError.notRecorded(current.input.path) }
        let open = try store.alerts(like: current).last { $0.state == .regressed && $0.openedRow < row }
        let history = try store.baseline(like: current, last: last).map { try store.summary(of: $0) }
        var j = Regression.judge(current: current, history: history, tolerancePct: tolerancePct)
        let flagged = j.findings.filter(\.regressed).map(\.label)
        switch (j.verdict, open) {
        case (.regression, nil):
            if try store.alerts(like: current).contains(where: { $0.openedRow == row }) {
                j.alert = "regressed: this night opened the alert (judged again)"
            } else {
                try store.openAlert(like: current, row: row, metrics: flagged, at: date)
                j.alert = "regressed: opened by this night (\(flagged.joined(separator: ", "))). Confirm with an interleaved A/B of the previous and the new build, 3 runs each (a study with the build as its factor); it stays flagged every night until the level returns or `herald-lab regress accept \(current.input.plan ?? "PLAN")` records who accepted it and why"
            }
        case (.regression, let a?):
            j.alert = "regressed since \(a.openedRun) (\(a.metrics)); still below the level before it; `herald-lab regress accept \(a.plan)` accepts the new level"
        case (.none, let a?):
            try store.close(a, as: .returned, row: row, by: nil, reason: "the level returned", at: date)
            j.alert = "returned: back to the level before \(a.openedRun); the alert is closed and its nights stay out of the baseline"
        case (.inconclusive, let a?), (.infra, let a?):
            // An open alert is not forgotten for want of a verdict: the night stays flagged.
            j.reasons.append("an alert is open since \(a.openedRun) (\(a.metrics)): still regressed until a night returns to the level before it or an operator accepts it")
            j.verdict = .regression
            j.alert = "regressed since \(a.openedRun); this night could not be judged on its own"
        default:
            break
        }
        j.changePoints = try changePoints(current: current, store: store, row: row)
        return j
    }

    /// Nights searched for change points, the judged night the newest.
    public static let changeWindow = 60

    /// Change points of each headline metric over the last `changeWindow` healthy nights
    /// (E-Divisive, Bonferroni over the metrics at `ChangePoints.alpha`), as lines naming the
    /// metric, the first run after the change, the levels before and after, and the p-value.
    public static func changePoints(current: AnalysisResult, store: HistoryStore, row: Int64) throws -> [String] {
        let runs = try store.series(like: current, upTo: row, last: changeWindow)
        guard runs.count >= 2 * ChangePoints.minimumSize else { return [] }
        let results = try runs.map { try store.summary(of: $0) }
        let alpha = ChangePoints.alpha / Double(Metric.allCases.count)
        var out = [String]()
        for (i, m) in Metric.allCases.enumerated() {
            let series = results.map { Regression.value($0, m) ?? .nan }
            for c in ChangePoints.find(series, alpha: alpha, permutations: 499, seed: UInt64(i + 1)) {
                out.append("\(m.label): from run \(runs[c.index].runId) (night \(c.index + 1) of \(runs.count)) \(Format.number(c.before)) → \(Format.number(c.after)) (E-Divisive, p \(String(format: "%.3f", c.p)))")
            }
        }
        return out
    }
}

public enum HistoryError: Error, CustomStringConvertible {
    case notRecorded(String)
    public var description: String {
        switch self { case .notRecorded(let path): return "\(path): could not be recorded in the history" }
    }
}
