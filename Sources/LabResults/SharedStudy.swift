import Foundation
import HeraldAnalysis

/// One study as the shared store keeps it (issue 41 item 2): its name, lab, plan, factor and
/// levels, each of its runs (level, block, seed, the coordinator's run id and how it ended), and
/// each comparison's effect with its 95 % interval and verdict; compare.json verbatim beside
/// them. What the outbox holds, one `.study.json` file per study, until the store has it.
public struct SharedStudy: Codable, Sendable, Equatable {
    public struct Run: Codable, Sendable, Equatable {
        public var index: Int
        public var block: Int
        public var level: String
        public var seed: String
        /// The run's folder inside the study folder.
        public var folder: String
        /// The coordinator's run id ("" when the run was never taken).
        public var runId: String
        /// complete, aborted, failed, ...
        public var state: String
        public init(index: Int, block: Int, level: String, seed: String, folder: String, runId: String, state: String) {
            self.index = index; self.block = block; self.level = level; self.seed = seed; self.folder = folder; self.runId = runId; self.state = state
        }
    }

    /// One comparison: `level` against `baseline` on `metric`.
    public struct Effect: Codable, Sendable, Equatable {
        public var metric: String
        public var level: String
        public var baseline: String
        public var baselineEstimate: Double?
        public var estimate: Double?
        public var delta: Double?
        public var ciLow: Double?
        public var ciHigh: Double?
        public var p: Double?
        public var pAdjusted: Double?
        /// better, worse, same, inconclusive, no data.
        public var verdict: String
        public init(metric: String, level: String, baseline: String, baselineEstimate: Double?, estimate: Double?, delta: Double?,
                    ciLow: Double?, ciHigh: Double?, p: Double?, pAdjusted: Double?, verdict: String) {
            self.metric = metric; self.level = level; self.baseline = baseline; self.baselineEstimate = baselineEstimate; self.estimate = estimate
            self.delta = delta; self.ciLow = ciLow; self.ciHigh = ciHigh; self.p = p; self.pAdjusted = pAdjusted; self.verdict = verdict
        }
    }

    /// The store's row id (nil before it is stored; never in the outbox).
    public var id: Int64?
    public var lab: String
    /// Unique per lab: made once when the study starts, so a retried write is the same study.
    public var studyId: String
    public var name: String
    public var plan: String
    public var factor: String
    public var baseline: String
    public var levels: [String]
    /// "crossover" or "unpaired" (the design's description).
    public var design: String
    public var recordedAt: Date
    public var checkPassed: Bool
    public var runs: [Run]
    public var effects: [Effect]
    /// compare.json, verbatim ("" when the levels were not compared).
    public var compareJSON: String

    /// Most runs and effects a study may hold (as StudyIndex reads study.json).
    public static let maximumRuns = 10_000
    public static let maximumEffects = 10_000

    public init(id: Int64? = nil, lab: String, studyId: String, name: String, plan: String, factor: String, baseline: String, levels: [String],
                design: String, recordedAt: Date, checkPassed: Bool, runs: [Run], effects: [Effect], compareJSON: String) {
        self.id = id; self.lab = lab; self.studyId = studyId; self.name = name; self.plan = plan; self.factor = factor; self.baseline = baseline
        self.levels = levels; self.design = design; self.recordedAt = recordedAt; self.checkPassed = checkPassed; self.runs = runs
        self.effects = effects; self.compareJSON = compareJSON
    }

    /// A finished study of `lab`: its runs and, when its levels were compared, `outcome`'s effects
    /// (compare.json's text in `compareJSON`).
    public init(lab: String, studyId: String, name: String, plan: String, levels: [String], design: String, runs: [Run],
                outcome: Comparison.Outcome?, compareJSON: String, at date: Date = Date()) throws {
        self.init(lab: lab, studyId: studyId, name: name, plan: plan, factor: outcome?.factor ?? "", baseline: outcome?.baseline ?? levels.first ?? "",
                  levels: levels, design: design, recordedAt: date, checkPassed: outcome?.checkPassed ?? false, runs: runs,
                  effects: (outcome?.effects ?? []).map { e in
                      Effect(metric: e.metric, level: e.level, baseline: e.baseline, baselineEstimate: e.baselineEstimate, estimate: e.estimate,
                             delta: e.delta, ciLow: e.ci95.flatMap { $0.count == 2 ? $0[0] : nil }, ciHigh: e.ci95.flatMap { $0.count == 2 ? $0[1] : nil },
                             p: e.p, pAdjusted: e.pAdjusted, verdict: e.verdict.rawValue)
                  },
                  compareJSON: compareJSON)
        try validate()
    }

    /// Runs that completed.
    public var runsComplete: Int { runs.filter { $0.state == "complete" }.count }

    /// Refuses what PostgreSQL's text cannot hold (a NUL), an empty or too long lab name, and
    /// more runs or effects than a study holds, naming the field.
    public func validate() throws {
        guard !lab.isEmpty else { throw ResultsStoreError.refused("lab: empty (--lab NAME)") }
        guard lab.count <= SharedRun.maximumLabName else { throw ResultsStoreError.refused("lab: over \(SharedRun.maximumLabName) characters") }
        guard !studyId.isEmpty else { throw ResultsStoreError.refused("study id: empty") }
        guard runs.count <= Self.maximumRuns else { throw ResultsStoreError.refused("study \(name.debugDescription): over \(Self.maximumRuns) runs") }
        guard effects.count <= Self.maximumEffects else { throw ResultsStoreError.refused("study \(name.debugDescription): over \(Self.maximumEffects) effects") }
        var fields: [(String, String)] = [("lab", lab), ("study id", studyId), ("study name", name), ("plan", plan), ("factor", factor),
                                          ("baseline", baseline), ("design", design), ("compare.json", compareJSON)]
        fields += levels.map { ("level", $0) }
        for r in runs { fields += [("run level", r.level), ("run seed", r.seed), ("run folder", r.folder), ("run id", r.runId), ("run state", r.state)] }
        for e in effects { fields += [("effect metric", e.metric), ("effect level", e.level), ("effect baseline", e.baseline), ("verdict", e.verdict)] }
        for (field, value) in fields where value.utf8.contains(0) {
            throw ResultsStoreError.refused("\(field): holds a NUL character, which PostgreSQL's text cannot store")
        }
    }
}
