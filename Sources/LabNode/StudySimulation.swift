import Foundation
import HeraldCore
import LabPlan

/// `herald-lab simulate STUDY`: every run of an expanded study in its order, each a bundle in
/// `<folder>/<run>/`, and `study.json` (factors, levels, order, seeds) beside them, written
/// durably after each run so an interrupted study still says what ran.
public final class StudySimulation {
    public struct Record: Codable, Sendable {
        public struct Factor: Codable, Sendable { public var path: String; public var levels: [String] }
        public struct Run: Codable, Sendable {
            public var index: Int
            public var block: Int
            public var level: String
            public var levelIndex: Int
            public var seed: UInt64
            public var bundle: String
            public var settings: [String: String]
            /// Which dongles ran it (nil in a simulation: simulated radios).
            public var dongles: [String: String]?
            /// On a lab (`herald-lab run STUDY`): the coordinator's run id, how the run ended
            /// (complete, aborted, failed: a failed run has no bundle) and why, and which agent
            /// and dongle ran each node.
            public var runId: String?
            public var state: String?
            public var message: String?
            public var nodes: [NodeRun]?
        }
        /// One node of a lab run: the agent that ran it and its dongle as the coordinator knows it.
        public struct NodeRun: Codable, Sendable, Equatable {
            public var node: String
            public var agent: String
            public var dongle: LabWire.DongleInfo?
            public init(node: String, agent: String, dongle: LabWire.DongleInfo?) { self.node = node; self.agent = agent; self.dongle = dongle }
        }
        public var format = "heraldlab-study/1"
        public var study: String
        public var plan: String
        public var seed: UInt64
        public var mode = BundleMode.simulate
        public var factors: [Factor]
        public var levels: [String]
        public var repeats: Int
        public var margins: [String: String]
        public var groups: [String]?
        public var order: [String]
        public var runs: [Run]
        /// On a lab: the coordinator, and whether the study is a crossover (every level on the
        /// same dongles, compared paired per dongle) or why not.
        public var coordinator: String?
        public var crossover: Bool?
        public var design: String?
    }

    public let plan: Plan
    public let planText: String
    public let runs: [StudyRun]
    public let folder: URL
    public let threads: Int?

    public init(plan: Plan, planText: String, runs: [StudyRun], output: URL, threads: Int? = nil) {
        self.plan = plan
        self.planText = planText
        self.runs = runs
        self.folder = output.appendingPathComponent(plan.study?.name ?? plan.name)
        self.threads = threads
    }

    public func record(done: Int) -> Record {
        var levels = [String]()
        for r in runs.sorted(by: { $0.levelIndex < $1.levelIndex }) where !levels.contains(r.level) { levels.append(r.level) }
        let study = plan.study
        return Record(study: study?.name ?? plan.name, plan: plan.name, seed: plan.seed,
                      factors: (study?.factors ?? []).map { .init(path: $0.path, levels: $0.levels) }, levels: levels,
                      repeats: study?.repeats ?? runs.count, margins: study?.margins ?? [:], groups: plan.groups?.map(\.name),
                      order: runs.map(\.folder),
                      runs: runs.prefix(done).map { .init(index: $0.index, block: $0.block, level: $0.level, levelIndex: $0.levelIndex, seed: $0.seed, bundle: $0.folder, settings: $0.settings) })
    }

    /// Runs every run in order; `each` is called after each run with its result (to analyse it).
    public func run(each: (StudyRun, Simulation.Result) throws -> Void) throws {
        try Durable.refuseLink(folder)
        for r in runs { try Durable.refuseLink(folder.appendingPathComponent(r.folder)) }
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let enc = JSONEncoder()
        enc.outputFormatting = [.prettyPrinted, .sortedKeys]
        for (k, r) in runs.enumerated() {
            let sim = Simulation(plan: r.plan, planText: planText, seed: r.seed, output: folder.appendingPathComponent(r.folder),
                                 runId: "\(record(done: 0).study)-\(r.folder)", threads: threads)
            let result = try sim.run()
            try each(r, result)
            try Durable.write(try enc.encode(record(done: k + 1)), to: folder.appendingPathComponent("study.json"))
        }
    }
}
