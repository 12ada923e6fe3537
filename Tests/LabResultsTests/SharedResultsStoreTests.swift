import Foundation
import HeraldAnalysis
import LabHistory
import LabNet
import LabNode
import LabPlan
import Logging
import PostgresNIO
import XCTest
@testable import LabResults

/// The shared results store against a real PostgreSQL the test starts (issue 41; the tier
/// `make test-results-server`): migrations once and under a lock, a newer schema refused, three
/// writers of 200 runs each with retries (nothing lost, duplicated or torn), PostgreSQL stopped
/// mid-run (the writes wait in the fsynced outbox and land once when it is back), hostile names
/// stored verbatim, and the least-privilege roles. Skipped only when PostgreSQL's server
/// binaries are absent.
final class SharedResultsStoreTests: XCTestCase {
    nonisolated(unsafe) static var server: PostgresServer?
    nonisolated(unsafe) static var databases = 0
    nonisolated(unsafe) static var base: AnalysisResult?
    static let coordinatorPassword = "coord-\(UUID().uuidString)"
    static let operatorPassword = "oper-\(UUID().uuidString)"
    static let ownerPassword = "owner-\(UUID().uuidString)"
    let logger = Logger(label: "test.results")
    var tmp: URL!

    override func setUpWithError() throws {
        tmp = FileManager.default.temporaryDirectory.appendingPathComponent("results-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
    }

    /// The server, started (and its roles created) by the first test that needs it.
    func startServer() async throws {
        guard Self.server == nil else { return }
        Self.server = try PostgresServer()
        for (role, password) in [("results_owner", Self.ownerPassword), ("lab_coordinator", Self.coordinatorPassword), ("lab_operator", Self.operatorPassword)] {
            try await Self.admin("CREATE ROLE \(role) LOGIN PASSWORD '\(password)'", logger: logger)
        }
    }

    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    override class func tearDown() {
        server?.destroy()
        server = nil
        super.tearDown()
    }

    static func admin(_ sql: String, database: String = "postgres", logger: Logger) async throws {
        let c = try await PostgresConnection.connect(configuration: .init(unixSocketPath: server!.socketPath, username: PostgresServer.superuser, password: nil, database: database),
                                                     id: 1, logger: logger)
        do { try await c.query(PostgresQuery(unsafeSQL: sql), logger: logger) } catch {
            try? await c.close()
            throw error
        }
        try await c.close()
    }

    /// A new database owned by results_owner, migrated by the owner, with the two roles' grants.
    func newDatabase(migrate: Bool = true) async throws -> String {
        try await startServer()
        Self.databases += 1
        let name = "results_\(Self.databases)"
        try await Self.admin("CREATE DATABASE \(name) OWNER results_owner", logger: logger)
        if migrate {
            let owner = try await store(name, role: "results_owner", password: Self.ownerPassword)
            try await owner.open()
            await owner.close()
            for grant in SharedResultsStore.grantStatements(coordinator: "lab_coordinator", operator: "lab_operator") {
                try await Self.admin(grant, database: name, logger: logger)
            }
        }
        return name
    }

    /// A store over TCP with the role's password read from a 0600 file.
    func store(_ database: String, role: String = "lab_coordinator", password: String? = nil) async throws -> SharedResultsStore {
        try Self.makeStore(database, role: role, password: password, dir: tmp, logger: logger)
    }

    static func makeStore(_ database: String, role: String = "lab_coordinator", password: String? = nil, dir tmp: URL, logger: Logger) throws -> SharedResultsStore {
        let file = tmp.appendingPathComponent("\(role)-\(UUID().uuidString).pw")
        _ = FileManager.default.createFile(atPath: file.path, contents: Data("\(password ?? Self.coordinatorPassword)\n".utf8), attributes: [.posixPermissions: 0o600])
        let location = try ResultsLocation.parse("postgres://\(role)@127.0.0.1:\(Self.server!.port)/\(database)")
        return try SharedResultsStore(location: location, password: try ResultsLocation.readPassword(file: file.path), logger: logger)
    }

    /// One simulated smoke run, analysed once per test process.
    func baseResult() throws -> AnalysisResult {
        if let b = Self.base { return b }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let out = tmp.appendingPathComponent("base")
        _ = try Simulation(plan: try Plan.load(path: root.appendingPathComponent("plans/smoke.yaml").path), planText: "", seed: 1, output: out).run()
        let r = try Analyser.analyse(out).result
        Self.base = r
        return r
    }

    func variant(_ base: AnalysisResult, _ id: String) -> AnalysisResult {
        var r = base
        r.input.runId = id
        r.input.path = "/srv/results/\(id)"
        return r
    }

    func count(_ database: String, _ sql: String) async throws -> Int {
        let c = try await PostgresConnection.connect(configuration: .init(unixSocketPath: Self.server!.socketPath, username: PostgresServer.superuser, password: nil, database: database),
                                                     id: 2, logger: logger)
        var n: Int64 = -1
        do {
            for try await (x) in try await c.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(Int64.self) { n = x }
        } catch {
            try? await c.close()
            throw error
        }
        try await c.close()
        return Int(n)
    }

    // MARK: Schema

    func testMigrationsAreAppliedOnceUnderALockAndAgainAreNoOps() async throws {
        let db = try await newDatabase(migrate: false)
        // The coordinator role cannot create the schema: said, naming what to do.
        do {
            let c = try await store(db)
            try await c.open()
            XCTFail("the coordinator role migrated")
        } catch let e as ResultsStoreError {
            guard case .needsMigration(0, SharedResultsStore.schemaVersion, _) = e else { return XCTFail("\(e)") }
            XCTAssertTrue(e.description.contains("owner role"), e.description)
        }
        // Three owners at once: one migrates, the others find it done.
        let tmp = self.tmp!, logger = self.logger
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<3 {
                group.addTask {
                    let s = try Self.makeStore(db, role: "results_owner", password: Self.ownerPassword, dir: tmp, logger: logger)
                    try await s.open()
                    await s.close()
                }
            }
            try await group.waitForAll()
        }
        let again = try await store(db, role: "results_owner", password: Self.ownerPassword)
        try await again.open()
        let version = try await again.schemaVersionInDatabase()
        XCTAssertEqual(version, SharedResultsStore.schemaVersion)
        await again.close()
        let rows = try await count(db, "SELECT count(*) FROM schema_version")
        XCTAssertEqual(rows, SharedResultsStore.migrations.count, "each migration recorded once")
        let tables = try await count(db, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('lab_run', 'lab_alert', 'schema_version')")
        XCTAssertEqual(tables, 3)
    }

    func testANewerSchemaIsRefusedAndLeftAlone() async throws {
        let db = try await newDatabase()
        try await Self.admin("INSERT INTO schema_version (version, name) VALUES (\(SharedResultsStore.schemaVersion + 7), 'from a newer herald-lab')", database: db, logger: logger)
        for role in [("results_owner", Self.ownerPassword), ("lab_coordinator", Self.coordinatorPassword)] {
            let s = try await store(db, role: role.0, password: role.1)
            do {
                try await s.open()
                XCTFail("\(role.0): a newer schema was accepted")
            } catch let e as ResultsStoreError {
                XCTAssertEqual(e, .newerSchema(database: SharedResultsStore.schemaVersion + 7, code: SharedResultsStore.schemaVersion))
                XCTAssertTrue(e.description.contains("newer than this herald-lab's"), e.description)
            }
            // Writes are refused too (the schema check comes first).
            do {
                try await s.record(try SharedRun(variant(try baseResult(), "r1"), lab: "a"))
                XCTFail("written against a newer schema")
            } catch let e as ResultsStoreError { XCTAssertEqual(e, .newerSchema(database: SharedResultsStore.schemaVersion + 7, code: SharedResultsStore.schemaVersion)) }
        }
        let rows = try await count(db, "SELECT count(*) FROM schema_version")
        XCTAssertEqual(rows, SharedResultsStore.migrations.count + 1, "nothing changed")
    }

    // MARK: Many writers

    func testThreeCoordinatorsWritingTwoHundredRunsEachLoseAndDuplicateNothing() async throws {
        let db = try await newDatabase()
        let base = try baseResult()
        let labs = ["lab-a", "lab-b", "lab-c"]
        // Each coordinator's 200 rows, built before the clock starts.
        var rows = [[SharedRun]]()
        for lab in labs {
            rows.append(try (0..<200).map { k in
                var r = variant(base, "run-\(k)")
                if k % 10 == 9 { r.input.infrastructure = ["node beta: state partial"] }
                return try SharedRun(r, lab: lab, bundleURL: "https://\(lab).example/results/run-\(k).tar.gz", at: Date(timeIntervalSince1970: 1_800_000_000 + Double(k)))
            })
        }
        let shared = try (0..<10).map { k in try SharedRun(variant(base, "shared-\(k)"), lab: "lab-shared", at: Date(timeIntervalSince1970: 1_800_000_000)) }
        let started = Date()
        let outcomes = try await withThrowingTaskGroup(of: [SharedResultsStore.Recorded].self) { group in
            for w in 0..<3 {
                let mine = rows[w]
                let s = try await store(db)
                group.addTask {
                    var out = [SharedResultsStore.Recorded]()
                    for (k, run) in mine.enumerated() {
                        out.append(try await s.record(run))
                        // A retry of a write that landed (a coordinator that crashed before removing its outbox file).
                        if k % 20 == 0 { out.append(try await s.record(run)) }
                        // Every coordinator writes the same runs of one lab at once: the store keeps each once.
                        if k % 20 == 5 { out.append(try await s.record(shared[k / 20])) }
                    }
                    await s.close()
                    return out
                }
            }
            var all = [SharedResultsStore.Recorded]()
            for try await o in group { all += o }
            return all
        }
        let seconds = Date().timeIntervalSince(started)
        print("results store: 3 writers x 200 runs (+30 retries, +30 contended) in \(String(format: "%.2f", seconds)) s, \(String(format: "%.0f", 660 / seconds)) writes/s")
        let inserted = outcomes.filter { if case .inserted = $0 { return true } else { return false } }.count
        XCTAssertEqual(inserted, 610, "600 runs and 10 shared runs inserted once each")
        XCTAssertEqual(outcomes.count - inserted, 50, "30 retries and 20 contended writes found their row")
        let total = try await count(db, "SELECT count(*) FROM lab_run")
        XCTAssertEqual(total, 610)
        let distinct = try await count(db, "SELECT count(DISTINCT (lab, run_id)) FROM lab_run")
        XCTAssertEqual(distinct, 610, "no duplicates")

        let reader = try await store(db)
        let all = try await reader.runs()
        XCTAssertEqual(all.count, 610)
        for lab in labs {
            let mine = all.filter { $0.lab == lab }
            XCTAssertEqual(Set(mine.map(\.runId)), Set((0..<200).map { "run-\($0)" }), lab)
        }
        // Nothing torn: every row is the one written, its summary whole.
        let written = Dictionary(uniqueKeysWithValues: (rows.flatMap { $0 } + shared).map { ("\($0.lab)\u{1F}\($0.runId)", $0) })
        for row in all {
            var expected = written["\(row.lab)\u{1F}\(row.runId)"]
            XCTAssertNotNil(expected)
            expected?.id = row.id
            XCTAssertEqual(row, expected, "\(row.lab) \(row.runId)")
            let summary = try row.summary()
            XCTAssertEqual(summary.input.runId, row.runId)
            XCTAssertEqual(summary.strict.continuitypct, row.continuityPct)
        }
        // Reading across labs, and per lab and testbed.
        let ab = try await reader.runs(labs: ["lab-a", "lab-b"])
        XCTAssertEqual(ab.count, 400)
        let lastA = try await reader.runs(labs: ["lab-a"], plan: "smoke", last: 5)
        XCTAssertEqual(lastA.map(\.runId), (195..<200).map { "run-\($0)" })
        let baseline = try await reader.baseline(like: variant(base, "run-150"), lab: "lab-b", last: 5)
        XCTAssertEqual(baseline.map(\.runId), ["run-144", "run-145", "run-146", "run-147", "run-148"], "lab-b's, before run-150, none with infra faults")
        XCTAssertTrue(baseline.allSatisfy { $0.lab == "lab-b" })
        let rates = try await reader.infraRates(lab: "lab-c", last: 100)
        XCTAssertEqual(rates, [HistoryStore.InfraRate(testbed: "sim", runs: 100, infra: 10)])
        let everyLab = try await reader.infraRates(lab: nil)
        XCTAssertEqual(everyLab.map(\.testbed), ["lab-a/sim", "lab-b/sim", "lab-c/sim", "lab-shared/sim"])
        await reader.close()
    }

    // MARK: The outbox

    func testPostgreSQLStoppedMidRunQueuesDurablyAndLandsOnceWhenBack() async throws {
        let db = try await newDatabase()
        let base = try baseResult()
        let outbox = try ResultsOutbox(directory: ResultsOutbox.beside(results: tmp))
        let store = try await store(db)
        // One run lands while the server is up.
        let first = try await outbox.record(try SharedRun(variant(base, "before"), lab: "lab-down"), into: store)
        XCTAssertEqual(first, ResultsOutbox.Drained(sent: 1, left: 0, rejected: 0, failure: nil))

        try Self.server!.stop()
        var queued = [String]()
        for k in 0..<5 {
            let d = try await outbox.record(try SharedRun(variant(base, "down-\(k)"), lab: "lab-down"), into: store)
            XCTAssertEqual(d.sent, 0)
            XCTAssertEqual(d.left, k + 1)
            XCTAssertNotNil(d.failure)
            queued.append("down-\(k)")
        }
        let pending = try outbox.pending()
        XCTAssertEqual(pending.count, 5)
        for url in pending {
            let attributes = try FileManager.default.attributesOfItem(atPath: url.path)
            XCTAssertEqual((attributes[.posixPermissions] as? NSNumber)?.intValue, 0o600)
            let run = try SharedRun.decoder().decode(SharedRun.self, from: Data(contentsOf: url))
            XCTAssertEqual(run.lab, "lab-down")
        }
        XCTAssertEqual(try pending.map { try SharedRun.decoder().decode(SharedRun.self, from: Data(contentsOf: $0)).runId }, queued, "kept in order")
        XCTAssertFalse(try FileManager.default.contentsOfDirectory(atPath: outbox.directory.path).contains { $0.hasSuffix(".tmp") }, "no temporary file left")

        try Self.server!.start()
        let drained = await outbox.drain(into: store)
        XCTAssertEqual(drained, ResultsOutbox.Drained(sent: 5, left: 0, rejected: 0, failure: nil))
        XCTAssertEqual(try outbox.pending(), [])
        let landed = try await store.runs(labs: ["lab-down"])
        XCTAssertEqual(landed.map(\.runId), ["before"] + queued, "each once, in order")
        // A coordinator that crashed after the COMMIT but before removing the file sends it again: no second row.
        try outbox.enqueue(try SharedRun(variant(base, "down-2"), lab: "lab-down"))
        let again = await outbox.drain(into: store)
        XCTAssertEqual(again.sent, 1)
        let total = try await store.count(lab: "lab-down")
        XCTAssertEqual(total, 6)
        // An entry that cannot be read is set aside, not retried forever nor blocking the rest.
        try Data("{torn".utf8).write(to: outbox.directory.appendingPathComponent("0000000000000000-00000000-000000.json"))
        try outbox.enqueue(try SharedRun(variant(base, "after"), lab: "lab-down"))
        let mixed = await outbox.drain(into: store)
        XCTAssertEqual(mixed, ResultsOutbox.Drained(sent: 1, left: 0, rejected: 1, failure: nil))
        XCTAssertTrue(FileManager.default.fileExists(atPath: outbox.directory.appendingPathComponent("rejected/0000000000000000-00000000-000000.json").path))
        // A row the server refuses for its data (here a constraint an operator added) is set aside too; the next lands.
        try await Self.admin("ALTER TABLE lab_run ADD CONSTRAINT no_evil CHECK (run_id <> 'evil')", database: db, logger: logger)
        try outbox.enqueue(try SharedRun(variant(base, "evil"), lab: "lab-down"))
        try outbox.enqueue(try SharedRun(variant(base, "good"), lab: "lab-down"))
        let refused = await outbox.drain(into: store)
        XCTAssertEqual(refused, ResultsOutbox.Drained(sent: 1, left: 0, rejected: 1, failure: nil))
        let afterRefusal = try await store.runs(labs: ["lab-down"]).map(\.runId)
        XCTAssertEqual(afterRefusal.suffix(2), ["after", "good"])
        let why = try FileManager.default.contentsOfDirectory(atPath: outbox.directory.appendingPathComponent("rejected").path).filter { $0.hasSuffix(".why") }
        XCTAssertEqual(why.count, 2)
        await store.close()
    }

    /// The coordinator's writer: `record` only queues (the run's end never waits for the
    /// server), sends in the background, and its retry loop lands what waited once the server is back.
    func testTheCoordinatorsWriterQueuesWhileDownAndItsRetryLoopLandsTheRuns() async throws {
        let db = try await newDatabase()
        let base = try baseResult()
        let s = try await store(db)
        let writer = try SharedHistoryWriter(lab: "lab-writer", store: s, outbox: try ResultsOutbox(directory: tmp.appendingPathComponent("outbox")), logger: logger)
        XCTAssertThrowsError(try SharedHistoryWriter(lab: "", store: s, outbox: writer.outbox, logger: logger))
        try Self.server!.stop()
        for k in 0..<3 { try writer.record(variant(base, "w\(k)"), bundle: URL(fileURLWithPath: "/srv/results/w\(k)")) }
        XCTAssertEqual(try writer.outbox.pending().count, 3, "queued before record returned")
        let down = await writer.drain()
        XCTAssertEqual(down.left, 3, "a drain while the server is down (or while another is under way) keeps them")
        try Self.server!.start()
        let loop = Task { await writer.run(retryEvery: 1) }
        defer { loop.cancel() }
        let deadline = Date().addingTimeInterval(20)
        while try writer.outbox.pending().count > 0 && Date() < deadline { try await Task.sleep(nanoseconds: 100_000_000) }
        XCTAssertEqual(try writer.outbox.pending(), [])
        let rows = try await writer.store.runs(labs: ["lab-writer"])
        XCTAssertEqual(rows.map(\.runId), ["w0", "w1", "w2"])
        XCTAssertEqual(rows.first?.bundleURL, "/srv/results/w0")
        loop.cancel()
        await s.close()
    }

    // MARK: TLS

    func testTLSWhenTheURLAsksVerifiedAgainstTheCAFile() async throws {
        let db = try await newDatabase()
        let port = Self.server!.port, ca = Self.server!.caFile
        let pw = tmp.appendingPathComponent("tls.pw")
        _ = FileManager.default.createFile(atPath: pw.path, contents: Data(Self.coordinatorPassword.utf8), attributes: [.posixPermissions: 0o600])
        // verify-full against the server's CA, by the name its certificate carries.
        let full = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@localhost:\(port)/\(db)?sslmode=verify-full&sslrootcert=\(ca)", passwordFile: pw.path, logger: logger)
        let tls = try await full.sessionTLS()
        XCTAssertNotNil(tls, "the session is encrypted")
        XCTAssertTrue(tls?.hasPrefix("TLS") == true, tls ?? "")
        let settings = try await full.sessionSettings()
        XCTAssertEqual(settings, ["herald-lab", "1min"], "application_name and statement_timeout")
        try await full.record(try SharedRun(variant(try baseResult(), "over-tls"), lab: "tls-lab"))
        await full.close()
        // --history-ca-file alone asks for verify-full.
        let byFlag = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@localhost:\(port)/\(db)", passwordFile: pw.path, caFile: ca, logger: logger)
        let flagTLS = try await byFlag.sessionTLS()
        XCTAssertNotNil(flagTLS)
        await byFlag.close()
        // Without sslmode: plain, as asked.
        let plain = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@127.0.0.1:\(port)/\(db)", passwordFile: pw.path, logger: logger)
        let plainTLS = try await plain.sessionTLS()
        XCTAssertNil(plainTLS)
        await plain.close()
        // The certificate names localhost, not 127.0.0.1: verify-full refuses the address, verify-ca takes it.
        do {
            _ = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@127.0.0.1:\(port)/\(db)?sslmode=verify-full&sslrootcert=\(ca)", passwordFile: pw.path, logger: logger)
            XCTFail("verify-full took a certificate for another name")
        } catch let e as ResultsStoreError {
            XCTAssertFalse(e.description.contains(Self.coordinatorPassword))
        }
        let byCA = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@127.0.0.1:\(port)/\(db)?sslmode=verify-ca&sslrootcert=\(ca)", passwordFile: pw.path, logger: logger)
        await byCA.close()
        // Another CA: refused.
        let other = tmp.appendingPathComponent("other-ca.pem").path
        try LabCA.create(commonName: "another CA", days: 2, certificate: other, key: tmp.appendingPathComponent("other-ca.key").path)
        do {
            _ = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@localhost:\(port)/\(db)?sslmode=verify-full&sslrootcert=\(other)", passwordFile: pw.path, logger: logger)
            XCTFail("a certificate of another CA was taken")
        } catch let e as ResultsStoreError {
            guard case .database = e else { return XCTFail("\(e)") }
        }
        // A wrong password: refused at connect, named as a refusal (the coordinator stops at start), the password never in the error.
        let wrong = tmp.appendingPathComponent("wrong.pw")
        _ = FileManager.default.createFile(atPath: wrong.path, contents: Data("not-\(Self.coordinatorPassword)".utf8), attributes: [.posixPermissions: 0o600])
        do {
            _ = try await SharedResultsStore.connect(url: "postgres://lab_coordinator@localhost:\(port)/\(db)?sslmode=verify-full&sslrootcert=\(ca)", passwordFile: wrong.path, logger: logger)
            XCTFail("a wrong password was taken")
        } catch let e as ResultsStoreError {
            guard case .refused = e else { return XCTFail("\(e)") }
            XCTAssertTrue(e.description.contains("28P01"), e.description)
            XCTAssertFalse(e.description.contains(Self.coordinatorPassword))
        }
        let rows = try await count(db, "SELECT count(*) FROM lab_run")
        XCTAssertEqual(rows, 1)
    }

    // MARK: Hostile names and roles

    func testHostileLabPlanAndRunNamesAreStoredVerbatimAndTheRolesHoldTheirLimits() async throws {
        let db = try await newDatabase()
        var r = variant(try baseResult(), "run'); DELETE FROM lab_run; --")
        r.input.plan = "plan\" OR 1=1; DROP TABLE lab_alert; --"
        r.input.variant = "$1 $2 %s %n \\x27 \u{202E}evil"
        r.input.testbed = "bench\nwith newline\ttab · 试验台 🚀"
        let labs = ["lab'; DROP TABLE lab_run; --", "Лаборатория \"Ω\"", String(repeating: "ä", count: SharedRun.maximumLabName)]
        let s = try await store(db)
        for lab in labs { try await s.record(try SharedRun(r, lab: lab)) }
        let back = try await s.runs(labs: labs)
        XCTAssertEqual(back.map(\.lab), labs)
        for row in back {
            XCTAssertEqual(row.runId, r.input.runId)
            XCTAssertEqual(row.plan, r.input.plan)
            XCTAssertEqual(row.variant, r.input.variant)
            XCTAssertEqual(row.testbed, r.input.testbed)
        }
        let byPlan = try await s.runs(labs: [labs[0]], plan: r.input.plan)
        XCTAssertEqual(byPlan.count, 1)
        let alert = try await s.openAlert(lab: labs[0], like: r, row: back[0].id!, metrics: ["continuity'--"])
        let alerts = try await s.alerts(lab: labs[0], plan: r.input.plan!)
        XCTAssertEqual(alerts.map(\.id), [alert])
        XCTAssertEqual(alerts.first?.metrics, "continuity'--")
        XCTAssertEqual(alerts.first?.testbed, r.input.testbed)
        // Refused before any SQL: a NUL, an empty or overlong lab name.
        for bad in ["nul\u{0}lab", "", String(repeating: "x", count: SharedRun.maximumLabName + 1)] {
            XCTAssertThrowsError(try SharedRun(r, lab: bad)) { XCTAssertTrue("\($0)".contains("lab"), "\($0)") }
        }
        var nul = try SharedRun(r, lab: "ok")
        nul.plan = "p\u{0}"
        do { try await s.record(nul); XCTFail("a NUL was stored") } catch let e as ResultsStoreError { XCTAssertTrue(e.description.contains("plan: holds a NUL"), e.description) }
        let tables = try await count(db, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('lab_run', 'lab_alert', 'schema_version')")
        XCTAssertEqual(tables, 3, "every table still there")

        // The coordinator role inserts and reads; it neither replaces, deletes, accepts nor changes the schema.
        do { try await s.record(try SharedRun(r, lab: labs[0]), replace: true); XCTFail("coordinator replaced a row") } catch let e as ResultsStoreError {
            XCTAssertTrue(e.description.contains("42501"), e.description)
        }
        do { _ = try await s.accept(lab: labs[0], plan: r.input.plan!, variant: nil, testbed: nil, by: "coordinator", reason: "no"); XCTFail("coordinator accepted") } catch let e as ResultsStoreError {
            XCTAssertTrue(e.description.contains("42501"), e.description)
        }
        let coordinator = try await PostgresConnection.connect(configuration: .init(host: "127.0.0.1", port: Self.server!.port, username: "lab_coordinator",
                                                                                    password: Self.coordinatorPassword, database: db, tls: .disable), id: 3, logger: logger)
        for sql in ["DELETE FROM lab_run", "DROP TABLE lab_run", "UPDATE schema_version SET version = 99", "TRUNCATE lab_alert"] {
            do { try await coordinator.query(PostgresQuery(unsafeSQL: sql), logger: logger); XCTFail("coordinator ran \(sql)") } catch {
                XCTAssertNotNil(SharedResultsStore.sqlState(error), "\(sql): \(SharedResultsStore.describe(error))")
            }
        }
        try await coordinator.close()
        // The operator accepts and replaces (and prunes: SharedResultsStoreTests+Retention).
        let op = try await store(db, role: "lab_operator", password: Self.operatorPassword)
        let accepted = try await op.accept(lab: labs[0], plan: r.input.plan!, variant: nil, testbed: nil, by: "ops@lab", reason: "new firmware")
        XCTAssertEqual(accepted, 1)
        let replaced = try await op.record(try SharedRun(r, lab: labs[0]), replace: true)
        XCTAssertEqual(replaced, .replaced(back[0].id!))
        await op.close()
        await s.close()
        let rows = try await count(db, "SELECT count(*) FROM lab_run")
        XCTAssertEqual(rows, 3)
    }
}
