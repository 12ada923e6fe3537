import ArgumentParser
import Foundation
import HeraldCore
import LabCoordinator
import LabHTTP
import LabNet
import LabPlan

/// Options of every command that talks to a coordinator.
struct CoordinatorOptions: ParsableArguments {
    /// The environment's defaults (README, docs/CI.md): the coordinator's URL and the file
    /// holding the operator's credential (a path, never the secret; $HERALDLAB_TOKEN holds a token
    /// itself, and $HERALDLAB_CREDENTIALS a credentials folder).
    static let coordinatorVariable = "HERALDLAB_COORDINATOR"
    static let tokenFileVariable = "HERALDLAB_TOKEN_FILE"

    @Option(name: .customLong("coordinator"), help: "Coordinator URL, e.g. http://coord.lab:8700 (default: $HERALDLAB_COORDINATOR).")
    var coordinatorFlag: String?

    @Option(name: .customLong("token-file"), help: "File holding the token (default: $HERALDLAB_TOKEN_FILE, else $HERALDLAB_TOKEN, else operator.token in the credentials folder).")
    var tokenFileFlag: String?

    @Option(help: "Credentials folder: ca.pem checks an https coordinator, operator.token is the credential (default: $HERALDLAB_CREDENTIALS).")
    var credentials: String?

    /// The environment the defaults are read from (a test's own).
    var environment: [String: String] = ProcessInfo.processInfo.environment

    enum CodingKeys: String, CodingKey { case coordinatorFlag, tokenFileFlag, credentials }

    /// --coordinator, else $HERALDLAB_COORDINATOR; "" when neither (validate refuses that).
    var coordinator: String { coordinatorFlag ?? environment[Self.coordinatorVariable].flatMap { $0.isEmpty ? nil : $0 } ?? "" }

    /// --token-file, else $HERALDLAB_TOKEN_FILE.
    var tokenFile: String? { tokenFileFlag ?? environment[Self.tokenFileVariable].flatMap { $0.isEmpty ? nil : $0 } }

    func validate() throws {
        if coordinator.isEmpty { throw ValidationError("--coordinator: give the coordinator's URL (e.g. --coordinator http://coord.lab:8700) or set $\(Self.coordinatorVariable)") }
    }

    /// The options as a command line to paste (hints): the coordinator, and the credential by the
    /// file or folder it is in, never the secret itself; a credential from $HERALDLAB_TOKEN is
    /// named as that variable, to be set again.
    var pasteable: String {
        var words = ["--coordinator", CLIConventions.shellQuoted(coordinator)]
        if let tokenFile { words += ["--token-file", CLIConventions.shellQuoted(tokenFile)] }
        if let credentials { words += ["--credentials", CLIConventions.shellQuoted(credentials)] }
        var line = words.joined(separator: " ")
        if tokenFile == nil, credentials == nil, environment["HERALDLAB_TOKEN"].map({ !$0.isEmpty }) == true { line += "   (with $HERALDLAB_TOKEN set)" }
        else if tokenFile == nil, credentials == nil, environment["HERALDLAB_CREDENTIALS"].map({ !$0.isEmpty }) == true { line += "   (with $HERALDLAB_CREDENTIALS set)" }
        return line
    }

    func client() throws -> LabClient {
        try coordinatorClient(coordinator, tokenFile: tokenFile, credentials: credentials)
    }

    /// A call whose failure ends the command with exit 2 and the reason.
    func call<T: Decodable>(_ method: String, _ path: String, as: T.Type = T.self) async throws -> T {
        let c = try client()
        do { return try await c.call(method, path) } catch {
            // A failure to connect or to get an answer names the request already; an HTTP
            // refusal ("HTTP 403: ...") does not.
            let text = OutsideText.escaped("\(error)", limit: 2000)
            log("herald-lab: " + (text.hasPrefix("\(method) ") ? text : "\(method) \(c.base.absoluteString)\(path): \(text)"))
            throw ExitCode(2)
        }
    }
}

/// `herald-lab agents`: the lab's agents as the coordinator sees them; enrol and revoke one.
struct AgentsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "agents", abstract: "List the agents a coordinator knows; enrol or revoke one.",
                                                    subcommands: [AgentsList.self, AgentsEnrol.self, AgentsRevoke.self], defaultSubcommand: AgentsList.self)
}

struct AgentsList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "Every agent: URL, liveness, last heartbeat, runs held, last error.")

    @OptionGroup var options: CoordinatorOptions

    @Option(help: ArgumentHelp("The coordinator's JSON to FILE (--json alone or --json -: standard output, instead of the table).", valueName: "FILE"))
    var json: String?

    func run() async throws {
        let views: [Coordinator.AgentView] = try await options.call(CoordinatorAPI.agents.method, CoordinatorAPI.agents.path())
        if let json {
            try CLIConventions.writeJSON(try LabJSON.encoder.encode(views), to: json, command: "agents")
            if json == "-" { return }
        }
        let now = Date().timeIntervalSince1970
        print("agent           state    radio  url                              last heartbeat  runs held")
        for v in views {
            let seen = v.lastSeen.map { String(format: "%.0f s ago", max(0, now - $0)) } ?? "never"
            // What agents said about themselves is shown, never obeyed: escaped.
            let held = (v.status?.held ?? []).map { OutsideText.escaped($0) }
            print(String(format: "%@ %@ %@ %@ %@ %@", OutsideText.escaped(v.info.name).padding(toLength: 15, withPad: " ", startingAt: 0), v.state.rawValue.padding(toLength: 8, withPad: " ", startingAt: 0),
                         v.info.radio.rawValue.padding(toLength: 6, withPad: " ", startingAt: 0), OutsideText.escaped(v.info.url).padding(toLength: 32, withPad: " ", startingAt: 0),
                         seen.padding(toLength: 15, withPad: " ", startingAt: 0), held.isEmpty ? "-" : held.joined(separator: ",")))
            if let e = v.lastError {
                let when = v.lastErrorAt.map { String(format: " (%.0f s ago)", max(0, now - $0)) } ?? ""
                print("    last error\(when): \(OutsideText.escaped(e))")
            }
        }
    }
}

/// `herald-lab runs`: list runs and control one (abort, cancel, gather again).
struct RunsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "runs", abstract: "List a coordinator's runs; abort, cancel or gather one again.",
                                                    subcommands: [List.self, Abort.self, Cancel.self, Gather.self], defaultSubcommand: List.self)

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Every run with its state and nodes.")
        @OptionGroup var options: CoordinatorOptions
        @Option(help: ArgumentHelp("The coordinator's JSON to FILE (--json alone or --json -: standard output, instead of the list).", valueName: "FILE"))
        var json: String?
        func run() async throws {
            let runs: [RunRecord] = try await options.call(CoordinatorAPI.runs.method, CoordinatorAPI.runs.path())
            if let json {
                try CLIConventions.writeJSON(try LabJSON.encoder.encode(runs), to: json, command: "runs")
                if json == "-" { return }
            }
            for r in runs {
                let nodes = r.nodes.map { OutsideText.escaped("\($0.name)@\($0.agent) \($0.state.rawValue)") }.joined(separator: ", ")
                print("\(OutsideText.escaped(r.id))  \(r.state.rawValue)  \(nodes)\(r.message.map { "\n    \(OutsideText.escaped($0))" } ?? "")")
            }
        }
    }

    struct Abort: RunAction {
        static let configuration = CommandConfiguration(abstract: "Stop a running run now; what the nodes logged is gathered into its bundle.")
        static let endpoint = CoordinatorAPI.abort
        @OptionGroup var options: CoordinatorOptions
        @Argument(help: "Run id.") var id: String
        static func describe(_ r: RunRecord) -> String { r.state == .cancelled ? "cancelled" : "abort requested; nodes stop and are gathered" }
    }

    struct Cancel: RunAction {
        static let configuration = CommandConfiguration(abstract: "Cancel a run that has not started; its agents are released.")
        static let endpoint = CoordinatorAPI.cancel
        @OptionGroup var options: CoordinatorOptions
        @Argument(help: "Run id.") var id: String
    }

    struct Gather: RunAction {
        static let configuration = CommandConfiguration(abstract: "Gather an ended run again (nodes lost before, a disk that was full).")
        static let endpoint = CoordinatorAPI.gather
        @OptionGroup var options: CoordinatorOptions
        @Argument(help: "Run id.") var id: String
    }
}

/// A command that POSTs `/v1/runs/ID/<verb>` and prints the run's new state.
protocol RunAction: AsyncParsableCommand {
    static var endpoint: Endpoint<NoBody, Data> { get }
    var options: CoordinatorOptions { get }
    var id: String { get }
    static func describe(_ r: RunRecord) -> String
}

extension RunAction {
    static func describe(_ r: RunRecord) -> String { r.state.rawValue }

    func run() async throws {
        guard SafeName.isValid(id) else { log("run id \"\(id)\" \(SafeName.problem(with: id)!)"); throw ExitCode(2) }
        let r: RunRecord = try await options.call(Self.endpoint.method, Self.endpoint.path(id))
        print("run \(r.id): \(Self.describe(r))")
    }
}
