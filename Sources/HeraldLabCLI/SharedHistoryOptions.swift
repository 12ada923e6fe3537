import ArgumentParser
import Foundation
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

    @Option(name: .customLong("lab"), help: "This lab's name in the shared store (1 to 128 characters; default: this machine's name).")
    var lab: String?

    /// The writer, or nil without --history. A wrong password, a missing database or a newer
    /// schema stop here (exit 2); a server that cannot be reached does not: runs queue until it answers.
    func writer(results: URL, logger: Logger) async throws -> SharedHistoryWriter? {
        guard let history else {
            if passwordFile != nil || caFile != nil || lab != nil {
                log("herald-lab: --history-password-file, --history-ca-file and --lab go with --history postgres://USER@HOST/DB")
                throw ExitCode(2)
            }
            return nil
        }
        do {
            var location = try ResultsLocation.parse(history)
            if let caFile {
                location.caFile = caFile
                if location.tls == .disable { location.tls = .verifyFull }
            }
            let password = try passwordFile.map { try ResultsLocation.readPassword(file: $0) }
            let store = try SharedResultsStore(location: location, password: password, logger: logger)
            let outbox = try ResultsOutbox(directory: ResultsOutbox.beside(results: results))
            let name = lab ?? ProcessInfo.processInfo.hostName
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

/// `herald-lab results-store`: the shared store's schema and roles (docs/RESULTS-SERVER.md).
struct ResultsStoreCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "results-store", abstract: "The shared results store on PostgreSQL: migrate its schema, print its roles' grants.",
                                                    subcommands: [Migrate.self, Grants.self])

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
