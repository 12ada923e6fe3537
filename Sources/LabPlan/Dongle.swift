import Foundation
import HeraldCore

/// Dongles: the Bluetooth controllers agents with radio bluez run their nodes on, as agents
/// describe them, the coordinator keeps their health, and plans select them (docs/API.md,
/// plans/README.md).
extension LabWire {
    /// A dongle as its agent sees it. `id` is its stable identity: the controller's public
    /// address (upper case), which stays the same across reboots and re-plugging, unlike hciN.
    public struct DongleInfo: Codable, Sendable, Equatable {
        /// The controller's address, "F0:00:00:00:00:01"; nil while it is unknown (a dongle named
        /// hciN that is not plugged in).
        public var id: String?
        /// The label the operator gave it (`--dongle-name`; default: the agent's name).
        public var name: String
        /// The host it is plugged into, and the agent that drives it.
        public var host: String?
        public var agent: String?
        /// hciN now (changes when it is re-plugged).
        public var adapter: String?
        /// Whether the adapter was there and powered when last looked at, and why not.
        public var present: Bool
        public var powered: Bool?
        public var problem: String?
        /// Controller identity (HCI Read Local Version Information).
        public var manufacturer: Int?
        public var manufacturerName: String?
        public var hciVersion: Int?
        public var hciRevision: Int?
        public var lmpVersion: Int?
        public var lmpSubversion: Int?
        /// `usb`, `virtual`, `pci`, `serial`, ... (from sysfs).
        public var bus: String?
        public var usb: USBInfo?
        /// The kernel driver (btusb), its module version, and what the driver says of the
        /// firmware and hardware where it says it (debugfs firmware_info, hardware_info).
        public var driver: String?
        public var driverVersion: String?
        public var firmware: String?
        public var hardware: String?
        public var tags: [String]?

        public init(id: String?, name: String, present: Bool) { self.id = id; self.name = name; self.present = present }

        /// "LMP 9.8870 (0x22a6)" style text of the controller's firmware, when known.
        public var firmwareText: String? {
            guard let v = lmpVersion, let s = lmpSubversion else { return firmware }
            let lmp = "LMP \(v).\(s) (0x\(String(s, radix: 16)))"
            return firmware.map { "\(lmp), \($0)" } ?? lmp
        }
    }

    /// The USB device a dongle is, from sysfs.
    public struct USBInfo: Codable, Sendable, Equatable {
        /// idVendor and idProduct, four hex digits each.
        public var vendor: String
        public var product: String
        public var serial: String?
        public var manufacturerString: String?
        public var productString: String?
        /// bcdDevice: the device's release number, which some makes bump with the firmware.
        public var release: String?
        /// The port path, "1-1.2" (bus 1, port 1 of the root hub, port 2 of the hub behind it):
        /// where on which hub the dongle is plugged.
        public var port: String
        public init(vendor: String, product: String, port: String) { self.vendor = vendor; self.product = product; self.port = port }
    }

    /// LAVA's device health, plus unknown: `good` passed its last check, `bad` is quarantined
    /// (failed checks, or the outlier of runs), `maintenance` and `retired` are set by the
    /// operator. Only good and unknown dongles are ever selected.
    public enum DongleHealth: String, Codable, Sendable, CaseIterable {
        case unknown, good, bad, maintenance, retired
        public var selectable: Bool { self == .unknown || self == .good }
    }

    /// The coordinator asks an agent to check its dongle: present, powered, can advertise
    /// (its own beacon), and scanning sees the beacons of the other dongles checked with it.
    public struct PreflightRequest: Codable, Sendable {
        public var id: String
        /// This dongle's beacon and the beacons of the others (manufacturer data 0xFFFF "HLpf"
        /// followed by the beacon, 4 bytes big-endian).
        public var beacon: UInt32
        public var peers: [UInt32]
        /// Seconds the check may take at most; the agent stops on its own after it.
        public var bound: Double
        public init(id: String, beacon: UInt32, peers: [UInt32], bound: Double) { self.id = id; self.beacon = beacon; self.peers = peers; self.bound = bound }
    }

    /// What a dongle's check found so far (or at its end, `finished`).
    public struct PreflightReport: Codable, Sendable, Equatable {
        public struct Sighting: Codable, Sendable, Equatable {
            public var beacon: UInt32
            /// Seconds after the check began that it was first seen, and its RSSI then.
            public var after: Double
            public var rssi: Int?
            public init(beacon: UInt32, after: Double, rssi: Int?) { self.beacon = beacon; self.after = after; self.rssi = rssi }
        }
        public var id: String
        public var agent: String
        public var dongle: DongleInfo?
        public var present = false
        public var powered = false
        public var advertising = false
        public var scanning = false
        public var seen: [Sighting] = []
        /// The first thing that failed, when one did.
        public var problem: String?
        /// Seconds the stages took: powered, advertising, scanning (after the check began).
        public var poweredAfter: Double?
        public var advertisingAfter: Double?
        public var elapsed: Double = 0
        public var finished = false
        public init(id: String, agent: String) { self.id = id; self.agent = agent }
    }

    /// The coordinator's verdict on one dongle's check (kept in the run record, the manifest and
    /// the dongle's history).
    public struct PreflightVerdict: Codable, Sendable, Equatable {
        public var dongle: String
        public var dongleId: String?
        public var agent: String
        public var ok: Bool
        /// Whether a failure is this dongle's own (counts towards quarantine); a check two
        /// dongles failed together blames neither.
        public var blame: Bool
        public var reason: String?
        /// Dongles it saw and that saw it (names); `seconds`: when it had heard the last of
        /// those it heard, from the start of its check.
        public var saw: [String]
        public var seenBy: [String]
        public var seconds: Double?
        public var warnings: [String]?
        public init(dongle: String, dongleId: String?, agent: String, ok: Bool, blame: Bool, reason: String?, saw: [String] = [], seenBy: [String] = [], seconds: Double? = nil) {
            self.dongle = dongle; self.dongleId = dongleId; self.agent = agent; self.ok = ok; self.blame = blame; self.reason = reason
            self.saw = saw; self.seenBy = seenBy; self.seconds = seconds
        }
    }

    /// A node's radio recovered its dongle (or tried): `power-cycle` (Adapter1.Powered off and
    /// on through bluetoothd), `usb-reset` (sysfs `authorized` 0 then 1 of its USB device).
    public struct Recovery: Codable, Sendable, Equatable {
        public var at: Double
        public var action: DongleRecoveryAction
        public var ok: Bool
        public var reason: String
        public var detail: String?
        public init(at: Double, action: DongleRecoveryAction, ok: Bool, reason: String, detail: String?) {
            self.at = at; self.action = action; self.ok = ok; self.reason = reason; self.detail = detail
        }
    }

    /// What an entry of a dongle's history records (the raw values are the wire's and the stored
    /// rows' strings).
    public enum DongleEventKind: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
        /// First seen; seen on another host, hub or agent.
        case registered, moved
        /// A health check, a run's pre-flight check, a run's verdict on it, a node's recovery of it.
        case check, preflight, run, recovery
        /// Its health changed (quarantined, released, maintenance).
        case health

        public var description: String { rawValue }
    }

    /// One entry of a dongle's history on the coordinator.
    public struct DongleEvent: Codable, Sendable, Equatable {
        public var kind: DongleEventKind
        public var at: Double
        public var ok: Bool
        public var message: String
        public var run: String?
        /// Evidence: what the check saw, the failures a quarantine rests on (JSON text).
        public var evidence: String?
        public init(kind: DongleEventKind, at: Double, ok: Bool, message: String, run: String? = nil, evidence: String? = nil) {
            self.kind = kind; self.at = at; self.ok = ok; self.message = message; self.run = run; self.evidence = evidence
        }
    }

    /// A dongle as the coordinator knows it (GET /v1/dongles).
    public struct DongleView: Codable, Sendable, Equatable {
        public var id: String
        public var info: DongleInfo
        public var health: DongleHealth
        public var healthReason: String?
        public var healthSince: Double?
        /// Failed checks and outlier runs in a row (quarantine after `quarantineAfter`).
        public var failures: Int
        public var outliers: Int
        public var firstSeen: Double
        public var lastSeen: Double
        /// The agent's liveness (alive, missing, lost) and the run it is busy with.
        public var agentState: String?
        public var busyWith: String?
        /// Newest first.
        public var history: [DongleEvent]
        public init(id: String, info: DongleInfo, health: DongleHealth, failures: Int, outliers: Int, firstSeen: Double, lastSeen: Double, history: [DongleEvent]) {
            self.id = id; self.info = info; self.health = health; self.failures = failures; self.outliers = outliers
            self.firstSeen = firstSeen; self.lastSeen = lastSeen; self.history = history
        }
    }

    /// The operator sets a dongle's health (quarantine, release, maintenance, retire).
    public struct HealthRequest: Codable, Sendable {
        public var health: DongleHealth
        public var reason: String?
        public init(health: DongleHealth, reason: String?) { self.health = health; self.reason = reason }
    }

    /// An on-demand health check (every free dongle, or the ones named).
    public struct CheckRequest: Codable, Sendable {
        public var dongles: [String]?
        public var bound: Double?
        public init(dongles: [String]?, bound: Double?) { self.dongles = dongles; self.bound = bound }
    }

    public struct CheckResult: Codable, Sendable {
        public var id: String
        public var verdicts: [PreflightVerdict]
        /// Dongles quarantined by this check.
        public var quarantined: [String]
        public var message: String?
        public init(id: String, verdicts: [PreflightVerdict], quarantined: [String], message: String?) {
            self.id = id; self.verdicts = verdicts; self.quarantined = quarantined; self.message = message
        }
    }

    /// Company id 0xFFFF (for tests) followed by "HLpf" and the beacon: a check's advert.
    public static let preflightCompany: UInt16 = 0xFFFF
    public static let preflightMagic: [UInt8] = Array("HLpf".utf8)

    public static func preflightData(_ beacon: UInt32) -> Data {
        Data(preflightMagic + [UInt8(beacon >> 24), UInt8((beacon >> 16) & 0xFF), UInt8((beacon >> 8) & 0xFF), UInt8(beacon & 0xFF)])
    }

    /// The beacon in a check's manufacturer data, nil for anything else.
    public static func preflightBeacon(_ data: Data) -> UInt32? {
        let b = [UInt8](data)
        guard b.count == 8, Array(b[0..<4]) == preflightMagic else { return nil }
        return UInt32(b[4]) << 24 | UInt32(b[5]) << 16 | UInt32(b[6]) << 8 | UInt32(b[7])
    }

    /// "AA:BB:CC:DD:EE:FF" in upper case, nil for anything else.
    public static func normalisedAddress(_ s: String) -> String? {
        let parts = s.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 6, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isHexDigit) }) else { return nil }
        return s.uppercased()
    }
}

extension AgentSelection {
    /// Whether a dongle fits the plan's dongle criteria (`manufacturer`, `firmware`); names and
    /// tags are matched by the coordinator with the agent.
    public func matches(_ d: LabWire.DongleInfo) -> Bool {
        if let list = manufacturer, !list.isEmpty {
            guard list.contains(where: { Self.manufacturerMatches($0, d) }) else { return false }
        }
        if let list = firmware, !list.isEmpty {
            guard list.contains(where: { Self.firmwareMatches($0, d) }) else { return false }
        }
        return true
    }

    /// Decimal or 0x-hexadecimal, in `range`; nil for anything else.
    public static func parseNumber(_ text: String, in range: ClosedRange<Int>) -> Int? {
        let t = text.trimmingCharacters(in: .whitespaces).lowercased()
        let v: Int? = t.hasPrefix("0x") ? Int(t.dropFirst(2), radix: 16) : (t.allSatisfy(\.isNumber) ? Int(t) : nil)
        guard let v, range.contains(v) else { return nil }
        return v
    }

    /// A company id (2, 0x0002) or a name, case-insensitively the whole name or its first word
    /// ("Intel" matches "Intel Corp.").
    static func manufacturerMatches(_ wanted: String, _ d: LabWire.DongleInfo) -> Bool {
        if let id = parseNumber(wanted, in: 0...0xFFFF) { return d.manufacturer == id }
        guard let name = d.manufacturerName?.lowercased() else { return false }
        let w = wanted.lowercased().trimmingCharacters(in: .whitespaces)
        if name == w { return true }
        return name.hasPrefix(w) && name.dropFirst(w.count).first.map { !$0.isLetter && !$0.isNumber } == true
    }

    /// An LMP subversion (8870, 0x22a6), or the driver's firmware text exactly (case-insensitive).
    static func firmwareMatches(_ wanted: String, _ d: LabWire.DongleInfo) -> Bool {
        if let v = parseNumber(wanted, in: 0...0xFFFF) { return d.lmpSubversion == v }
        return d.firmware?.lowercased() == wanted.lowercased()
    }

    /// Whether the selection says anything about dongles (only radio bluez has them).
    public var selectsDongles: Bool {
        dongles != nil || manufacturer != nil || firmware != nil
    }
}

/// What agents say of their dongles is taken as hostile: the coordinator keeps only names that
/// are names, numbers in range, bounded text without control characters.
extension LabWire.DongleInfo {
    public func sanitised(agent: String) -> LabWire.DongleInfo {
        var d = LabWire.DongleInfo(id: id.flatMap(LabWire.normalisedAddress), name: SafeName.isValid(name) ? name : agent, present: present)
        d.host = host.flatMap { SafeName.isValid($0) ? $0 : nil }
        d.agent = agent
        d.adapter = adapter.flatMap { a in a.hasPrefix("hci") && (4...6).contains(a.count) && a.dropFirst(3).allSatisfy { $0.isASCII && $0.isNumber } ? a : nil }
        d.powered = powered
        d.problem = LabWire.cleanText(problem, max: 500)
        func inRange(_ v: Int?, _ r: ClosedRange<Int>) -> Int? { v.flatMap { r.contains($0) ? $0 : nil } }
        d.manufacturer = inRange(manufacturer, 0...0xFFFF)
        d.manufacturerName = LabWire.cleanText(manufacturerName, max: 80)
        d.hciVersion = inRange(hciVersion, 0...255)
        d.hciRevision = inRange(hciRevision, 0...0xFFFF)
        d.lmpVersion = inRange(lmpVersion, 0...255)
        d.lmpSubversion = inRange(lmpSubversion, 0...0xFFFF)
        d.bus = LabWire.cleanText(bus, max: 32)
        d.driver = LabWire.cleanText(driver, max: 64)
        d.driverVersion = LabWire.cleanText(driverVersion, max: 64)
        d.firmware = LabWire.cleanText(firmware, max: 256)
        d.hardware = LabWire.cleanText(hardware, max: 256)
        d.usb = usb.flatMap { u -> LabWire.USBInfo? in
            func hex4(_ s: String) -> Bool { s.count == 4 && s.allSatisfy(\.isHexDigit) }
            let portOK = u.port.count <= 32 && u.port.allSatisfy { ($0.isASCII && $0.isNumber) || $0 == "-" || $0 == "." }
            guard hex4(u.vendor), hex4(u.product), portOK else { return nil }
            var v = LabWire.USBInfo(vendor: u.vendor.lowercased(), product: u.product.lowercased(), port: u.port)
            v.serial = LabWire.cleanText(u.serial, max: 126)
            v.manufacturerString = LabWire.cleanText(u.manufacturerString, max: 126)
            v.productString = LabWire.cleanText(u.productString, max: 126)
            v.release = u.release.flatMap { hex4($0) ? $0.lowercased() : nil }
            return v
        }
        d.tags = tags.map { Array($0.filter(SafeName.isValid).prefix(PlanLimits.maximumTags)) }
        return d
    }
}

extension LabWire.PreflightReport {
    /// An agent's report as the coordinator keeps it: its dongle sanitised, its problem bounded,
    /// at most 1000 sightings with finite times.
    public func sanitised(agent: String) -> LabWire.PreflightReport {
        var r = self
        r.agent = agent
        r.dongle = dongle?.sanitised(agent: agent)
        r.problem = problem.map { LabWire.cleanText($0, max: 500) ?? "failed" }
        r.seen = Array(seen.filter { $0.after.isFinite && $0.after >= 0 && $0.after < 86_400 }.prefix(1000))
        func finite(_ v: Double?) -> Double? { v.flatMap { $0.isFinite && $0 >= 0 && $0 < 86_400 ? $0 : nil } }
        r.poweredAfter = finite(poweredAfter)
        r.advertisingAfter = finite(advertisingAfter)
        r.elapsed = finite(elapsed) ?? 0
        return r
    }
}

extension LabWire {
    /// Text without control characters, at most `max` characters; nil when empty.
    public static func cleanText(_ s: String?, max: Int) -> String? {
        guard let s else { return nil }
        let kept = String(String.UnicodeScalarView(s.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F && !(0x80...0x9F).contains($0.value) && $0.properties.generalCategory != .format }))
        let t = String(kept.prefix(max)).trimmingCharacters(in: .whitespaces)
        return t.isEmpty ? nil : t
    }
}
