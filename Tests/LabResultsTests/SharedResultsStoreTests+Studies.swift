import Foundation
import HeraldAnalysis
import PostgresNIO
import XCTest
import LabTestSupport
@testable import LabResults

/// Studies, `--lab` and retention in the shared store (issue 41 items 2 and 4), against the real
/// PostgreSQL the suite starts (make test-results-server).
extension SharedResultsStoreTests {
    func study(_ id: String, lab: String, name: String = "adv-interval", at date: Date = Date(timeIntervalSince1970: 1_800_000_000)) throws -> SharedStudy {
        let levels = ["100ms", "250ms'; DROP TABLE lab_study; --"]
        let runs = (0..<4).map { k in
            SharedStudy.Run(index: k, block: k / 2, level: levels[k % 2], seed: "\(1000 + k)", folder: "run-\(k)", runId: "\(id)-r\(k)", state: k == 3 ? "failed" : "complete")
        }
        let effects = [
            SharedStudy.Effect(metric: "detection", level: levels[1], baseline: levels[0], baselineEstimate: 90, estimate: 95, delta: 5, ciLow: 1.5, ciHigh: 8.25,
                               p: 0.01, pAdjusted: 0.02, verdict: "better"),
            SharedStudy.Effect(metric: "continuity", level: levels[1], baseline: levels[0], baselineEstimate: nil, estimate: nil, delta: nil, ciLow: nil, ciHigh: nil,
                               p: nil, pAdjusted: nil, verdict: "no data"),
        ]
        return SharedStudy(lab: lab, studyId: id, name: name, plan: "office \"10\"", factor: "sensor.advertInterval", baseline: levels[0], levels: levels,
                           design: "crossover", recordedAt: date, checkPassed: true, runs: runs, effects: effects, compareJSON: "{\"effects\": []}")
    }

    /// Drains until the outbox is empty (30 s at most): a background drain of the writer's may
    /// hold the outbox when one is asked for, so the condition is waited on.
    func drained(_ writer: SharedHistoryWriter) async throws {
        try await eventually("the shared-history outbox to drain") {
            await writer.drain()
            return try writer.outbox.pending().isEmpty
        }
        XCTAssertEqual(try writer.outbox.pending(), [])
    }

    func testAStudyItsRunsAndEffectsLandOnceThroughTheOutboxAlsoWhenPostgreSQLWasDown() async throws {
        let db = try await newDatabase()
        let base = try baseResult()
        let s = try await store(db)
        let writer = try SharedHistoryWriter(lab: "lab-study", store: s, outbox: try ResultsOutbox(directory: tmp.appendingPathComponent("outbox")), logger: logger)
        try Self.server!.stop()
        try writer.record(variant(base, "s1-r0"), bundle: URL(fileURLWithPath: "/srv/results/s1-r0"))
        // The writer names the study's lab, whatever the study said.
        try writer.record(try study("s1", lab: "elsewhere"))
        let pending = try writer.outbox.pending()
        XCTAssertEqual(pending.map { $0.lastPathComponent.hasSuffix(".study.json") }, [false, true], "run then study, in order")
        for url in pending {
            let attributes = try FileManager.default.attributesOfItem(atPath: url.path)
            XCTAssertEqual((attributes[.posixPermissions] as? NSNumber)?.intValue, 0o600)
        }
        // Nothing leaves while the server is down (the writer's own background drains fail).
        let down = await writer.drain()
        XCTAssertEqual(down.left, 2)
        XCTAssertEqual(try writer.outbox.pending(), pending)
        try Self.server!.start()
        // Drained once the server is back: the condition waited on (a background drain may hold the outbox meanwhile).
        try await drained(writer)
        let runs = try await s.runs(labs: ["lab-study"]).map(\.runId)
        XCTAssertEqual(runs, ["s1-r0"])
        // Sent again (a crash after the COMMIT, before the unlink): no second study, no extra rows.
        try writer.outbox.enqueue(try study("s1", lab: "lab-study"))
        try await drained(writer)
        let studies = try await s.studies(labs: ["lab-study"])
        XCTAssertEqual(studies.count, 1)
        var expected = try study("s1", lab: "lab-study")
        expected.id = studies.first?.id
        XCTAssertEqual(studies.first, expected, "name, levels, runs and effects (intervals and verdicts) as recorded, hostile level name verbatim")
        let runRows = try await count(db, "SELECT count(*) FROM lab_study_run")
        let effectRows = try await count(db, "SELECT count(*) FROM lab_study_effect")
        XCTAssertEqual([runRows, effectRows], [4, 2])
        let complete = try await count(db, "SELECT runs_complete FROM lab_study")
        XCTAssertEqual(complete, 3)
        // A study holding a NUL is refused before any SQL, naming the field.
        var bad = try study("s2", lab: "lab-study")
        bad.runs[1].level = "x\u{0}"
        XCTAssertThrowsError(try writer.outbox.enqueue(bad)) { XCTAssertTrue("\($0)".contains("run level: holds a NUL"), "\($0)") }
        // The coordinator role may insert studies but not delete them.
        let c = try await PostgresConnection.connect(configuration: .init(host: "127.0.0.1", port: Self.server!.port, username: "lab_coordinator",
                                                                          password: Self.coordinatorPassword, database: db, tls: .disable), id: 4, logger: logger)
        do { try await c.query("DELETE FROM lab_study", logger: logger); XCTFail("coordinator deleted a study") } catch {
            XCTAssertEqual(SharedResultsStore.sqlState(error), "42501")
        }
        try await c.close()
        await s.close()
    }

    func testAComparisonOutcomeBecomesEffectsWithIntervalsAndVerdicts() throws {
        let json = """
            {"factor": "f", "baseline": "a", "levels": [], "sameSettings": {}, "checkPassed": true, "check": [], "baselineCI95": {}, "method": "m",
             "pairing": "unpaired", "effects": [{"metric": "detection", "label": "Detection", "factor": "f", "baseline": "a", "level": "b",
             "baselineEstimate": 1, "estimate": 2, "delta": 1, "ci95": [0.25, 1.75], "p": 0.04, "pAdjusted": 0.08, "verdict": "inconclusive"}]}
            """
        let o = try JSONDecoder().decode(Comparison.Outcome.self, from: Data(json.utf8))
        let s = try SharedStudy(lab: "l", studyId: "id", name: "n", plan: "p", levels: ["a", "b"], design: "unpaired", runs: [], outcome: o, compareJSON: "{}")
        XCTAssertEqual(s.effects, [SharedStudy.Effect(metric: "detection", level: "b", baseline: "a", baselineEstimate: 1, estimate: 2, delta: 1, ciLow: 0.25,
                                                      ciHigh: 1.75, p: 0.04, pAdjusted: 0.08, verdict: "inconclusive")])
        XCTAssertEqual([s.factor, s.baseline], ["f", "a"])
    }

    func testPruneKeepsNDaysPerLabAndSummariesThatTrendsStillDraws() async throws {
        let db = try await newDatabase()
        let base = try baseResult()
        let now = Date(timeIntervalSince1970: 1_800_000_000) // 2027-01-15 08:00 UTC
        let day = 86_400.0
        // Two labs, one run a night for 10 nights (the 3rd of each lab's nights an infra run), plus a study 10 nights old.
        var runs = [SharedRun]()
        for lab in ["north", "south"] {
            for k in 0..<10 {
                var r = variant(base, "\(lab)-\(k)")
                if k == 2 { r.input.infrastructure = ["node beta: state partial"] }
                var row = try SharedRun(r, lab: lab, at: now.addingTimeInterval(-Double(k) * day))
                row.detectionPct = Double(50 + k)
                runs.append(row)
            }
        }
        let coordinator = try await store(db)
        let loaded = try await coordinator.recordBatch(runs)
        XCTAssertEqual(loaded, 20)
        let reloaded = try await coordinator.recordBatch(runs)
        XCTAssertEqual(reloaded, 0, "a batch sent again adds nothing")
        try await coordinator.record(try study("old", lab: "north", at: now.addingTimeInterval(-10 * day)))
        try await coordinator.record(try study("new", lab: "north", at: now))
        let plan = runs[0].plan
        let before = try await coordinator.nightlySeries(plan: plan, labs: ["north"], since: now.addingTimeInterval(-30 * day))
        XCTAssertEqual(before.count, 10)
        XCTAssertTrue(before.allSatisfy { !$0.summarised && $0.runs == 1 })
        // Coordinators cannot prune.
        do { _ = try await coordinator.prune(keepDays: 3, summaryDays: 5, lab: "north", now: now); XCTFail("coordinator pruned") } catch let e as ResultsStoreError {
            XCTAssertTrue(e.description.contains("42501"), e.description)
        }
        let op = try await store(db, role: "lab_operator", password: Self.operatorPassword)
        // Range checks, naming the flag, before any SQL.
        for (keep, summary, flag) in [(0, 10, "--keep-days"), (36_501, 36_501, "--keep-days"), (5, 4, "--summary-days"), (5, 36_501, "--summary-days")] {
            do { _ = try await op.prune(keepDays: keep, summaryDays: summary, lab: nil, now: now); XCTFail("\(keep) \(summary) accepted") } catch let e as ResultsStoreError {
                XCTAssertTrue(e.description.contains(flag), e.description)
            }
        }
        // North: keep the runs of 3 nights (today and 3 before: k 0...3), summaries of 8.
        let p = try await op.prune(keepDays: 3, summaryDays: 8, lab: "north", now: now)
        XCTAssertEqual(p.runsDeleted, 6)
        XCTAssertEqual(p.nightsSummarised, 6)
        XCTAssertEqual(p.summariesDeleted, 1, "the night 9 ago is older than the 8 kept")
        XCTAssertEqual(p.studiesDeleted, 1)
        let northRuns = try await op.runs(labs: ["north"]).map(\.runId).sorted()
        XCTAssertEqual(northRuns, (0...3).map { "north-\($0)" })
        let southRuns = try await op.count(lab: "south")
        XCTAssertEqual(southRuns, 10, "another lab's runs are untouched")
        let studies = try await op.studies(labs: ["north"]).map(\.studyId)
        XCTAssertEqual(studies, ["new"])
        let orphans = try await count(db, "SELECT count(*) FROM lab_study_run WHERE study NOT IN (SELECT id FROM lab_study)")
        XCTAssertEqual(orphans, 0)
        // Trends' series: 4 nights from runs, 5 from summaries (nights 4 to 8 ago), the same
        // figures (the infra run's night has no mean: its one run had infrastructure faults).
        let after = try await op.nightlySeries(plan: plan, labs: ["north"], since: now.addingTimeInterval(-30 * day))
        XCTAssertEqual(after.count, 9)
        XCTAssertEqual(after.filter(\.summarised).count, 5)
        XCTAssertEqual(after.map(\.detectionPct), (0...8).reversed().map { $0 == 2 ? nil : Double(50 + $0) })
        XCTAssertEqual(after.map(\.night), Array(before.suffix(9).map(\.night)))
        // A run of a pruned night that landed late (an outbox drained after days) merges into its summary.
        var late = try SharedRun(variant(base, "north-late"), lab: "north", at: now.addingTimeInterval(-5 * day + 60))
        late.detectionPct = 65
        try await coordinator.record(late)
        let merged = try await op.prune(keepDays: 3, summaryDays: 8, lab: "north", now: now)
        XCTAssertEqual([merged.runsDeleted, merged.nightsSummarised, merged.summariesDeleted], [1, 1, 0])
        let night5 = try await op.nightlySeries(plan: plan, labs: ["north"], since: now.addingTimeInterval(-30 * day)).filter { $0.runs == 2 }
        XCTAssertEqual(night5.count, 1)
        XCTAssertEqual(night5.first?.detectionPct, 60, "(55 + 65) / 2")
        // The infra night (2 ago) is kept as runs; once pruned, its summary has no means but counts the run.
        _ = try await op.prune(keepDays: 1, summaryDays: 8, lab: nil, now: now)
        let infraNight = try await op.nightlySeries(plan: plan, labs: ["north", "south"], since: now.addingTimeInterval(-30 * day)).filter { $0.infra == 1 }
        XCTAssertEqual(infraNight.count, 2)
        XCTAssertTrue(infraNight.allSatisfy { $0.summarised && $0.detectionPct == nil && $0.runs == 1 })
        await op.close()
        await coordinator.close()
    }

    /// An upgrade: a store at schema version 1 holding a run (as the first release left it) is
    /// brought to the current version by the owner in place; the run is still there, and the new
    /// tables and indexes work with it.
    func testAStoreAtVersionOneWithRowsIsUpgradedInPlace() async throws {
        let db = try await newDatabase(migrate: false)
        try await Self.admin("CREATE TABLE schema_version (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())", database: db, logger: logger)
        for sql in SharedResultsStore.migrations[0].statements { try await Self.admin(sql, database: db, logger: logger) }
        try await Self.admin("INSERT INTO schema_version (version, name) VALUES (1, 'runs and alerts')", database: db, logger: logger)
        try await Self.admin("""
            INSERT INTO lab_run (lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, recorded_at, created_at, seed,
                devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total, checks_failed, failed_checks, infra, summary_json)
            VALUES ('old-lab', 'r1', '/srv/r1', '/srv/r1', 'bench', 'smoke', '', 'k', '', '', now() - interval '100 days', '', '1', 2, 99.5, 98, 97, 1, true, 'pass',
                4, 0, '', '', '{}')
            """, database: db, logger: logger)
        for table in ["schema_version", "lab_run", "lab_alert"] { try await Self.admin("ALTER TABLE \(table) OWNER TO results_owner", database: db, logger: logger) }
        // The first release's grants.
        for grant in ["GRANT SELECT ON schema_version, lab_run, lab_alert TO lab_coordinator, lab_operator",
                      "GRANT INSERT ON lab_run, lab_alert TO lab_coordinator, lab_operator", "GRANT UPDATE ON lab_run, lab_alert TO lab_operator"] {
            try await Self.admin(grant, database: db, logger: logger)
        }
        // A coordinator cannot upgrade it, and says so.
        do { try await store(db).open(); XCTFail("a coordinator migrated") } catch let e as ResultsStoreError {
            guard case .needsMigration(1, SharedResultsStore.schemaVersion, _) = e else { return XCTFail("\(e)") }
        }
        let owner = try await store(db, role: "results_owner", password: Self.ownerPassword)
        try await owner.open()
        let version = try await owner.schemaVersionInDatabase()
        XCTAssertEqual(version, SharedResultsStore.schemaVersion)
        await owner.close()
        for grant in SharedResultsStore.grantStatements(coordinator: "lab_coordinator", operator: "lab_operator") { try await Self.admin(grant, database: db, logger: logger) }
        let versions = try await count(db, "SELECT count(*) FROM schema_version")
        XCTAssertEqual(versions, SharedResultsStore.migrations.count)
        let op = try await store(db, role: "lab_operator", password: Self.operatorPassword)
        let kept = try await op.runs(labs: ["old-lab"]).map(\.runId)
        XCTAssertEqual(kept, ["r1"])
        let pruned = try await op.prune(keepDays: 30, summaryDays: 365, lab: "old-lab")
        XCTAssertEqual([pruned.runsDeleted, pruned.nightsSummarised], [1, 1])
        let nights = try await op.nightlySeries(plan: "smoke", labs: ["old-lab"], since: Date().addingTimeInterval(-200 * 86_400))
        XCTAssertEqual(nights.map(\.detectionPct), [99.5])
        await op.close()
    }
}
