import ArgumentParser

struct HeraldLab: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-lab",
        abstract: "A test lab for the Herald BLE proximity protocol.",
        subcommands: [PlanCommand.self, SimulateCommand.self, AnalyseCommand.self, CompareCommand.self, RegressCommand.self, HistoryCommand.self]
    )
}
