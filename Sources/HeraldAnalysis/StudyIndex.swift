import Foundation
import HeraldCore

/// The parts of a study folder's study.json that `compare` needs (written by
/// `herald-lab simulate STUDY`; docs/STATISTICS.md), read leniently and checked: each run's
/// bundle must be a plain folder inside the study folder.
public struct StudyIndex: Decodable, Sendable {
    public struct Factor: Decodable, Sendable {
        public var path: String; public var levels: [String]
        public init(path: String, levels: [String]) { self.path = path; self.levels = levels }
    }
    public struct Run: Decodable, Sendable {
        public var index: Int
        public var block: Int
        public var level: String
        public var seed: UInt64
        public var bundle: String
        /// On a lab: how the run ended (complete, aborted, failed: a failed run has no bundle)
        /// and which agent and dongle ran each node.
        public var state: String?
        public var nodes: [NodeRun]?
        public init(index: Int, block: Int, level: String, seed: UInt64, bundle: String, state: String? = nil, nodes: [NodeRun]? = nil) {
            self.index = index; self.block = block; self.level = level; self.seed = seed; self.bundle = bundle; self.state = state; self.nodes = nodes
        }
        /// Whether a bundle was fetched for the run (a lab run that failed has none).
        public var hasBundle: Bool { state.map { $0 == "complete" || $0 == "aborted" } ?? true }
    }
    public struct NodeRun: Decodable, Sendable {
        public struct Dongle: Decodable, Sendable {
            public var id: String?; public var name: String?
            public init(id: String?, name: String?) { self.id = id; self.name = name }
        }
        public init(node: String, agent: String, dongle: Dongle?) { self.node = node; self.agent = agent; self.dongle = dongle }
        public var node: String
        public var agent: String
        public var dongle: Dongle?
        /// What stands for the device across runs: its dongle's address, else its agent.
        public var unit: String { dongle?.id.map { "dongle \($0)" } ?? "agent \(agent)" }
    }
    /// On a lab: every level ran on the same dongles in turn (compared paired per dongle).
    public var crossover: Bool?
    public var format: String
    public var study: String
    public var plan: String
    public var factors: [Factor]
    public var levels: [String]
    public var repeats: Int
    public var margins: [String: String]?
    public var groups: [String]?
    public var runs: [Run]

    public static let fileName = "study.json"

    /// A study's index built in code (the coordinator's dashboard, from its runs' `studyRun`).
    public init(study: String, plan: String, factors: [Factor], levels: [String], repeats: Int, margins: [String: String]?, crossover: Bool?, runs: [Run]) {
        self.format = "heraldlab-study/1"
        self.study = study; self.plan = plan; self.factors = factors; self.levels = levels; self.repeats = repeats
        self.margins = margins; self.crossover = crossover; self.runs = runs
    }

    /// Reads `folder/study.json`; nil when the folder has none.
    public static func load(_ folder: URL) throws -> StudyIndex? {
        let url = folder.appendingPathComponent(fileName)
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let data = try LogFileAccess.read(url, root: folder, limit: InputLimits.maximumJSONBytes)
        let index: StudyIndex
        do { index = try JSONDecoder().decode(StudyIndex.self, from: data) } catch {
            throw AnalysisError.badFlag("\(url.path): not a study index: \(error)")
        }
        guard index.format.hasPrefix("heraldlab-study/") else { throw AnalysisError.badFlag("\(url.path): format \"\(Format.label(String(index.format.prefix(64))))\" is not heraldlab-study/1") }
        guard index.runs.count <= 10_000, index.levels.count <= 1000 else { throw AnalysisError.badFlag("\(url.path): too many runs or levels") }
        for r in index.runs {
            let parts = r.bundle.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
            guard !parts.isEmpty, parts.count <= 2, parts.allSatisfy({ SafeName.isValid($0) }) else {
                throw AnalysisError.badFlag("\(url.path): run \(r.index): bundle \"\(Format.label(String(r.bundle.prefix(64))))\" is not a folder inside the study")
            }
            guard (r.nodes?.count ?? 0) <= 10_000 else { throw AnalysisError.badFlag("\(url.path): run \(r.index): too many nodes") }
            guard index.levels.contains(r.level) else { throw AnalysisError.badFlag("\(url.path): run \(r.index): level \"\(Format.label(String(r.level.prefix(64))))\" is not among the study's levels") }
        }
        return index
    }

    /// A margin as study.json writes it: "1" (points, or the metric's unit) or "10%" (of the baseline).
    public static func margin(_ text: String) -> Margin? {
        let t = text.trimmingCharacters(in: .whitespaces)
        if t.hasSuffix("%"), let v = Double(t.dropLast()), v.isFinite, v >= 0, v <= 1000 { return .relative(v / 100) }
        if let v = Double(t), v.isFinite, v >= 0, v <= 1e9 { return .points(v) }
        return nil
    }
}

extension Comparison {
    /// The design of a study folder: its levels in the study's order (the first is the
    /// baseline), each run's bundle (analysed if it has no summary yet), the study's margins.
    /// A study with node groups compares the groups (A/B in one run), within each level.
    public static func design(study folder: URL, index: StudyIndex) throws -> Design {
        var byLevel = [String: [RunRef]]()
        var order = [String]()
        let grouped = (index.groups?.count ?? 0) >= 2
        // A crossover (same dongles for every level) is compared paired per dongle; node groups
        // put different dongles in each arm, so they are not.
        let paired = index.crossover == true && !grouped
        for run in index.runs.sorted(by: { $0.index < $1.index }) where run.hasBundle {
            let result = try SummaryLoader.load(folder.appendingPathComponent(run.bundle))
            var single = RunRef(result: result, label: result.input.runId ?? run.bundle, settings: settings(result))
            if paired { single.units = Dictionary((run.nodes ?? []).map { ($0.node, $0.unit) }, uniquingKeysWith: { a, _ in a }) }
            for ref in (grouped ? refs(result) : [single]) {
                let group = ref.settings["group"]
                let name = grouped ? (index.levels.count > 1 ? "\(run.level) [\(group ?? "-")]" : (group ?? "-")) : run.level
                if byLevel[name] == nil { order.append(name) }
                byLevel[name, default: []].append(ref)
            }
        }
        if !grouped { order = index.levels.filter { byLevel[$0] != nil } + index.levels.filter { byLevel[$0] == nil } }
        let expected = grouped ? nil : Optional(index.repeats)
        let factor = grouped ? "group" + (index.factors.isEmpty ? "" : " × " + index.factors.map(\.path).joined(separator: " × ")) : index.factors.map(\.path).joined(separator: " × ")
        var d = Design(factor: factor, levels: order.map { Level(name: $0, runs: byLevel[$0] ?? [], expectedRuns: expected) })
        d.paired = paired
        for (k, v) in index.margins ?? [:] {
            guard let metric = Metric(rawValue: k) else { throw AnalysisError.badFlag("study.json: margins: \"\(Format.label(String(k.prefix(64))))\" is not a metric (\(Metric.allCases.map(\.rawValue).joined(separator: ", ")))") }
            guard let m = StudyIndex.margin(v) else { throw AnalysisError.badFlag("study.json: margins.\(k): \"\(Format.label(String(v.prefix(64))))\" is not a margin (a number, or a percentage such as 10%)") }
            d.margins[metric] = m
        }
        return d
    }
}
