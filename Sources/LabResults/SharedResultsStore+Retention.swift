import Foundation
import PostgresNIO

/// Retention in the shared store (issue 41 item 4, `herald-lab results-store prune`): runs older
/// than N days are deleted per lab, each night they ran first summed up in `lab_night` (runs,
/// passed, infra, the headline figures' means over the runs without infrastructure faults), which
/// Trends still draws; summaries and studies are kept M days (M >= N).
extension SharedResultsStore {
    /// The days `prune` accepts for --keep-days and --summary-days.
    public static let retentionDays = 1...36_500

    /// What a prune did.
    public struct Pruned: Sendable, Equatable {
        /// Nights summed up (new or merged summary rows).
        public var nightsSummarised = 0
        public var runsDeleted = 0
        public var studiesDeleted = 0
        public var summariesDeleted = 0
        /// The first instants kept: runs recorded before `runsBefore`, summaries and studies before `summariesBefore`, are gone.
        public var runsBefore: Date
        public var summariesBefore: Date
    }

    /// The start (00:00 UTC) of the night `days` days before `now`'s: everything before it is pruned.
    public static func cutoff(days: Int, now: Date) -> Date {
        var utc = Calendar(identifier: .gregorian)
        utc.timeZone = TimeZone(identifier: "UTC")!
        let today = utc.startOfDay(for: now)
        return utc.date(byAdding: .day, value: -days, to: today)!
    }

    /// Deletes the runs of `lab` (every lab when nil) recorded before the night `keepDays` days ago,
    /// after summing each of their nights into `lab_night` (merged with a summary already there);
    /// deletes studies and summaries older than `summaryDays`. One transaction: all or nothing.
    public func prune(keepDays: Int, summaryDays: Int, lab: String?, now: Date = Date()) async throws -> Pruned {
        guard Self.retentionDays.contains(keepDays) else { throw ResultsStoreError.refused("--keep-days \(keepDays): from \(Self.retentionDays.lowerBound) to \(Self.retentionDays.upperBound)") }
        guard Self.retentionDays.contains(summaryDays), summaryDays >= keepDays else {
            throw ResultsStoreError.refused("--summary-days \(summaryDays): from --keep-days (\(keepDays)) to \(Self.retentionDays.upperBound)")
        }
        let runsBefore = Self.cutoff(days: keepDays, now: now), summariesBefore = Self.cutoff(days: summaryDays, now: now)
        let every = lab == nil, name = lab ?? ""
        return try await transaction { c in
            var out = Pruned(runsBefore: runsBefore, summariesBefore: summariesBefore)
            // Weighted by the runs each mean is over, so a night summed in two prunes (a run
            // queued in an outbox for days lands after its night was pruned) is as if in one.
            let summarise: PostgresQuery = """
                INSERT INTO lab_night AS n (lab, plan, variant, testbed, settings_key, night, runs, passed, infra, clean,
                    detection_pct, continuity_pct, herald_continuity_pct, longevity, detection_min, continuity_min)
                SELECT lab, plan, variant, testbed, settings_key, (recorded_at AT TIME ZONE 'UTC')::date, count(*),
                    count(*) FILTER (WHERE passed), count(*) FILTER (WHERE infra <> ''), count(*) FILTER (WHERE infra = ''),
                    avg(detection_pct) FILTER (WHERE infra = ''), avg(continuity_pct) FILTER (WHERE infra = ''),
                    avg(herald_continuity_pct) FILTER (WHERE infra = ''), avg(longevity) FILTER (WHERE infra = ''),
                    min(detection_pct) FILTER (WHERE infra = ''), min(continuity_pct) FILTER (WHERE infra = '')
                FROM lab_run WHERE recorded_at < \(runsBefore) AND (\(every) OR lab = \(name))
                GROUP BY 1, 2, 3, 4, 5, 6
                ON CONFLICT (lab, plan, variant, testbed, settings_key, night) DO UPDATE SET
                    runs = n.runs + EXCLUDED.runs, passed = n.passed + EXCLUDED.passed, infra = n.infra + EXCLUDED.infra,
                    clean = n.clean + EXCLUDED.clean,
                    detection_pct = (COALESCE(n.detection_pct, 0) * n.clean + COALESCE(EXCLUDED.detection_pct, 0) * EXCLUDED.clean) / NULLIF(n.clean + EXCLUDED.clean, 0),
                    continuity_pct = (COALESCE(n.continuity_pct, 0) * n.clean + COALESCE(EXCLUDED.continuity_pct, 0) * EXCLUDED.clean) / NULLIF(n.clean + EXCLUDED.clean, 0),
                    herald_continuity_pct = (COALESCE(n.herald_continuity_pct, 0) * n.clean + COALESCE(EXCLUDED.herald_continuity_pct, 0) * EXCLUDED.clean) / NULLIF(n.clean + EXCLUDED.clean, 0),
                    longevity = (COALESCE(n.longevity, 0) * n.clean + COALESCE(EXCLUDED.longevity, 0) * EXCLUDED.clean) / NULLIF(n.clean + EXCLUDED.clean, 0),
                    detection_min = LEAST(n.detection_min, EXCLUDED.detection_min),
                    continuity_min = LEAST(n.continuity_min, EXCLUDED.continuity_min)
                RETURNING 1
                """
            for try await _ in try await c.query(summarise, logger: Self.quiet).decode(Int32.self) { out.nightsSummarised += 1 }
            for try await _ in try await c.query("DELETE FROM lab_run WHERE recorded_at < \(runsBefore) AND (\(every) OR lab = \(name)) RETURNING 1", logger: Self.quiet).decode(Int32.self) {
                out.runsDeleted += 1
            }
            for try await _ in try await c.query("DELETE FROM lab_study WHERE recorded_at < \(summariesBefore) AND (\(every) OR lab = \(name)) RETURNING 1", logger: Self.quiet).decode(Int32.self) {
                out.studiesDeleted += 1
            }
            for try await _ in try await c.query("""
                DELETE FROM lab_night WHERE night < (\(summariesBefore) AT TIME ZONE 'UTC')::date AND (\(every) OR lab = \(name)) RETURNING 1
                """, logger: Self.quiet).decode(Int32.self) {
                out.summariesDeleted += 1
            }
            return out
        }
    }

    /// One night of one lab's plan, variant, settings and testbed: what Trends draws a point of.
    public struct Night: Sendable, Equatable, Codable {
        public var lab: String
        public var plan: String
        public var variant: String
        public var testbed: String
        public var settingsKey: String
        /// YYYY-MM-DD (UTC).
        public var night: String
        public var runs: Int
        public var passed: Int
        public var infra: Int
        /// Means over the night's runs without infrastructure faults (nil: none).
        public var detectionPct: Double?
        public var continuityPct: Double?
        public var heraldContinuityPct: Double?
        public var longevity: Double?
        /// True when the night's runs were pruned and this is their summary.
        public var summarised: Bool
    }

    /// The nightly series of `plan` in the given labs (every lab when empty) since `since`, oldest
    /// night first per lab and testbed: the nights whose runs are kept, summed from the runs, and
    /// the pruned nights' summaries. The query Trends draws over a shared store (and `make bench-results` times).
    public func nightlySeries(plan: String, labs: [String] = [], since: Date) async throws -> [Night] {
        try await using { c in
            let q: PostgresQuery = """
                SELECT lab, plan, variant, testbed, settings_key, to_char(night, 'YYYY-MM-DD'), runs, passed, infra,
                       detection_pct, continuity_pct, herald_continuity_pct, longevity, summarised
                FROM (
                    SELECT lab, plan, variant, testbed, settings_key, (recorded_at AT TIME ZONE 'UTC')::date AS night, count(*) AS runs,
                           count(*) FILTER (WHERE passed) AS passed, count(*) FILTER (WHERE infra <> '') AS infra,
                           avg(detection_pct) FILTER (WHERE infra = '') AS detection_pct, avg(continuity_pct) FILTER (WHERE infra = '') AS continuity_pct,
                           avg(herald_continuity_pct) FILTER (WHERE infra = '') AS herald_continuity_pct,
                           avg(longevity) FILTER (WHERE infra = '') AS longevity, false AS summarised
                    FROM lab_run WHERE plan = \(plan) AND recorded_at >= \(since) AND (\(labs.isEmpty) OR lab = ANY(\(labs)))
                    GROUP BY 1, 2, 3, 4, 5, 6
                    UNION ALL
                    SELECT lab, plan, variant, testbed, settings_key, night, runs, passed, infra, detection_pct, continuity_pct,
                           herald_continuity_pct, longevity, true
                    FROM lab_night WHERE plan = \(plan) AND night >= (\(since) AT TIME ZONE 'UTC')::date AND (\(labs.isEmpty) OR lab = ANY(\(labs)))
                ) t
                ORDER BY lab, testbed, variant, settings_key, night, summarised
                """
            var out = [Night]()
            for try await row in try await c.query(q, logger: Self.quiet) {
                let x = row.makeRandomAccess()
                out.append(Night(lab: try x[0].decode(String.self), plan: try x[1].decode(String.self), variant: try x[2].decode(String.self),
                                 testbed: try x[3].decode(String.self), settingsKey: try x[4].decode(String.self), night: try x[5].decode(String.self),
                                 runs: Int(try x[6].decode(Int64.self)), passed: Int(try x[7].decode(Int64.self)), infra: Int(try x[8].decode(Int64.self)),
                                 detectionPct: try x[9].decode(Double?.self), continuityPct: try x[10].decode(Double?.self),
                                 heraldContinuityPct: try x[11].decode(Double?.self), longevity: try x[12].decode(Double?.self),
                                 summarised: try x[13].decode(Bool.self)))
            }
            return out
        }
    }

    /// Refreshes the planner's statistics of the tables the series and baselines read (as the
    /// owner; after a bulk load).
    public func analyse() async throws {
        try await using { c in
            try await c.query("ANALYZE lab_run", logger: Self.quiet)
            try await c.query("ANALYZE lab_night", logger: Self.quiet)
        }
    }

    /// Stores `runs` as new rows in batches of up to 1,000 (one INSERT of bound arrays each, in one
    /// transaction per batch); rows already there are left as they were. For loading a history
    /// (`make bench-results`, imports). Returns how many were new.
    @discardableResult
    public func recordBatch(_ runs: [SharedRun]) async throws -> Int {
        for r in runs { try r.validate() }
        var inserted = 0
        var start = 0
        while start < runs.count {
            let batch = Array(runs[start..<min(runs.count, start + 1000)])
            start += batch.count
            inserted += try await transaction { c in
                let q: PostgresQuery = """
                    INSERT INTO lab_run (lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, recorded_at,
                        created_at, seed, devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total,
                        checks_failed, failed_checks, infra, summary_json)
                    SELECT lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, to_timestamp(recorded_at),
                        created_at, seed, devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total,
                        checks_failed, failed_checks, infra, summary_json
                    FROM unnest(\(batch.map(\.lab)), \(batch.map(\.runId)), \(batch.map(\.path)), \(batch.map(\.bundleURL)), \(batch.map(\.testbed)),
                                \(batch.map(\.plan)), \(batch.map(\.variant)), \(batch.map(\.settingsKey)), \(batch.map(\.firmware)), \(batch.map(\.dongleMake)),
                                \(batch.map { $0.recordedAt.timeIntervalSince1970 }), \(batch.map(\.createdAt)), \(batch.map(\.seed)), \(batch.map { Int64($0.devices) }),
                                \(batch.map(\.detectionPct)), \(batch.map(\.continuityPct)), \(batch.map(\.heraldContinuityPct)), \(batch.map(\.longevity)),
                                \(batch.map(\.passed)), \(batch.map(\.verdict)), \(batch.map { Int64($0.checksTotal) }), \(batch.map { Int64($0.checksFailed) }),
                                \(batch.map(\.failedChecks)), \(batch.map(\.infra)), \(batch.map(\.summaryJSON)))
                        AS t (lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, recorded_at,
                              created_at, seed, devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total,
                              checks_failed, failed_checks, infra, summary_json)
                    ON CONFLICT (lab, run_id) DO NOTHING
                    RETURNING 1
                    """
                var n = 0
                for try await _ in try await c.query(q, logger: Self.quiet).decode(Int32.self) { n += 1 }
                return n
            }
        }
        return inserted
    }
}
