import Foundation
import HeraldCore

/// A test plan: which nodes take part, where they stand, how their sensors are set, how long the
/// test runs and what counts as a pass. Parsed from YAML (`Plan.load`), documented in plans/README.md.
/// Encoded as JSON (durations in seconds) inside manifests and agent assignments.
public struct Plan: Codable, Sendable, Equatable {
    public var name: String
    public var description: String = ""
    public var variant: String = ""
    /// Seconds.
    public var duration: TimeInterval
    /// Seconds after start before the contact event begins.
    public var warmup: TimeInterval = 0
    /// Virtual-time epoch for simulations.
    public var start: Date = Plan.defaultStart
    public var seed: UInt64 = 1
    public var nodes: [NodeSpec]
    public var sensor: SensorSettings = SensorSettings()
    public var radio: RadioSettings = RadioSettings()
    public var thresholds: Thresholds = Thresholds()
    public var agents: AgentSelection = AgentSelection()
    /// Node groups with their own sensor settings (A/B in one run); nil: none.
    public var groups: [NodeGroup]?
    /// A study: factors, levels, repeats, margins (`herald-lab simulate STUDY` expands it).
    public var study: Study?
    /// Which study this run belongs to (`studyRun:`, written by `Plan.expandStudy`); nil: none.
    public var studyRun: StudyMembership?

    public static let defaultStart = Date(timeIntervalSince1970: 1_767_225_600) // 2026-01-01T00:00:00Z

    public init(name: String, duration: TimeInterval, nodes: [NodeSpec]) {
        self.name = name
        self.duration = duration
        self.nodes = nodes
    }

    /// Problems with the plan's numbers, for plans built in code or decoded from JSON (YAML plans
    /// are checked field by field when read, with the same limits, `PlanLimits`). Empty: fine.
    public var rangeProblems: [String] {
        var out = [String]()
        func check(_ path: String, _ v: Double, _ range: ClosedRange<Double>) {
            if !(v.isFinite && range.contains(v)) { out.append("\(path): \(v) is out of range (\(range.lowerBound) to \(range.upperBound))") }
        }
        check("duration", duration, PlanLimits.minimumDuration...PlanLimits.maximumDuration)
        check("warmup", warmup, 0...PlanLimits.maximumDuration)
        if warmup.isFinite, duration.isFinite, warmup >= duration { out.append("warmup: must be shorter than duration") }
        if !(start.timeIntervalSince1970 >= 0 && start < PlanLimits.latestStart) { out.append("start: out of range (years 1970 to 2999)") }
        if nodes.count > PlanLimits.maximumNodes { out.append("nodes: \(nodes.count) nodes; at most \(PlanLimits.maximumNodes)") }
        let c = PlanLimits.maximumCoordinate
        for (i, n) in nodes.enumerated() {
            check("nodes[\(i)].position[0]", n.position.x, -c...c)
            check("nodes[\(i)].position[1]", n.position.y, -c...c)
            if n.power.count > PlanLimits.maximumPowerIntervals { out.append("nodes[\(i)].power: too many intervals") }
            for (j, p) in n.power.enumerated() {
                check("nodes[\(i)].power[\(j)].off", p.off, 0...PlanLimits.maximumDuration)
                if let on = p.on { check("nodes[\(i)].power[\(j)].on", on, 0...PlanLimits.maximumDuration) }
            }
            if let p = n.persona, radio.kind != .sim { out.append("nodes[\(i)].persona: \(PlanReader.personaNeedsSim(p))") }
        }
        if let s = agents.spares { check("agents.spares", Double(s), 0...Double(PlanLimits.maximumNodes)) }
        if let p = agents.preflight { check("agents.preflight", p, 0...600) }
        check("sensor.scan.on", sensor.scanOn, PlanLimits.minimumScanOn...PlanLimits.maximumScanPhase)
        check("sensor.scan.rest", sensor.scanRest, 0...PlanLimits.maximumScanPhase)
        check("sensor.scan.off", sensor.scanOff, 0...PlanLimits.maximumScanPhase)
        check("sensor.advertInterval", sensor.advertInterval, 0.02...10.24)
        check("sensor.connectionTimeout", sensor.connectionTimeout, 0.01...PlanLimits.maximumConnectionTimeout)
        check("sensor.purgeAfter", sensor.purgeAfter, 1...PlanLimits.maximumDuration)
        check("sensor.txPower", Double(sensor.txPower), -127...20)
        check("radio.referencePower", radio.referencePower, -120...0)
        check("radio.pathLossExponent", radio.pathLossExponent, 1...6)
        check("radio.shadowing", radio.shadowing, 0...30)
        check("radio.sensitivity", radio.sensitivity, -130...0)
        check("radio.reportLoss", radio.reportLoss, 0...1)
        check("radio.connectSuccess", radio.connectSuccess, 0...1)
        check("radio.connectLatency", radio.connectLatency, 0...PlanLimits.maximumConnectLatency)
        check("radio.macRotation", radio.macRotation, 0...PlanLimits.maximumDuration)
        if radio.macRotation > 0 && radio.macRotation < 1 { out.append("radio.macRotation: rotating more often than every 1s is not realistic") }
        if let c = radio.crowding {
            let scan = PlanLimits.scanTiming
            if let cap = c.capture { check("radio.crowding.capture", cap, 0...PlanLimits.maximumCapture) }
            if let w = c.scanWindow { check("radio.crowding.scanWindow", w, scan) }
            check("radio.crowding.scanInterval", c.scanInterval, scan)
            if let w = c.scanWindow, w.isFinite, c.scanInterval.isFinite, w > c.scanInterval { out.append("radio.crowding.scanWindow: longer than scanInterval") }
            if let r = c.reportRate { check("radio.crowding.reportRate", r, 1...PlanLimits.maximumReportRate) }
            if let m = c.maxConnections { check("radio.crowding.maxConnections", Double(m), 1...Double(PlanLimits.maximumConnectionLimit)) }
            check("radio.crowding.discoveryTime", c.discoveryTime, 0...PlanLimits.maximumConnectLatency)
            check("radio.crowding.connectLoad", c.connectLoad, 0...1)
        }
        if let d = radio.devices { out += d.problems(at: "radio.devices") }
        if let e = radio.environment { out += e.problems(at: "radio.environment") }
        if let b = radio.phones { out += b.problems(at: "radio.phones") }
        return out
    }

    /// The contact-event window of a run that starts at `start`: from the end of warm-up to the end.
    public func contactEvent(startingAt start: Date) -> ContactEventWindow {
        ContactEventWindow(start: start.addingTimeInterval(warmup), end: start.addingTimeInterval(duration))
    }
}

public struct ContactEventWindow: Codable, Sendable, Equatable {
    public var start: Date
    public var end: Date
    public init(start: Date, end: Date) { self.start = start; self.end = end }
}

/// One node of a plan.
public struct NodeSpec: Codable, Sendable, Equatable {
    public var name: String
    /// Fixed payload identifier (pinned in the plan, or derived from the name).
    public var identifier: Int32
    /// Herald shortName of the node's payload, as every log shows it.
    public var shortName: String
    public var position: Position
    public var tags: [String] = []
    /// Power-off intervals, seconds after start.
    public var power: [PowerInterval] = []
    /// A simulated phone instead of a Linux node (simulations only); nil: a Linux node.
    public var persona: Persona?
    /// The node group this node belongs to (A/B in one run), and that group's sensor settings.
    public var group: String?
    public var sensor: SensorSettings?
    /// An iPhone persona's location permission (`location: off`: the app is suspended in the
    /// background between wake-ups, with `radio.phones`); nil: on.
    public var location: Bool?

    public init(name: String, identifier: Int32? = nil, position: Position, tags: [String] = [], power: [PowerInterval] = [], persona: Persona? = nil) {
        self.name = name
        let id = identifier ?? TestIdentifier.derive(from: TestIdentifier.deviceText(nodeName: name))
        self.identifier = id
        self.shortName = FixedPayloadSupplier(identifier: id).shortName
        self.position = position
        self.tags = tags
        self.power = power
        self.persona = persona
    }
}

/// A phone a simulated node behaves as, toward the Linux nodes around it (plans/README.md):
/// - `android`: Herald for Android: the Herald service and a 0x05F1 pseudo address advertised,
///   the payload read over GATT, Android-style signal writes (HeraldLab's own sensor, which
///   behaves as Herald's Android sensor does).
/// - `ios-foreground`: Herald for iOS in the foreground: the Herald service advertised, the
///   payload readable, the iOS-style signal characteristic.
/// - `ios-background`: Herald for iOS in the background: only Apple manufacturer data
///   advertised (iOS moves service UUIDs to Apple's overflow area), so the Herald service is
///   found only by connecting and discovering services.
/// - `android-receive-only`: Herald for Android on a phone whose Bluetooth cannot advertise
///   (Herald's README names the Samsung J6): it scans and connects like `android`, and makes
///   itself known by writing its payload to each peer every 5 minutes and its RSSI of that peer
///   every 15 s (PROTOCOL.md, "Writes").
public enum Persona: String, Codable, Sendable, CaseIterable {
    case android
    case iosBackground = "ios-background"
    case iosForeground = "ios-foreground"
    case androidReceiveOnly = "android-receive-only"

    public var isAndroid: Bool { self == .android || self == .androidReceiveOnly }
    /// What the persona's detection.csv and the manifest say it runs.
    public var os: String { isAndroid ? "Android" : "iOS" }
    /// Android: the API level (Android 13; the receive-only J6 shipped with Android 8, API 26);
    /// iOS: the version.
    public var osVersion: String {
        switch self {
        case .android: return "33"
        case .androidReceiveOnly: return "26"
        case .iosBackground, .iosForeground: return "16.0"
        }
    }
}

/// A position in metres; encoded as `[x, y]`.
public struct Position: Codable, Sendable, Equatable, CustomStringConvertible {
    public var x: Double
    public var y: Double
    public init(x: Double, y: Double) { self.x = x; self.y = y }
    public init(from decoder: Decoder) throws {
        var c = try decoder.unkeyedContainer()
        x = try c.decode(Double.self)
        y = try c.decode(Double.self)
    }
    public func encode(to encoder: Encoder) throws {
        var c = encoder.unkeyedContainer()
        try c.encode(x)
        try c.encode(y)
    }
    public func distance(to other: Position) -> Double { ((x - other.x) * (x - other.x) + (y - other.y) * (y - other.y)).squareRoot() }
    public var description: String { "(\(x), \(y))" }
}

/// A node is off from `off` until `on` (seconds after start; nil: until the end).
public struct PowerInterval: Codable, Sendable, Equatable {
    public var off: TimeInterval
    public var on: TimeInterval?
    public init(off: TimeInterval, on: TimeInterval?) { self.off = off; self.on = on }
}

/// Herald sensor settings, the same for every node of a plan.
public struct SensorSettings: Codable, Sendable, Equatable {
    public var scanOn: TimeInterval = 4
    public var scanRest: TimeInterval = 1
    public var scanOff: TimeInterval = 2
    public var advertInterval: TimeInterval = 0.25
    public var txPower: Int = -4
    public var includeTxPower: Bool = false
    public var pseudoAddress: Bool = true
    public var connectionTimeout: TimeInterval = 8
    public var payloadSharing: Bool = true
    public var logLevel: LogLevelSetting = .info
    public var purgeAfter: TimeInterval = 15 * 60
    public init() {}
}

public enum LogLevelSetting: String, Codable, Sendable, CaseIterable { case debug, info, fault }

public enum RadioKind: String, Codable, Sendable, CaseIterable { case sim, bluez }

/// Which radio the nodes use, and the simulated radio's parameters.
public struct RadioSettings: Codable, Sendable, Equatable {
    public var kind: RadioKind = .sim
    public var adapter: String = "hci0"
    public var referencePower: Double = -59
    public var pathLossExponent: Double = 2.0
    public var shadowing: Double = 4
    public var sensitivity: Double = -100
    public var reportLoss: Double = 0.1
    public var connectSuccess: Double = 0.95
    public var connectLatency: TimeInterval = 0.3
    public var macRotation: TimeInterval = 0
    /// The crowding model (`radio.crowding`); nil: the idealised radio.
    public var crowding: CrowdingSettings?
    /// Devices that differ and keep their character across runs (`radio.devices`); nil: identical devices.
    public var devices: DeviceVariation?
    /// Runs that differ (`radio.environment`); nil: the same room every run.
    public var environment: RunEnvironment?
    /// Phones that miss windows as phones do (`radio.phones`, persona nodes); nil: phones that never do.
    public var phones: PhoneBehaviour?
    public init() {}
}

/// `radio.crowding`: what makes a crowded room degrade (docs/SIMULATOR.md). `crowding: on` is
/// this struct's defaults, the calibrated model; a part is off when its value is nil (or
/// `collisions` false, `connectLoad` 0). Mapped onto RadioSim's `CrowdingParameters`.
public struct CrowdingSettings: Codable, Sendable, Equatable {
    public var collisions: Bool = true
    /// dB; nil: no capture effect.
    public var capture: Double? = 8
    /// Scanner duty (seconds); nil window: an idealised scanner on all three channels.
    public var scanWindow: TimeInterval? = 0.01125
    public var scanInterval: TimeInterval = 0.01125
    /// Reports per second a controller hands its host; nil: unlimited.
    public var reportRate: Double? = 200
    /// Concurrent connections per controller; nil: unlimited.
    public var maxConnections: Int? = 5
    /// Seconds of service discovery per connection.
    public var discoveryTime: TimeInterval = 1
    /// Failure added per link active nearby (0: off).
    public var connectLoad: Double = 0.02
    public init() {}
}

/// Pass/fail limits for reports, JUnit and regression checks.
public struct Thresholds: Codable, Sendable, Equatable {
    public var detectionPct: Double = 100
    public var continuityPct: Double = 90
    public var pairContinuityPct: Double = 80
    public var timeToFirstDetection: TimeInterval = 60
    public var timeToFirstRead: TimeInterval = 120
    public var regressionTolerancePct: Double = 2
    public init() {}
}

/// How a coordinator picks agents, and with radio bluez their dongles, for a plan
/// (plans/README.md). Quarantined, retired and in-maintenance dongles are never selected.
public struct AgentSelection: Codable, Sendable, Equatable {
    public var count: Int?
    public var names: [String]?
    public var tags: [String]?
    /// Dongles by name (their labels), in node order.
    public var dongles: [String]?
    /// Controller makers: Bluetooth SIG company ids ("2", "0x000F") or names ("Intel").
    public var manufacturer: [String]?
    /// Firmware: LMP subversions ("8870", "0x22a6") or the driver's firmware text.
    public var firmware: [String]?
    /// Extra matching dongles checked with the chosen ones, each taking the place of one that
    /// fails its pre-flight check.
    public var spares: Int?
    /// The longest a pre-flight check may take (seconds); 0: no check.
    public var preflight: TimeInterval?
    public init(count: Int? = nil, names: [String]? = nil, tags: [String]? = nil) {
        self.count = count
        self.names = names
        self.tags = tags
    }

    /// The pre-flight bound when a plan says none.
    public static let defaultPreflight: TimeInterval = 30
}

