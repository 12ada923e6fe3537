import Foundation
import HeraldRadio
import HeraldCore

/// Parameters of the simulated radio (plans' `radio:` section).
public struct RadioParameters: Sendable, Equatable, Codable {
    /// RSSI in dBm at 1 m from a 0 dBm transmitter.
    public var referencePower: Double = -59
    /// Log-distance path-loss exponent.
    public var pathLossExponent: Double = 2.0
    /// Standard deviation of the seeded shadowing noise, dB.
    public var shadowing: Double = 4
    /// Reports weaker than this are not received, dBm.
    public var sensitivity: Double = -100
    /// Probability that a scanner misses one advert.
    public var reportLoss: Double = 0.1
    /// Probability that a connection attempt succeeds.
    public var connectSuccess: Double = 0.95
    /// Time to connect and resolve services, seconds.
    public var connectLatency: TimeInterval = 0.3
    /// Latency of one GATT round trip (read, write, discovery), seconds.
    public var gattLatency: TimeInterval = 0.03
    /// ATT MTU: long reads continue at growing offsets while a chunk of MTU - 1 bytes comes back.
    public var mtu: Int = 23
    /// Rotate each node's MAC this often, seconds (0 = never).
    public var macRotation: TimeInterval = 0
    /// BLE adds a random 0-10 ms delay to every advertising event.
    public var maximumAdvertisingDelay: TimeInterval = 0.01
    /// The crowding model (docs/SIMULATOR.md); nil: the idealised radio of earlier versions.
    public var crowding: CrowdingParameters?
    /// Devices that differ and keep their character (docs/SIMULATOR.md); nil: identical devices.
    public var devices: DeviceVariation?
    /// Runs that differ: the room's path loss, a moving attenuation field, interference bursts; nil: the same room every run.
    public var environment: RunEnvironment?
    /// Phones that miss windows (persona nodes; docs/SIMULATOR.md); nil: phones that never do.
    public var phones: PhoneBehaviour?

    public init() {}
}

/// What makes a crowded room degrade: shared advertising channels, scanners that hear one
/// channel at a time, a controller's report rate and connection limits. Each part is off when
/// its value is nil (or 0 for `connectLoad`). Defaults are the calibrated model (docs/SIMULATOR.md).
public struct CrowdingParameters: Sendable, Equatable, Codable {
    /// Overlapping PDUs on one channel destroy each other at a receiver that hears both.
    public var collisions: Bool = true
    /// Capture effect: the stronger PDU survives when it is this many dB above every interferer
    /// (nil: no capture, any overlap loses both).
    public var capture: Double? = 8
    /// Time between the starts of an event's PDUs on channels 37, 38, 39 beyond the PDU's own air time.
    public var channelGap: TimeInterval = 0.0005
    /// Scanner duty: listens `scanWindow` of every `scanInterval`, one channel per interval in
    /// turn 37, 38, 39 (nil: an idealised scanner hearing all three channels, one report per event).
    public var scanWindow: TimeInterval? = 0.01125
    public var scanInterval: TimeInterval = 0.01125
    /// Advertising reports a controller hands to its host per second at most (nil: unlimited).
    public var reportRate: Double? = 200
    /// Concurrent connections per controller, as central or peripheral (nil: unlimited).
    public var maxConnections: Int? = 5
    /// Service discovery time added to each discovery (holds the connection), seconds.
    public var discoveryTime: TimeInterval = 1
    /// Each link active near either end multiplies a connection's success by (1 - connectLoad).
    public var connectLoad: Double = 0.02

    public init() {}

    /// Everything off: the idealised radio expressed as crowding parameters.
    public static var off: CrowdingParameters {
        var c = CrowdingParameters()
        c.collisions = false; c.capture = nil; c.scanWindow = nil; c.reportRate = nil
        c.maxConnections = nil; c.discoveryTime = 0; c.connectLoad = 0
        return c
    }

    /// Whether advertising goes through the per-channel path (collisions or scanner duty).
    var channelModel: Bool { collisions || scanWindow != nil }

    /// Air time of a legacy advertising PDU at 1 Mbit/s carrying `advert` (seconds):
    /// preamble 1 + access address 4 + header 2 + AdvA 6 + AD structures + CRC 3 bytes, 8 µs each.
    public static func airTime(_ advert: Advertisement) -> TimeInterval {
        var ad = 3 // flags
        let short = advert.serviceUUIDs.filter { $0.uuidString.hasPrefix("0000") && $0.uuidString.hasSuffix("-0000-1000-8000-00805F9B34FB") }.count
        let long = advert.serviceUUIDs.count - short
        if short > 0 { ad += 2 + 2 * short }
        if long > 0 { ad += 2 + 16 * long }
        for (_, data) in advert.manufacturerData { ad += 2 + 2 + data.count }
        if advert.includeTxPower { ad += 3 }
        let bytes = 1 + 4 + 2 + 6 + min(ad, 31) + 3
        return Double(bytes) * 8e-6
    }
}

/// Log-distance path loss with seeded Gaussian shadowing:
/// rssi = referencePower + txPower - 10 n log10(max(d, 0.1 m)) + N(0, shadowing).
public struct PropagationModel: Sendable, Equatable {
    public var parameters: RadioParameters
    public init(parameters: RadioParameters) { self.parameters = parameters }

    /// Mean RSSI for a 0 dBm transmitter at `distance` metres.
    public func meanRSSI(distance: Double) -> Double {
        parameters.referencePower - 10 * parameters.pathLossExponent * log10(max(distance, 0.1))
    }

    /// Distance at which the mean RSSI of a `txPower` transmitter meets the sensitivity.
    public func range(txPower: Double) -> Double {
        pow(10, (parameters.referencePower + txPower - parameters.sensitivity) / (10 * parameters.pathLossExponent))
    }
}
