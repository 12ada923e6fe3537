import Foundation
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// The statistics comparisons, studies and regression verdicts rest on (docs/STATISTICS.md):
/// score intervals for proportions, seeded cluster bootstraps over devices, Student t
/// quantiles, prediction intervals, multiple-comparison control and repeats advice.
/// Everything is deterministic for a seed; nothing here reads a clock.
public enum Stats {
    /// A closed interval [lo, hi].
    public struct Interval: Codable, Sendable, Equatable {
        public var lo: Double
        public var hi: Double
        public init(_ lo: Double, _ hi: Double) { self.lo = lo; self.hi = hi }
        public func contains(_ v: Double) -> Bool { v >= lo && v <= hi }
        public var width: Double { hi - lo }
    }

    // MARK: Distributions

    /// Standard normal distribution function.
    public static func normalCDF(_ x: Double) -> Double { 0.5 * erfc(-x / 2.0.squareRoot()) }

    /// Standard normal quantile (bisection on the distribution function; |error| < 1e-12).
    public static func normalQuantile(_ p: Double) -> Double {
        precondition(p > 0 && p < 1, "a probability strictly between 0 and 1")
        var lo = -40.0, hi = 40.0
        for _ in 0..<200 {
            let mid = (lo + hi) / 2
            if normalCDF(mid) < p { lo = mid } else { hi = mid }
            if hi - lo < 1e-13 { break }
        }
        return (lo + hi) / 2
    }

    /// Regularised incomplete beta I_x(a, b), by its continued fraction (modified Lentz).
    static func incompleteBeta(_ x: Double, _ a: Double, _ b: Double) -> Double {
        if x <= 0 { return 0 }
        if x >= 1 { return 1 }
        let lg: Double = lgamma(a + b) - lgamma(a) - lgamma(b)
        let lnFront: Double = lg + a * log(x) + b * log(1 - x)
        // The fraction converges fast for x < (a+1)/(a+b+2); use the symmetry otherwise.
        if x > (a + 1) / (a + b + 2) { return 1 - incompleteBeta(1 - x, b, a) }
        let tiny = 1e-300
        var c = 1.0
        var d = 1 - (a + b) * x / (a + 1)
        if abs(d) < tiny { d = tiny }
        d = 1 / d
        var f = d
        for m in 1...500 {
            let m = Double(m)
            // Even step.
            var num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
            d = 1 + num * d; if abs(d) < tiny { d = tiny }
            c = 1 + num / c; if abs(c) < tiny { c = tiny }
            d = 1 / d
            f *= d * c
            // Odd step.
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
            d = 1 + num * d; if abs(d) < tiny { d = tiny }
            c = 1 + num / c; if abs(c) < tiny { c = tiny }
            d = 1 / d
            let delta = d * c
            f *= delta
            if abs(delta - 1) < 1e-15 { break }
        }
        return exp(lnFront) * f / a
    }

    /// Student t distribution function with `df` degrees of freedom.
    public static func tCDF(_ t: Double, df: Double) -> Double {
        precondition(df > 0)
        let tail = 0.5 * incompleteBeta(df / (df + t * t), df / 2, 0.5)
        return t >= 0 ? 1 - tail : tail
    }

    /// Student t quantile (t_{p, df}); e.g. t_{0.975, 4} = 2.776.
    public static func tQuantile(_ p: Double, df: Double) -> Double {
        precondition(p > 0 && p < 1 && df > 0)
        if p == 0.5 { return 0 }
        if p < 0.5 { return -tQuantile(1 - p, df: df) }
        var lo = 0.0, hi = 1.0
        while tCDF(hi, df: df) < p { hi *= 2; if hi > 1e12 { return hi } }
        for _ in 0..<200 {
            let mid = (lo + hi) / 2
            if tCDF(mid, df: df) < p { lo = mid } else { hi = mid }
            if hi - lo < 1e-12 * max(1, hi) { break }
        }
        return (lo + hi) / 2
    }

    // MARK: Proportions

    /// Wilson score interval for k successes in n (as fractions, 0...1). n = 0: [0, 1].
    public static func wilson(_ k: Int, _ n: Int, confidence: Double = 0.95) -> Interval {
        precondition(k >= 0 && n >= 0 && k <= n)
        guard n > 0 else { return Interval(0, 1) }
        let z = normalQuantile(1 - (1 - confidence) / 2)
        let nn = Double(n), p = Double(k) / nn, z2 = z * z
        let centre = (p + z2 / (2 * nn)) / (1 + z2 / nn)
        let half = z / (1 + z2 / nn) * (p * (1 - p) / nn + z2 / (4 * nn * nn)).squareRoot()
        // At k = 0 or k = n the interval touches the bound exactly.
        return Interval(k == 0 ? 0 : max(0, centre - half), k == n ? 1 : min(1, centre + half))
    }

    /// Newcombe's hybrid score interval (method 10) for p2 - p1, from the two Wilson intervals
    /// (fractions). Used where only pooled counts exist.
    public static func newcombe(k1: Int, n1: Int, k2: Int, n2: Int, confidence: Double = 0.95) -> Interval {
        let w1 = wilson(k1, n1, confidence: confidence), w2 = wilson(k2, n2, confidence: confidence)
        let p1 = n1 > 0 ? Double(k1) / Double(n1) : 0, p2 = n2 > 0 ? Double(k2) / Double(n2) : 0
        let d = p2 - p1
        let lo = d - ((p2 - w2.lo) * (p2 - w2.lo) + (w1.hi - p1) * (w1.hi - p1)).squareRoot()
        let hi = d + ((w2.hi - p2) * (w2.hi - p2) + (p1 - w1.lo) * (p1 - w1.lo)).squareRoot()
        return Interval(max(-1, lo), min(1, hi))
    }

    /// One-sided upper bound on a failure rate when none of n failed: 1 - alpha^(1/n).
    public static func zeroFailureUpperBound(_ n: Int, alpha: Double = 0.05) -> Double {
        n > 0 ? 1 - pow(alpha, 1 / Double(n)) : 1
    }

    // MARK: Summaries

    public static func mean(_ v: [Double]) -> Double? { v.isEmpty ? nil : v.reduce(0, +) / Double(v.count) }

    /// Sample standard deviation (n - 1); nil below 2 values.
    public static func sd(_ v: [Double]) -> Double? {
        guard v.count >= 2, let m = mean(v) else { return nil }
        return (v.reduce(0) { $0 + ($1 - m) * ($1 - m) } / Double(v.count - 1)).squareRoot()
    }

    /// The median (mean of the middle two for an even count); nil when empty.
    public static func median(_ v: [Double]) -> Double? {
        guard !v.isEmpty else { return nil }
        let s = v.sorted()
        return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
    }

    /// The q-quantile of sorted values (linear between order statistics, R type 7).
    public static func quantile(sorted s: [Double], _ q: Double) -> Double? {
        guard !s.isEmpty else { return nil }
        let h = Double(s.count - 1) * min(1, max(0, q))
        let i = min(s.count - 1, max(0, Saturating.int(h.rounded(.down))))
        return i + 1 < s.count ? s[i] + (h - Double(i)) * (s[i + 1] - s[i]) : s[i]
    }

    /// Prediction interval for one new value from past values: mean ± t_{1-(1-c)/2, n-1} s √(1 + 1/n).
    /// Nil below 2 values (no variance to go on).
    public static func predictionInterval(_ values: [Double], confidence: Double = 0.95) -> Interval? {
        guard values.count >= 2, let m = mean(values), let s = sd(values) else { return nil }
        let n = Double(values.count)
        let t = tQuantile(1 - (1 - confidence) / 2, df: n - 1)
        let half = t * s * (1 + 1 / n).squareRoot()
        return Interval(m - half, m + half)
    }

    // MARK: Multiple comparisons

    /// Holm's step-down adjustment of p-values (family-wise error control); same order as given.
    public static func holm(_ p: [Double]) -> [Double] {
        let m = p.count
        let order = p.indices.sorted { p[$0] < p[$1] || (p[$0] == p[$1] && $0 < $1) }
        var adjusted = [Double](repeating: 1, count: m)
        var running = 0.0
        for (rank, i) in order.enumerated() {
            running = max(running, min(1, Double(m - rank) * p[i]))
            adjusted[i] = running
        }
        return adjusted
    }

    // MARK: Power and repeats

    /// Independent units per arm to tell a difference `delta` from 0 with a two-sided test at
    /// `alpha` and the given power, when one unit's standard deviation is `sd`:
    /// n = 2 (z_{1-alpha/2} + z_{power})^2 sd^2 / delta^2. Nil when it cannot be said (no delta),
    /// capped at `cap` (a value at the cap means "more than is worth running").
    public static func unitsPerArm(sd: Double, delta: Double, alpha: Double = 0.05, power: Double = 0.8, cap: Int = 100) -> Int? {
        guard sd.isFinite, delta.isFinite, abs(delta) > 0 else { return nil }
        if sd == 0 { return 2 }
        let z = normalQuantile(1 - alpha / 2) + normalQuantile(power)
        let n = 2 * z * z * sd * sd / (delta * delta)
        // Range-checked before the conversion: a difference of nearly 0 asks for more than Int holds.
        guard n.isFinite, n < Double(cap) else { return cap }
        return min(cap, max(2, Int(n.rounded(.up))))
    }

    /// Cohen's h between two proportions (fractions).
    public static func cohenH(_ p1: Double, _ p2: Double) -> Double { 2 * asin(p1.squareRoot()) - 2 * asin(p2.squareRoot()) }

    /// Independent units per arm to tell two proportions apart (two-sided alpha, power).
    public static func unitsPerArm(p1: Double, p2: Double, alpha: Double = 0.05, power: Double = 0.8) -> Int? {
        let h = abs(cohenH(p1, p2))
        guard h > 0 else { return nil }
        let z = normalQuantile(1 - alpha / 2) + normalQuantile(power)
        let n = (z / h * z / h).rounded(.up)
        return n.isFinite && n < Double(Int32.max) ? Int(n) : Int(Int32.max)
    }
}

// MARK: Cluster bootstrap

/// What one observation of a run contributes: counts for pooled metrics and values for median
/// metrics, with the device it belongs to and, for a pair, the other device. Devices are the
/// independent units: a bootstrap draws devices, and a pair counts as often as both its
/// devices were drawn (windows inside a pair, and pairs sharing a device, are correlated).
public struct StatUnit: Sendable, Equatable {
    /// Successes (hits, windows, samples) and their possible total, for a pooled ratio.
    public var hits: Double
    public var possible: Double
    /// Values for a median metric (empty for a pooled one).
    public var values: [Double]
    /// The device (observer) and the other device of a pair (nil: none), as identities within
    /// the arm: the same number stands for the same dongle in every run of the arm (compare keys
    /// it by the dongle, docs/STATISTICS.md), so a resample draws that dongle once for all of
    /// its runs. Numbers need not be contiguous.
    public var device: Int
    public var partner: Int?
    /// The values are censoring times, not event times: the event (a first detection, a first
    /// read) had not happened by then, the end of the run (docs/STATISTICS.md, censored times).
    public var censored: Bool
    public init(hits: Double = 0, possible: Double = 0, values: [Double] = [], device: Int = 0, partner: Int? = nil, censored: Bool = false) {
        self.hits = hits
        self.possible = possible
        self.values = values
        self.device = device
        self.partner = partner
        self.censored = censored
    }
}

/// How a metric is put together over units: a pooled ratio (sum hits / sum possible, times
/// `scale`), or the median of every unit's values.
public enum Pooling: String, Codable, Sendable {
    case ratio, median

    public func statistic(_ units: [StatUnit], scale: Double = 1) -> Double? {
        switch self {
        case .ratio:
            var h = 0.0, p = 0.0
            for u in units { h += u.hits; p += u.possible }
            return p > 0 ? scale * h / p : nil
        case .median:
            var all = [Double]()
            for u in units { all.append(contentsOf: u.values) }
            return Stats.median(all)
        }
    }

    /// Whether the median lands on a censored value (more than half of the values, or exactly
    /// half with the other middle value, were not observed by the end): the median is then
    /// only known to be above the run's length. Never for a ratio.
    public func censored(_ units: [StatUnit]) -> Bool {
        guard self == .median else { return false }
        var all = [(Double, Bool)]()
        for u in units { for v in u.values { all.append((v, u.censored)) } }
        guard !all.isEmpty else { return false }
        all.sort { $0.0 < $1.0 || ($0.0 == $1.0 && !$0.1 && $1.1) }
        let n = all.count
        return n % 2 == 1 ? all[n / 2].1 : (all[n / 2 - 1].1 || all[n / 2].1)
    }
}

/// Seeded cluster bootstraps: resample runs (three or more in an arm) and the arm's dongles
/// (each dongle once for all of its runs), recompute the pooled statistic, take expanded
/// percentile intervals (docs/STATISTICS.md).
public struct ClusterBootstrap: Sendable {
    public var resamples: Int
    public var seed: UInt64
    public init(resamples: Int = 2000, seed: UInt64 = 1) {
        self.resamples = max(100, min(100_000, resamples))
        self.seed = seed
    }

    /// Unit visits one bootstrap may make (resamples x units): a run of 150 devices has 22,350
    /// ordered pairs, and 2,000 resamples of each of 10 metrics would take minutes. Up to 2,500
    /// units (50 devices) every resample is drawn; beyond, fewer, never under `minimumResamples`
    /// (docs/STATISTICS.md).
    public static let unitBudget = 5_000_000
    /// Resamples a comparison draws at least, whatever its size (when `resamples` asks for as
    /// many): Holm multiplies the smallest Monte-Carlo p-value (at least 1/B) by the family's
    /// size, and with B = 400 a study of 3 levels could never call anything (issue 38).
    public static let minimumResamples = 2000

    /// Runs a level needs before its runs are resampled (and before a crossover is paired).
    public static let minimumRunsToResample = Prepared.minimumRunsToResample

    /// The resamples to draw over `units` units: `resamples`, or fewer within `unitBudget`.
    public func resamples(over units: Int) -> Int {
        min(resamples, max(Self.minimumResamples, Self.unitBudget / max(1, units)))
    }

    /// An arm: its runs, each a list of units.
    public typealias Arm = [[StatUnit]]

    /// How much a percentile interval from `n` independent units (dongles) is widened:
    /// Hesterberg's expanded percentile interval (The American Statistician 69(4), 2015), the
    /// factor sqrt(n / (n - 1)) t_{1-a/2, n-1} / z_{1-a/2}. A bootstrap of n units has the
    /// variance (n - 1)/n of the true one and a normal, not a t, shape: with 5-12 dongles
    /// that differ a 95 % percentile interval covers 84-89 % (docs/STATISTICS.md).
    public static func expansion(units n: Int, confidence: Double = 0.95) -> Double {
        guard n >= 2 else { return 1 }
        let a = (1 - confidence) / 2
        let nn = Double(n)
        return (nn / (nn - 1)).squareRoot() * Stats.tQuantile(1 - a, df: nn - 1) / Stats.normalQuantile(1 - a)
    }

    /// An arm prepared for fast resampling. A resample is a count per run (runs drawn with
    /// replacement when there are `minimumRunsToResample` or more, else each run once) and a
    /// count per device: the arm's distinct devices are drawn once for the whole resample
    /// (a dongle in every run of the arm keeps one count in all of them). A unit weighs
    /// (its run's count) x (its device's count) x (its partner's count): a run drawn k times
    /// weighs k, and a pair weighs as often as both its devices were drawn. Devices that never
    /// share a run with another run's devices are drawn within their own runs (strata), so
    /// runs of different dongles keep their sizes. The statistic is a weighted ratio, or a
    /// weighted median over the arm's values sorted once.
    struct Prepared {
        var runCount: Int
        /// Distinct devices of the arm (a dongle in several runs is one device).
        var deviceCount: Int
        /// Devices drawn together: those linked by sharing runs.
        var strata: [[Int]]
        var unitRun: [Int]
        var unitDevice: [Int]
        var unitPartner: [Int]
        var hits: [Double]
        var possible: [Double]
        /// Every value of every unit, sorted (a censored value after an observed one of the
        /// same time), with the unit it belongs to and whether it is censored.
        var values: [Double]
        var owner: [Int]
        var valueCensored: [Bool]

        init(_ arm: Arm) {
            var ids = [Int: Int]()
            func index(_ d: Int) -> Int {
                if let g = ids[d] { return g }
                let g = ids.count
                ids[d] = g
                return g
            }
            var hits = [Double](), possible = [Double](), unitRun = [Int](), unitDevice = [Int](), unitPartner = [Int]()
            var pairs = [(Double, Int, Bool)]()
            var runFirst = [Int]()
            for run in arm where !run.isEmpty {
                let r = runFirst.count
                runFirst.append(index(run[0].device))
                for u in run {
                    let k = hits.count
                    for v in u.values { pairs.append((v, k, u.censored)) }
                    hits.append(u.hits)
                    possible.append(u.possible)
                    unitRun.append(r)
                    unitDevice.append(index(u.device))
                    unitPartner.append(u.partner.map(index) ?? -1)
                }
            }
            // Strata: devices of one run belong together, and runs that share a device merge.
            var parent = Array(0..<ids.count)
            func find(_ x: Int) -> Int {
                var x = x
                while parent[x] != x { parent[x] = parent[parent[x]]; x = parent[x] }
                return x
            }
            func union(_ a: Int, _ b: Int) { let ra = find(a), rb = find(b); if ra != rb { parent[max(ra, rb)] = min(ra, rb) } }
            for u in unitDevice.indices {
                union(unitDevice[u], runFirst[unitRun[u]])
                if unitPartner[u] >= 0 { union(unitPartner[u], runFirst[unitRun[u]]) }
            }
            var byRoot = [Int: Int](), strata = [[Int]]()
            for d in 0..<ids.count {
                let root = find(d)
                if let s = byRoot[root] { strata[s].append(d) } else { byRoot[root] = strata.count; strata.append([d]) }
            }
            pairs.sort { $0.0 < $1.0 || ($0.0 == $1.0 && !$0.2 && $1.2) }
            self.runCount = runFirst.count
            self.deviceCount = ids.count
            self.strata = strata
            self.unitRun = unitRun
            self.unitDevice = unitDevice
            self.unitPartner = unitPartner
            self.hits = hits
            self.possible = possible
            self.values = pairs.map(\.0)
            self.owner = pairs.map(\.1)
            self.valueCensored = pairs.map(\.2)
        }

        /// Runs are drawn only from this many runs up: fewer runs say nothing of run-to-run
        /// noise, so each is kept once and only the devices are drawn.
        static let minimumRunsToResample = 3

        /// Draws runs (when there are enough) and devices, and sets each unit's weight.
        func draw(_ g: inout SeededGenerator, counts: inout [Int], weights: inout [Double]) {
            var runCounts = [Int](repeating: 1, count: runCount)
            draw(&g, runCounts: &runCounts, counts: &counts, weights: &weights)
        }

        func draw(_ g: inout SeededGenerator, runCounts: inout [Int], counts: inout [Int], weights: inout [Double]) {
            let n = runCount
            if n >= Self.minimumRunsToResample {
                for r in runCounts.indices { runCounts[r] = 0 }
                for _ in 0..<n { runCounts[Int(g.next() % UInt64(n))] += 1 }
            } else {
                for r in runCounts.indices { runCounts[r] = 1 }
            }
            for i in counts.indices { counts[i] = 0 }
            for stratum in strata {
                let size = UInt64(stratum.count)
                for _ in 0..<stratum.count { counts[stratum[Int(g.next() % size)]] += 1 }
            }
            for u in weights.indices {
                let p = unitPartner[u]
                weights[u] = Double(runCounts[unitRun[u]] * counts[unitDevice[u]] * (p >= 0 ? counts[p] : 1))
            }
        }

        /// The weighted median's position: the value where the cumulative weight passes half,
        /// and the next value with weight when it lands exactly on half.
        func medianPosition(weights: [Double]?) -> (Int, Int?)? {
            var total = 0.0
            if let weights { for i in values.indices { total += weights[owner[i]] } } else { total = Double(values.count) }
            guard total > 0 else { return nil }
            let half = total / 2
            var seen = 0.0
            for i in values.indices {
                let w = weights?[owner[i]] ?? 1
                guard w > 0 else { continue }
                seen += w
                if seen > half { return (i, nil) }
                if seen == half {
                    var j = i + 1
                    while j < values.count, (weights?[owner[j]] ?? 1) == 0 { j += 1 }
                    return (i, j < values.count ? j : nil)
                }
            }
            return nil
        }

        func statistic(_ pooling: Pooling, weights: [Double]?, scale: Double) -> Double? {
            switch pooling {
            case .ratio:
                var h = 0.0, p = 0.0
                for i in hits.indices {
                    let w = weights?[i] ?? 1
                    h += w * hits[i]
                    p += w * possible[i]
                }
                return p > 0 ? scale * h / p : nil
            case .median:
                guard let (i, j) = medianPosition(weights: weights) else { return nil }
                return j.map { (values[i] + values[$0]) / 2 } ?? values[i]
            }
        }

        /// Whether the (unweighted) median is censored: it lands on a value not observed by the end.
        func censored(_ pooling: Pooling) -> Bool {
            guard pooling == .median, let (i, j) = medianPosition(weights: nil) else { return false }
            return valueCensored[i] || (j.map { valueCensored[$0] } ?? false)
        }
    }

    public struct Estimate: Sendable {
        public var estimate: Double
        public var ci: Stats.Interval
        /// Standard deviation of the bootstrap replicates.
        public var se: Double
        /// A median of times that lands on a censored value: the estimate (the run's length) is
        /// a lower bound, printed "> estimate".
        public var censored = false
    }

    /// The percentile interval of `reps` widened by `factor` around the replicates' median
    /// (the expanded percentile interval; factor 1: the plain percentile interval).
    static func interval(sorted reps: [Double], confidence: Double, factor: Double) -> Stats.Interval {
        let a = (1 - confidence) / 2
        let lo = Stats.quantile(sorted: reps, a)!, hi = Stats.quantile(sorted: reps, 1 - a)!
        let mid = Stats.quantile(sorted: reps, 0.5)!
        return Stats.Interval(mid + factor * (lo - mid), mid + factor * (hi - mid))
    }

    /// The statistic of one arm with its expanded percentile interval.
    public func estimate(_ arm: Arm, pooling: Pooling, scale: Double = 1, confidence: Double = 0.95, stream: String = "") -> Estimate? {
        let prepared = Prepared(arm)
        guard prepared.runCount > 0, let point = prepared.statistic(pooling, weights: nil, scale: scale) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-one " + stream)
        var counts = [Int](repeating: 0, count: prepared.deviceCount)
        var runCounts = [Int](repeating: 1, count: prepared.runCount)
        var weights = [Double](repeating: 0, count: prepared.hits.count)
        var reps = [Double]()
        let draws = resamples(over: prepared.hits.count)
        reps.reserveCapacity(draws)
        for _ in 0..<draws {
            prepared.draw(&g, runCounts: &runCounts, counts: &counts, weights: &weights)
            if let v = prepared.statistic(pooling, weights: weights, scale: scale) { reps.append(v) }
        }
        guard !reps.isEmpty else { return nil }
        reps.sort()
        let factor = Self.expansion(units: prepared.deviceCount, confidence: confidence)
        return Estimate(estimate: point, ci: Self.interval(sorted: reps, confidence: confidence, factor: factor), se: Stats.sd(reps) ?? 0,
                        censored: prepared.censored(pooling))
    }

    public struct Difference: Sendable {
        /// Level minus baseline.
        public var delta: Double
        public var ci: Stats.Interval
        public var se: Double
        /// Two-sided bootstrap p-value for a difference of 0 (twice the smaller tail of the
        /// expanded replicates, at least 1/B).
        public var p: Double
        /// Each arm's own estimate and interval, from the same resamples (the same statistic
        /// whose difference `delta` is: delta = level - baseline).
        public var baseline: Estimate? = nil
        public var level: Estimate? = nil
    }

    /// The difference `level - baseline` of a statistic, each arm resampled on its own.
    public func difference(baseline: Arm, level: Arm, pooling: Pooling, scale: Double = 1, confidence: Double = 0.95, stream: String = "") -> Difference? {
        let pa = Prepared(baseline), pb = Prepared(level)
        guard pa.runCount > 0, pb.runCount > 0,
              let a = pa.statistic(pooling, weights: nil, scale: scale), let b = pb.statistic(pooling, weights: nil, scale: scale) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-diff " + stream)
        var ca = [Int](repeating: 0, count: pa.deviceCount), cb = [Int](repeating: 0, count: pb.deviceCount)
        var ra = [Int](repeating: 1, count: pa.runCount), rb = [Int](repeating: 1, count: pb.runCount)
        var wa = [Double](repeating: 0, count: pa.hits.count), wb = [Double](repeating: 0, count: pb.hits.count)
        var reps = [Double](), repsA = [Double](), repsB = [Double]()
        let draws = resamples(over: pa.hits.count + pb.hits.count)
        reps.reserveCapacity(draws)
        for _ in 0..<draws {
            pa.draw(&g, runCounts: &ra, counts: &ca, weights: &wa)
            pb.draw(&g, runCounts: &rb, counts: &cb, weights: &wb)
            if let va = pa.statistic(pooling, weights: wa, scale: scale), let vb = pb.statistic(pooling, weights: wb, scale: scale) {
                reps.append(vb - va)
                repsA.append(va)
                repsB.append(vb)
            }
        }
        // The difference is widened by the smaller arm's dongles (the fewer independent units).
        let factor = Self.expansion(units: min(pa.deviceCount, pb.deviceCount), confidence: confidence)
        guard var d = Self.summarise(point: b - a, reps: reps, confidence: confidence, factor: factor) else { return nil }
        func arm(_ point: Double, _ r: [Double], _ p: Prepared) -> Estimate {
            let sorted = r.sorted()
            return Estimate(estimate: point, ci: Self.interval(sorted: sorted, confidence: confidence, factor: Self.expansion(units: p.deviceCount, confidence: confidence)),
                            se: Stats.sd(sorted) ?? 0, censored: p.censored(pooling))
        }
        d.baseline = arm(a, repsA, pa)
        d.level = arm(b, repsB, pb)
        return d
    }

    /// Paired differences (one per dongle in a crossover): the mean difference and its interval,
    /// resampling dongles.
    public func pairedDifference(_ differences: [Double], confidence: Double = 0.95, stream: String = "") -> Difference? {
        guard let point = Stats.mean(differences) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-paired " + stream)
        let n = differences.count
        var reps = [Double]()
        reps.reserveCapacity(resamples)
        for _ in 0..<resamples {
            var s = 0.0
            for _ in 0..<n { s += differences[Int(g.next() % UInt64(n))] }
            reps.append(s / Double(n))
        }
        return Self.summarise(point: point, reps: reps, confidence: confidence, factor: Self.expansion(units: n, confidence: confidence))
    }

    /// A crossover's paired difference: each unit's (dongle's) mean figure over the level's runs
    /// minus its mean over the baseline's runs, averaged over the units that ran both. A
    /// resample draws the runs of each level (with replacement) and the units (the same draw in
    /// every run, so the pairing holds): run-to-run noise, which every dongle of a run shares,
    /// stays in the interval. `baseline` and `level` hold each run's figure by unit. The
    /// difference's `baseline` and `level` estimates are the same statistic on each side (the
    /// mean over those dongles of each dongle's mean figure), so delta = level - baseline.
    public func crossoverDifference(baseline: [[String: Double]], level: [[String: Double]], confidence: Double = 0.95, stream: String = "") -> (difference: Difference, units: Int)? {
        var keys = Set<String>()
        for r in baseline { keys.formUnion(r.keys) }
        var inLevel = Set<String>()
        for r in level { inLevel.formUnion(r.keys) }
        let units = keys.intersection(inLevel).sorted()
        guard !units.isEmpty, !baseline.isEmpty, !level.isEmpty else { return nil }
        // Figures as [run][unit] (nan: the unit gave none in that run).
        func table(_ runs: [[String: Double]]) -> [[Double]] { runs.map { r in units.map { r[$0] ?? .nan } } }
        let a = table(baseline), b = table(level)
        func mean(_ t: [[Double]], runs: [Int], unit: Int) -> Double? {
            var s = 0.0, n = 0
            for r in runs where !t[r][unit].isNaN { s += t[r][unit]; n += 1 }
            return n > 0 ? s / Double(n) : nil
        }
        /// Each side's mean over the drawn dongles that have a figure on both sides.
        func statistic(runsA: [Int], runsB: [Int], draw: [Int]) -> (Double, Double)? {
            var sa = 0.0, sb = 0.0, n = 0
            for u in draw {
                guard let ma = mean(a, runs: runsA, unit: u), let mb = mean(b, runs: runsB, unit: u) else { continue }
                sa += ma
                sb += mb
                n += 1
            }
            return n > 0 ? (sa / Double(n), sb / Double(n)) : nil
        }
        guard let (pointA, pointB) = statistic(runsA: Array(a.indices), runsB: Array(b.indices), draw: Array(units.indices)) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-crossover " + stream)
        var reps = [Double](), repsA = [Double](), repsB = [Double]()
        reps.reserveCapacity(resamples)
        for _ in 0..<resamples {
            let ra = a.indices.map { _ in Int(g.next() % UInt64(a.count)) }
            let rb = b.indices.map { _ in Int(g.next() % UInt64(b.count)) }
            let draw = units.indices.map { _ in Int(g.next() % UInt64(units.count)) }
            if let (va, vb) = statistic(runsA: ra, runsB: rb, draw: draw) {
                reps.append(vb - va)
                repsA.append(va)
                repsB.append(vb)
            }
        }
        let factor = Self.expansion(units: units.count, confidence: confidence)
        guard var d = Self.summarise(point: pointB - pointA, reps: reps, confidence: confidence, factor: factor) else { return nil }
        func arm(_ point: Double, _ r: [Double]) -> Estimate {
            let sorted = r.sorted()
            return Estimate(estimate: point, ci: Self.interval(sorted: sorted, confidence: confidence, factor: factor), se: Stats.sd(sorted) ?? 0)
        }
        d.baseline = arm(pointA, repsA)
        d.level = arm(pointB, repsB)
        return (d, units.count)
    }

    /// The difference's expanded percentile interval and p-value: the replicates are widened by
    /// `factor` around their median, and p is twice the smaller tail of the widened replicates
    /// beyond 0 (at least 1/B), so p < 1 - confidence exactly when the interval excludes 0.
    static func summarise(point: Double, reps: [Double], confidence: Double, factor: Double = 1) -> Difference? {
        guard !reps.isEmpty else { return nil }
        let sorted = reps.sorted()
        let mid = Stats.quantile(sorted: sorted, 0.5)!
        let widened = factor == 1 ? sorted : sorted.map { mid + factor * ($0 - mid) }
        let below = Double(widened.filter { $0 <= 0 }.count), above = Double(widened.filter { $0 >= 0 }.count)
        let n = Double(sorted.count)
        let p = min(1, max(1 / n, 2 * min(below, above) / n))
        return Difference(delta: point, ci: interval(sorted: sorted, confidence: confidence, factor: factor), se: Stats.sd(sorted) ?? 0, p: p)
    }
}
