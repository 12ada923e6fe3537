import Foundation
import HeraldCore

/// The metrics comparisons and regressions weigh, each computed with the device (observer) as
/// the independent unit from a run's per-pair results (summary.json's `pairs`): windows inside
/// a pair, and pairs of one observer, are correlated; devices are not (docs/STATISTICS.md).
public enum Metric: String, CaseIterable, Codable, Sendable {
    case detectionPct
    case continuityStrictPct
    case continuityHeraldPct
    case samplesPerPairMinute
    case intervalMedian
    case intervalP95
    case longestGap
    case timeToFirstDetection
    case timeToFirstRead
    case readSuccessPct

    /// What a report prints.
    public var label: String {
        switch self {
        case .detectionPct: return "detection %"
        case .continuityStrictPct: return "continuity % (strict)"
        case .continuityHeraldPct: return "continuity % (herald)"
        case .samplesPerPairMinute: return "RSSI samples /pair/min"
        case .intervalMedian: return "median interval s"
        case .intervalP95: return "p95 interval s"
        case .longestGap: return "longest gap s"
        case .timeToFirstDetection: return "first detection s"
        case .timeToFirstRead: return "first read s"
        case .readSuccessPct: return "read success %"
        }
    }

    public var higherIsBetter: Bool {
        switch self {
        case .detectionPct, .continuityStrictPct, .continuityHeraldPct, .samplesPerPairMinute, .readSuccessPct: return true
        default: return false
        }
    }

    /// Pooled ratio (sum over units / sum possible) or the median over every pair's value.
    public var pooling: Pooling {
        switch self {
        case .detectionPct, .continuityStrictPct, .continuityHeraldPct, .samplesPerPairMinute, .readSuccessPct: return .ratio
        default: return .median
        }
    }

    /// The metric's bound when it is a percentage that cannot exceed 100.
    public var ceiling: Double? {
        switch self {
        case .detectionPct, .continuityStrictPct, .readSuccessPct: return 100
        default: return nil
        }
    }

    /// Default practical margin: a change smaller than this does not matter. Percentages in
    /// points; rates and times relative to the baseline (10 %).
    public var defaultMargin: Margin {
        switch self {
        case .detectionPct, .continuityStrictPct, .continuityHeraldPct, .readSuccessPct: return .points(1)
        default: return .relative(0.1)
        }
    }

    public var isPercentage: Bool { ceiling != nil || self == .continuityHeraldPct }
}

/// A practical margin: absolute (in the metric's unit, points for percentages) or a fraction
/// of the baseline's value.
public enum Margin: Codable, Sendable, Equatable, CustomStringConvertible {
    case points(Double)
    case relative(Double)

    public func absolute(baseline: Double) -> Double {
        switch self {
        case .points(let v): return v
        case .relative(let f): return f * abs(baseline)
        }
    }
    public var description: String {
        switch self {
        case .points(let v): return String(format: "±%g", v)
        case .relative(let f): return String(format: "±%g%%", f * 100)
        }
    }
}

/// Which pairs of a run count (all, or those inside one node group: A/B in one run).
public struct PairSelection: Sendable, Equatable {
    /// Devices (folder names) whose pairs count; nil: every device.
    public var devices: Set<String>?
    public init(devices: Set<String>? = nil) { self.devices = devices }
    public static let all = PairSelection()
    func includes(_ p: AnalysisResult.PairMetrics) -> Bool {
        guard let d = devices else { return true }
        return d.contains(p.observer) && d.contains(p.observed)
    }
}

/// A run's metrics with the device as the unit.
public enum RunMetrics {
    /// Minutes of the contact event.
    public static func contactMinutes(_ r: AnalysisResult) -> Double {
        if let s = AnalysisTime.parse(r.parameters.ceStart), let e = AnalysisTime.parse(r.parameters.ceEnd), e > s { return (e - s) / 60 }
        return Double(r.parameters.cetotal) / 2
    }

    /// Seconds from the filter window's start (where times to first detection and first read
    /// are counted from) to its end: a pair not detected (or not read) by then is censored there.
    public static func observedSeconds(_ r: AnalysisResult) -> Double {
        if let s = AnalysisTime.parse(r.parameters.filterStart), let e = AnalysisTime.parse(r.parameters.filterEnd), e > s { return e - s }
        return contactMinutes(r) * 60
    }

    /// One unit per ordered pair (its observer and observed device, by index in the run's
    /// devices) holding what `metric` needs of it; a bootstrap draws devices, not pairs. The
    /// times to first detection and first read are censored: a pair never detected (read)
    /// holds the run's observed length, marked censored ("not detected by the end"), so their
    /// median is over every pair (docs/STATISTICS.md).
    public static func units(_ r: AnalysisResult, _ metric: Metric, selection: PairSelection = .all) -> [StatUnit] {
        let cetotal = Double(max(1, r.parameters.cetotal))
        let minutes = contactMinutes(r)
        let end = observedSeconds(r)
        var index = [String: Int]()
        for (i, d) in r.devices.enumerated() { index[d.folder] = i }
        var out = [StatUnit]()
        for p in r.pairs where selection.includes(p) {
            var u = StatUnit(device: index[p.observer] ?? -1, partner: index[p.observed] ?? -2)
            switch metric {
            case .detectionPct: u.hits = p.detected ? 1 : 0; u.possible = 1
            case .continuityStrictPct: u.hits = Double(p.strictWindows); u.possible = cetotal
            case .continuityHeraldPct: u.hits = Double(p.heraldWindows); u.possible = cetotal
            case .samplesPerPairMinute: u.hits = Double(p.rssiSamples); u.possible = minutes
            case .readSuccessPct: u.hits = p.timeToFirstRead != nil ? 1 : 0; u.possible = 1
            case .intervalMedian: if let v = p.intervalP50 { u.values = [v] }
            case .intervalP95: if let v = p.intervalP95 { u.values = [v] }
            case .longestGap: u.values = [p.longestGap]
            case .timeToFirstDetection:
                if let v = p.timeToFirstDetection, v.isFinite { u.values = [v] } else { u.values = [end]; u.censored = true }
            case .timeToFirstRead:
                if let v = p.timeToFirstRead, v.isFinite { u.values = [v] } else { u.values = [end]; u.censored = true }
            }
            out.append(u)
        }
        return out
    }

    public static func scale(_ m: Metric) -> Double { m.isPercentage ? 100 : 1 }

    /// Whether every unit of these runs gives the same value (nothing to test), and whether that
    /// value is the metric's ceiling.
    public static func spread(_ runs: [[StatUnit]], _ metric: Metric) -> (noVariance: Bool, atCeiling: Bool) {
        var values = [Double]()
        for run in runs {
            for u in run {
                switch metric.pooling {
                case .ratio: if u.possible > 0 { values.append(scale(metric) * u.hits / u.possible) }
                case .median: values.append(contentsOf: u.values)
                }
            }
        }
        guard let first = values.first else { return (true, false) }
        let same = values.allSatisfy { abs($0 - first) < 1e-9 }
        let ceiling = metric.ceiling.map { c in values.allSatisfy { $0 >= c - 1e-9 } } ?? false
        return (same, ceiling)
    }

    public struct Value: Codable, Sendable {
        public var metric: Metric
        public var estimate: Double?
        public var ci95: [Double]?
        /// Devices that gave the figure.
        public var units: Int
        /// "at its ceiling", "no variance across devices", "no data", or nil.
        public var note: String?
        /// A time whose median is censored: more than half of the pairs had no event by the end,
        /// so the median is above `estimate` (the run's length).
        public var censored: Bool? = nil
    }

    /// Every metric of one run with its 95 % interval (bootstrap over devices, seeded).
    public static func compute(_ r: AnalysisResult, selection: PairSelection = .all, bootstrap: ClusterBootstrap = ClusterBootstrap(resamples: 1000, seed: 1)) -> [Value] {
        Metric.allCases.map { m in
            let units = self.units(r, m, selection: selection)
            let usable = units.filter { m.pooling == .ratio ? $0.possible > 0 : !$0.values.isEmpty }
            let devices = Set(usable.map(\.device)).count
            guard let e = bootstrap.estimate([usable], pooling: m.pooling, scale: scale(m), stream: m.rawValue) else {
                return Value(metric: m, estimate: nil, ci95: nil, units: 0, note: "no data")
            }
            let s = spread([usable], m)
            let note = e.censored ? "censored: more than half of the pairs had none by the end of the run"
                : (s.atCeiling ? "at its ceiling (every pair)" : (s.noVariance ? "no variance across pairs" : nil))
            return Value(metric: m, estimate: e.estimate, ci95: [e.ci.lo, e.ci.hi], units: devices, note: note, censored: e.censored ? true : nil)
        }
    }

    /// A text table of `compute`.
    public static func table(_ values: [Value]) -> String {
        var lines = ["metric (devices as units)       estimate   95 % interval          devices"]
        for v in values {
            let est = v.estimate.map { (v.censored == true ? "> " : "") + Format.number($0) } ?? "–"
            let ci = v.ci95.map { "[\(Format.number($0[0])), \(Format.number($0[1]))]" } ?? ""
            lines.append(Format.pad(v.metric.label, 29) + " " + Format.pad(est, 10) + " " + Format.pad(ci, 22) + " " + String(v.units) + (v.note.map { "  (\($0))" } ?? ""))
        }
        return lines.joined(separator: "\n")
    }
}

/// Number and label formatting for the statistics tables.
public enum Format {
    /// Four significant figures, at most three decimals.
    public static func number(_ v: Double) -> String {
        guard v.isFinite else { return String(v) }
        let a = abs(v)
        if a >= 100 { return String(format: "%.1f", v) }
        if a >= 10 { return String(format: "%.2f", v) }
        return String(format: "%.3f", v)
    }
    public static func signed(_ v: Double) -> String { (v >= 0 ? "+" : "") + number(v) }
    public static func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }

    /// A label from outside (a plan, a bundle, a setting) made safe to print: every printed label
    /// of compare, regress and study goes through the one escape helper all output uses.
    public static func label(_ s: String) -> String { OutsideText.escaped(s) }
}
