import ArgumentParser
import Foundation
import LabBuildInfo
import LabLog
import Logging

@available(macOS 10.15, macCatalyst 13, iOS 13, tvOS 13, watchOS 6, *)
@main
struct HeraldLab: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-lab",
        abstract: "A test lab for the Herald BLE proximity protocol.",
        version: BuildInfo.line,
        subcommands: [PlanCommand.self, SimulateCommand.self, AnalyseCommand.self, CompareCommand.self, RegressCommand.self, HistoryCommand.self, AirCommand.self, AgentCommand.self, NodeCommand.self, CoordinatorCommand.self, RunCommand.self, AgentsCommand.self, DonglesCommand.self, RunsCommand.self, CACommand.self, EnrolCommand.self, ResultsStoreCommand.self]
    )

    /// As ArgumentParser's, except that a command line it cannot parse exits 2 like every other
    /// bad input (ArgumentParser's own code is 64), with its message and usage; `--json` alone is
    /// `--json -` (standard output), and a mistyped subcommand is told the close one.
    static func main() async {
        // The services' logs (coordinator, agent, air, their HTTP): one line per event on stderr,
        // outside text escaped; each service sets its level from --log-level.
        LoggingSystem.bootstrap { LabLogHandler(label: $0) }
        // One --json [FILE] on every command (CLIConventions), and a subcommand that is not one
        // answered with the close one, exit 2.
        let arguments = CLIConventions.normalizeJSON(Array(CommandLine.arguments.dropFirst()))
        if let unknown = CLIConventions.unknownSubcommand(arguments, root: HeraldLab.self) {
            FileHandle.standardError.write(Data("\(unknown)\n".utf8))
            Foundation.exit(2)
        }
        do {
            var command = try parseAsRoot(arguments)
            if var async = command as? AsyncParsableCommand { try await async.run() } else { try command.run() }
        } catch {
            if exitCode(for: error) == .validationFailure {
                FileHandle.standardError.write(Data((fullMessage(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            exit(withError: error)
        }
    }
}
