import Foundation
import HeraldCore
import HeraldRadio
import HeraldLogs
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
    /// Threads that hand scan reports to the nodes (`SimMedium` lanes); the logs are the same for any number.
    public let threads: Int

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

    /// `threads`: default both cores (at most 2; more gains nothing measurable on a hot path bound by memory).
    public init(plan: Plan, planText: String, seed: UInt64? = nil, output: URL, runId: String? = nil, threads: Int? = nil) {
        self.plan = plan
        self.planText = planText
        self.seed = seed ?? plan.seed
        self.output = output
        self.runId = runId ?? output.lastPathComponent
        self.threads = max(1, min(8, threads ?? min(2, ProcessInfo.processInfo.activeProcessorCount)))
    }

    /// The version simulated Linux nodes write to detection.csv: the one node identifiers are
    /// derived with (`<name>:Linux:Linux:6.1`). Real nodes write their kernel release.
    public static let linuxVersion = "6.1"

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
        p.devices = r.devices
        p.environment = r.environment
        p.phones = r.phones
        return p
    }

    /// Runs the plan; `progress` is called with the simulated fraction done (0...1) a few times a run.
    public func run(progress: (Double) -> Void = { _ in }) throws -> Result {
        let wallStart = Date()
        if let problem = plan.rangeProblems.first { throw SimulationError.invalidPlan(problem) }
        let fm = FileManager.default
        let nodesDir = output.appendingPathComponent("nodes")
        // A nodes folder that cannot be listed is an error, not an empty one to write into.
        if fm.fileExists(atPath: nodesDir.path), !(try fm.contentsOfDirectory(atPath: nodesDir.path)).isEmpty {
            throw SimulationError.outputNotEmpty(output.path)
        }
        try fm.createDirectory(at: nodesDir, withIntermediateDirectories: true)

        let scheduler = VirtualScheduler(start: plan.start)
        // An iPhone persona acts the moment it hears an advert (iOS connects at once), which
        // parallel lanes forbid: plans with personas hand reports over on one thread.
        let lanes = plan.nodes.contains { $0.persona != nil } ? 1 : threads
        let medium = SimMedium(scheduler: scheduler, parameters: Self.parameters(plan.radio), seed: seed, lanes: lanes)
        defer { medium.finishDeliveries() }
        var runners = [SimulatedNode]()
        var startOffsets = SeededGenerator(seed: seed, stream: "start-offsets")
        for spec in plan.nodes {
            let transport = medium.addNode(name: spec.name, x: spec.position.x, y: spec.position.y)
            for p in spec.power { medium.schedulePower(node: transport.index, off: p.off, on: p.on) }
            switch spec.persona {
            case .android?, .androidReceiveOnly?: medium.setPhone(transport.index, kind: .android)
            case .iosBackground?, .iosForeground?: medium.setPhone(transport.index, kind: .iPhone(location: spec.location ?? true))
            case nil: break
            }
            let assignment = NodeAssignment(runId: runId, plan: plan, node: spec, seed: seed)
            let runner = SimulatedNode(assignment: assignment, transport: transport, directory: nodesDir.appendingPathComponent(spec.name))
            runners.append(runner)
            // Real devices are never switched on in the same millisecond: start within the first second.
            let offset = startOffsets.nextUnit()
            medium.clock(of: transport.index).schedule(after: offset) { runner.start() }
        }
        let end = plan.start.addingTimeInterval(plan.duration)
        let steps = max(1, min(100, Saturating.int(plan.duration / 60)))
        for k in 1...steps {
            scheduler.run(until: plan.start.addingTimeInterval(plan.duration * Double(k) / Double(steps)))
            medium.flushDeliveries()
            progress(Double(k) / Double(steps))
        }
        scheduler.run(until: end)
        medium.flushDeliveries()
        for r in runners { r.stop() }
        medium.finishDeliveries()

        // The files' SHA-256 on every thread (a 100-node hour is about 5 GB), in node order.
        let directories = runners.map(\.directory)
        let hashes = try Self.hashFiles(directories, names: NodeRunner.heraldFiles, threads: threads)
        var manifestNodes = [Manifest.Node]()
        for (k, (spec, runner)) in zip(plan.nodes, runners).enumerated() {
            var node = Manifest.Node(name: spec.name, identifier: spec.identifier, shortName: runner.shortName,
                                     osVersion: runner.osVersion, position: spec.position, radio: "sim")
            node.os = runner.os
            node.persona = spec.persona?.rawValue
            if plan.radio.devices != nil { node.character = medium.character(ofNode: k) }
            node.startedAt = plan.start
            node.state = spec.power.contains { $0.on == nil } ? .partial : .complete
            for (file, entry) in zip(NodeRunner.heraldFiles, hashes[k]) { node.files[file] = entry }
            manifestNodes.append(node)
        }
        var manifest = Manifest(runId: runId, createdAt: end, mode: .simulate, seed: seed, plan: plan, planText: planText,
                                contactEvent: plan.contactEvent(startingAt: plan.start), nodes: manifestNodes)
        if plan.radio.environment != nil {
            manifest.environment = .init(pathLossOffset: medium.roomOffset, bursts: medium.bursts, burstSeconds: medium.burstSeconds)
        }
        try manifest.write(to: output.appendingPathComponent("manifest.json"))
        return Result(manifest: manifest, bundle: output, wallSeconds: Date().timeIntervalSince(wallStart),
                      simulatedSeconds: plan.duration, schedulerEvents: scheduler.executedCount,
                      advertisingEvents: medium.advertisingEvents, reportsDelivered: medium.reportsDelivered,
                      collisionsLost: medium.collisionsLost, reportsDropped: medium.reportsDropped,
                      connectionsRefused: medium.connectionsRefused)
    }
}

/// One node of a simulation: a Linux node (HeraldLab's sensor and logs), or a phone persona.
/// An Android phone runs the same sensor (Herald's Android sensor is its model) and says Android
/// in detection.csv; an iPhone is an `IOSPersona`. Simulated nodes run no kernel of their own:
/// Linux nodes report `Simulation.linuxVersion`, so that a bundle is the same on every machine.
final class SimulatedNode {
    private enum Kind { case sensor(NodeRunner), iPhone(IOSPersona) }
    private let kind: Kind
    let directory: URL

    init(assignment: NodeAssignment, transport: SimTransport, directory: URL) {
        self.directory = directory
        switch assignment.node.persona {
        case nil:
            kind = .sensor(NodeRunner(assignment: assignment, transport: transport, directory: directory, power: MainsPower(),
                                      osVersion: assignment.osVersion ?? Simulation.linuxVersion, writing: .batch))
        case let p? where p.isAndroid:
            // A receive-only phone's radio refuses to advertise, as such a phone's does: the
            // sensor then writes its payload and RSSI to its peers instead.
            transport.canAdvertise = p != .androidReceiveOnly
            kind = .sensor(NodeRunner(assignment: assignment, transport: transport, directory: directory, power: MainsPower(),
                                      os: p.os, osVersion: p.osVersion, writing: .batch))
        case let p?:
            let phone = IOSPersona(mode: p == .iosForeground ? .foreground : .background, assignment: assignment,
                                   transport: transport, directory: directory, osVersion: p.osVersion)
            phone.findsOverflowInBackground = assignment.radio.phones != nil && (assignment.node.location ?? true)
            kind = .iPhone(phone)
        }
    }

    func start() {
        switch kind { case .sensor(let r): r.start(); case .iPhone(let p): p.start() }
    }
    func stop() {
        switch kind { case .sensor(let r): r.stop(); case .iPhone(let p): p.stop() }
    }
    var shortName: String {
        switch kind { case .sensor(let r): return r.payload.shortName; case .iPhone(let p): return p.payload.shortName }
    }
    var os: String {
        switch kind { case .sensor(let r): return r.os; case .iPhone(let p): return p.os }
    }
    var osVersion: String {
        switch kind { case .sensor(let r): return r.osVersion; case .iPhone(let p): return p.osVersion }
    }
}

extension Simulation {
    /// SHA-256 and size of each named file in each folder, folders shared among `threads`
    /// threads; the first failure (in folder order) is thrown.
    static func hashFiles(_ directories: [URL], names: [String], threads: Int) throws -> [[Manifest.FileEntry]] {
        // Invariant (unchecked Sendable): every field is read and written under `lock`, and read
        // without it only after every thread has ended.
        final class Results: @unchecked Sendable {
            var entries: [[Manifest.FileEntry]?]
            var errors: [(any Error)?]
            let lock = NSLock()
            var next = 0
            init(_ n: Int) { entries = Array(repeating: nil, count: n); errors = Array(repeating: nil, count: n) }
            func take() -> Int? { lock.lock(); defer { lock.unlock() }; guard next < entries.count else { return nil }; next += 1; return next - 1 }
        }
        let results = Results(directories.count)
        DispatchQueue.concurrentPerform(iterations: max(1, min(threads, directories.count))) { _ in
            while let k = results.take() {
                do {
                    let entries = try names.map { name -> Manifest.FileEntry in
                        let (sha, bytes) = try SHA256.hash(fileAt: directories[k].appendingPathComponent(name))
                        return Manifest.FileEntry(bytes: bytes, sha256: sha)
                    }
                    results.lock.lock(); results.entries[k] = entries; results.lock.unlock()
                } catch {
                    results.lock.lock(); results.errors[k] = error; results.lock.unlock()
                }
            }
        }
        if let error = results.errors.compactMap({ $0 }).first { throw error }
        return results.entries.map { $0 ?? [] }
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
