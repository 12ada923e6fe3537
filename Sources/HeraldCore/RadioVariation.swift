import Foundation

/// A plan section of numbers with limits (`radio.devices`, `radio.environment`, `radio.phones`):
/// one range check for all, each problem with its path and unit.
public protocol RangedFields {
    static var limits: [(field: String, range: ClosedRange<Double>, unit: String)] { get }
    func value(_ field: String) -> Double
}

extension RangedFields {
    /// Fields out of their limits (or not finite), each with its path under `path`. Empty: fine.
    public func rangeProblems(at path: String) -> [String] {
        Self.limits.compactMap { f in
            let v = value(f.field)
            return v.isFinite && f.range.contains(v) ? nil : "\(path).\(f.field): \(v)\(f.unit) is out of range (\(f.range.lowerBound) to \(f.range.upperBound)\(f.unit))"
        }
    }

    /// Problems with the numbers (by default, the range check).
    public func problems(at path: String) -> [String] { rangeProblems(at: path) }
}

/// `radio.devices`: how much simulated devices differ from one another (docs/SIMULATOR.md,
/// "Devices and runs that differ"). Each device draws its `DeviceCharacter` once from these
/// spreads, keyed by its identity (its name, or an agent's dongle label) and `population`,
/// never by a run's seed: the same dongle keeps its character across every run and seed of a
/// study, as a real dongle with a weak antenna is weak in every run.
public struct DeviceVariation: Codable, Sendable, Equatable, RangedFields {
    /// Standard deviation of a device's TX power offset, dB.
    public var txSpread: Double = 3
    /// Standard deviation of a device's receive gain offset (the RSSI it reports, and what it can hear), dB.
    public var rxSpread: Double = 3
    /// Standard deviation of a device's receiver sensitivity offset, dB.
    public var sensitivitySpread: Double = 2
    /// Largest loss of a device's antenna pattern or orientation, dB (each device draws uniformly
    /// from 0 to this; it costs both what the device sends and what it hears).
    public var orientationLoss: Double = 6
    /// Standard deviation of a device's advertising-interval error, as a fraction of the interval.
    public var advertJitter: Double = 0.01
    /// Standard deviation of a device's clock drift, parts per million.
    public var clockDrift: Double = 20
    /// Standard deviation of a device's scan-report loss around `radio.reportLoss` (probability).
    public var reportLossSpread: Double = 0.05
    /// Standard deviation of a device's connection reliability (a factor on every attempt it takes part in).
    public var connectSpread: Double = 0.03
    /// Which population of devices: another number gives every device another character.
    public var population: UInt64 = 1
    public init() {}

    /// Limits of each field (plan check and `Plan.rangeProblems`).
    public static let limits: [(field: String, range: ClosedRange<Double>, unit: String)] = [
        ("txSpread", 0...20, "dB"), ("rxSpread", 0...20, "dB"), ("sensitivitySpread", 0...20, "dB"),
        ("orientationLoss", 0...30, "dB"), ("advertJitter", 0...0.2, ""), ("clockDrift", 0...500, "ppm"),
        ("reportLossSpread", 0...0.5, ""), ("connectSpread", 0...0.5, ""),
    ]

    public func value(_ field: String) -> Double {
        switch field {
        case "txSpread": return txSpread
        case "rxSpread": return rxSpread
        case "sensitivitySpread": return sensitivitySpread
        case "orientationLoss": return orientationLoss
        case "advertJitter": return advertJitter
        case "clockDrift": return clockDrift
        case "reportLossSpread": return reportLossSpread
        case "connectSpread": return connectSpread
        default: return .nan
        }
    }

    public mutating func set(_ field: String, _ v: Double) {
        switch field {
        case "txSpread": txSpread = v
        case "rxSpread": rxSpread = v
        case "sensitivitySpread": sensitivitySpread = v
        case "orientationLoss": orientationLoss = v
        case "advertJitter": advertJitter = v
        case "clockDrift": clockDrift = v
        case "reportLossSpread": reportLossSpread = v
        case "connectSpread": connectSpread = v
        default: break
        }
    }


    /// The character of the device known as `identity`: the same for every run and seed.
    public func character(of identity: String) -> DeviceCharacter {
        var g = SeededGenerator(seed: population, stream: "device/\(identity)")
        // Every draw is made whatever the spreads, so that changing one spread leaves the others' draws alone.
        let tx = g.nextGaussian(), rx = g.nextGaussian(), sens = g.nextGaussian(), orient = g.nextUnit()
        let jitter = g.nextGaussian(), drift = g.nextGaussian(), loss = g.nextGaussian(), connect = g.nextGaussian()
        func clamp(_ v: Double, _ lo: Double, _ hi: Double) -> Double { min(hi, max(lo, v)) }
        // Normal draws are cut at 3 standard deviations: a device 5 sigma off is a broken device, not a spread.
        return DeviceCharacter(
            identity: identity,
            txOffset: txSpread * clamp(tx, -3, 3),
            rxOffset: rxSpread * clamp(rx, -3, 3),
            sensitivityOffset: sensitivitySpread * clamp(sens, -3, 3),
            orientationLoss: orientationLoss * orient,
            advertIntervalFactor: 1 + advertJitter * clamp(jitter, -3, 3),
            clockDriftPPM: clockDrift * clamp(drift, -3, 3),
            reportLossOffset: reportLossSpread * clamp(loss, -3, 3),
            connectFactor: clamp(1 - connectSpread * abs(clamp(connect, -3, 3)), 0, 1))
    }
}

/// One simulated device's drawn character (recorded per node in the manifest).
public struct DeviceCharacter: Codable, Sendable, Equatable {
    public var identity: String
    /// dB added to everything the device sends.
    public var txOffset: Double
    /// dB added to everything the device hears (reported RSSI and reception alike).
    public var rxOffset: Double
    /// dB added to the radio's sensitivity for this receiver (positive: deafer).
    public var sensitivityOffset: Double
    /// dB lost by the device's antenna pattern or orientation, both ways.
    public var orientationLoss: Double
    /// The device's advertising interval is the requested one times this (drift included).
    public var advertIntervalFactor: Double
    public var clockDriftPPM: Double
    /// Added to `radio.reportLoss` for this scanner (the result kept within 0 to 0.95).
    public var reportLossOffset: Double
    /// Every connection attempt the device takes part in succeeds with this factor on its probability.
    public var connectFactor: Double

    public init(identity: String, txOffset: Double = 0, rxOffset: Double = 0, sensitivityOffset: Double = 0, orientationLoss: Double = 0,
                advertIntervalFactor: Double = 1, clockDriftPPM: Double = 0, reportLossOffset: Double = 0, connectFactor: Double = 1) {
        self.identity = identity
        self.txOffset = txOffset
        self.rxOffset = rxOffset
        self.sensitivityOffset = sensitivityOffset
        self.orientationLoss = orientationLoss
        self.advertIntervalFactor = advertIntervalFactor
        self.clockDriftPPM = clockDriftPPM
        self.reportLossOffset = reportLossOffset
        self.connectFactor = connectFactor
    }

    /// The advertising interval including the device's error and its clock's drift.
    public var intervalFactor: Double { advertIntervalFactor * (1 + clockDriftPPM * 1e-6) }
}

/// `radio.environment`: how runs differ (docs/SIMULATOR.md). Drawn from the run's seed, so two
/// runs of one plan with other seeds are two different days in the room.
public struct RunEnvironment: Codable, Sendable, Equatable, RangedFields {
    /// Standard deviation of the run's offset of the room's path loss, dB.
    public var pathLossSpread: Double = 2
    /// Standard deviation of each device's slowly varying attenuation (people, furniture), dB.
    public var fieldSpread: Double = 3
    /// How long that attenuation takes to change (its correlation time), seconds.
    public var fieldTime: TimeInterval = 600
    /// Interference bursts (Wi-Fi) per hour, on average.
    public var burstRate: Double = 4
    /// Mean length of a burst, seconds.
    public var burstLength: TimeInterval = 20
    /// Extra probability that a scanner misses an advert during a burst.
    public var burstLoss: Double = 0.5
    public init() {}

    /// How often the attenuation field moves, seconds.
    public static let fieldStep: TimeInterval = 10

    public static let limits: [(field: String, range: ClosedRange<Double>, unit: String)] = [
        ("pathLossSpread", 0...20, "dB"), ("fieldSpread", 0...20, "dB"), ("fieldTime", 10...86_400, "s"),
        ("burstRate", 0...3600, " per hour"), ("burstLength", 0.1...3600, "s"), ("burstLoss", 0...1, ""),
    ]

    public func value(_ field: String) -> Double {
        switch field {
        case "pathLossSpread": return pathLossSpread
        case "fieldSpread": return fieldSpread
        case "fieldTime": return fieldTime
        case "burstRate": return burstRate
        case "burstLength": return burstLength
        case "burstLoss": return burstLoss
        default: return .nan
        }
    }

    public mutating func set(_ field: String, _ v: Double) {
        switch field {
        case "pathLossSpread": pathLossSpread = v
        case "fieldSpread": fieldSpread = v
        case "fieldTime": fieldTime = v
        case "burstRate": burstRate = v
        case "burstLength": burstLength = v
        case "burstLoss": burstLoss = v
        default: break
        }
    }

}

/// `radio.phones`: what makes real phones miss windows (docs/SIMULATOR.md, "Phones that behave
/// like phones"), applied to persona nodes. Drawn from the run's seed, per phone.
public struct PhoneBehaviour: Codable, Sendable, Equatable, RangedFields {
    /// Android: stalls of the Bluetooth stack or the OS's scan scheduling per hour (no scan
    /// results, no advertising, no connections), and their mean length in seconds.
    public var androidStallRate: Double = 0.5
    public var androidStallLength: TimeInterval = 45
    /// Android: the BLE address rotates this often (0: never), seconds.
    public var androidRotation: TimeInterval = 900
    /// iOS with location off: the app runs for `iosAwake` seconds (mean) after each wake-up, then
    /// is suspended for `iosSuspended` seconds (mean): no scan results, no connections of its own;
    /// the system keeps advertising and serving GATT.
    public var iosAwake: TimeInterval = 60
    public var iosSuspended: TimeInterval = 60
    /// iOS: the BLE address rotates this often (0: never), seconds.
    public var iosRotation: TimeInterval = 900
    /// Probability that a connection a phone takes part in fails with a GATT error.
    public var gattFailure: Double = 0.05
    public init() {}

    public static let limits: [(field: String, range: ClosedRange<Double>, unit: String)] = [
        ("androidStallRate", 0...3600, " per hour"), ("androidStallLength", 0.1...86_400, "s"), ("androidRotation", 0...86_400, "s"),
        ("iosAwake", 0.1...86_400, "s"), ("iosSuspended", 0...86_400, "s"), ("iosRotation", 0...86_400, "s"), ("gattFailure", 0...1, ""),
    ]

    public func value(_ field: String) -> Double {
        switch field {
        case "androidStallRate": return androidStallRate
        case "androidStallLength": return androidStallLength
        case "androidRotation": return androidRotation
        case "iosAwake": return iosAwake
        case "iosSuspended": return iosSuspended
        case "iosRotation": return iosRotation
        case "gattFailure": return gattFailure
        default: return .nan
        }
    }

    public mutating func set(_ field: String, _ v: Double) {
        switch field {
        case "androidStallRate": androidStallRate = v
        case "androidStallLength": androidStallLength = v
        case "androidRotation": androidRotation = v
        case "iosAwake": iosAwake = v
        case "iosSuspended": iosSuspended = v
        case "iosRotation": iosRotation = v
        case "gattFailure": gattFailure = v
        default: break
        }
    }

    public func problems(at path: String) -> [String] {
        var out = rangeProblems(at: path)
        for f in ["androidRotation", "iosRotation"] where value(f) > 0 && value(f) < 1 { out.append("\(path).\(f): rotating more often than every 1s is not realistic") }
        return out
    }
}

/// Which phone a simulated node is, for `PhoneBehaviour`.
public enum PhoneKind: Sendable, Equatable {
    case android
    /// An iPhone; `location` on keeps the app running in the background.
    case iPhone(location: Bool)
}
