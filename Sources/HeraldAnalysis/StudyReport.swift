import Foundation

/// study.html beside a comparison: one self-contained page (inline CSS and SVG, no script, no
/// network): a forest plot of every effect as a change relative to the baseline with its 95 %
/// interval and margin, the effects table, each metric's per-run figures by level, and the run
/// order.
public enum StudyReport {
    /// One run of the order (from study.json), for the run-order table.
    public struct OrderedRun: Sendable {
        public var index: Int
        public var block: Int
        public var level: String
        public var seed: UInt64
        public var bundle: String
        public init(index: Int, block: Int, level: String, seed: UInt64, bundle: String) {
            self.index = index
            self.block = block
            self.level = level
            self.seed = seed
            self.bundle = bundle
        }
    }

    static func esc(_ s: String) -> String { HTMLReport.esc(Format.label(s)) }

    /// The forest plot of a comparison's effects (inline SVG, every label escaped): each effect
    /// as a change relative to the baseline on a symmetric log scale, its 95 % interval, the
    /// practical margin as a grey band, the verdict. study.html and the coordinator's dashboard show it.
    /// `inlineStyle`: false leaves out the SVG's own <style> (a page that allows none styles it).
    public static func forestPlot(_ o: Comparison.Outcome, inlineStyle: Bool = true) -> String {
        // Forest plot: relative change (%), interval, margin band, zero line.
        let rows = o.effects.filter { $0.delta != nil && $0.baselineEstimate != nil }
        func rel(_ v: Double, _ e: Comparison.Effect) -> Double {
            let b = abs(e.baselineEstimate ?? 0)
            return b > 0 ? 100 * v / b : 0
        }
        // A symmetric log scale (sign · log10(1 + |%|)): changes of 1 % and of 1,000 % both show.
        func t(_ pct: Double) -> Double { pct.isFinite ? (pct < 0 ? -1 : 1) * log10(1 + abs(pct)) : 0 }
        var extent = t(10)
        for e in rows {
            for v in [e.delta!, e.ci95?[0] ?? 0, e.ci95?[1] ?? 0] { extent = max(extent, abs(t(rel(v, e)))) }
        }
        extent = min(t(100_000), extent * 1.05)
        let labelW = 300.0, plotW = 520.0, rowH = 22.0, top = 24.0
        let height = top + rowH * Double(max(1, rows.count)) + 30
        func x(_ pct: Double) -> Double { labelW + (max(-extent, min(extent, t(pct))) + extent) / (2 * extent) * plotW }
        var h = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(labelW + plotW + 140))\" height=\"\(Int(height))\" role=\"img\" aria-label=\"forest plot\">"
            + (inlineStyle ? "<style>text{font-size:12px;font-family:sans-serif}</style>" : "")
        h += "<line x1=\"\(x(0))\" y1=\"\(top - 8)\" x2=\"\(x(0))\" y2=\"\(height - 24)\" stroke=\"#888\"/>"
        for tick in [-1000.0, -100, -10, 10, 100, 1000] where abs(t(tick)) <= extent {
            h += "<line x1=\"\(x(tick))\" y1=\"\(top - 8)\" x2=\"\(x(tick))\" y2=\"\(height - 24)\" stroke=\"#eee\"/>"
            h += "<text x=\"\(x(tick))\" y=\"\(height - 8)\" text-anchor=\"middle\">\(String(format: "%+.0f%%", tick))</text>"
        }
        for (i, e) in rows.enumerated() {
            let y = top + rowH * Double(i) + rowH / 2
            let colour = e.verdict == .better ? "#1a7f37" : e.verdict == .worse ? "#b42318" : e.verdict == .same ? "#555" : "#9a6700"
            if let m = e.margin, m > 0 {
                let lo = x(rel(-m, e)), hi = x(rel(m, e))
                h += "<rect x=\"\(lo)\" y=\"\(y - 8)\" width=\"\(max(1, hi - lo))\" height=\"16\" fill=\"#eee\"/>"
            }
            let label = o.levels.count > 2 ? "\(e.label) · \(e.level)" : e.label
            h += "<text x=\"4\" y=\"\(y + 4)\">\(esc(label))</text>"
            if let ci = e.ci95 {
                h += "<line x1=\"\(x(rel(ci[0], e)))\" y1=\"\(y)\" x2=\"\(x(rel(ci[1], e)))\" y2=\"\(y)\" stroke=\"\(colour)\" stroke-width=\"2\"/>"
            }
            h += "<circle cx=\"\(x(rel(e.delta!, e)))\" cy=\"\(y)\" r=\"4\" fill=\"\(colour)\"/>"
            h += "<text x=\"\(labelW + plotW + 8)\" y=\"\(y + 4)\" fill=\"\(colour)\">\(e.verdict.rawValue)</text>"
        }
        return h + "</svg>"
    }

    /// Every effect as a table row (metric, level, baseline and level estimates, difference with
    /// its 95 % interval, verdict with the repeats advised, note), every text escaped.
    public static func estimatesTable(_ o: Comparison.Outcome) -> String {
        var h = "<table><tr><th class=\"l\">metric</th><th class=\"l\">level</th><th>baseline</th><th>level</th><th>difference [95 %]</th><th class=\"l\">verdict</th><th class=\"l\">note</th></tr>\n"
        for e in o.effects {
            func n(_ v: Double?) -> String { v.map(Format.number) ?? "–" }
            let diff = e.delta.map { Format.signed($0) + (e.ci95.map { " [\(Format.signed($0[0])), \(Format.signed($0[1]))]" } ?? "") } ?? "–"
            let verdict = e.verdict.rawValue + (e.repeatsAdvised.map { " (+\($0) runs a level)" } ?? "")
            h += "<tr><td class=\"l\">\(esc(e.label))</td><td class=\"l\">\(esc(e.level))</td><td>\(e.baselineCensored == true ? "&gt; " : "")\(n(e.baselineEstimate))</td><td>\(e.estimateCensored == true ? "&gt; " : "")\(n(e.estimate))</td><td>\(diff)</td>"
            h += "<td class=\"l \(e.verdict == .noData ? "" : e.verdict.rawValue)\">\(esc(verdict))</td><td class=\"l note\">\(esc(e.note ?? ""))</td></tr>\n"
        }
        return h + "</table>\n"
    }

    public static func html(_ o: Comparison.Outcome, title: String, order: [OrderedRun] = []) -> String {
        let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
        var h = """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"><title>\(esc(title))</title>
        <style>
        body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
        h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
        table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
        td.l,th.l{text-align:left}.better{color:#1a7f37;font-weight:600}.worse{color:#b42318;font-weight:600}
        .same{color:#555}.inconclusive{color:#9a6700}.note{color:#666;font-size:12px}.fail{color:#b42318;font-weight:600}
        </style></head><body>
        <h1>\(esc(title))</h1>
        <p>factor <b>\(esc(o.factor))</b>, baseline <b>\(esc(o.baseline))</b>; levels: \(o.levels.map { "\(esc($0.name)) (\($0.runs.count) run\($0.runs.count == 1 ? "" : "s"))" }.joined(separator: ", "))</p>
        <p class="\(o.checkPassed ? "note" : "fail")">\(o.checkPassed ? "check" : "CHECK FAILED (no verdicts)"): \(o.check.prefix(20).map(esc).joined(separator: "<br>"))</p>

        """
        h += "<h2>Effects (change from the baseline, % of its value on a log scale, 95 % interval; grey: the practical margin)</h2>\n"
        h += forestPlot(o) + "\n"
        // The table.
        h += "<h2>Estimates</h2>\n" + estimatesTable(o)
        h += "<p class=\"note\">\(esc(o.method))</p>\n"
        // Per-level distributions across runs.
        h += "<h2>Each run's figure, by level</h2>\n"
        for metric in Metric.allCases {
            let series = o.levels.map { ($0.name, ($0.perRun[metric.rawValue] ?? []).compactMap { $0 }) }
            let all = series.flatMap { $0.1 }
            guard let lo = all.min(), let hi = all.max() else { continue }
            let span = hi - lo > 0 ? hi - lo : max(1, abs(hi))
            let w = 520.0, lh = 18.0
            let svgH = Double(series.count) * lh + 22
            func px(_ v: Double) -> Double { 130 + (v - lo) / span * (w - 150) }
            h += "<div><b>\(esc(metric.label))</b><br><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(w + 60))\" height=\"\(Int(svgH))\" role=\"img\" aria-label=\"\(esc(metric.label)) by level\"><style>text{font-size:11px;font-family:sans-serif}</style>"
            for (k, (name, values)) in series.enumerated() {
                let y = Double(k) * lh + 12
                h += "<text x=\"2\" y=\"\(y + 4)\">\(esc(String(name.prefix(20))))</text>"
                for v in values { h += "<circle cx=\"\(px(v))\" cy=\"\(y)\" r=\"3.5\" fill=\"\(colours[k % colours.count])\" fill-opacity=\"0.7\"/>" }
            }
            h += "<text x=\"130\" y=\"\(svgH - 4)\">\(Format.number(lo))</text><text x=\"\(w - 20)\" y=\"\(svgH - 4)\" text-anchor=\"end\">\(Format.number(hi))</text></svg></div>\n"
        }
        if !order.isEmpty {
            h += "<h2>Run order</h2>\n<table><tr><th>#</th><th>block</th><th class=\"l\">level</th><th>seed</th><th class=\"l\">bundle</th></tr>\n"
            for r in order { h += "<tr><td>\(r.index + 1)</td><td>\(r.block + 1)</td><td class=\"l\">\(esc(r.level))</td><td>\(r.seed)</td><td class=\"l\">\(esc(r.bundle))</td></tr>\n" }
            h += "</table>\n"
        }
        h += "</body></html>\n"
        return h
    }
}
