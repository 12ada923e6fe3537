import Foundation

/// Loads or computes a bundle's summary: report/summary.json when present, else a fresh analysis.
public enum SummaryLoader {
    public static func load(_ path: URL) throws -> AnalysisResult {
        let summary = path.appendingPathComponent("report/summary.json")
        if FileManager.default.fileExists(atPath: summary.path), let r = try? ReportWriter.readSummary(summary, root: path) { return r }
        if path.lastPathComponent == "summary.json" {
            // A summary given directly: a regular file, read whole up to a bound.
            return try ReportWriter.readSummary(path, root: path.deletingLastPathComponent())
        }
        return try Analyser.analyse(path).result
    }
}

/// Run-to-run regression: which headline figures and pairs fell below the baseline by more
/// than the tolerance (percentage points).
public enum Regression {
    public struct Finding: Codable, Sendable {
        public var metric: String
        public var baseline: Double
        public var current: Double
        public var delta: Double { current - baseline }
    }

    public static func compare(current: AnalysisResult, baseline: AnalysisResult, tolerance: Double) -> (regressions: [Finding], compared: [Finding]) {
        var compared = [Finding]()
        compared.append(.init(metric: "detection %", baseline: baseline.strict.detectionpct, current: current.strict.detectionpct))
        compared.append(.init(metric: "continuity % (strict)", baseline: baseline.strict.continuitypct, current: current.strict.continuitypct))
        compared.append(.init(metric: "continuity % (herald)", baseline: baseline.herald.continuitypct, current: current.herald.continuitypct))
        let base = Dictionary(baseline.pairs.map { ("\($0.observer) sees \($0.observed)", $0) }, uniquingKeysWith: { a, _ in a })
        for p in current.pairs {
            let key = "\(p.observer) sees \(p.observed)"
            guard let b = base[key] else { continue }
            compared.append(.init(metric: "continuity % of \(key)", baseline: b.strictScorePct, current: p.strictScorePct))
        }
        let regressions = compared.filter { $0.current < $0.baseline - tolerance - 1e-9 }
        return (regressions, compared)
    }
}

/// Side-by-side comparison of runs, grouped by plan variant, sensor settings and controller identity.
public enum Comparison {
    public struct Group: Sendable {
        public var key: String
        public var runs: [AnalysisResult]
    }

    public static func groupKey(_ r: AnalysisResult) -> String {
        let variant = r.input.variant.flatMap { $0.isEmpty ? nil : $0 } ?? "-"
        let sensor = r.input.sensor.map { s in s.keys.sorted().map { "\($0)=\(s[$0]!)" }.joined(separator: " ") } ?? "-"
        let controllers = r.input.controllers.map { c in Set(c.values).sorted().joined(separator: "; ") } ?? "-"
        return "plan \(r.input.plan ?? "-") · variant \(variant) · sensor \(sensor) · controllers \(controllers)"
    }

    public static func groups(_ runs: [AnalysisResult]) -> [Group] {
        var order = [String]()
        var by = [String: [AnalysisResult]]()
        for r in runs {
            let k = groupKey(r)
            if by[k] == nil { order.append(k) }
            by[k, default: []].append(r)
        }
        return order.map { Group(key: $0, runs: by[$0]!) }
    }

    static let metrics: [(String, @Sendable (AnalysisResult) -> Double?)] = [
        ("detection %", { $0.strict.detectionpct }),
        ("continuity % (strict)", { $0.strict.continuitypct }),
        ("continuity % (herald)", { $0.herald.continuitypct }),
        ("longevity (strict)", { $0.strict.longevity }),
        ("median interval s", { r in median(r.pairs.compactMap(\.intervalP50)) }),
        ("longest gap s", { r in r.pairs.map(\.longestGap).max() }),
        ("time to first detection s", { r in median(r.pairs.compactMap(\.timeToFirstDetection)) }),
    ]

    static func median(_ v: [Double]) -> Double? {
        guard !v.isEmpty else { return nil }
        let s = v.sorted()
        return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
    }

    /// A text table: one column per group (mean over its runs), deltas against the first group.
    public static func table(_ runs: [AnalysisResult]) -> String {
        let gs = groups(runs)
        var lines = [String]()
        for (i, g) in gs.enumerated() {
            lines.append("G\(i + 1): \(g.key) (\(g.runs.count) run\(g.runs.count == 1 ? "" : "s"): \(g.runs.map { $0.input.runId ?? $0.input.path }.joined(separator: ", ")))")
        }
        lines.append("")
        var header = "metric".padding(toLength: 28, withPad: " ", startingAt: 0)
        for i in gs.indices { header += "  " + "G\(i + 1)".padding(toLength: 10, withPad: " ", startingAt: 0) + (i > 0 ? "  " + "Δ G1".padding(toLength: 9, withPad: " ", startingAt: 0) : "") }
        lines.append(header)
        for (name, value) in metrics {
            var line = name.padding(toLength: 28, withPad: " ", startingAt: 0)
            let means: [Double?] = gs.map { g in
                let vs = g.runs.compactMap(value)
                return vs.isEmpty ? nil : vs.reduce(0, +) / Double(vs.count)
            }
            for (i, m) in means.enumerated() {
                line += "  " + (m.map { String(format: "%.4f", $0) } ?? "–").padding(toLength: 10, withPad: " ", startingAt: 0)
                if i > 0 {
                    let d: String
                    if let m, let base = means[0] { d = String(format: "%+.4f", m - base) } else { d = "–" }
                    line += "  " + d.padding(toLength: 9, withPad: " ", startingAt: 0)
                }
            }
            lines.append(line)
        }
        return lines.joined(separator: "\n")
    }
}
