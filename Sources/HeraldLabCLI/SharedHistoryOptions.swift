import ArgumentParser
import Foundation
import HeraldAnalysis
import HeraldCore
import LabCoordinator
import LabHistory
import LabResults
import Logging

/// `--history postgres://…` and its companions (issue 41): the shared results store a
/// coordinator also records each analysed run to, through the durable outbox in the results
/// folder; history.sqlite is still written (SQLite stays the default). Never a password on the
/// command line: it is read from --history-password-file.
struct SharedHistoryOptions: ParsableArguments {
    @Option(name: .customLong("history"), help: "The shared results store, postgres://USER@HOST[:PORT]/DB[?sslmode=verify-full&sslrootcert=CA.pem] (docs/RESULTS-SERVER.md): each analysed run is also queued in RESULTS/.history-outbox and sent there. No password in it: --history-password-file.")
    var history: String?

    @Option(name: .customLong("history-password-file"), help: "File (mode 0600) holding the password of --history's role.")
    var passwordFile: String?

    @Option(name: .customLong("history-ca-file"), help: "CA file the shared store's certificate is checked against (TLS verify-full unless the URL's sslmode says otherwise).")
    var caFile: String?

    @Option(name: .customLong("lab"), help: "This lab's name, in every run's manifest.json and in the shared store (letters, digits, '-', '_', '.', at most 64; default with --history: this machine's name).")
    var lab: String?

    /// --lab, checked as every name from outside is (SafeName); nil when not given.
    func labName() throws -> String? {
        guard let lab else { return nil }
        if let problem = SafeName.problem(with: lab) {
            log("herald-lab: --lab \"\(OutsideText.escaped(lab, limit: 80, quotes: true))\" \(problem)")
            throw ExitCode(2)
        }
        return lab
    }

    /// The writer, or nil without --history. A wrong password, a missing database or a newer
    /// schema stop here (exit 2); a server that cannot be reached does not: runs queue until it answers.
    func writer(results: URL, logger: Logger) async throws -> SharedHistoryWriter? {
        let checkedLab = try labName()
        guard let history else {
            if passwordFile != nil || caFile != nil {
                log("herald-lab: --history-password-file and --history-ca-file go with --history postgres://USER@HOST/DB")
                throw ExitCode(2)
            }
            return nil
        }
        let name = checkedLab ?? ProcessInfo.processInfo.hostName
        if lab == nil, let problem = SafeName.problem(with: name) {
            log("herald-lab: this machine's name \(OutsideText.escaped(name, limit: 80)) \(problem) as a lab name: give --lab NAME")
            throw ExitCode(2)
        }
        do {
            let store = try makeStore(history, logger: logger)
            let location = store.location
            let outbox = try ResultsOutbox(directory: ResultsOutbox.beside(results: results))
            let writer = try SharedHistoryWriter(lab: name, store: store, outbox: outbox, logger: logger)
            do {
                try await store.open()
                logger.notice("shared history: \(location) as lab \(name.debugDescription)")
            } catch ResultsStoreError.database(let why) {
                logger.warning("shared history \(location): \(why); runs are kept in \(outbox.directory.path) until it answers")
            }
            return writer
        } catch {
            log("herald-lab: \(error)")
            throw ExitCode(2)
        }
    }
}

extension SharedHistoryOptions {
    /// A store at --history (no I/O until its first call): the password from its file, the CA file for TLS.
    func makeStore(_ history: String, logger: Logger) throws -> SharedResultsStore {
        var location = try ResultsLocation.parse(history)
        if let caFile {
            location.caFile = caFile
            if location.tls == .disable { location.tls = .verifyFull }
        }
        let password = try passwordFile.map { try ResultsLocation.readPassword(file: $0) }
        return try SharedResultsStore(location: location, password: password, logger: logger)
    }

    /// The store the dashboard's Trends read (issue 41), its own connection beside the
    /// writer's; nil without --history.
    func dashboardReader(logger: Logger) throws -> SharedResultsStore? {
        guard let history else { return nil }
        do { return try makeStore(history, logger: logger) } catch {
            log("herald-lab: \(error)")
            throw ExitCode(2)
        }
    }

    /// A study that finished on the coordinator, as the shared store keeps it.
    static func sharedStudy(_ s: FinishedStudy, lab: String, at date: Date = Date()) throws -> SharedStudy {
        try SharedStudy(lab: lab, studyId: s.studyId, name: s.name, plan: s.plan, levels: s.levels, design: s.design,
                        runs: s.runs.map { .init(index: $0.index, block: $0.block, level: $0.level, seed: "", folder: $0.runId, runId: $0.runId, state: $0.state) },
                        outcome: s.outcome, compareJSON: s.compareJSON, at: date)
    }
}

/// `herald-lab results-store`: the shared store's schema and roles (docs/RESULTS-SERVER.md).
struct ResultsStoreCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "results-store", abstract: "The shared results store on PostgreSQL: migrate its schema, print its roles' grants, read runs and infra rates across labs.",
                                                    subcommands: [Migrate.self, Grants.self, Runs.self, Infra.self, Prune.self])

    /// Where the store is, for the reading subcommands.
    struct Connection: ParsableArguments {
        @Option(name: .customLong("history"), help: "postgres://USER@HOST[:PORT]/DB[?sslmode=verify-full&sslrootcert=CA.pem]")
        var history: String
        @Option(name: .customLong("history-password-file"), help: "File (mode 0600) holding the role's password.")
        var passwordFile: String?
        @Option(name: .customLong("history-ca-file"), help: "CA file the store's certificate is checked against.")
        var caFile: String?
        func open(_ command: String) async throws -> SharedResultsStore {
            do { return try await SharedResultsStore.connect(url: history, passwordFile: passwordFile, caFile: caFile, logger: Logger(label: "herald-lab.results")) } catch {
                log("herald-lab results-store \(command): \(error)")
                throw ExitCode(2)
            }
        }
    }

    struct Runs: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The runs of one or more labs (every lab without --lab), oldest first.")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("lab"), help: "A lab's runs (repeat for several).") var labs: [String] = []
        @Option(help: "Only runs of this plan.") var plan: String?
        @Option(help: "Only the newest N.") var last: Int?
        @Option(help: ArgumentHelp("The runs as JSON to FILE (--json alone or --json -: standard output, instead of the table).", valueName: "FILE"))
        var json: String?

        struct Row: Encodable {
            var lab, runId, plan, variant, testbed, firmware, dongleMake, recordedAt, verdict, infra, bundleURL: String
            var devices: Int
            var detectionPct, continuityPct, heraldContinuityPct, longevity: Double
            var passed: Bool
        }

        func run() async throws {
            if let last, !(1...100_000).contains(last) { log("herald-lab results-store runs: --last from 1 to 100000"); throw ExitCode(2) }
            let store = try await connection.open("runs")
            let runs: [SharedRun]
            do { runs = try await store.runs(labs: labs, plan: plan, last: last) } catch {
                await store.close()
                log("herald-lab results-store runs: \(error)")
                throw ExitCode(2)
            }
            await store.close()
            let iso = ISO8601DateFormatter()
            if let json {
                let e = JSONEncoder()
                e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
                e.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
                try CLIConventions.writeJSON(try e.encode(runs.map {
                    Row(lab: $0.lab, runId: $0.runId, plan: $0.plan, variant: $0.variant, testbed: $0.testbed, firmware: $0.firmware, dongleMake: $0.dongleMake,
                        recordedAt: iso.string(from: $0.recordedAt), verdict: $0.verdict, infra: $0.infra, bundleURL: $0.bundleURL, devices: $0.devices,
                        detectionPct: $0.detectionPct, continuityPct: $0.continuityPct, heraldContinuityPct: $0.heraldContinuityPct, longevity: $0.longevity, passed: $0.passed)
                }), to: json, command: "results-store runs")
                if json == "-" { return }
            }
            guard !runs.isEmpty else { print("no runs\(labs.isEmpty ? "" : " of " + labs.map(Format.label).joined(separator: ", "))\(plan.map { " for plan \(Format.label($0))" } ?? "")"); return }
            print("recorded              lab           plan            testbed       run                          detection%  continuity%  verdict")
            for r in runs {
                func col(_ s: String, _ n: Int) -> String { Format.label(s).padding(toLength: n, withPad: " ", startingAt: 0) }
                print(String(format: "%@  %@  %@  %@  %@  %9.2f  %10.4f  %@", iso.string(from: r.recordedAt), col(r.lab, 12), col(r.plan, 14), col(r.testbed, 12),
                             col(r.runId, 27), r.detectionPct, r.continuityPct, Format.label(r.verdict)))
            }
        }
    }

    struct Infra: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Each testbed's infrastructure-fault rate over its last runs, of one lab (every lab's, as LAB/TESTBED, without --lab).")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("lab"), help: "The lab.") var lab: String?
        @Option(help: "Runs per testbed (default 30).") var last = 30

        func run() async throws {
            guard (1...100_000).contains(last) else { log("herald-lab results-store infra: --last from 1 to 100000"); throw ExitCode(2) }
            let store = try await connection.open("infra")
            let rates: [HistoryStore.InfraRate]
            do { rates = try await store.infraRates(lab: lab, last: last) } catch {
                await store.close()
                log("herald-lab results-store infra: \(error)")
                throw ExitCode(2)
            }
            await store.close()
            for r in rates {
                let i = r.interval
                print(String(format: "%@  %d of %d runs with infra faults (%.1f %%, 95 %% %.1f to %.1f %%)", Format.label(r.testbed), r.infra, r.runs, r.rate * 100, i.lo * 100, i.hi * 100))
            }
        }
    }

    struct Prune: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete runs older than --keep-days per lab (as the operators' role), each of their nights kept as a summary Trends still draws; summaries and studies older than --summary-days go too.",
            discussion: "Days count whole nights (UTC): --keep-days 30 keeps today's runs and those of the 30 nights before. One transaction: all or nothing.")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("keep-days"), help: "Keep the runs of the last N nights (1 to 36500).") var keepDays: Int
        @Option(name: .customLong("summary-days"), help: "Keep nightly summaries and studies of the last M nights (--keep-days to 36500; default 3650).") var summaryDays: Int?
        @Option(name: .customLong("lab"), help: "Only this lab's (default: every lab's).") var lab: String?

        func run() async throws {
            let range = SharedResultsStore.retentionDays
            guard range.contains(keepDays) else { log("herald-lab results-store prune: --keep-days \(keepDays): from \(range.lowerBound) to \(range.upperBound)"); throw ExitCode(2) }
            let summaries = summaryDays ?? max(keepDays, 3650)
            guard range.contains(summaries), summaries >= keepDays else {
                log("herald-lab results-store prune: --summary-days \(summaries): from --keep-days (\(keepDays)) to \(range.upperBound)")
                throw ExitCode(2)
            }
            if let lab, lab.isEmpty || lab.count > SharedRun.maximumLabName || lab.utf8.contains(0) {
                log("herald-lab results-store prune: --lab: a name of 1 to \(SharedRun.maximumLabName) characters without NUL")
                throw ExitCode(2)
            }
            let store = try await connection.open("prune")
            let p: SharedResultsStore.Pruned
            do { p = try await store.prune(keepDays: keepDays, summaryDays: summaries, lab: lab) } catch {
                await store.close()
                log("herald-lab results-store prune: \(error)")
                throw ExitCode(2)
            }
            await store.close()
            let iso = ISO8601DateFormatter()
            let whose = lab.map { "lab \(Format.label($0))" } ?? "every lab"
            print("\(whose): \(p.runsDeleted) run\(p.runsDeleted == 1 ? "" : "s") before \(iso.string(from: p.runsBefore)) deleted, their nights in \(p.nightsSummarised) summar\(p.nightsSummarised == 1 ? "y" : "ies"); \(p.summariesDeleted) summar\(p.summariesDeleted == 1 ? "y" : "ies") and \(p.studiesDeleted) stud\(p.studiesDeleted == 1 ? "y" : "ies") before \(iso.string(from: p.summariesBefore)) deleted")
        }
    }

    struct Migrate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Bring the store's schema to this herald-lab's version (as the store's owner role); a newer schema is refused.")
        @Option(name: .customLong("history"), help: "postgres://OWNER@HOST[:PORT]/DB[?sslmode=verify-full&sslrootcert=CA.pem]")
        var history: String
        @Option(name: .customLong("history-password-file"), help: "File (mode 0600) holding the owner's password.")
        var passwordFile: String?
        @Option(name: .customLong("history-ca-file"), help: "CA file the store's certificate is checked against.")
        var caFile: String?

        func run() async throws {
            do {
                let store = try await SharedResultsStore.connect(url: history, passwordFile: passwordFile, caFile: caFile, logger: Logger(label: "herald-lab.results"))
                let version = try await store.schemaVersionInDatabase()
                await store.close()
                print("\(store.location): schema version \(version)")
            } catch {
                log("herald-lab results-store migrate: \(error)")
                throw ExitCode(2)
            }
        }
    }

    struct Grants: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the GRANT statements of the coordinators' role (insert, read) and the operators' role (also update), to run as the owner.")
        @Option(name: .customLong("coordinator-role")) var coordinator = "lab_coordinator"
        @Option(name: .customLong("operator-role")) var op = "lab_operator"
        func run() throws {
            for statement in SharedResultsStore.grantStatements(coordinator: coordinator, operator: op) { print(statement + ";") }
        }
    }
}
