import ArgumentParser

@available(macOS 10.15, macCatalyst 13, iOS 13, tvOS 13, watchOS 6, *)
@main
struct HeraldLab: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-lab",
        abstract: "A test lab for the Herald BLE proximity protocol.",
        subcommands: [PlanCommand.self, SimulateCommand.self, AnalyseCommand.self, CompareCommand.self, RegressCommand.self, HistoryCommand.self, AirCommand.self, AgentCommand.self, NodeCommand.self, CoordinatorCommand.self, RunCommand.self, AgentsCommand.self, RunsCommand.self, BenchCommand.self]
    )
}
