import Foundation
import HeraldCore
import Yams

/// Node groups (A/B in one run): each group's nodes run their own sensor settings, under the
/// same air at the same time. Nodes are dealt to groups in turn (node 1 to the first group,
/// node 2 to the second, ...) unless a group lists its nodes.
public struct NodeGroup: Codable, Sendable, Equatable {
    public var name: String
    /// Plan paths and the values they are set to, as written (`sensor.advertInterval: 100ms`).
    public var set: [String: String]
    public var nodes: [String]
    public init(name: String, set: [String: String], nodes: [String]) { self.name = name; self.set = set; self.nodes = nodes }
}

/// A study (plans/README.md, docs/STATISTICS.md): factors by plan path with their levels, how
/// many times each level runs, and the practical margins of its metrics.
public struct Study: Codable, Sendable, Equatable {
    public struct Factor: Codable, Sendable, Equatable {
        public var path: String
        /// Levels as written in the plan (`100ms`, `1s`); the first is the baseline.
        public var levels: [String]
    }
    public var name: String
    public var factors: [Factor]
    public var repeats: Int
    /// Metric name to margin: a number (points, or the metric's unit) or a percentage of the baseline.
    public var margins: [String: String]

    /// The metrics a margin may name (HeraldAnalysis `Metric`).
    public static let metricNames = ["detectionPct", "continuityStrictPct", "continuityHeraldPct", "samplesPerPairMinute", "intervalMedian",
                                     "intervalP95", "longestGap", "timeToFirstDetection", "timeToFirstRead", "readSuccessPct"]
    /// Plan paths a factor may set (a group: `sensor.` only, since the air is shared).
    public static let factorPrefixes = ["sensor.", "radio.", "agents.firmware", "agents.manufacturer", "duration", "warmup", "variant"]
    public static let maximumRepeats = 100
    public static let maximumRuns = 1000
}

/// Which study a run belongs to: `studyRun:` in the run's plan, written by `Plan.expandStudy`
/// into every run's text (so a coordinator that keeps the plan text knows, across restarts):
/// the study (name, factors, repeats, margins, as the study's plan wrote them), this run's level,
/// its place in the run order and its block.
public struct StudyMembership: Codable, Sendable, Equatable {
    public var study: Study
    /// The level's name, one of `study.levelNames`.
    public var level: String
    /// 0-based position in the run order.
    public var index: Int
    public var block: Int
    public init(study: Study, level: String, index: Int, block: Int) { self.study = study; self.level = level; self.index = index; self.block = block }
}

extension Study {
    /// Every combination of the factors' levels, first factor slowest: (path, value) each.
    public var combinations: [[(path: String, value: String)]] {
        var combos: [[(path: String, value: String)]] = [[]]
        for f in factors { combos = combos.flatMap { c in f.levels.map { c + [(path: f.path, value: $0)] } } }
        return combos
    }

    /// The levels' names in the study's order (the first is the baseline): the value for one
    /// factor, `path=value, path=value` for several, `-` for none.
    public var levelNames: [String] {
        combinations.map { c in c.isEmpty ? "-" : c.count == 1 ? c[0].value : c.map { "\($0.path)=\($0.value)" }.joined(separator: ", ") }
    }
}

/// One run of an expanded study.
public struct StudyRun: Sendable, Equatable {
    /// 0-based position in the run order.
    public var index: Int
    /// The block (one run of every level, in a seeded random order).
    public var block: Int
    /// The level's name (`100ms`, or `path=value, path=value` for several factors).
    public var level: String
    public var levelIndex: Int
    public var settings: [String: String]
    public var seed: UInt64
    /// The run's folder inside the study folder.
    public var folder: String
    public var plan: Plan
    /// The run's own plan text, as a coordinator takes it: the study's plan without its
    /// `study:` block, this level's settings and this run's seed written in.
    public var yaml: String
}

/// How a study's levels meet the lab's dongles (docs/STATISTICS.md, crossover).
public enum StudyLabDesign: Sendable, Equatable {
    /// Every level runs on the same dongles in turn: the node-to-agent assignment of the first
    /// run is pinned to every later run, so each dongle is its own control.
    case crossover
    /// The levels run on different dongles; the reason.
    case notCrossover(String)

    public var isCrossover: Bool { self == .crossover }

    public var description: String {
        switch self {
        case .crossover: return "crossover: every level runs on the same dongles in turn (the first run's node-to-agent assignment is pinned to every later run); each dongle is its own control, compared paired per dongle"
        case .notCrossover(let why): return "not a crossover: \(why); the levels are compared unpaired"
        }
    }
}

extension Study {
    /// Factor paths that choose which dongles (or agents) run, rather than set what they run.
    public static let selectorPaths = ["agents.", "radio.kind"]

    /// Whether the study, run on a lab, is a crossover: a factor that selects dongles
    /// (firmware, manufacturer) gives each level its own dongles, so it cannot be one.
    public var labDesign: StudyLabDesign {
        let selectors = factors.map(\.path).filter { p in Self.selectorPaths.contains { p == $0 || p.hasPrefix($0) } }
        guard selectors.isEmpty else {
            return .notCrossover("factor \(selectors.joined(separator: ", ")) selects different dongles for each level")
        }
        return .crossover
    }
}

extension Plan {
    /// The runs a plan's study expands to, in a seeded, randomised, interleaved order: each
    /// block holds every level once (A,B / B,A for two levels), so drift over time is not read
    /// as an effect. Each run gets its own seed. A plan without a study is one run.
    /// `seed` (simulate --seed) replaces the plan's seed: the order and every run's seed follow it.
    public static func expandStudy(yaml: String, source: String = "plan", seed: UInt64? = nil) throws(PlanError) -> (plan: Plan, runs: [StudyRun]) {
        var plan = try parse(yaml: yaml, source: source)
        if let seed { plan.seed = seed }
        guard let study = plan.study else {
            return (plan, [StudyRun(index: 0, block: 0, level: "-", levelIndex: 0, settings: [:], seed: plan.seed, folder: "run-01", plan: plan, yaml: yaml)])
        }
        let combos = study.combinations
        let root: Node
        do { guard let r = try Yams.compose(yaml: yaml) else { throw PlanError(source: source, problems: [.init(path: "", message: "empty")]) }; root = r } catch let e as PlanError { throw e } catch {
            throw PlanError(source: source, problems: [.init(path: "", message: "not valid YAML")])
        }
        var variants = [Plan]()
        var trees = [Node]()
        // The study as each run's `studyRun.study` carries it: as written, its name made explicit.
        var studyNode = Node.Mapping([])
        if case .mapping(let rm) = root, case .mapping(let sm)? = rm["study"] { studyNode = sm }
        studyNode["name"] = Node(study.name)
        for (k, combo) in combos.enumerated() {
            var tree = root
            guard case .mapping(var m) = tree else { throw PlanError(source: source, problems: [.init(path: "", message: "expected a mapping")]) }
            m["study"] = nil
            tree = .mapping(m)
            for (path, value) in combo { tree = PlanReader.setting(tree, path: path.split(separator: ".").map(String.init), value: value) }
            var reader = PlanReader()
            guard let p = reader.plan(tree), reader.problems.isEmpty else {
                let name = combo.map { "\($0.0)=\($0.1)" }.joined(separator: ", ")
                throw PlanError(source: source, problems: reader.problems.map { .init(path: "study (level \(k + 1): \(name))." + $0.path, message: $0.message, line: $0.line) })
            }
            variants.append(p)
            trees.append(tree)
        }
        let names = study.levelNames
        var order = SeededGenerator(seed: plan.seed, stream: "study-order")
        var seeds = SeededGenerator(seed: plan.seed, stream: "study-seeds")
        var runs = [StudyRun]()
        for block in 0..<study.repeats {
            var perm = Array(combos.indices)
            for i in stride(from: perm.count - 1, to: 0, by: -1) { perm.swapAt(i, Int(order.next() % UInt64(i + 1))) }
            for li in perm {
                let index = runs.count
                var p = variants[li]
                p.seed = seeds.next() >> 33
                p.studyRun = StudyMembership(study: study, level: names[li], index: index, block: block)
                var tree = PlanReader.setting(trees[li], path: ["seed"], value: String(p.seed))
                if case .mapping(var tm) = tree {
                    tm["studyRun"] = .mapping(Node.Mapping([("study", .mapping(studyNode)), ("level", Node(names[li])), ("index", Node(String(index))), ("block", Node(String(block)))]))
                    tree = .mapping(tm)
                }
                let text: String
                do { text = try Yams.serialize(node: tree) } catch {
                    throw PlanError(source: source, problems: [.init(path: "study", message: "cannot write run \(index + 1)'s plan: \(error)")])
                }
                runs.append(StudyRun(index: index, block: block, level: names[li], levelIndex: li,
                                     settings: Dictionary(uniqueKeysWithValues: combos[li].map { ($0.path, $0.value) }), seed: p.seed,
                                     folder: String(format: "run-%02d-L%d", index + 1, li + 1), plan: p, yaml: text))
            }
        }
        return (plan, runs)
    }
}

extension Plan {
    /// A run's plan text with its nodes pinned to `agents` (node order), as a crossover runs
    /// every level on the dongles of its first run: `agents.names` is set, and the selectors it
    /// replaces (count, tags, dongles, manufacturer, firmware, spares) are dropped, so the
    /// coordinator can only use those agents, or refuse the run.
    public static func pinning(yaml: String, agents: [String], source: String = "plan") throws(PlanError) -> String {
        let root: Node?
        do { root = try Yams.compose(yaml: yaml) } catch { throw PlanError(source: source, problems: [.init(path: "", message: "not valid YAML")]) }
        guard case .mapping(var m)? = root else { throw PlanError(source: source, problems: [.init(path: "", message: "expected a mapping")]) }
        var a: Node.Mapping
        if case .mapping(let existing)? = m["agents"] { a = existing } else { a = Node.Mapping([]) }
        for key in ["count", "tags", "dongles", "manufacturer", "firmware", "spares"] { a[key] = nil }
        a["names"] = .sequence(Node.Sequence(agents.map { Node($0) }))
        m["agents"] = .mapping(a)
        let text: String
        do { text = try Yams.serialize(node: .mapping(m)) } catch { throw PlanError(source: source, problems: [.init(path: "agents", message: "cannot write the pinned plan: \(error)")]) }
        _ = try parse(yaml: text, source: source) // the pinned plan must still be a plan
        return text
    }
}

extension PlanReader {
    /// The tree with `path` set to the scalar `value` (mappings created where missing).
    static func setting(_ node: Node, path: [String], value: String) -> Node {
        guard let key = path.first else { return Node(value) }
        var m: Node.Mapping
        if case .mapping(let existing) = node { m = existing } else { m = Node.Mapping([]) }
        let child = m[key] ?? Node.mapping(Node.Mapping([]))
        // A scalar in the way (`crowding: on`) gives way to a mapping (which starts from the
        // same calibrated defaults `on` stands for).
        let base: Node = path.count > 1 && !Self.isMapping(child) ? Node.mapping(Node.Mapping([])) : child
        m[key] = setting(base, path: Array(path.dropFirst()), value: value)
        return .mapping(m)
    }

    static func isMapping(_ n: Node) -> Bool { if case .mapping = n { return true }; return false }

    /// `groups:` (A/B in one run): each group's name, `set` (sensor paths only) and optional nodes.
    mutating func groups(_ node: Node, _ path: String, root: Node, nodes: inout [NodeSpec]) -> [NodeGroup]? {
        guard case .sequence(let seq) = node, seq.count >= 2, seq.count <= 16 else { fail(path, node, "expected a list of 2 to 16 groups, each with name and set"); return nil }
        var out = [NodeGroup]()
        var settings = [SensorSettings]()
        for (i, item) in seq.enumerated() {
            let at = "\(path)[\(i)]"
            guard let m = mapping(item, at, known: ["name", "set", "nodes"]) else { continue }
            guard let nameNode = m["name"], let name = self.name(nameNode, "\(at).name") else { if m["name"] == nil { fail("\(at).name", item, "required") }; continue }
            if out.contains(where: { $0.name == name }) { fail("\(at).name", nameNode, "group \"\(name)\" given twice"); continue }
            var set = [String: String]()
            var tree = root
            if let s = m["set"] {
                guard case .mapping(let sm) = s else { fail("\(at).set", s, "expected a mapping of sensor paths to values (sensor.advertInterval: 100ms)"); continue }
                for (k, v) in sm {
                    guard let key = k.string, key.hasPrefix("sensor."), key.count > 7 else {
                        fail("\(at).set", k, "\(Self.show(k)): a group sets sensor settings only (sensor.advertInterval, sensor.scan.on, ...): the radio is shared by every node"); continue
                    }
                    guard case .scalar(let sv) = v else { fail("\(at).set.\(key)", v, "expected a value"); continue }
                    set[key] = sv.string
                    tree = Self.setting(tree, path: key.split(separator: ".").map(String.init), value: sv.string)
                }
            }
            var sensor = SensorSettings()
            if case .mapping(let tm) = tree, let sn = tm["sensor"] {
                var sub = PlanReader()
                if let s = sub.sensor(sn, "sensor") { sensor = s }
                for p in sub.problems { fail("\(at).set" + (p.path.isEmpty ? "" : "." + p.path), v: item, p.message) }
            }
            var members = [String]()
            if let n = m["nodes"], let list = nameList(n, "\(at).nodes", maxCount: PlanLimits.maximumNodes) { members = list }
            out.append(NodeGroup(name: name, set: set, nodes: members))
            settings.append(sensor)
        }
        guard out.count == seq.count else { return nil }
        let listed = out.contains { !$0.nodes.isEmpty }
        for (i, g) in out.enumerated() where listed {
            for n in g.nodes where !nodes.contains(where: { $0.name == n }) { fail("\(path)[\(i)].nodes", nil, "no node named \"\(n)\"") }
        }
        for k in nodes.indices {
            let gi: Int?
            if listed { gi = out.firstIndex { $0.nodes.contains(nodes[k].name) } } else { gi = k % out.count }
            guard let gi else { fail(path, node, "node \(nodes[k].name) is in no group; list every node, or none (nodes are then dealt in turn)"); continue }
            nodes[k].group = out[gi].name
            nodes[k].sensor = settings[gi]
            if !listed { out[gi].nodes.append(nodes[k].name) }
        }
        return out
    }

    mutating func fail(_ path: String, v: Node?, _ message: String) { fail(path, v, message) }

    /// `studyRun:` (a run of a study, as `Plan.expandStudy` writes it): the study, this run's
    /// level (one of the study's), its index in the run order and its block, all in range.
    mutating func studyRun(_ node: Node, _ path: String, planName: String) -> StudyMembership? {
        guard let m = mapping(node, path, known: ["study", "level", "index", "block"]) else { return nil }
        for key in ["study", "level", "index", "block"] where m[key] == nil { fail("\(path).\(key)", node, "required (studyRun is written by herald-lab run STUDY and simulate STUDY)") }
        let before = problems.count
        guard let sn = m["study"], let study = self.study(sn, "\(path).study", planName: planName), problems.count == before else { return nil }
        guard !study.factors.isEmpty else { fail("\(path).study.factors", sn, "required: the study's factors"); return nil }
        let names = study.levelNames
        var level: String?
        if let n = m["level"], let s = string(n, "\(path).level", maxBytes: 1024) {
            if names.contains(s) { level = s } else { fail("\(path).level", n, "\"\(s.prefix(64))\" is not one of the study's \(names.count) levels (\(names.prefix(8).joined(separator: "; "))\(names.count > 8 ? "; ..." : ""))") }
        }
        let runs = names.count * study.repeats
        let index = m["index"].flatMap { integer($0, "\(path).index", in: 0...max(0, runs - 1)) }
        let block = m["block"].flatMap { integer($0, "\(path).block", in: 0...max(0, study.repeats - 1)) }
        guard let level, let index, let block else { return nil }
        return StudyMembership(study: study, level: level, index: index, block: block)
    }

    /// `study:` factors (plan paths and levels), repeats, margins.
    mutating func study(_ node: Node, _ path: String, planName: String) -> Study? {
        guard let m = mapping(node, path, known: ["name", "factors", "repeats", "margins"]) else { return nil }
        var study = Study(name: planName, factors: [], repeats: 5, margins: [:])
        if let n = m["name"], let v = name(n, "\(path).name") { study.name = v }
        if let n = m["repeats"], let v = integer(n, "\(path).repeats", in: 1...Study.maximumRepeats) { study.repeats = v }
        if let f = m["factors"] {
            guard case .sequence(let seq) = f, (1...4).contains(seq.count) else { fail("\(path).factors", f, "expected a list of 1 to 4 factors, each with path and levels"); return nil }
            for (i, item) in seq.enumerated() {
                let at = "\(path).factors[\(i)]"
                guard let fm = mapping(item, at, known: ["path", "levels"]) else { continue }
                guard let pn = fm["path"], let p = string(pn, "\(at).path", maxBytes: 128) else { if fm["path"] == nil { fail("\(at).path", item, "required: the plan path the factor sets (sensor.advertInterval)") }; continue }
                guard Study.factorPrefixes.contains(where: { p == $0 || p.hasPrefix($0) }), !p.hasSuffix("."), p.split(separator: ".").allSatisfy({ SafeName.isValid(String($0)) }) else {
                    fail("\(at).path", pn, "\"\(p.prefix(64))\" is not a plan path a study can vary (paths under \(Study.factorPrefixes.joined(separator: ", ")))"); continue
                }
                if study.factors.contains(where: { $0.path == p }) { fail("\(at).path", pn, "\"\(p)\" is a factor twice"); continue }
                guard let ln = fm["levels"], case .sequence(let ls) = ln, (2...16).contains(ls.count) else { fail("\(at).levels", fm["levels"] ?? item, "expected a list of 2 to 16 levels"); continue }
                var levels = [String]()
                for (j, l) in ls.enumerated() {
                    guard case .scalar(let s) = l, !s.string.isEmpty, s.string.utf8.count <= 64 else { fail("\(at).levels[\(j)]", l, "expected a value as the plan writes it (100ms, on, 0.2)"); continue }
                    if let problem = Self.labelProblem(s.string) { fail("\(at).levels[\(j)]", l, "\"\(s.string.prefix(64))\" \(problem)"); continue }
                    if levels.contains(s.string) { fail("\(at).levels[\(j)]", l, "\"\(s.string)\" is a level twice"); continue }
                    levels.append(s.string)
                }
                study.factors.append(.init(path: p, levels: levels))
            }
        }
        let combos = study.factors.reduce(1) { $0 * max(1, $1.levels.count) }
        if combos * study.repeats > Study.maximumRuns { fail("\(path).repeats", m["repeats"], "\(combos) levels x \(study.repeats) repeats is \(combos * study.repeats) runs; at most \(Study.maximumRuns)") }
        if let n = m["margins"], let mm = mapping(n, "\(path).margins", known: Study.metricNames) {
            for (k, v) in mm {
                guard case .scalar(let s) = v else { fail("\(path).margins.\(k)", v, "expected a number or a percentage (1, 10%)"); continue }
                let t = s.string.trimmingCharacters(in: .whitespaces)
                let number = t.hasSuffix("%") ? Double(t.dropLast()) : Double(t)
                guard let x = number, x.isFinite, x >= 0, x <= (t.hasSuffix("%") ? 1000 : 1e9) else { fail("\(path).margins.\(k)", v, "\"\(t.prefix(64))\" is not a margin; write a number (points, or the metric's unit) or a percentage of the baseline (10%)"); continue }
                study.margins[k] = t
            }
        }
        return study
    }
}
