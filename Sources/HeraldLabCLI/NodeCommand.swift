import ArgumentParser
import BlueZRadio
import Foundation
import HeraldCore
import HeraldLogs
import HeraldRadio
import LabHTTP
import LabNode
import LabPlan

/// `herald-lab node PLAN --node NAME --adapter hci0 --out DIR`: one node of a plan on this
/// machine's Bluetooth adapter, without a coordinator (bring-up of a new node, BlueZ tests).
struct NodeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "node",
        abstract: "Run one node of a plan on this machine's Bluetooth adapter (BlueZ) and write its Herald logs."
    )

    @Argument(help: "Plan file (YAML).")
    var plan: String

    @Option(help: "The plan's node to be.")
    var node: String

    @Option(help: "BlueZ adapter: name (hci0) or address.")
    var adapter: String = "hci0"

    @Option(help: "Folder for the Herald logs (default: results/<plan>-node-<node>).")
    var out: String?

    @Option(help: "How long to run, such as 2m or 8h (default: the plan's duration).", transform: Flags.duration(min: 0.001, max: PlanLimits.maximumDuration))
    var duration: TimeInterval?

    @Option(help: "Time between status lines, 100ms to 1d (default: 10s).", transform: Flags.duration(min: 0.1, max: 86_400))
    var every: TimeInterval = 10

    @Option(name: .customLong("power-supply"), help: "Folder of the machine's power supplies, read for battery.csv (mains when it has no battery).")
    var powerSupply: String = "/sys/class/power_supply"

    func run() async throws {
        let plan = try loadPlan(self.plan)
        guard let spec = plan.nodes.first(where: { $0.name == node }) else {
            log("herald-lab node: plan \(plan.name) has no node \"\(node)\"; its nodes are \(plan.nodes.map(\.name).joined(separator: ", "))")
            throw ExitCode(2)
        }
        if let persona = spec.persona {
            log("herald-lab node: node \(node) is a simulated phone (persona \(persona.rawValue)); herald-lab simulate runs it")
            throw ExitCode(2)
        }
        let dir = URL(fileURLWithPath: out ?? "results/\(plan.name)-node-\(node)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let identity = ControllerIdentity.read(adapter: adapter)
        try LabJSON.encoder.encode(identity).write(to: dir.appendingPathComponent("controller.json"), options: .atomic)
        log("node \(node): controller \(adapter): \(identity.summary)")

        var assignment = NodeAssignment(runId: "\(plan.name)-\(node)", plan: plan, node: spec)
        assignment.duration = duration ?? plan.duration
        let scheduler = DispatchScheduler(label: "heraldlab.node")
        let transport = BlueZTransport(options: .init(adapter: adapter), scheduler: scheduler)
        let runner = scheduler.sync {
            let runner = NodeRunner(assignment: assignment, transport: transport, directory: dir,
                                    power: SysfsPowerSupply(root: URL(fileURLWithPath: powerSupply)))
            transport.log = { message in runner.radioLog(message); log("node \(spec.name): \(message)") }
            runner.start()
            return runner
        }
        let boxed = UncheckedBox(runner)
        log("node \(node): running for \(formatDuration(assignment.duration)) on \(adapter); logs in \(dir.path) (Ctrl-C stops early)")
        let started = Date()
        let status = Task {
            while !Task.isCancelled {
                try? await Task.sleep(nanoseconds: UInt64(Saturating.nanoseconds(every)))
                guard !Task.isCancelled else { break }
                let s = scheduler.sync { boxed.value.status }
                log(String(format: "node %@ %5.0fs: radio %@, peers %d [%@], payload reads %d, RSSI %d (%d in the last minute)",
                           spec.name, Date().timeIntervalSince(started), scheduler.sync { transport.state.rawValue },
                           s.peersDetected, s.peers.joined(separator: " "), s.payloadsRead, s.rssiTotal, s.rssiLastMinute)
                    + (s.radio.map { "; \($0)" } ?? ""))
            }
        }
        if await waitForTermination(timeout: assignment.duration) { log("node \(node): stopping early on a signal") }
        status.cancel()
        let final = scheduler.sync {
            boxed.value.stop()
            transport.close()
            return boxed.value.status
        }
        print("node \(spec.name): peers \(final.peersDetected) [\(final.peers.joined(separator: " "))], payload reads \(final.payloadsRead), RSSI rows \(final.rssiTotal)")
        print("logs: \(dir.path)")
    }
}

extension ControllerIdentity {
    var summary: String {
        switch self {
        case .unavailable(let why): return "identity unavailable (\(why))"
        case .controller(let c):
            return "\(c.address), \(c.manufacturerName ?? "manufacturer \(c.manufacturer)"), HCI \(c.hciVersion) LMP \(c.lmpVersion).\(c.lmpSubversion)"
        }
    }
}
