import Foundation

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

    public init() {}
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
