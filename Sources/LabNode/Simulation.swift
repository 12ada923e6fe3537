import Foundation
import HeraldCore
import HeraldRadio
import LabPlan
import RadioSim

/// Runs every node of a plan in one process on virtual time, over one simulated medium, and
/// writes a results bundle (docs/BUNDLE.md). The same seed gives byte-identical logs.
public final class Simulation {
    public let plan: Plan
    public let planText: String
    public let seed: UInt64
    public let output: URL
    public let runId: String

    public struct Result: Sendable {
        public var manifest: Manifest
        public var bundle: URL
        public var wallSeconds: Double
        public var simulatedSeconds: Double
        public var schedulerEvents: UInt64
        public var advertisingEvents: Int
        public var reportsDelivered: Int
        /// Crowding counters (0 with crowding off).
        public var collisionsLost: Int = 0
        public var reportsDropped: Int = 0
        public var connectionsRefused: Int = 0
    }

    public init(plan: Plan, planText: String, seed: UInt64? = nil, output: URL, runId: String? = nil) {
        self.plan = plan
        self.planText = planText
        self.seed = seed ?? plan.seed
        self.output = output
        self.runId = runId ?? output.lastPathComponent
    }

    public static func parameters(_ r: RadioSettings) -> RadioParameters {
        var p = RadioParameters()
        p.referencePower = r.referencePower
        p.pathLossExponent = r.pathLossExponent
        p.shadowing = r.shadowing
        p.sensitivity = r.sensitivity
        p.reportLoss = r.reportLoss
        p.connectSuccess = r.connectSuccess
        p.connectLatency = r.connectLatency
        p.macRotation = r.macRotation
        if let c = r.crowding {
            var k = CrowdingParameters()
            k.collisions = c.collisions
            k.capture = c.capture
            k.scanWindow = c.scanWindow
            k.scanInterval = c.scanInterval
            k.reportRate = c.reportRate
            k.maxConnections = c.maxConnections
            k.discoveryTime = c.discoveryTime
            k.connectLoad = c.connectLoad
            p.crowding = k
        }
        return p
    }

    /// Runs the plan; `progress` is called with the simulated fraction done (0...1) a few times a run.
    public func run(progress: (Double) -> Void = { _ in }) throws -> Result {
        let wallStart = Date()
        if let problem = plan.rangeProblems.first { throw SimulationError.invalidPlan(problem) }
        let fm = FileManager.default
        let nodesDir = output.appendingPathComponent("nodes")
        if fm.fileExists(atPath: nodesDir.path), let existing = try? fm.contentsOfDirectory(atPath: nodesDir.path), !existing.isEmpty {
            throw SimulationError.outputNotEmpty(output.path)
        }
        try fm.createDirectory(at: nodesDir, withIntermediateDirectories: true)

        let scheduler = VirtualScheduler(start: plan.start)
        let medium = SimMedium(scheduler: scheduler, parameters: Self.parameters(plan.radio), seed: seed)
        var runners = [NodeRunner]()
        var startOffsets = SeededGenerator(seed: seed, stream: "start-offsets")
        for spec in plan.nodes {
            let transport = medium.addNode(name: spec.name, x: spec.position.x, y: spec.position.y)
            for p in spec.power { medium.schedulePower(node: transport.index, off: p.off, on: p.on) }
            let assignment = NodeAssignment(runId: runId, plan: plan, node: spec, seed: seed)
            let runner = NodeRunner(assignment: assignment, transport: transport, directory: nodesDir.appendingPathComponent(spec.name), writing: .batch)
            runners.append(runner)
            // Real devices are never switched on in the same millisecond: start within the first second.
            let offset = startOffsets.nextUnit()
            scheduler.schedule(after: offset) { runner.start() }
        }
        let end = plan.start.addingTimeInterval(plan.duration)
        let steps = max(1, min(100, Int(plan.duration / 60)))
        for k in 1...steps {
            scheduler.run(until: plan.start.addingTimeInterval(plan.duration * Double(k) / Double(steps)))
            progress(Double(k) / Double(steps))
        }
        scheduler.run(until: end)
        for r in runners { r.stop() }

        var manifestNodes = [Manifest.Node]()
        for (spec, runner) in zip(plan.nodes, runners) {
            var node = Manifest.Node(name: spec.name, identifier: spec.identifier, shortName: runner.payload.shortName,
                                     osVersion: runner.assignment.osVersion, position: spec.position, radio: "sim")
            node.startedAt = plan.start
            node.state = spec.power.contains { $0.on == nil } ? .partial : .complete
            for file in NodeRunner.heraldFiles {
                let url = runner.directory.appendingPathComponent(file)
                let (sha, bytes) = try SHA256.hash(fileAt: url)
                node.files[file] = Manifest.FileEntry(bytes: bytes, sha256: sha)
            }
            manifestNodes.append(node)
        }
        let manifest = Manifest(runId: runId, createdAt: end, mode: "simulate", seed: seed, plan: plan, planText: planText,
                                contactEvent: plan.contactEvent(startingAt: plan.start), nodes: manifestNodes)
        try manifest.write(to: output.appendingPathComponent("manifest.json"))
        return Result(manifest: manifest, bundle: output, wallSeconds: Date().timeIntervalSince(wallStart),
                      simulatedSeconds: plan.duration, schedulerEvents: scheduler.executedCount,
                      advertisingEvents: medium.advertisingEvents, reportsDelivered: medium.reportsDelivered,
                      collisionsLost: medium.collisionsLost, reportsDropped: medium.reportsDropped,
                      connectionsRefused: medium.connectionsRefused)
    }
}

public enum SimulationError: Error, CustomStringConvertible {
    case outputNotEmpty(String)
    /// A plan whose numbers are out of range (`Plan.rangeProblems`).
    case invalidPlan(String)
    public var description: String {
        switch self {
        case .invalidPlan(let problem): return "the plan cannot be simulated: \(problem)"
        case .outputNotEmpty(let path): return "\(path)/nodes already holds node folders; choose another --out (bundles are never overwritten)"
        }
    }
}
