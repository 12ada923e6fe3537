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
    /// The device (observer) within its run, and the other device of a pair (nil: none).
    public var device: Int
    public var partner: Int?
    public init(hits: Double = 0, possible: Double = 0, values: [Double] = [], device: Int = 0, partner: Int? = nil) {
        self.hits = hits
        self.possible = possible
        self.values = values
        self.device = device
        self.partner = partner
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
}

/// Seeded cluster bootstraps: resample units (and, with several runs in an arm, runs first,
/// then units inside each chosen run), recompute the pooled statistic, take percentiles.
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

    /// An arm prepared for fast resampling: a resample is a count per device (how often it was
    /// drawn; runs are drawn first when there are several), a unit weighs the product of its
    /// devices' counts (the vertex bootstrap for pairs), and the statistic is a weighted ratio,
    /// or a weighted median over the arm's values sorted once.
    struct Prepared {
        /// Each run's devices, as a range of global device indices.
        var runs: [Range<Int>]
        var deviceCount: Int
        var unitDevice: [Int]
        var unitPartner: [Int]
        var hits: [Double]
        var possible: [Double]
        /// Every value of every unit, sorted, with the unit it belongs to.
        var values: [Double]
        var owner: [Int]

        init(_ arm: Arm) {
            var runs = [Range<Int>](), hits = [Double](), possible = [Double]()
            var unitDevice = [Int](), unitPartner = [Int]()
            var pairs = [(Double, Int)]()
            var next = 0
            for run in arm where !run.isEmpty {
                var ids = [Int: Int]()
                func global(_ d: Int) -> Int {
                    if let g = ids[d] { return g }
                    let g = next + ids.count
                    ids[d] = g
                    return g
                }
                for u in run {
                    let k = hits.count
                    for v in u.values { pairs.append((v, k)) }
                    hits.append(u.hits)
                    possible.append(u.possible)
                    unitDevice.append(global(u.device))
                    unitPartner.append(u.partner.map(global) ?? -1)
                }
                runs.append(next..<(next + ids.count))
                next += ids.count
            }
            pairs.sort { $0.0 < $1.0 }
            self.runs = runs
            self.deviceCount = next
            self.unitDevice = unitDevice
            self.unitPartner = unitPartner
            self.hits = hits
            self.possible = possible
            self.values = pairs.map(\.0)
            self.owner = pairs.map(\.1)
        }

        /// Runs are drawn (then devices inside each) only from this many runs up: fewer runs
        /// say nothing of run-to-run noise, so their devices are drawn run by run.
        static let minimumRunsToResample = 3

        /// Draws devices (runs first when there are enough) and sets each unit's weight.
        func draw(_ g: inout SeededGenerator, counts: inout [Int], weights: inout [Double]) {
            for i in counts.indices { counts[i] = 0 }
            let n = runs.count
            let resampleRuns = n >= Self.minimumRunsToResample
            for k in 0..<n {
                let run = resampleRuns ? runs[Int(g.next() % UInt64(n))] : runs[k]
                let size = UInt64(run.count)
                for _ in 0..<run.count { counts[run.lowerBound + Int(g.next() % size)] += 1 }
            }
            for u in weights.indices {
                let p = unitPartner[u]
                weights[u] = Double(counts[unitDevice[u]] * (p >= 0 ? counts[p] : 1))
            }
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
                var total = 0.0
                if let weights { for i in values.indices { total += weights[owner[i]] } } else { total = Double(values.count) }
                guard total > 0 else { return nil }
                // Weighted median: the value where the cumulative weight passes half; between
                // two values when it lands exactly on half.
                let half = total / 2
                var seen = 0.0
                for i in values.indices {
                    let w = weights?[owner[i]] ?? 1
                    guard w > 0 else { continue }
                    seen += w
                    if seen > half { return values[i] }
                    if seen == half {
                        var j = i + 1
                        while j < values.count, (weights?[owner[j]] ?? 1) == 0 { j += 1 }
                        return j < values.count ? (values[i] + values[j]) / 2 : values[i]
                    }
                }
                return nil
            }
        }
    }

    public struct Estimate: Sendable {
        public var estimate: Double
        public var ci: Stats.Interval
        /// Standard deviation of the bootstrap replicates.
        public var se: Double
    }

    /// The statistic of one arm with its percentile interval.
    public func estimate(_ arm: Arm, pooling: Pooling, scale: Double = 1, confidence: Double = 0.95, stream: String = "") -> Estimate? {
        let prepared = Prepared(arm)
        guard !prepared.runs.isEmpty, let point = prepared.statistic(pooling, weights: nil, scale: scale) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-one " + stream)
        var counts = [Int](repeating: 0, count: prepared.deviceCount)
        var weights = [Double](repeating: 0, count: prepared.hits.count)
        var reps = [Double]()
        let draws = resamples(over: prepared.hits.count)
        reps.reserveCapacity(draws)
        for _ in 0..<draws {
            prepared.draw(&g, counts: &counts, weights: &weights)
            if let v = prepared.statistic(pooling, weights: weights, scale: scale) { reps.append(v) }
        }
        guard !reps.isEmpty else { return nil }
        reps.sort()
        let a = (1 - confidence) / 2
        return Estimate(estimate: point, ci: Stats.Interval(Stats.quantile(sorted: reps, a)!, Stats.quantile(sorted: reps, 1 - a)!), se: Stats.sd(reps) ?? 0)
    }

    public struct Difference: Sendable {
        /// Level minus baseline.
        public var delta: Double
        public var ci: Stats.Interval
        public var se: Double
        /// Two-sided bootstrap p-value for a difference of 0 (twice the smaller tail, at least 1/B).
        public var p: Double
        /// Each arm's own estimate and percentile interval, from the same resamples.
        public var baseline: Estimate? = nil
        public var level: Estimate? = nil
    }

    /// The difference `level - baseline` of a statistic, each arm resampled on its own.
    public func difference(baseline: Arm, level: Arm, pooling: Pooling, scale: Double = 1, confidence: Double = 0.95, stream: String = "") -> Difference? {
        let pa = Prepared(baseline), pb = Prepared(level)
        guard !pa.runs.isEmpty, !pb.runs.isEmpty,
              let a = pa.statistic(pooling, weights: nil, scale: scale), let b = pb.statistic(pooling, weights: nil, scale: scale) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-diff " + stream)
        var ca = [Int](repeating: 0, count: pa.deviceCount), cb = [Int](repeating: 0, count: pb.deviceCount)
        var wa = [Double](repeating: 0, count: pa.hits.count), wb = [Double](repeating: 0, count: pb.hits.count)
        var reps = [Double](), repsA = [Double](), repsB = [Double]()
        let draws = resamples(over: pa.hits.count + pb.hits.count)
        reps.reserveCapacity(draws)
        for _ in 0..<draws {
            pa.draw(&g, counts: &ca, weights: &wa)
            pb.draw(&g, counts: &cb, weights: &wb)
            if let ra = pa.statistic(pooling, weights: wa, scale: scale), let rb = pb.statistic(pooling, weights: wb, scale: scale) {
                reps.append(rb - ra)
                repsA.append(ra)
                repsB.append(rb)
            }
        }
        guard var d = Self.summarise(point: b - a, reps: reps, confidence: confidence) else { return nil }
        func arm(_ point: Double, _ r: [Double]) -> Estimate {
            let sorted = r.sorted(), q = (1 - confidence) / 2
            return Estimate(estimate: point, ci: Stats.Interval(Stats.quantile(sorted: sorted, q)!, Stats.quantile(sorted: sorted, 1 - q)!), se: Stats.sd(sorted) ?? 0)
        }
        d.baseline = arm(a, repsA)
        d.level = arm(b, repsB)
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
        return Self.summarise(point: point, reps: reps, confidence: confidence)
    }

    /// A crossover's paired difference: each unit's (dongle's) mean figure over the level's runs
    /// minus its mean over the baseline's runs, averaged over the units that ran both. A
    /// resample draws the runs of each level (with replacement) and the units (the same draw in
    /// every run, so the pairing holds): run-to-run noise, which every dongle of a run shares,
    /// stays in the interval. `baseline` and `level` hold each run's figure by unit.
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
        func statistic(runsA: [Int], runsB: [Int], draw: [Int]) -> Double? {
            var s = 0.0, n = 0
            for u in draw {
                guard let ma = mean(a, runs: runsA, unit: u), let mb = mean(b, runs: runsB, unit: u) else { continue }
                s += mb - ma
                n += 1
            }
            return n > 0 ? s / Double(n) : nil
        }
        guard let point = statistic(runsA: Array(a.indices), runsB: Array(b.indices), draw: Array(units.indices)) else { return nil }
        var g = SeededGenerator(seed: seed, stream: "bootstrap-crossover " + stream)
        var reps = [Double]()
        reps.reserveCapacity(resamples)
        for _ in 0..<resamples {
            let ra = a.indices.map { _ in Int(g.next() % UInt64(a.count)) }
            let rb = b.indices.map { _ in Int(g.next() % UInt64(b.count)) }
            let draw = units.indices.map { _ in Int(g.next() % UInt64(units.count)) }
            if let v = statistic(runsA: ra, runsB: rb, draw: draw) { reps.append(v) }
        }
        guard let d = Self.summarise(point: point, reps: reps, confidence: confidence) else { return nil }
        return (d, units.count)
    }

    static func summarise(point: Double, reps: [Double], confidence: Double) -> Difference? {
        guard !reps.isEmpty else { return nil }
        let sorted = reps.sorted()
        let a = (1 - confidence) / 2
        let below = Double(sorted.filter { $0 <= 0 }.count), above = Double(sorted.filter { $0 >= 0 }.count)
        let n = Double(sorted.count)
        let p = min(1, max(1 / n, 2 * min(below, above) / n))
        return Difference(delta: point, ci: Stats.Interval(Stats.quantile(sorted: sorted, a)!, Stats.quantile(sorted: sorted, 1 - a)!),
                          se: Stats.sd(sorted) ?? 0, p: p)
    }
}
