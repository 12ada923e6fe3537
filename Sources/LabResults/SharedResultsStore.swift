import Foundation
import HeraldAnalysis
import LabHistory
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO

/// The results store many labs share, on PostgreSQL through postgres-nio (issue 41). One
/// connection per store, opened when first needed and opened again after a failure; the schema
/// is migrated (or refused when newer) on every first connection. Every value travels as a bound
/// parameter; SQL text is only this file's constants.
public actor SharedResultsStore {
    /// The schema this code reads and writes; `migrations` bring a database up to it.
    public static var schemaVersion: Int { migrations.last!.version }

    struct Migration: Sendable {
        var version: Int
        var name: String
        var statements: [String]
    }

    /// Versioned, in order, never edited once released: a change is a new migration.
    static let migrations: [Migration] = [
        Migration(version: 1, name: "runs and alerts", statements: [
            """
            CREATE TABLE lab_run (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                lab text NOT NULL, run_id text NOT NULL, path text NOT NULL, bundle_url text NOT NULL,
                testbed text NOT NULL, plan text NOT NULL, variant text NOT NULL, settings_key text NOT NULL,
                firmware text NOT NULL, dongle_make text NOT NULL,
                recorded_at timestamptz NOT NULL, created_at text NOT NULL, seed text NOT NULL,
                devices bigint NOT NULL, detection_pct double precision NOT NULL, continuity_pct double precision NOT NULL,
                herald_continuity_pct double precision NOT NULL, longevity double precision NOT NULL,
                passed boolean NOT NULL, verdict text NOT NULL, checks_total bigint NOT NULL, checks_failed bigint NOT NULL,
                failed_checks text NOT NULL, infra text NOT NULL, summary_json text NOT NULL,
                UNIQUE (lab, run_id)
            )
            """,
            "CREATE INDEX lab_run_like ON lab_run (lab, plan, variant, testbed, settings_key, id)",
            "CREATE INDEX lab_run_testbed ON lab_run (lab, testbed, id)",
            """
            CREATE TABLE lab_alert (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                lab text NOT NULL, plan text NOT NULL, variant text NOT NULL, settings_key text NOT NULL, testbed text NOT NULL,
                state text NOT NULL CHECK (state IN ('regressed', 'returned', 'accepted')),
                opened_at timestamptz NOT NULL, opened_run text NOT NULL, opened_row bigint NOT NULL, metrics text NOT NULL,
                closed_at timestamptz, closed_row bigint, closed_by text, reason text
            )
            """,
            "CREATE INDEX lab_alert_key ON lab_alert (lab, plan, variant, testbed, state)",
        ]),
        // Per study its runs and effects (SharedResultsStore+Studies).
        Migration(version: 2, name: "studies", statements: [
            """
            CREATE TABLE lab_study (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                lab text NOT NULL, study_id text NOT NULL, name text NOT NULL, plan text NOT NULL, factor text NOT NULL,
                baseline text NOT NULL, levels text[] NOT NULL, design text NOT NULL, recorded_at timestamptz NOT NULL,
                runs_total bigint NOT NULL, runs_complete bigint NOT NULL, check_passed boolean NOT NULL, compare_json text NOT NULL,
                UNIQUE (lab, study_id)
            )
            """,
            "CREATE INDEX lab_study_recorded ON lab_study (lab, recorded_at)",
            """
            CREATE TABLE lab_study_run (
                study bigint NOT NULL REFERENCES lab_study (id) ON DELETE CASCADE,
                k bigint NOT NULL, block bigint NOT NULL, level text NOT NULL, seed text NOT NULL, folder text NOT NULL,
                run_id text NOT NULL, state text NOT NULL,
                PRIMARY KEY (study, k)
            )
            """,
            """
            CREATE TABLE lab_study_effect (
                study bigint NOT NULL REFERENCES lab_study (id) ON DELETE CASCADE,
                k bigint NOT NULL, metric text NOT NULL, level text NOT NULL, baseline text NOT NULL,
                baseline_estimate double precision, estimate double precision, delta double precision,
                ci_low double precision, ci_high double precision, p double precision, p_adjusted double precision,
                verdict text NOT NULL,
                PRIMARY KEY (study, k)
            )
            """,
        ]),
        // Retention (SharedResultsStore+Retention): per-night summaries that outlive their runs,
        // and the indexes the Trends series and the pruning read by time.
        Migration(version: 3, name: "nightly summaries and time indexes", statements: [
            """
            CREATE TABLE lab_night (
                lab text NOT NULL, plan text NOT NULL, variant text NOT NULL, testbed text NOT NULL, settings_key text NOT NULL,
                night date NOT NULL, runs bigint NOT NULL, passed bigint NOT NULL, infra bigint NOT NULL, clean bigint NOT NULL,
                detection_pct double precision, continuity_pct double precision, herald_continuity_pct double precision,
                longevity double precision, detection_min double precision, continuity_min double precision,
                PRIMARY KEY (lab, plan, variant, testbed, settings_key, night)
            )
            """,
            "CREATE INDEX lab_night_plan ON lab_night (plan, night)",
            "CREATE INDEX lab_run_plan_time ON lab_run (plan, recorded_at)",
            "CREATE INDEX lab_run_lab_time ON lab_run (lab, recorded_at)",
        ]),
    ]

    static let quiet = Logger(label: "herald-lab.results.postgres", factory: { _ in SwiftLogNoOpLogHandler() })

    /// The advisory lock migrations hold (one migrator at a time across every lab).
    static let migrationLock: Int64 = 0x4865_7261_6C64_4C62 // "HeraldLb"

    public nonisolated let location: ResultsLocation
    private let configuration: PostgresConnection.Configuration
    private let logger: Logger
    private var connection: PostgresConnection?
    private var connections = 0
    private var checkedSchema = false

    /// A store at `location` (no I/O until the first call). `password`: read from a file by the
    /// caller (ResultsLocation.readPassword), never from the command line.
    public init(location: ResultsLocation, password: String?, logger: Logger = Logger(label: "herald-lab.results")) throws {
        self.location = location
        self.logger = logger
        var config: PostgresConnection.Configuration
        if let dir = location.socketDirectory {
            config = .init(unixSocketPath: "\(dir)/.s.PGSQL.\(location.port)", username: location.user, password: password, database: location.database)
        } else {
            var tls = TLSConfiguration.makeClientConfiguration()
            switch location.tls {
            case .disable, .require: tls.certificateVerification = .none
            case .verifyCA: tls.certificateVerification = .noHostnameVerification
            case .verifyFull: tls.certificateVerification = .fullVerification
            }
            if let ca = location.caFile {
                guard FileManager.default.isReadableFile(atPath: ca) else { throw ResultsStoreError.badURL("CA file \(ca): cannot read it") }
                tls.trustRoots = .file(ca)
            }
            let mode: PostgresConnection.Configuration.TLS
            if location.tls == .disable { mode = .disable } else {
                do { mode = .require(try NIOSSLContext(configuration: tls)) } catch { throw ResultsStoreError.badURL("TLS: \(error)") }
            }
            config = .init(host: location.host!, port: location.port, username: location.user, password: password, database: location.database, tls: mode)
            if let host = location.host, !Self.isAddress(host) { config.options.tlsServerName = host }
        }
        config.options.connectTimeout = .seconds(10)
        // Named in pg_stat_activity; no statement holds a drain for ever (a dead network still can,
        // until TCP gives up: the runs wait in the outbox meanwhile).
        config.options.additionalStartupParameters = [("application_name", "herald-lab"), ("statement_timeout", "60000")]
        configuration = config
    }

    /// Opens the store at a URL: the password from `passwordFile` (mode 0600), `caFile` for TLS
    /// (verify-full, unless the URL says otherwise). Connects and migrates now, so a bad URL, a
    /// wrong password or a newer schema is said at start.
    public static func connect(url: String, passwordFile: String? = nil, caFile: String? = nil, logger: Logger = Logger(label: "herald-lab.results")) async throws -> SharedResultsStore {
        var location = try ResultsLocation.parse(url)
        if let caFile {
            location.caFile = caFile
            if location.tls == .disable { location.tls = .verifyFull }
        }
        let password = try passwordFile.map { try ResultsLocation.readPassword(file: $0) }
        let store = try SharedResultsStore(location: location, password: password, logger: logger)
        try await store.open()
        return store
    }

    static func isAddress(_ host: String) -> Bool {
        var v4 = in_addr(), v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// Connects (if not connected) and checks or migrates the schema.
    public func open() async throws { _ = try await connected() }

    public func close() async {
        if let c = connection { try? await c.close() }
        connection = nil
    }

    // MARK: Connection

    private func connected() async throws -> PostgresConnection {
        if let c = connection, !c.isClosed { return c }
        connection = nil
        connections += 1
        let c: PostgresConnection
        do {
            // postgres-nio's own logging stays off: its trace of the startup could carry the password.
            c = try await PostgresConnection.connect(configuration: configuration, id: connections, logger: Self.quiet)
        } catch {
            // The server answered and refused: this login or database (SQLSTATE class 28, 3D000).
            if let state = Self.sqlState(error), state.hasPrefix("28") || state == "3D000" {
                throw ResultsStoreError.refused("\(location): \(Self.describe(error))")
            }
            throw ResultsStoreError.database("cannot connect to \(location): \(Self.describe(error))")
        }
        if !checkedSchema {
            do { try await migrate(c) } catch {
                try? await c.close()
                throw error
            }
            checkedSchema = true
            logger.debug("results store \(location): schema version \(Self.schemaVersion)")
        }
        connection = c
        return c
    }

    /// Runs `body` on the connection; any failure drops the connection (the next call connects
    /// anew) and is said as a ResultsStoreError without the query's values.
    func using<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        let c = try await connected()
        do { return try await body(c) } catch {
            try? await c.close()
            connection = nil
            if let e = error as? ResultsStoreError { throw e }
            if let state = Self.sqlState(error), state.hasPrefix("22") || state.hasPrefix("23") { throw ResultsStoreError.rowRefused(Self.describe(error)) }
            throw ResultsStoreError.database(Self.describe(error))
        }
    }

    /// In one transaction; rolled back on any failure.
    func transaction<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await using { c in
            try await c.query("BEGIN", logger: Self.quiet)
            do {
                let v = try await body(c)
                try await c.query("COMMIT", logger: Self.quiet)
                return v
            } catch {
                _ = try? await c.query("ROLLBACK", logger: Self.quiet)
                throw error
            }
        }
    }

    /// What went wrong, as a person reads it: the server's SQLSTATE and message, or the
    /// connection's failure (postgres-nio's own description hides both).
    static func describe(_ error: Error) -> String {
        if let e = error as? ResultsStoreError { return e.description }
        if let p = error as? PSQLError {
            if let info = p.serverInfo {
                return "\(info[.message] ?? "error") (SQLSTATE \(info[.sqlState] ?? "?"))"
            }
            return "\(p.code)\(p.underlying.map { ": \($0)" } ?? "")"
        }
        return "\(error)"
    }

    static func sqlState(_ error: Error) -> String? { (error as? PSQLError)?.serverInfo?[.sqlState] }

    // MARK: Schema

    private func version(_ c: PostgresConnection) async throws -> Int {
        let exists = try await c.query("SELECT to_regclass('schema_version') IS NOT NULL", logger: Self.quiet)
        var has = false
        for try await (b) in exists.decode(Bool.self) { has = b }
        guard has else { return 0 }
        var v = 0
        for try await (x) in try await c.query("SELECT COALESCE(MAX(version), 0)::bigint FROM schema_version", logger: Self.quiet).decode(Int64.self) { v = Int(x) }
        return v
    }

    /// Applies the migrations the database lacks, in one transaction under an advisory lock;
    /// refuses a database whose schema is newer than this code's.
    private func migrate(_ c: PostgresConnection) async throws {
        let code = Self.schemaVersion
        let found: Int
        do { found = try await version(c) } catch { throw ResultsStoreError.database("cannot read the schema version: \(Self.describe(error))") }
        if found > code { throw ResultsStoreError.newerSchema(database: found, code: code) }
        if found == code { return }
        do {
            try await c.query("BEGIN", logger: Self.quiet)
            try await c.query("SELECT pg_advisory_xact_lock(\(Self.migrationLock))", logger: Self.quiet)
            try await c.query("CREATE TABLE IF NOT EXISTS schema_version (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())", logger: Self.quiet)
            // Another migrator may have gone first while this one waited for the lock.
            let now = try await version(c)
            if now > code {
                _ = try? await c.query("ROLLBACK", logger: Self.quiet)
                throw ResultsStoreError.newerSchema(database: now, code: code)
            }
            for m in Self.migrations where m.version > now {
                for sql in m.statements { try await c.query(PostgresQuery(unsafeSQL: sql), logger: Self.quiet) }
                try await c.query("INSERT INTO schema_version (version, name) VALUES (\(Int64(m.version)), \(m.name))", logger: Self.quiet)
                logger.notice("results store \(location): migrated to schema version \(m.version) (\(m.name))")
            }
            try await c.query("COMMIT", logger: Self.quiet)
        } catch let e as ResultsStoreError {
            throw e
        } catch {
            _ = try? await c.query("ROLLBACK", logger: Self.quiet)
            if Self.sqlState(error) == "42501" {
                throw ResultsStoreError.needsMigration(database: found, code: code, reason: Self.describe(error))
            }
            throw ResultsStoreError.database("migration to schema version \(code) failed: \(Self.describe(error))")
        }
    }

    /// Whether this store's session is encrypted (pg_stat_ssl), and with which protocol.
    func sessionTLS() async throws -> String? {
        try await using { c in
            var out: String?
            for try await (ssl, version) in try await c.query("SELECT ssl, COALESCE(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()", logger: Self.quiet)
                .decode((Bool, String).self) where ssl { out = version }
            return out
        }
    }

    /// The session's application_name and statement_timeout.
    func sessionSettings() async throws -> [String] {
        try await using { c in
            var out = [String]()
            for try await (a, t) in try await c.query("SELECT current_setting('application_name'), current_setting('statement_timeout')", logger: Self.quiet)
                .decode((String, String).self) { out = [a, t] }
            return out
        }
    }

    /// The database's schema version (0: none yet).
    public func schemaVersionInDatabase() async throws -> Int {
        try await using { c in try await version(c) }
    }

    /// The GRANT statements of the two least-privilege roles (docs/RESULTS-SERVER.md):
    /// coordinators insert and read runs, alerts and studies; operators also update alerts
    /// (accept, close), may replace a run's row, and prune (`results-store prune`: delete old
    /// runs and studies, write and delete nightly summaries). Coordinators never delete; neither
    /// changes the schema. Run them as the owner after the migrations (again after an upgrade).
    public static func grantStatements(coordinator: String, operator op: String) -> [String] {
        let c = quoteIdentifier(coordinator), o = quoteIdentifier(op)
        return [
            "GRANT SELECT ON schema_version, lab_run, lab_alert, lab_study, lab_study_run, lab_study_effect, lab_night TO \(c), \(o)",
            "GRANT INSERT ON lab_run, lab_alert, lab_study, lab_study_run, lab_study_effect TO \(c), \(o)",
            "GRANT UPDATE ON lab_run, lab_alert TO \(o)",
            "GRANT INSERT, UPDATE, DELETE ON lab_night TO \(o)",
            "GRANT DELETE ON lab_run, lab_study, lab_study_run, lab_study_effect TO \(o)",
        ]
    }

    /// An SQL identifier, quoted (for role names in GRANT, which cannot be bound).
    public static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\u{0}", with: "").replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    // MARK: Runs

    public enum Recorded: Sendable, Equatable {
        /// A new row.
        case inserted(Int64)
        /// The run was there already (a retry): left as it was.
        case present(Int64)
        /// The run was there and its row was replaced (`replace: true`).
        case replaced(Int64)
        public var id: Int64 {
            switch self { case .inserted(let i), .present(let i), .replaced(let i): return i }
        }
    }

    /// Stores a run once per (lab, run id): a retry of a write that landed changes nothing;
    /// `replace` (an operator analysing a bundle again) replaces the row, keeping its id.
    @discardableResult
    public func record(_ run: SharedRun, replace: Bool = false) async throws -> Recorded {
        try run.validate()
        return try await transaction { c in
            let conflict = replace
                ? """
                  DO UPDATE SET path = EXCLUDED.path, bundle_url = EXCLUDED.bundle_url, testbed = EXCLUDED.testbed, plan = EXCLUDED.plan,
                  variant = EXCLUDED.variant, settings_key = EXCLUDED.settings_key, firmware = EXCLUDED.firmware, dongle_make = EXCLUDED.dongle_make,
                  recorded_at = EXCLUDED.recorded_at, created_at = EXCLUDED.created_at, seed = EXCLUDED.seed, devices = EXCLUDED.devices,
                  detection_pct = EXCLUDED.detection_pct, continuity_pct = EXCLUDED.continuity_pct, herald_continuity_pct = EXCLUDED.herald_continuity_pct,
                  longevity = EXCLUDED.longevity, passed = EXCLUDED.passed, verdict = EXCLUDED.verdict, checks_total = EXCLUDED.checks_total,
                  checks_failed = EXCLUDED.checks_failed, failed_checks = EXCLUDED.failed_checks, infra = EXCLUDED.infra, summary_json = EXCLUDED.summary_json
                  """
                : "DO NOTHING"
            let q: PostgresQuery = """
                INSERT INTO lab_run (lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, recorded_at,
                    created_at, seed, devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total,
                    checks_failed, failed_checks, infra, summary_json)
                VALUES (\(run.lab), \(run.runId), \(run.path), \(run.bundleURL), \(run.testbed), \(run.plan), \(run.variant), \(run.settingsKey),
                    \(run.firmware), \(run.dongleMake), \(run.recordedAt), \(run.createdAt), \(run.seed), \(Int64(run.devices)), \(run.detectionPct),
                    \(run.continuityPct), \(run.heraldContinuityPct), \(run.longevity), \(run.passed), \(run.verdict), \(Int64(run.checksTotal)),
                    \(Int64(run.checksFailed)), \(run.failedChecks), \(run.infra), \(run.summaryJSON))
                ON CONFLICT (lab, run_id) \(unescaped: conflict)
                RETURNING id, (xmax = 0) AS inserted
                """
            for try await (id, inserted) in try await c.query(q, logger: Self.quiet).decode((Int64, Bool).self) {
                return inserted ? Recorded.inserted(id) : .replaced(id)
            }
            for try await (id) in try await c.query("SELECT id FROM lab_run WHERE lab = \(run.lab) AND run_id = \(run.runId)", logger: Self.quiet).decode(Int64.self) {
                return Recorded.present(id)
            }
            throw ResultsStoreError.database("run \(run.runId.debugDescription) of lab \(run.lab.debugDescription): neither inserted nor found")
        }
    }

    static let runColumns = """
        id, lab, run_id, path, bundle_url, testbed, plan, variant, settings_key, firmware, dongle_make, recorded_at, created_at, seed,
        devices, detection_pct, continuity_pct, herald_continuity_pct, longevity, passed, verdict, checks_total, checks_failed,
        failed_checks, infra, summary_json
        """

    static func run(_ row: PostgresRow) throws -> SharedRun {
        let c = row.makeRandomAccess()
        return SharedRun(id: try c[0].decode(Int64.self), lab: try c[1].decode(String.self), runId: try c[2].decode(String.self),
                         path: try c[3].decode(String.self), bundleURL: try c[4].decode(String.self), testbed: try c[5].decode(String.self),
                         plan: try c[6].decode(String.self), variant: try c[7].decode(String.self), settingsKey: try c[8].decode(String.self),
                         firmware: try c[9].decode(String.self), dongleMake: try c[10].decode(String.self), recordedAt: try c[11].decode(Date.self),
                         createdAt: try c[12].decode(String.self), seed: try c[13].decode(String.self), devices: Int(try c[14].decode(Int64.self)),
                         detectionPct: try c[15].decode(Double.self), continuityPct: try c[16].decode(Double.self),
                         heraldContinuityPct: try c[17].decode(Double.self), longevity: try c[18].decode(Double.self), passed: try c[19].decode(Bool.self),
                         verdict: try c[20].decode(String.self), checksTotal: Int(try c[21].decode(Int64.self)), checksFailed: Int(try c[22].decode(Int64.self)),
                         failedChecks: try c[23].decode(String.self), infra: try c[24].decode(String.self), summaryJSON: try c[25].decode(String.self))
    }

    func fetchRuns(_ q: PostgresQuery) async throws -> [SharedRun] {
        try await using { c in
            var out = [SharedRun]()
            for try await row in try await c.query(q, logger: Self.quiet) { out.append(try Self.run(row)) }
            return out
        }
    }

    /// Runs of the given labs (every lab when empty), optionally of one plan, in the order they
    /// were stored; the newest `last` when given.
    public func runs(labs: [String] = [], plan: String? = nil, last: Int? = nil) async throws -> [SharedRun] {
        var binds = PostgresBindings()
        var conditions = [String]()
        if !labs.isEmpty { binds.append(labs); conditions.append("lab = ANY($\(binds.count))") }
        if let plan { binds.append(plan); conditions.append("plan = $\(binds.count)") }
        var sql = "SELECT \(Self.runColumns) FROM lab_run"
        if !conditions.isEmpty { sql += " WHERE " + conditions.joined(separator: " AND ") }
        if let last { binds.append(Int64(max(1, last))); sql += " ORDER BY id DESC LIMIT $\(binds.count)" } else { sql += " ORDER BY id" }
        let rows = try await fetchRuns(PostgresQuery(unsafeSQL: sql, binds: binds))
        return last == nil ? rows : rows.reversed()
    }

    /// The stored row of (lab, run id), if any.
    public func run(lab: String, runId: String) async throws -> SharedRun? {
        try await fetchRuns("SELECT \(unescaped: Self.runColumns) FROM lab_run WHERE lab = \(lab) AND run_id = \(runId)").first
    }

    /// Rows in all (every lab).
    public func count(lab: String? = nil) async throws -> Int {
        try await using { c in
            let q: PostgresQuery = lab.map { "SELECT count(*) FROM lab_run WHERE lab = \($0)" } ?? "SELECT count(*) FROM lab_run"
            var n: Int64 = 0
            for try await (x) in try await c.query(q, logger: Self.quiet).decode(Int64.self) { n = x }
            return Int(n)
        }
    }

    /// The last `last` runs of `lab` like `r` (same plan, variant, settings, testbed), oldest
    /// first, stored before `r` when `r` is stored, without `r` itself, and without runs with
    /// infrastructure faults unless asked; nights an alert holds out are left out as
    /// HistoryStore.baseline leaves them.
    public func baseline(like r: AnalysisResult, lab: String, last: Int, includeInfra: Bool = false) async throws -> [SharedRun] {
        let key = HistoryStore.settingsKey(r), testbed = r.input.testbed ?? ""
        let plan = r.input.plan ?? "", variant = r.input.variant ?? ""
        let runId = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        let alerts = try await alerts(lab: lab, plan: plan).filter { $0.variant == variant && $0.settingsKey == key && $0.testbed == testbed }
        func excluded(_ id: Int64) -> Bool {
            alerts.contains { a in
                switch a.state {
                case .regressed: return id >= a.openedRow
                case .returned: return id >= a.openedRow && id < (a.closedRow ?? Int64.max)
                case .accepted: return id < a.openedRow
                }
            }
        }
        let own = try await run(lab: lab, runId: runId)?.id ?? Int64.max
        let rows = try await fetchRuns("""
            SELECT \(unescaped: Self.runColumns) FROM lab_run
            WHERE lab = \(lab) AND plan = \(plan) AND variant = \(variant) AND settings_key = \(key) AND testbed = \(testbed)
              AND run_id <> \(runId) AND id < \(own) AND (\(includeInfra) OR infra = '')
            ORDER BY id DESC LIMIT \(Int64(max(1, last) + 1000))
            """)
        return Array(rows.filter { !excluded($0.id ?? 0) }.prefix(max(1, last)).reversed())
    }

    /// The infrastructure-fault rate of each testbed of `lab` (every lab when nil: testbeds of
    /// different labs are different benches, so each is named `lab/testbed` then) over its last `last` runs.
    public func infraRates(lab: String?, last: Int = 30) async throws -> [HistoryStore.InfraRate] {
        try await using { c in
            let q: PostgresQuery = """
                SELECT CASE WHEN \(lab == nil) THEN lab || '/' || testbed ELSE testbed END, count(*), count(*) FILTER (WHERE infra <> '')
                FROM (SELECT lab, testbed, infra, row_number() OVER (PARTITION BY lab, testbed ORDER BY id DESC) AS k
                      FROM lab_run WHERE \(lab == nil) OR lab = \(lab ?? "")) t
                WHERE k <= \(Int64(max(1, last)))
                GROUP BY 1 ORDER BY 1
                """
            var out = [HistoryStore.InfraRate]()
            for try await (testbed, runs, infra) in try await c.query(q, logger: Self.quiet).decode((String, Int64, Int64).self) {
                out.append(.init(testbed: testbed, runs: Int(runs), infra: Int(infra)))
            }
            return out
        }
    }

    // MARK: Alerts

    /// A regression alert of one lab's plan, variant, settings and testbed (HistoryStore.Alert with its lab).
    public struct Alert: Sendable, Equatable, Codable {
        public var id: Int64
        public var lab: String
        public var plan: String
        public var variant: String
        public var settingsKey: String
        public var testbed: String
        public var state: HistoryStore.Alert.State
        public var openedAt: Date
        public var openedRun: String
        public var openedRow: Int64
        public var metrics: String
        public var closedAt: Date?
        public var closedRow: Int64?
        public var closedBy: String?
        public var reason: String?
    }

    /// Alerts of `lab`'s plan, oldest first.
    public func alerts(lab: String, plan: String) async throws -> [Alert] {
        try await using { c in
            let q: PostgresQuery = """
                SELECT id, lab, plan, variant, settings_key, testbed, state, opened_at, opened_run, opened_row, metrics, closed_at, closed_row, closed_by, reason
                FROM lab_alert WHERE lab = \(lab) AND plan = \(plan) ORDER BY id
                """
            var out = [Alert]()
            for try await row in try await c.query(q, logger: Self.quiet) {
                let x = row.makeRandomAccess()
                let state = try x[6].decode(String.self)
                guard let s = HistoryStore.Alert.State(rawValue: state) else { throw ResultsStoreError.database("alert state \(state.debugDescription)") }
                out.append(Alert(id: try x[0].decode(Int64.self), lab: try x[1].decode(String.self), plan: try x[2].decode(String.self),
                                 variant: try x[3].decode(String.self), settingsKey: try x[4].decode(String.self), testbed: try x[5].decode(String.self),
                                 state: s, openedAt: try x[7].decode(Date.self), openedRun: try x[8].decode(String.self), openedRow: try x[9].decode(Int64.self),
                                 metrics: try x[10].decode(String.self), closedAt: try x[11].decode(Date?.self), closedRow: try x[12].decode(Int64?.self),
                                 closedBy: try x[13].decode(String?.self), reason: try x[14].decode(String?.self)))
            }
            return out
        }
    }

    /// Opens an alert for `lab`'s runs like `r`, from store row `row`.
    @discardableResult
    public func openAlert(lab: String, like r: AnalysisResult, row: Int64, metrics: [String], at date: Date = Date()) async throws -> Int64 {
        let runId = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        return try await transaction { c in
            let q: PostgresQuery = """
                INSERT INTO lab_alert (lab, plan, variant, settings_key, testbed, state, opened_at, opened_run, opened_row, metrics)
                VALUES (\(lab), \(r.input.plan ?? ""), \(r.input.variant ?? ""), \(HistoryStore.settingsKey(r)), \(r.input.testbed ?? ""), 'regressed',
                        \(date), \(runId), \(row), \(metrics.joined(separator: ", ")))
                RETURNING id
                """
            for try await (id) in try await c.query(q, logger: Self.quiet).decode(Int64.self) { return id }
            throw ResultsStoreError.database("alert not stored")
        }
    }

    /// An operator accepts `lab`'s open alerts of `plan` (of one variant and testbed when
    /// given): the level they flagged is the new normal. Returns how many.
    public func accept(lab: String, plan: String, variant: String?, testbed: String?, by who: String, reason: String, at date: Date = Date()) async throws -> Int {
        try await transaction { c in
            let q: PostgresQuery = """
                UPDATE lab_alert SET state = 'accepted', closed_at = \(date), closed_by = \(who), reason = \(reason),
                       closed_row = (SELECT MAX(id) FROM lab_run WHERE lab = \(lab))
                WHERE lab = \(lab) AND plan = \(plan) AND state = 'regressed'
                  AND (\(variant == nil) OR variant = \(variant ?? "")) AND (\(testbed == nil) OR testbed = \(testbed ?? ""))
                RETURNING id
                """
            var n = 0
            for try await _ in try await c.query(q, logger: Self.quiet).decode(Int64.self) { n += 1 }
            return n
        }
    }
}
