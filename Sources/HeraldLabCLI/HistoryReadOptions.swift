import ArgumentParser
import HeraldCore
import Foundation
import HeraldAnalysis
import LabHistory
import LabResults
import Logging

/// The history a reading command reads (issue 41): history.sqlite of --results by default, or
/// the shared results store with `--history postgres://…` (its password from
/// --history-password-file, never the command line; --history-ca-file for TLS), filtered by
/// `--lab` (repeatable where a command reads several labs). The same flags as the coordinator's
/// SharedHistoryOptions, which write there.
struct HistoryReadOptions: ParsableArguments {
    @Option(name: .customLong("history"), help: "Read the shared results store, postgres://USER@HOST[:PORT]/DB[?sslmode=verify-full&sslrootcert=CA.pem] (docs/RESULTS-SERVER.md), instead of history.sqlite. No password in it: --history-password-file.")
    var history: String?

    @Option(name: .customLong("history-password-file"), help: "File (mode 0600) holding the password of --history's role.")
    var passwordFile: String?

    @Option(name: .customLong("history-ca-file"), help: "CA file the shared store's certificate is checked against (TLS verify-full unless the URL's sslmode says otherwise).")
    var caFile: String?

    @Option(name: .customLong("lab"), help: "A lab of the shared store (with --history; 1 to 128 characters).")
    var labs: [String] = []

    /// Refuses flags that go with --history without it, lab names no store can hold, and more
    /// labs than the command reads (`most`), naming the flag: exit 2. No I/O.
    func check(_ command: String, most: Int? = nil, least: Int = 0) throws {
        if history == nil, passwordFile != nil || caFile != nil || !labs.isEmpty {
            let given = [("--history-password-file", passwordFile != nil), ("--history-ca-file", caFile != nil), ("--lab", !labs.isEmpty)].filter(\.1).map(\.0)
            log("herald-lab \(command): \(given.joined(separator: ", ")) go\(given.count == 1 ? "es" : "") with --history postgres://USER@HOST/DB (the local history.sqlite holds one lab)")
            throw ExitCode(2)
        }
        for lab in labs {
            if let problem = LabName.problem(lab) {
                log("herald-lab \(command): --lab \"\(OutsideText.escaped(String(lab.prefix(200))))\": \(problem)")
                throw ExitCode(2)
            }
        }
        if let most, labs.count > most {
            log("herald-lab \(command): --lab given \(labs.count) times: \(most == 1 ? "one lab" : "at most \(most) labs") here")
            throw ExitCode(2)
        }
        if history != nil, labs.count < least {
            log("herald-lab \(command): --lab: \(least) labs needed with --history (--lab A --lab B), \(labs.count) given")
            throw ExitCode(2)
        }
        if let history {
            do { _ = try ResultsLocation.parse(history) } catch {
                log("herald-lab \(command): \(error)")
                throw ExitCode(2)
            }
        }
    }

    /// The shared store (connected, schema checked), or nil without --history. A bad URL, an
    /// unreadable password file, a wrong password or a newer schema: exit 2.
    func sharedStore(_ command: String) async throws -> SharedResultsStore? {
        guard let history else { return nil }
        do {
            return try await SharedResultsStore.connect(url: history, passwordFile: passwordFile, caFile: caFile, logger: Logger(label: "herald-lab.results"))
        } catch {
            log("herald-lab \(command): \(error)")
            throw ExitCode(2)
        }
    }

    /// The history to read: the shared store with --history, else history.sqlite of `results`.
    func reader(_ command: String, results: URL) async throws -> any HistoryReading {
        if let store = try await sharedStore(command) { return store }
        do { return try HistoryStore(url: results.appendingPathComponent("history.sqlite")) } catch {
            log("herald-lab \(command): history: \(error)")
            throw ExitCode(2)
        }
    }

    /// The one lab a command acts as (regress, analyse): --lab, else this machine's name, as the coordinator's writer names it.
    var lab: String { labs.first ?? ProcessInfo.processInfo.hostName }
}
