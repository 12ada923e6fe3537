import Foundation
import HeraldAnalysis
import LabPlan

/// A study that finished on this coordinator (every planned run of it ended), as the shared
/// results store keeps it (issue 41 item 2; `Config.recordStudy`).
public struct FinishedStudy: Sendable {
    public struct Run: Sendable {
        public var index: Int
        public var block: Int
        public var level: String
        public var runId: String
        public var state: String
    }
    /// Stable across restarts: the study's first run's id (a coordinator's run ids are unique).
    public var studyId: String
    public var name: String
    public var plan: String
    public var levels: [String]
    /// "crossover" or "unpaired".
    public var design: String
    public var runs: [Run]
    /// The levels' comparison; nil when it could not be made (fewer than two levels with a bundle).
    public var outcome: Comparison.Outcome?
    /// compare.json's text of `outcome` ("" without one).
    public var compareJSON: String
}

extension Coordinator {
    /// After run `r` ended: when it was the last of its study to end, hands the study (its runs,
    /// the levels' comparison) to `config.recordStudy`, which only queues it.
    func recordStudyIfFinished(_ r: RunRecord) {
        guard let record = config.recordStudy, dashboard.studies.membership(r) != nil else { return }
        guard let s = pages.dashboardStudies().first(where: { $0.runs.contains { $0.record.id == r.id } }) else { return }
        guard s.runs.count >= s.planned, s.runs.allSatisfy({ $0.record.state.isFinal }), let first = s.runs.first else { return }
        var outcome: Comparison.Outcome?, json = ""
        switch pages.studyOutcome(s) {
        case .success(let o):
            outcome = o
            do { json = String(decoding: try Comparison.json(o), as: UTF8.self) } catch {
                logger.error("study \(s.study.name): compare.json not written for the shared history: \(error)")
            }
        case .failure(let e):
            logger.warning("study \(s.study.name): recorded without a comparison: \(e.message)")
        }
        let finished = FinishedStudy(
            studyId: first.record.id, name: s.study.name, plan: s.plan, levels: s.study.levelNames,
            design: s.study.labDesign.isCrossover ? "crossover" : "unpaired",
            runs: s.runs.map { .init(index: $0.membership.index, block: $0.membership.block, level: $0.membership.level, runId: $0.record.id, state: $0.record.state.rawValue) },
            outcome: outcome, compareJSON: json)
        do { try record(finished) } catch {
            logger.error("study \(s.study.name): not queued for the shared history: \(error)", metadata: ["run": .string(r.id)])
        }
    }
}
