import Foundation
import PostgresNIO

/// Studies in the shared store (issue 41 item 2): a study's row, its runs and its effects, written
/// in one transaction, once per (lab, study id).
extension SharedResultsStore {
    /// Stores `study` once per (lab, study id): a retry of a write that landed changes nothing.
    @discardableResult
    public func record(_ study: SharedStudy) async throws -> Recorded {
        try study.validate()
        return try await transaction { c in
            let insert: PostgresQuery = """
                INSERT INTO lab_study (lab, study_id, name, plan, factor, baseline, levels, design, recorded_at, runs_total, runs_complete,
                    check_passed, compare_json)
                VALUES (\(study.lab), \(study.studyId), \(study.name), \(study.plan), \(study.factor), \(study.baseline), \(study.levels),
                    \(study.design), \(study.recordedAt), \(Int64(study.runs.count)), \(Int64(study.runsComplete)), \(study.checkPassed), \(study.compareJSON))
                ON CONFLICT (lab, study_id) DO NOTHING
                RETURNING id
                """
            var id: Int64?
            for try await (x) in try await c.query(insert, logger: Self.quiet).decode(Int64.self) { id = x }
            guard let id else {
                for try await (x) in try await c.query("SELECT id FROM lab_study WHERE lab = \(study.lab) AND study_id = \(study.studyId)", logger: Self.quiet).decode(Int64.self) {
                    return Recorded.present(x)
                }
                throw ResultsStoreError.database("study \(study.studyId.debugDescription) of lab \(study.lab.debugDescription): neither inserted nor found")
            }
            for (k, r) in study.runs.enumerated() {
                try await c.query("""
                    INSERT INTO lab_study_run (study, k, block, level, seed, folder, run_id, state)
                    VALUES (\(id), \(Int64(k)), \(Int64(r.block)), \(r.level), \(r.seed), \(r.folder), \(r.runId), \(r.state))
                    """, logger: Self.quiet)
            }
            for (k, e) in study.effects.enumerated() {
                try await c.query("""
                    INSERT INTO lab_study_effect (study, k, metric, level, baseline, baseline_estimate, estimate, delta, ci_low, ci_high, p, p_adjusted, verdict)
                    VALUES (\(id), \(Int64(k)), \(e.metric), \(e.level), \(e.baseline), \(e.baselineEstimate), \(e.estimate), \(e.delta),
                            \(e.ciLow), \(e.ciHigh), \(e.p), \(e.pAdjusted), \(e.verdict))
                    """, logger: Self.quiet)
            }
            return Recorded.inserted(id)
        }
    }

    /// The studies of the given labs (every lab when empty), oldest first, with their runs and effects.
    public func studies(labs: [String] = []) async throws -> [SharedStudy] {
        try await using { c in
            var out = [SharedStudy]()
            let q: PostgresQuery = """
                SELECT id, lab, study_id, name, plan, factor, baseline, levels, design, recorded_at, check_passed, compare_json
                FROM lab_study WHERE \(labs.isEmpty) OR lab = ANY(\(labs)) ORDER BY id
                """
            for try await row in try await c.query(q, logger: Self.quiet) {
                let x = row.makeRandomAccess()
                out.append(SharedStudy(id: try x[0].decode(Int64.self), lab: try x[1].decode(String.self), studyId: try x[2].decode(String.self),
                                       name: try x[3].decode(String.self), plan: try x[4].decode(String.self), factor: try x[5].decode(String.self),
                                       baseline: try x[6].decode(String.self), levels: try x[7].decode([String].self), design: try x[8].decode(String.self),
                                       recordedAt: try x[9].decode(Date.self), checkPassed: try x[10].decode(Bool.self), runs: [], effects: [],
                                       compareJSON: try x[11].decode(String.self)))
            }
            for i in out.indices {
                let id = out[i].id!
                for try await (k, block, level, seed, folder, runId, state) in try await c.query("""
                    SELECT k, block, level, seed, folder, run_id, state FROM lab_study_run WHERE study = \(id) ORDER BY k
                    """, logger: Self.quiet).decode((Int64, Int64, String, String, String, String, String).self) {
                    out[i].runs.append(.init(index: Int(k), block: Int(block), level: level, seed: seed, folder: folder, runId: runId, state: state))
                }
                for try await row in try await c.query("""
                    SELECT metric, level, baseline, baseline_estimate, estimate, delta, ci_low, ci_high, p, p_adjusted, verdict
                    FROM lab_study_effect WHERE study = \(id) ORDER BY k
                    """, logger: Self.quiet) {
                    let x = row.makeRandomAccess()
                    out[i].effects.append(.init(metric: try x[0].decode(String.self), level: try x[1].decode(String.self), baseline: try x[2].decode(String.self),
                                                baselineEstimate: try x[3].decode(Double?.self), estimate: try x[4].decode(Double?.self),
                                                delta: try x[5].decode(Double?.self), ciLow: try x[6].decode(Double?.self), ciHigh: try x[7].decode(Double?.self),
                                                p: try x[8].decode(Double?.self), pAdjusted: try x[9].decode(Double?.self), verdict: try x[10].decode(String.self)))
                }
            }
            return out
        }
    }
}
