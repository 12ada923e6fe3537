import Foundation
import HeraldCore
import HeraldRadio
import HeraldLogs
import HeraldSensor
import LabPlan

/// One lab node: the fixed-identifier payload, a Herald BLE sensor over a transport, and the
/// Herald loggers writing into the node's folder. The same runner serves `simulate` (a
/// `SimTransport` on virtual time), agents on the air (`AirTransport`) and agents on BlueZ.
/// Use it only on the transport's scheduler (for a DispatchScheduler: through `execute`/`sync`).
public final class NodeRunner {
    /// The files a node folder holds, and nothing else.
    public static let heraldFiles = NodeLogs.fileNames

    public let assignment: NodeAssignment
    public let directory: URL
    public let payload: FixedPayloadSupplier
    public let sensor: BLESensor
    public let array: SensorArray
    public let logs: NodeLogs
    private let counters: NodeCounters
    private let transport: any BLETransport
    public private(set) var state: NodeStatus.State = .idle
    /// What detection.csv and the status say the node runs.
    public let os: String
    public let osVersion: String

    /// - Parameters:
    ///   - power: where battery.csv's readings come from: by default the machine's power supply
    ///     (/sys/class/power_supply; mains when it has no battery).
    ///   - os, osVersion: what detection.csv says; the version defaults to the assignment's, else
    ///     the machine's kernel release (`uname -r`).
    ///   - writing: `.batch` for a simulation in virtual time (files written in large blocks and at
    ///     close), `.live` wherever someone may read the folder while the node runs.
    public init(assignment: NodeAssignment, transport: any BLETransport, directory: URL, power: any PowerSource = SysfsPowerSupply(),
                os: String = "Linux", osVersion: String? = nil, writing: LogWriting = .live) {
        self.assignment = assignment
        self.directory = directory
        self.os = os
        self.osVersion = osVersion ?? assignment.osVersion ?? HostSystem.kernelRelease() ?? "unknown"
        let scheduler = transport.scheduler
        self.transport = transport
        payload = FixedPayloadSupplier(identifier: assignment.node.identifier)
        logs = NodeLogs(directory: directory, deviceName: assignment.node.name, os: os, osVersion: self.osVersion,
                        ownShortName: payload.shortName, scheduler: scheduler,
                        logLevel: SensorLogger.Level(name: assignment.sensor.logLevel.rawValue) ?? .info, power: power, writing: writing)
        var settings = BLESensorSettings(assignment.sensor)
        if assignment.radio.kind != .sim { settings.connectionSpread = BLESensorSettings.labConnectionSpread }
        sensor = BLESensor(transport: transport, payloadDataSupplier: payload, settings: settings,
                           random: SeededGenerator(seed: assignment.seed, stream: "sensor/\(assignment.node.name)"),
                           log: LoggerBridge(logs.logger))
        array = SensorArray(ble: sensor)
        counters = NodeCounters(scheduler: scheduler, ownShortName: payload.shortName)
        for d in logs.delegates { array.add(delegate: d) }
        array.add(delegate: counters)
    }

    public func start() {
        guard state == .idle || state == .armed else { return }
        state = .running
        logs.logger.log(.info, subsystem: "HeraldLab", category: "Node", "node \(assignment.node.name) starts run \(assignment.runId) (payload \(payload.shortName), identifier \(assignment.node.identifier))")
        array.start()
    }

    /// Stops the sensor and flushes and closes every log file.
    public func stop() {
        guard state == .running else { return }
        array.stop()
        state = .stopped
        logs.logger.log(.info, subsystem: "HeraldLab", category: "Node", "node \(assignment.node.name) stopped")
        logs.close()
    }

    /// Where a radio's own diagnostics go: log.txt, category Radio. Call on the scheduler.
    public var radioLog: (String) -> Void {
        { [logs] message in logs.logger.log(.info, subsystem: "HeraldLab", category: "Radio", message) }
    }

    /// The first log file that could not be written, and why.
    public var writeError: String? { logs.writeError }

    /// Flushes every log to disk (the files stay open).
    public func flush() { logs.flush() }

    public var status: NodeStatus {
        var s = NodeStatus(state: state, peersDetected: counters.peers.count, payloadsRead: counters.payloadsRead,
                           rssiLastMinute: counters.rssiLastMinute, rssiTotal: counters.rssiTotal, peers: counters.peers.sorted(),
                           osVersion: osVersion, radio: transport.condition)
        s.recentPeers = counters.recentPeers
        return s
    }
}

extension BLESensorSettings {
    public init(_ s: SensorSettings) {
        self.init()
        scanOn = s.scanOn
        scanRest = s.scanRest
        scanOff = s.scanOff
        advertInterval = s.advertInterval
        txPower = s.txPower
        includeTxPower = s.includeTxPower
        pseudoAddress = s.pseudoAddress
        connectionTimeout = s.connectionTimeout
        payloadSharing = s.payloadSharing
        purgeAfter = s.purgeAfter
    }
}

/// The sensor's diagnostic log goes to log.txt.
final class LoggerBridge: SensorLog {
    let logger: SensorLogger
    init(_ logger: SensorLogger) { self.logger = logger }
    func isEnabled(_ level: SensorLogLevel) -> Bool { logger.isEnabled(SensorLogger.Level(rawValue: level.rawValue) ?? .info) }
    func log(_ level: SensorLogLevel, subsystem: String, category: String, _ message: String) {
        logger.log(SensorLogger.Level(rawValue: level.rawValue) ?? .info, subsystem: subsystem, category: category, message)
    }
}
