import Foundation
import HeraldCore
import LabBuildInfo

/// The software that wrote a bundle.
public enum HeraldLabVersion {
    public static let name = "herald-lab"
    public static let version = BuildInfo.version
    /// The commit the binary was built from (`herald-lab --version`).
    public static var commit: String { BuildInfo.commit }
}

/// One node's slice of a plan, as the simulator builds it and as a coordinator sends it to an agent.
public struct NodeAssignment: Codable, Sendable, Equatable {
    public var runId: String
    public var planName: String
    public var node: NodeSpec
    public var sensor: SensorSettings
    public var radio: RadioSettings
    /// Seed of the node's random generators (derived from the run's seed and the node name).
    public var seed: UInt64
    /// Seconds.
    public var duration: TimeInterval
    public var warmup: TimeInterval
    /// OS version written to detection.csv and reported in the node's status; nil (the default):
    /// the node's own kernel release (`uname -r`), read where it runs.
    public var osVersion: String?

    public init(runId: String, plan: Plan, node: NodeSpec, seed: UInt64? = nil, osVersion: String? = nil) {
        self.runId = runId
        self.planName = plan.name
        self.node = node
        self.sensor = node.sensor ?? plan.sensor
        self.radio = plan.radio
        self.seed = seed ?? plan.seed
        self.duration = plan.duration
        self.warmup = plan.warmup
        self.osVersion = osVersion
    }
}

/// `manifest.json` of a results bundle (docs/BUNDLE.md).
public struct Manifest: Codable, Sendable, Equatable {
    public static let formatName = "heraldlab-bundle/1"

    public struct Software: Codable, Sendable, Equatable {
        public var name = HeraldLabVersion.name
        public var version = HeraldLabVersion.version
        /// Absent in bundles written before 0.2.0.
        public var commit: String? = HeraldLabVersion.commit
        public init() {}
    }

    public struct Skew: Codable, Sendable, Equatable {
        public var p50Ms: Double
        public var p99Ms: Double
        public var maxMs: Double
        public init(p50Ms: Double, p99Ms: Double, maxMs: Double) { self.p50Ms = p50Ms; self.p99Ms = p99Ms; self.maxMs = maxMs }
    }

    public struct FileEntry: Codable, Sendable, Equatable {
        public var bytes: Int64
        public var sha256: String
        public init(bytes: Int64, sha256: String) { self.bytes = bytes; self.sha256 = sha256 }
    }

    public struct AgentInfo: Codable, Sendable, Equatable {
        public var name: String
        public var url: String
        public var tags: [String]
        public var version: String
        public init(name: String, url: String, tags: [String], version: String) { self.name = name; self.url = url; self.tags = tags; self.version = version }
    }

    /// complete: logs cover the whole run; partial: they have gaps (see `gaps`) or the run was
    /// stopped early; lost: nothing could be gathered. HeraldCore's, shared with the analyser.
    public typealias NodeState = BundleNodeState

    /// A period without rows the node can vouch for, in coordinator time.
    public struct Gap: Codable, Sendable, Equatable {
        public var from: Date
        public var to: Date
        public var reason: String
        public init(from: Date, to: Date, reason: String) { self.from = from; self.to = to; self.reason = reason }
    }

    public struct Node: Codable, Sendable, Equatable {
        public var name: String
        public var identifier: Int32
        public var shortName: String
        public var os: String = "Linux"
        public var osVersion: String
        /// The phone a simulated node behaves as (`android`, `android-receive-only`, `ios-background`, `ios-foreground`);
        /// nil for a Linux node.
        public var persona: String?
        public var position: Position?
        public var radio: String
        public var clockOffset: Double = 0
        public var clockRoundTrip: Double?
        public var startedAt: Date?
        /// How late the node started against the instant it was given, both in its own clock
        /// (exact; the clock offset's own error is bounded by `clockRoundTrip / 2`).
        public var startDelayMs: Double?
        public var state: NodeState = .complete
        public var gaps: [Gap]?
        /// Why the node is not complete, when it is not.
        public var message: String?
        /// Controller identity: a JSON object as the BlueZ radio reports it, or nil.
        public var controller: [String: String]?
        /// The bluetoothd the node ran with (radio bluez): "5.82", or why it is unknown.
        public var bluezVersion: String?
        /// The dongle that ran the node (radio bluez): its identity, where it was plugged, and
        /// its health when the run was armed.
        public var dongle: LabWire.DongleInfo?
        public var dongleHealth: LabWire.DongleHealth?
        /// What the node's radio did to get its dongle back (power cycles, USB resets).
        public var recoveries: [LabWire.Recovery]?
        public var agent: AgentInfo?
        /// A simulated device's drawn character (`radio.devices` on), the same in every run.
        public var character: DeviceCharacter?
        public var files: [String: FileEntry] = [:]
        public init(name: String, identifier: Int32, shortName: String, osVersion: String, position: Position?, radio: String) {
            self.name = name
            self.identifier = identifier
            self.shortName = shortName
            self.osVersion = osVersion
            self.position = position
            self.radio = radio
        }
    }

    public var format = Manifest.formatName
    public var runId: String
    public var createdAt: Date
    public var software = Software()
    public var mode: BundleMode
    public var seed: UInt64
    public var plan: Plan
    public var planText: String
    public var contactEvent: ContactEventWindow
    /// Spread of the nodes' actual starts around the intended instant `startAt`, from each
    /// node's own measure of how late it started.
    public var startSkew: Skew?
    /// The intended common start (coordinator clock).
    public var startAt: Date?
    public var nodes: [Node]
    /// The dongles' pre-flight checks (radio bluez): who passed, who was left out and why.
    public var preflight: [LabWire.PreflightVerdict]?
    /// What the simulated room did in this run (`radio.environment` on).
    public var environment: EnvironmentRecord?
    /// True when an operator aborted the run: its logs stop early and it has no verdict (issue 40).
    public var aborted: Bool?
    /// The lab that ran it (the coordinator's `--lab NAME`, its name in a shared results store;
    /// issue 41); absent when the coordinator was given none.
    public var lab: String?

    /// A simulated run's draw of its environment.
    public struct EnvironmentRecord: Codable, Sendable, Equatable {
        /// dB added to every path in this run.
        public var pathLossOffset: Double
        /// Interference bursts that began, and their total length in seconds.
        public var bursts: Int
        public var burstSeconds: Double
        public init(pathLossOffset: Double, bursts: Int, burstSeconds: Double) {
            self.pathLossOffset = pathLossOffset
            self.bursts = bursts
            self.burstSeconds = burstSeconds
        }
    }

    public init(runId: String, createdAt: Date, mode: BundleMode, seed: UInt64, plan: Plan, planText: String, contactEvent: ContactEventWindow, nodes: [Node]) {
        self.runId = runId
        self.createdAt = createdAt
        self.mode = mode
        self.seed = seed
        self.plan = plan
        self.planText = planText
        self.contactEvent = contactEvent
        self.nodes = nodes
    }

    /// JSON with ISO 8601 millisecond times, keys sorted, pretty-printed.
    public func encoded() throws -> Data {
        try Manifest.encoder.encode(self)
    }

    /// Written durably: the manifest is what makes a bundle complete.
    public func write(to url: URL) throws {
        try Durable.write(encoded(), to: url)
    }

    public static func read(from url: URL) throws -> Manifest {
        try decoder.decode(Manifest.self, from: Data(contentsOf: url))
    }

    public static var encoder: JSONEncoder {
        let e = JSONEncoder()
        e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        e.dateEncodingStrategy = .custom { date, encoder in
            var c = encoder.singleValueContainer()
            try c.encode(HeraldTimestamp.iso8601(date))
        }
        return e
    }

    public static var decoder: JSONDecoder {
        let d = JSONDecoder()
        d.dateDecodingStrategy = .custom { decoder in
            let c = try decoder.singleValueContainer()
            let s = try c.decode(String.self)
            guard let date = HeraldTimestamp.parse(s) else {
                throw DecodingError.dataCorruptedError(in: c, debugDescription: "not an ISO 8601 time: \(s)")
            }
            return date
        }
        return d
    }
}
