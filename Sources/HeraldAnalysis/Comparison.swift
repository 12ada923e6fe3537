import Foundation

/// Loads or computes a bundle's summary: report/summary.json when present, else a fresh analysis.
public enum SummaryLoader {
    /// `note` is told when report/summary.json is there but cannot be read, so the bundle is
    /// analysed again with the default options (which may not be those the summary was made
    /// with); by default one line on stderr.
    public static func load(_ path: URL, note: (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) throws -> AnalysisResult {
        let summary = path.appendingPathComponent("report/summary.json")
        if FileManager.default.fileExists(atPath: summary.path) {
            do { return try ReportWriter.readSummary(summary, root: path) } catch {
                note("\(summary.path) cannot be read (\(error)); analysing \(path.path) again with the default options")
            }
        }
        if path.lastPathComponent == "summary.json" {
            // A summary given directly: a regular file, read whole up to a bound.
            return try ReportWriter.readSummary(path, root: path.deletingLastPathComponent())
        }
        return try Analyser.analyse(path).result
    }
}

/// Comparison of runs grouped by the settings that differ (or by a study's levels): for each
/// metric the difference of each level from the baseline with a 95 % interval (cluster
/// bootstrap over devices, and over runs when a level has several), a verdict (better, worse,
/// same within the practical margin, inconclusive with the repeats that would resolve it),
/// the family of metrics held to a 5 % family-wise error with Holm's method, and a check that
/// each arm got the devices, pairs and windows it should before any verdict.
public enum Comparison {
    /// One run (or one node group of a run) in an arm.
    public struct RunRef: Sendable {
        public var result: AnalysisResult
        public var selection: PairSelection
        /// Run id, with the group for A/B in one run.
        public var label: String
        /// Every setting of the run, flattened (`sensor.advertInterval` = `0.1`).
        public var settings: [String: String]
        /// A crossover: each device folder's unit (the dongle that ran it), the same across levels.
        public var units: [String: String]?
        public init(result: AnalysisResult, selection: PairSelection = .all, label: String, settings: [String: String]) {
            self.result = result
            self.selection = selection
            self.label = label
            self.settings = settings
        }
    }

    public struct Level: Sendable {
        public var name: String
        public var runs: [RunRef]
        /// Runs a study planned for this level (nil: unknown, bundles given by hand).
        public var expectedRuns: Int?
        public init(name: String, runs: [RunRef], expectedRuns: Int? = nil) {
            self.name = name
            self.runs = runs
            self.expectedRuns = expectedRuns
        }
    }

    /// What to compare: a factor, its levels (the first is the baseline), margins.
    public struct Design: Sendable {
        public var factor: String
        public var levels: [Level]
        public var margins: [Metric: Margin] = [:]
        public var alpha = 0.05
        public var resamples = 2000
        public var seed: UInt64 = 1
        public var maximumRepeats = 50
        /// A crossover: every level ran on the same dongles, compared paired per dongle (each
        /// dongle's figure under a level minus under the baseline, bootstrapped over dongles).
        public var paired = false
        public init(factor: String, levels: [Level]) { self.factor = factor; self.levels = levels }

        /// Pairs by device folder (the node): for simulated runs, where a node is the same
        /// simulated device in every run, and for tests.
        public mutating func pairByNode() {
            paired = true
            for l in levels.indices {
                for r in levels[l].runs.indices { levels[l].runs[r].units = Dictionary(uniqueKeysWithValues: levels[l].runs[r].result.devices.map { ($0.folder, $0.folder) }) }
            }
        }
        public func margin(_ m: Metric) -> Margin { margins[m] ?? m.defaultMargin }
    }

    public enum VerdictKind: String, Codable, Sendable { case better, worse, same, inconclusive, noData = "no data" }

    public struct Effect: Codable, Sendable {
        public var metric: String
        public var label: String
        public var factor: String
        public var baseline: String
        public var level: String
        /// The two arms' estimates of exactly the statistic whose difference `delta` is (paired
        /// per dongle: the mean over the paired dongles of each dongle's figure), so that
        /// delta = estimate - baselineEstimate, with their 95 % intervals.
        public var baselineEstimate: Double?
        public var baselineCI95: [Double]?
        public var estimate: Double?
        public var estimateCI95: [Double]?
        /// A median time that is censored (more than half of the pairs had none by the end of
        /// the run): the estimate is the run's length, a lower bound, printed "> estimate".
        public var baselineCensored: Bool?
        public var estimateCensored: Bool?
        public var delta: Double?
        public var ci95: [Double]?
        /// Bootstrap p-value of the difference, and after Holm's adjustment over the family.
        public var p: Double?
        public var pAdjusted: Double?
        public var margin: Double?
        public var verdict: VerdictKind
        /// More runs per level that would likely resolve an inconclusive verdict (power 0.8 at
        /// the family's alpha, from the variance seen); nil when not inconclusive.
        public var repeatsAdvised: Int?
        public var note: String?
        /// How the difference was estimated: "paired per dongle" (a crossover, n dongles) or "unpaired".
        public var pairing: String?
        public var pairedUnits: Int?
    }

    public struct LevelSummary: Codable, Sendable {
        public var name: String
        public var runs: [String]
        public var devicesPerRun: [Int]
        /// Distinct devices (dongles, by their identity across runs) in all of the level's runs:
        /// the bootstrap's sample of devices, which repeat runs of the same dongles do not grow.
        public var dongles: Int?
        /// Each run's own estimate of every metric (run-to-run noise), by metric.
        public var perRun: [String: [Double?]]
        public var settings: [String: String]
    }

    public struct Outcome: Codable, Sendable {
        public var factor: String
        public var baseline: String
        public var levels: [LevelSummary]
        /// Settings every run shares (not printed; kept for the record).
        public var sameSettings: [String: String]
        public var checkPassed: Bool
        public var check: [String]
        public var effects: [Effect]
        /// The baseline's own 95 % interval, by metric.
        public var baselineCI95: [String: [Double]]
        public var method: String
        /// "paired per dongle" (a crossover) or "unpaired".
        public var pairing: String
    }

    /// Paired differences need at least this many dongles that ran both levels.
    public static let minimumPairedUnits = 3

    /// The device a run's folder stands for across runs: the crossover's unit (study.json), the
    /// manifest's dongle or agent, the controller's address, else the node (a simulated node is
    /// the same device, with the same character, in every run).
    static func identity(_ ref: RunRef, folder: String) -> String {
        if let u = ref.units?[folder] { return u }
        if let u = ref.result.input.units?[folder] { return u }
        if let c = ref.result.input.controllers?[folder], let address = c.split(separator: " ").first(where: { $0.hasPrefix("address=") && $0.count > 8 }) {
            return "controller " + address.dropFirst(8)
        }
        return "node " + folder
    }

    /// A level's runs as one arm whose devices are numbered by their identity across the
    /// level's runs (`identity`): the bootstrap then draws a dongle once for all of its runs,
    /// instead of as a new device in every run (issue 38). A run whose identities are not
    /// distinct (two folders on one dongle) is numbered by its nodes.
    static func arm(_ level: Level, _ metric: Metric) -> ClusterBootstrap.Arm {
        var ids = [String: Int]()
        func number(_ key: String) -> Int {
            if let n = ids[key] { return n }
            ids[key] = ids.count
            return ids.count - 1
        }
        return level.runs.enumerated().map { (r, ref) in
            let folders = ref.result.devices.map(\.folder)
            var keys = folders.map { identity(ref, folder: $0) }
            if Set(keys).count != keys.count { keys = folders.map { "node " + $0 } }
            let numbers = keys.map(number)
            func numbered(_ i: Int) -> Int { i >= 0 && i < numbers.count ? numbers[i] : number("run \(r) device \(i)") }
            var units = RunMetrics.units(ref.result, metric, selection: ref.selection)
            for k in units.indices {
                units[k].device = numbered(units[k].device)
                units[k].partner = units[k].partner.map(numbered)
            }
            return units
        }
    }

    /// The distinct devices of a level's runs (by `identity`): the dongles its bootstrap draws.
    public static func dongles(_ level: Level) -> Int {
        var keys = Set<String>()
        for ref in level.runs {
            let folders = ref.result.devices.map(\.folder).filter { ref.selection.devices?.contains($0) ?? true }
            var k = folders.map { identity(ref, folder: $0) }
            if Set(k).count != k.count { k = folders.map { "node " + $0 } }
            keys.formUnion(k)
        }
        return keys.count
    }

    /// Each run's figure per unit (dongle) under a level: the pairs the unit observed in that run.
    static func perUnit(_ level: Level, _ metric: Metric) -> [[String: Double]] {
        level.runs.compactMap { ref -> [String: Double]? in
            guard let keys = ref.units else { return nil }
            var units = [String: [StatUnit]]()
            let folders = ref.result.devices.map(\.folder)
            for u in RunMetrics.units(ref.result, metric, selection: ref.selection) where u.device >= 0 && u.device < folders.count {
                guard let key = keys[folders[u.device]] else { continue }
                units[key, default: []].append(u)
            }
            return units.compactMapValues { metric.pooling.statistic($0, scale: RunMetrics.scale(metric)) }
        }
    }

    // MARK: Grouping bundles

    /// Every setting of a run that can tell runs apart (the seed and run id cannot).
    public static func settings(_ r: AnalysisResult) -> [String: String] {
        var out = [String: String]()
        out["plan"] = r.input.plan ?? "-"
        out["variant"] = (r.input.variant?.isEmpty ?? true) ? "-" : r.input.variant!
        func flatten(_ prefix: String, _ v: JSONValue) {
            if case .object(let o) = v { for (k, x) in o { flatten(prefix + "." + k, x) } } else { out[prefix] = v.description }
        }
        for (k, v) in r.input.sensor ?? [:] { flatten("sensor." + k, v) }
        for (k, v) in r.input.radio ?? [:] { flatten("radio." + k, v) }
        if let c = r.input.controllers { out["controllers"] = Set(c.values).sorted().joined(separator: "; ") }
        out["devices"] = String(r.devices.count)
        return out
    }

    /// A run, or its node groups as separate arms (A/B in one run).
    public static func refs(_ r: AnalysisResult) -> [RunRef] {
        let id = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        let base = settings(r)
        guard let groups = r.input.nodeGroups, Set(groups.values).count >= 2 else { return [RunRef(result: r, label: id, settings: base)] }
        var order = [String]()
        for d in r.devices { if let g = groups[d.folder], !order.contains(g) { order.append(g) } }
        return order.map { g in
            var s = base
            s["devices"] = String(groups.values.filter { $0 == g }.count)
            s["group"] = g
            for (k, v) in r.input.groupSensor?[g] ?? [:] { s["sensor." + k] = v.description }
            return RunRef(result: r, selection: PairSelection(devices: Set(groups.filter { $0.value == g }.map(\.key))), label: "\(id) [\(g)]", settings: s)
        }
    }

    /// Groups runs by the settings that differ among them; the factor names only those.
    /// Nil with a reason when all runs share every setting.
    public static func design(_ runs: [AnalysisResult]) -> Result<Design, ComparisonError> {
        let all = runs.flatMap(refs)
        var keys = Set<String>()
        for r in all { keys.formUnion(r.settings.keys) }
        let differing = keys.sorted().filter { k in Set(all.map { $0.settings[k] ?? "-" }).count > 1 && k != "devices" }
        guard !differing.isEmpty else {
            return .failure(.nothingDiffers("every run has the same settings (plan, variant, sensor, radio, controllers): there is no factor to compare; give runs of different settings, or a study"))
        }
        var order = [String]()
        var by = [String: [RunRef]]()
        // Node groups are named by their group (the factor says which settings they differ in).
        let grouped = differing.contains("group")
        let others = differing.filter { $0 != "group" }
        for r in all {
            let name = grouped ? (r.settings["group"] ?? "-")
                : differing.map { k in differing.count == 1 ? (r.settings[k] ?? "-") : "\(k)=\(r.settings[k] ?? "-")" }.joined(separator: ", ")
            if by[name] == nil { order.append(name) }
            by[name, default: []].append(r)
        }
        let factor = grouped ? (others.isEmpty ? "group" : "group (\(others.joined(separator: " × ")))") : differing.joined(separator: " × ")
        return .success(Design(factor: factor, levels: order.map { Level(name: $0, runs: by[$0]!) }))
    }

    public enum ComparisonError: Error, CustomStringConvertible {
        case nothingDiffers(String)
        case tooFew(String)
        public var description: String {
            switch self { case .nothingDiffers(let s), .tooFew(let s): return s }
        }
    }

    // MARK: The arm check

    /// Whether each arm got the devices, pairs and windows it should: a lost or partial dongle
    /// biases an arm, so it comes before any verdict.
    static func armCheck(_ d: Design) -> (Bool, [String]) {
        var problems = [String]()
        var cetotals = Set<Int>()
        var perLevelDevices = [(String, Set<Int>)]()
        for level in d.levels {
            var counts = Set<Int>()
            for ref in level.runs {
                let r = ref.result
                cetotals.insert(r.parameters.cetotal)
                let devices = r.devices.filter { ref.selection.devices?.contains($0.folder) ?? true }
                counts.insert(devices.count)
                for dev in devices where dev.flagged {
                    problems.append("\(Format.label(ref.label)): device \(Format.label(dev.folder)): \(Format.label(dev.problems.joined(separator: "; ")))")
                }
                let expected = devices.count * (devices.count - 1)
                let got = r.pairs.filter { ref.selection.includes($0) }.count
                if got != expected { problems.append("\(Format.label(ref.label)): \(got) pairs analysed, \(expected) expected") }
            }
            if let e = level.expectedRuns, level.runs.count != e {
                problems.append("level \(Format.label(level.name)): \(level.runs.count) of \(e) planned runs")
            }
            perLevelDevices.append((level.name, counts))
        }
        if cetotals.count > 1 { problems.append("contact events differ in length: \(cetotals.sorted().map(String.init).joined(separator: ", ")) windows") }
        let sizes = perLevelDevices.flatMap { $0.1 }
        if let lo = sizes.min(), let hi = sizes.max(), hi - lo > 1 {
            problems.append("devices per run differ between arms: " + perLevelDevices.map { "\(Format.label($0.0)) \($0.1.sorted().map(String.init).joined(separator: "/"))" }.joined(separator: ", "))
        }
        if problems.isEmpty {
            let counts = d.levels.map { "\(Format.label($0.name)) \($0.runs.count) run\($0.runs.count == 1 ? "" : "s")" }.joined(separator: ", ")
            return (true, ["every arm got its devices, pairs and \(cetotals.first ?? 0) windows a pair (\(counts))"])
        }
        return (false, problems)
    }

    // MARK: Effects

    /// Devices an arm needs (in its smallest run) before any verdict: with 2 the bootstrap's
    /// interval has zero width, with 3-4 an A/A difference is called in 10-18 % of cases
    /// (../shared/stats/REVIEW.md, finding 2).
    public static let minimumDevicesToJudge = 5

    public static func compare(_ d: Design) -> Outcome {
        let (checked, checkLines) = armCheck(d)
        let bootstrap = ClusterBootstrap(resamples: d.resamples, seed: d.seed)
        let arms: [[Metric: ClusterBootstrap.Arm]] = d.levels.map { level in
            var m = [Metric: ClusterBootstrap.Arm]()
            for metric in Metric.allCases { m[metric] = arm(level, metric) }
            return m
        }
        var effects = [Effect]()
        var baselineCI = [String: [Double]]()
        let baseline = d.levels[0]
        for (li, level) in d.levels.enumerated().dropFirst() {
            for metric in Metric.allCases {
                let a = arms[0][metric]!, b = arms[li][metric]!
                let scale = RunMetrics.scale(metric)
                var e = Effect(metric: metric.rawValue, label: metric.label, factor: d.factor, baseline: baseline.name, level: level.name, verdict: .noData)
                guard let diff = bootstrap.difference(baseline: a, level: b, pooling: metric.pooling, scale: scale, stream: "\(li) \(metric.rawValue)"),
                      let ea = diff.baseline, let eb = diff.level else {
                    e.note = "no data in at least one arm"
                    effects.append(e)
                    continue
                }
                e.baselineEstimate = ea.estimate
                e.baselineCI95 = [ea.ci.lo, ea.ci.hi]
                e.estimate = eb.estimate
                e.estimateCI95 = [eb.ci.lo, eb.ci.hi]
                if ea.censored { e.baselineCensored = true }
                if eb.censored { e.estimateCensored = true }
                e.delta = diff.delta
                e.ci95 = [diff.ci.lo, diff.ci.hi]
                e.p = diff.p
                e.pairing = "unpaired"
                if d.paired {
                    // Paired only with runs enough to see run-to-run noise: every dongle of a
                    // run shares it, so pairing cannot remove it (docs/STATISTICS.md).
                    let runsNeeded = ClusterBootstrap.minimumRunsToResample
                    if baseline.runs.count < runsNeeded || level.runs.count < runsNeeded {
                        e.note = "unpaired: a paired comparison needs \(runsNeeded) runs a level (to see run-to-run noise); this level has \(min(baseline.runs.count, level.runs.count))"
                    } else if let (pd, units) = bootstrap.crossoverDifference(baseline: perUnit(baseline, metric), level: perUnit(level, metric), stream: "\(li) \(metric.rawValue)"),
                              units >= minimumPairedUnits {
                        e.delta = pd.delta
                        e.ci95 = [pd.ci.lo, pd.ci.hi]
                        e.p = pd.p
                        // One statistic per row: the arms' columns are the paired statistic's
                        // (the mean over these dongles of each one's figure), delta = level - baseline.
                        if let pa = pd.baseline, let pb = pd.level {
                            e.baselineEstimate = pa.estimate
                            e.baselineCI95 = [pa.ci.lo, pa.ci.hi]
                            e.estimate = pb.estimate
                            e.estimateCI95 = [pb.ci.lo, pb.ci.hi]
                            e.baselineCensored = nil
                            e.estimateCensored = nil
                        }
                        e.pairing = "paired per dongle"
                        e.pairedUnits = units
                    } else {
                        e.note = "unpaired: fewer than \(minimumPairedUnits) dongles gave this figure under both levels"
                    }
                }
                if baselineCI[metric.rawValue] == nil, let ci = e.baselineCI95 { baselineCI[metric.rawValue] = ci }
                e.margin = d.margin(metric).absolute(baseline: e.baselineEstimate ?? ea.estimate)
                let spread = RunMetrics.spread(a + b, metric)
                let censoredArms = [e.baselineCensored == true ? baseline.name : nil, e.estimateCensored == true ? level.name : nil].compactMap { $0 }
                if !censoredArms.isEmpty {
                    e.note = [e.note, "censored in \(censoredArms.map(Format.label).joined(separator: " and ")): more than half of the pairs had none by the end of the run, so that median is only known to be above the run's length (the difference is a bound)"].compactMap { $0 }.joined(separator: "; ")
                }
                if spread.atCeiling { e.note = [e.note, "at its ceiling in every pair of both arms: saturated, it cannot show a difference"].compactMap { $0 }.joined(separator: "; ") }
                else if spread.noVariance { e.note = [e.note, "no variance: every pair of both arms gives the same value"].compactMap { $0 }.joined(separator: "; ") }
                effects.append(e)
            }
        }
        // What the data can judge (issue 38): both arms in one run (node groups) are paired by the
        // design; across runs, run-to-run noise needs 3 runs a level; an arm needs 5 devices.
        let withinRun = d.levels.allSatisfy { $0.runs.allSatisfy { $0.selection.devices != nil } }
        func devices(_ level: Level) -> Int {
            level.runs.map { ref in ref.result.devices.filter { ref.selection.devices?.contains($0.folder) ?? true }.count }.min() ?? 0
        }
        // Holm over the family (every metric of every level against the baseline).
        let tested = effects.indices.filter { effects[$0].p != nil }
        let adjusted = Stats.holm(tested.map { effects[$0].p! })
        for (k, i) in tested.enumerated() { effects[i].pAdjusted = adjusted[k] }
        let familySize = max(1, tested.count)
        for i in tested {
            var e = effects[i]
            let metric = Metric(rawValue: e.metric)!
            let level = d.levels.first { $0.name == e.level }!
            let lo = e.ci95![0], hi = e.ci95![1], margin = e.margin!
            let inside = lo >= -margin - 1e-12 && hi <= margin + 1e-12
            let significant = e.pAdjusted! < d.alpha && (lo > 0 || hi < 0)
            let fewestRuns = min(baseline.runs.count, level.runs.count)
            let fewestDevices = min(devices(baseline), devices(level))
            let spread = RunMetrics.spread(arms[0][metric]! + arms[d.levels.firstIndex { $0.name == level.name }!][metric]!, metric)
            // A zero-width interval, or a metric saturated or without variance, cannot show a
            // difference: "same" there would claim what the data cannot tell.
            let blind = !(hi - lo > 1e-12) || spread.atCeiling || spread.noVariance
            if !checked {
                e.verdict = .inconclusive
                e.note = [e.note, "no verdict: the arm check failed"].compactMap { $0 }.joined(separator: "; ")
            } else if fewestDevices < Self.minimumDevicesToJudge {
                e.verdict = .inconclusive
                e.note = [e.note, "too few devices to judge: \(fewestDevices) a run in the smaller arm; at least \(Self.minimumDevicesToJudge) are needed (2 give a zero-width interval, 3-4 call an A/A difference too often)"].compactMap { $0 }.joined(separator: "; ")
            } else if !withinRun && fewestRuns < ClusterBootstrap.minimumRunsToResample {
                e.verdict = .inconclusive
                e.repeatsAdvised = ClusterBootstrap.minimumRunsToResample - fewestRuns
                e.note = [e.note, "no verdict across runs with \(fewestRuns) run\(fewestRuns == 1 ? "" : "s") a level: the interval holds no run-to-run noise; \(ClusterBootstrap.minimumRunsToResample) runs a level are needed (\(ClusterBootstrap.minimumRunsToResample - fewestRuns) more), or node groups in one run"].compactMap { $0 }.joined(separator: "; ")
            } else if inside && blind && !(significant && !inside) {
                e.verdict = .inconclusive
                e.note = [e.note, "not same: the interval has no width or the metric cannot vary here, so the data could not have shown a difference"].compactMap { $0 }.joined(separator: "; ")
            } else if significant && !inside {
                let up = e.delta! > 0
                e.verdict = up == metric.higherIsBetter ? .better : .worse
            } else if inside {
                e.verdict = .same
                if significant { e.note = [e.note, "a real difference, smaller than the practical margin"].compactMap { $0 }.joined(separator: "; ") }
            } else {
                e.verdict = .inconclusive
                // Run-level SD from the bootstrap's SE of the difference: se^2 = s^2 (1/na + 1/nb).
                let na = Double(baseline.runs.count), nb = Double(level.runs.count)
                let se = (hi - lo) / (2 * Stats.normalQuantile(0.975))
                let s = se / (1 / na + 1 / nb).squareRoot()
                let alpha = d.alpha / Double(familySize)
                var needed = [Int]()
                if let n = Stats.unitsPerArm(sd: s, delta: abs(e.delta!), alpha: alpha, cap: d.maximumRepeats * 10) { needed.append(n) }
                if margin > abs(e.delta!), let n = Stats.unitsPerArm(sd: s, delta: margin - abs(e.delta!), alpha: alpha, cap: d.maximumRepeats * 10) { needed.append(n) }
                if let n = needed.min() {
                    let more = max(1, n - Int(min(na, nb)))
                    e.repeatsAdvised = min(more, d.maximumRepeats)
                    if more > d.maximumRepeats {
                        e.note = [e.note, "more than \(d.maximumRepeats) more runs a level would be needed to tell a difference of \(Format.number(abs(e.delta!))) from none at alpha \(Format.number(alpha)), with the noise between runs and dongles measured here (SD \(Format.number(s)) a run): below what this design can resolve"].compactMap { $0 }.joined(separator: "; ")
                    } else {
                        // What the runs would resolve, at the verdict's alpha, from the run and
                        // dongle noise this comparison measured, and what they cost on this lab.
                        let minutes = level.runs.map { RunMetrics.contactMinutes($0.result) }.max() ?? 0
                        let total = Double(more * d.levels.count) * minutes
                        let cost = minutes > 0 ? String(format: "; at %.0f min a run, at least %.0f min of lab time for the %d levels", minutes, total, d.levels.count) : ""
                        e.note = [e.note, "+\(more) run\(more == 1 ? "" : "s") a level would tell a difference of \(Format.number(abs(e.delta!))) from none (or show it inside the margin) at alpha \(Format.number(alpha)), with the noise between runs and dongles measured here (SD \(Format.number(s)) a run)\(cost)"].compactMap { $0 }.joined(separator: "; ")
                    }
                }
            }
            effects[i] = e
        }
        let levels = d.levels.enumerated().map { (li, level) -> LevelSummary in
            var perRun = [String: [Double?]]()
            for metric in Metric.allCases {
                perRun[metric.rawValue] = arms[li][metric]!.map { metric.pooling.statistic($0, scale: RunMetrics.scale(metric)) }
            }
            var common = level.runs.first?.settings ?? [:]
            for r in level.runs { common = common.filter { r.settings[$0.key] == $0.value } }
            return LevelSummary(name: level.name, runs: level.runs.map(\.label),
                                devicesPerRun: level.runs.map { ref in ref.result.devices.filter { ref.selection.devices?.contains($0.folder) ?? true }.count },
                                dongles: dongles(level), perRun: perRun, settings: common)
        }
        var shared = levels.first?.settings ?? [:]
        for l in levels { shared = shared.filter { l.settings[$0.key] == $0.value } }
        let pairedEffects = effects.filter { $0.pairing == "paired per dongle" }
        let pairing = d.paired && !pairedEffects.isEmpty ? "paired per dongle" : "unpaired"
        let pairedText = pairing == "paired per dongle"
            ? "paired per dongle (a crossover: every level ran on the same dongles; the difference is the mean over dongles of each dongle's figure under the level minus under the baseline, \(d.resamples) resamples of the runs of each level and of the dongles, seed \(d.seed)\(pairedEffects.count < effects.filter { $0.p != nil }.count ? "; metrics with fewer than \(minimumPairedUnits) dongles in both levels unpaired" : "")); arm estimates by "
            : "unpaired; "
        let method = pairedText + "device bootstrap (\(d.resamples) resamples, fewer for very large arms but never under \(min(d.resamples, ClusterBootstrap.minimumResamples)), seed \(d.seed)): each dongle (by its identity across runs) drawn with replacement once for all of its runs, a pair weighted by how often both its devices were drawn" +
            (d.levels.contains { $0.runs.count >= 3 } ? ", times how often its run was drawn: runs resampled within each level of 3 runs or more" : "") +
            (d.levels.contains { $0.runs.count < 3 } ? (d.levels.contains { $0.runs.count >= 3 } ? "; levels of fewer runs" : "; with fewer than 3 runs a level") + " keep each run once (the interval then holds device-to-device noise only: repeat runs to see run-to-run noise)" : "") +
            "; expanded percentile 95 % intervals (widened for the number of dongles); times to first detection and read censored at the run's end; Holm over \(familySize) comparisons at family-wise \(String(format: "%g", d.alpha)); same = interval inside the practical margin and not of zero width; no verdict with fewer than \(minimumDevicesToJudge) devices a run in an arm, nor across runs with fewer than \(ClusterBootstrap.minimumRunsToResample) runs a level"
        return Outcome(factor: d.factor, baseline: baseline.name, levels: levels, sameSettings: shared, checkPassed: checked, check: checkLines, effects: effects, baselineCI95: baselineCI, method: method, pairing: pairing)
    }

    // MARK: Output

    public static func text(_ o: Outcome) -> String {
        var lines = [String]()
        lines.append("factor: \(Format.label(o.factor))  (baseline \(Format.label(o.baseline)))")
        for l in o.levels {
            lines.append("  level \(Format.label(l.name)): \(l.runs.count) run\(l.runs.count == 1 ? "" : "s"), devices per run \(Set(l.devicesPerRun).sorted().map(String.init).joined(separator: "/"))\(l.dongles.map { ", \($0) distinct" } ?? ""): \(l.runs.prefix(6).map(Format.label).joined(separator: ", "))\(l.runs.count > 6 ? ", …" : "")")
        }
        lines.append((o.checkPassed ? "check: " : "CHECK FAILED (no verdicts): ") + o.check.prefix(20).joined(separator: "\n  "))
        let units = Set(o.effects.compactMap(\.pairedUnits))
        lines.append("pairing: \(o.pairing)" + (units.isEmpty ? "" : " (\(units.sorted().map(String.init).joined(separator: "/")) dongles ran every level)"))
        lines.append("")
        for level in o.levels.dropFirst() {
            lines.append(Format.pad("metric", 24) + Format.pad(Format.label(o.baseline), 27) + Format.pad(Format.label(level.name), 27) + Format.pad("difference [95 %]", 28) + "verdict")
            for e in o.effects where e.level == level.name {
                func est(_ v: Double?, _ ci: [Double]?) -> String {
                    guard let v else { return "–" }
                    return Format.number(v) + (ci.map { " [\(Format.number($0[0])), \(Format.number($0[1]))]" } ?? "")
                }
                func bound(_ censored: Bool?) -> String { censored == true ? "> " : "" }
                let base = bound(e.baselineCensored) + est(e.baselineEstimate, e.baselineCI95 ?? o.baselineCI95[e.metric])
                let diff = e.delta.map { Format.signed($0) + (e.ci95.map { " [\(Format.signed($0[0])), \(Format.signed($0[1]))]" } ?? "") } ?? "–"
                var verdict = e.verdict.rawValue
                if let r = e.repeatsAdvised { verdict += " (+\(r) run\(r == 1 ? "" : "s") a level)" }
                lines.append(Format.pad(e.label, 24) + Format.pad(base, 27) + Format.pad(bound(e.estimateCensored) + est(e.estimate, e.estimateCI95), 27) + Format.pad(diff, 28) + verdict)
            }
            let notes = o.effects.filter { $0.level == level.name && $0.note != nil }
            for e in notes { lines.append("  note: \(e.label): \(e.note!)") }
            lines.append("")
        }
        if o.levels.contains(where: { $0.runs.count > 1 }) {
            lines.append("run to run (each run's own figure, lowest–highest):")
            for metric in Metric.allCases {
                let cells = o.levels.map { l -> String in
                    let v = (l.perRun[metric.rawValue] ?? []).compactMap { $0 }
                    guard let lo = v.min(), let hi = v.max() else { return Format.pad("–", 27) }
                    return Format.pad("\(Format.number(lo))–\(Format.number(hi))", 27)
                }
                lines.append(Format.pad(metric.label, 24) + cells.joined())
            }
        }
        lines.append("method: \(o.method)")
        return lines.joined(separator: "\n")
    }

    public static func json(_ o: Outcome) throws -> Data {
        let enc = JSONEncoder()
        enc.outputFormatting = [.prettyPrinted, .sortedKeys]
        enc.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try enc.encode(o)
    }
}
