import Foundation
import HeraldCore
import HeraldRadio
import RadioSim

// The air's wire contract, typed. Both sides (`AirTransport` in a node's process, `AirServer` in
// `herald-lab air`, and the coordinator's notices) speak it through these types only: one case per
// message kind, fields already parsed (addresses, UUIDs, bytes). On the wire each message is one
// JSON object per line, `{"t": kind, "id": n, ...fields}`, exactly as before the types existed
// (`AirFields` below is that object); a line whose kind is unknown does not decode and is dropped,
// and a known kind with unusable fields becomes `.malformed`, answered with a failure.

/// What a node (or the coordinator) asks of the air. `id` pairs the air's reply with the call.
public struct AirRequest: Sendable {
    public var id: Int?
    public var call: AirCall
    public init(id: Int? = nil, _ call: AirCall) { self.id = id; self.call = call }
}

/// A node's hello: who it is, where it stands, and what lets it attach.
public struct AirHello: Sendable, Equatable {
    public var node: String?
    public var x: Double?
    public var y: Double?
    public var parameters: RadioParameters?
    public var token: String?
    public var ticket: String?
    public init(node: String?, x: Double?, y: Double?, parameters: RadioParameters?, token: String?, ticket: String?) {
        self.node = node; self.x = x; self.y = y; self.parameters = parameters; self.token = token; self.ticket = ticket
    }
}

public enum AirCall: Sendable {
    case hello(AirHello)
    /// A coordinator's signed notice (`NodeTicket.Notice`): a run ended, an agent revoked.
    case notice(String)
    case powerOn
    /// The node's GATT service and the current value of each readable characteristic.
    case register(GATTService, values: [BluetoothUUID: Data])
    /// Fresh values of the readable characteristics (no reply).
    case values([BluetoothUUID: Data])
    case startAdvertising(Advertisement)
    case stopAdvertising
    case startScanning
    case stopScanning
    case connect(RadioAddress, timeout: Double)
    case disconnect(RadioAddress)
    case discover(RadioAddress)
    case read(RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID)
    case write(RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool)
    /// A known kind whose fields cannot be used (`problem` says which): answered with a failure.
    case malformed(kind: String, problem: String)

    var kind: String {
        switch self {
        case .hello: return "hello"
        case .notice: return "notice"
        case .powerOn: return "powerOn"
        case .register: return "register"
        case .values: return "values"
        case .startAdvertising: return "startAdvertising"
        case .stopAdvertising: return "stopAdvertising"
        case .startScanning: return "startScanning"
        case .stopScanning: return "stopScanning"
        case .connect: return "connect"
        case .disconnect: return "disconnect"
        case .discover: return "discover"
        case .read: return "read"
        case .write: return "write"
        case .malformed(let kind, _): return kind
        }
    }
}

/// What the air tells a node: answers and the medium's events. `at` is the air's clock when it
/// sent the message (a node tells a fresh report from one that waited in a buffer).
public struct AirAnswer: Sendable {
    public var id: Int?
    public var news: AirNews
    public var at: Double?
    public init(id: Int? = nil, _ news: AirNews, at: Double? = nil) { self.id = id; self.news = news; self.at = at }
}

public enum AirNews: Sendable {
    /// Once a second, so a node can tell a silent air from a dead link.
    case tick
    /// The answer to a hello: the node's address in the medium, or why it may not attach.
    case attached(RadioAddress)
    case refused(String)
    /// The answer to a notice: taken, or why not.
    case noticeTaken
    case noticeRefused(String)
    /// The answer to a call.
    case reply(AirOutcome)
    case state(RadioState)
    case report(ScanReport)
    case disconnected(RadioAddress)
    case gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress)
    case gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress)
    case centralDisconnected(RadioAddress)
}

/// How a call ended.
public enum AirOutcome: Sendable {
    case done
    case services([GATTService])
    case value(Data)
    case failed(TransportError)

    var voidResult: Result<Void, TransportError> {
        if case .failed(let e) = self { return .failure(e) }
        return .success(())
    }
}

/// The wire object: every field any kind uses, by the names on the wire. Only the contract's
/// types above build and read it.
struct AirFields: Codable {
    var t: String
    var id: Int?
    var node: String?
    var x: Double?
    var y: Double?
    var parameters: RadioParameters?
    var ok: Bool?
    var error: String?
    var errorKind: String?
    var address: String?
    var rssi: Int?
    var txPower: Int?
    var includeTxPower: Bool?
    var interval: Double?
    var mfr: [String: String]?
    var uuids: [String]?
    var services: [ServiceWire]?
    var service: String?
    var characteristic: String?
    var value: String?
    var withResponse: Bool?
    var offset: Int?
    var central: String?
    var state: String?
    var timeout: Double?
    var values: [String: String]?
    var at: Double?
    var token: String?
    var ticket: String?
    var notice: String?

    init(_ t: String, id: Int? = nil) { self.t = t; self.id = id }

    struct ServiceWire: Codable {
        var uuid: String
        var characteristics: [[String]] // [uuid, flags...]
    }
}

/// A line whose kind this side does not know.
struct UnknownAirKind: Error, CustomStringConvertible {
    var kind: String
    var description: String { "unknown air message kind \(OutsideText.escaped(kind, limit: 40))" }
}

extension AirRequest: Codable {
    public init(from decoder: any Decoder) throws {
        let f = try AirFields(from: decoder)
        id = f.id
        call = try Self.call(f)
    }

    public func encode(to encoder: any Encoder) throws { try fields.encode(to: encoder) }

    private static func call(_ f: AirFields) throws -> AirCall {
        func address() -> RadioAddress { RadioAddress(f.address ?? "") }
        switch f.t {
        case "hello": return .hello(AirHello(node: f.node, x: f.x, y: f.y, parameters: f.parameters, token: f.token, ticket: f.ticket))
        case "notice":
            guard let n = f.notice else { return .malformed(kind: f.t, problem: "no notice") }
            return .notice(n)
        case "powerOn": return .powerOn
        case "register":
            guard let w = f.services?.first, let s = AirWireCoding.service(w) else { return .malformed(kind: f.t, problem: "no service") }
            return .register(s, values: AirWireCoding.values(f.values))
        case "values": return .values(AirWireCoding.values(f.values))
        case "startAdvertising":
            return .startAdvertising(Advertisement(serviceUUIDs: (f.uuids ?? []).compactMap(BluetoothUUID.init), manufacturerData: AirWireCoding.mfr(f.mfr),
                                                   txPower: f.txPower, includeTxPower: f.includeTxPower ?? false, interval: f.interval))
        case "stopAdvertising": return .stopAdvertising
        case "startScanning": return .startScanning
        case "stopScanning": return .stopScanning
        case "connect": return .connect(address(), timeout: f.timeout ?? 8)
        case "disconnect": return .disconnect(address())
        case "discover": return .discover(address())
        case "read":
            guard let s = f.service.flatMap(BluetoothUUID.init), let c = f.characteristic.flatMap(BluetoothUUID.init) else { return .malformed(kind: f.t, problem: "bad read") }
            return .read(address(), service: s, characteristic: c)
        case "write":
            guard let s = f.service.flatMap(BluetoothUUID.init), let c = f.characteristic.flatMap(BluetoothUUID.init),
                  let v = f.value.flatMap({ Data(base64Encoded: $0) }) else { return .malformed(kind: f.t, problem: "bad write") }
            return .write(address(), service: s, characteristic: c, value: v, withResponse: f.withResponse ?? true)
        default: throw UnknownAirKind(kind: f.t)
        }
    }

    var fields: AirFields {
        var f = AirFields(call.kind, id: id)
        switch call {
        case .hello(let h):
            f.node = h.node; f.x = h.x; f.y = h.y; f.parameters = h.parameters; f.token = h.token; f.ticket = h.ticket
        case .notice(let n): f.notice = n
        case .powerOn, .stopAdvertising, .startScanning, .stopScanning, .malformed: break
        case .register(let s, let values):
            f.services = [AirWireCoding.wire(s)]
            f.values = AirWireCoding.valuesWire(values)
        case .values(let values): f.values = AirWireCoding.valuesWire(values)
        case .startAdvertising(let ad):
            f.uuids = ad.serviceUUIDs.map(\.uuidString)
            f.mfr = AirWireCoding.mfrWire(ad.manufacturerData)
            f.txPower = ad.txPower
            f.includeTxPower = ad.includeTxPower
            f.interval = ad.interval
        case .connect(let a, let timeout): f.address = a.value; f.timeout = timeout
        case .disconnect(let a), .discover(let a): f.address = a.value
        case .read(let a, let s, let c):
            f.address = a.value; f.service = s.uuidString; f.characteristic = c.uuidString
        case .write(let a, let s, let c, let v, let withResponse):
            f.address = a.value; f.service = s.uuidString; f.characteristic = c.uuidString
            f.value = v.base64EncodedString(); f.withResponse = withResponse
        }
        return f
    }
}

extension AirAnswer: Codable {
    public init(from decoder: any Decoder) throws {
        let f = try AirFields(from: decoder)
        id = f.id
        at = f.at
        news = try Self.news(f)
    }

    public func encode(to encoder: any Encoder) throws { try fields.encode(to: encoder) }

    private static func news(_ f: AirFields) throws -> AirNews {
        let failure = AirWireCoding.transportError(kind: f.errorKind, f.error)
        switch f.t {
        case "tick": return .tick
        case "hello": return f.ok == true ? .attached(RadioAddress(f.address ?? "")) : .refused(f.error ?? "no reason given")
        case "notice": return f.ok == true ? .noticeTaken : .noticeRefused(f.error ?? "no reason given")
        case "reply":
            guard f.ok == true else { return .reply(.failed(failure)) }
            if let s = f.services { return .reply(.services(s.compactMap(AirWireCoding.service))) }
            if let v = f.value {
                guard let d = Data(base64Encoded: v) else { return .reply(.failed(.failed("the air's value is not base64"))) }
                return .reply(.value(d))
            }
            return .reply(.done)
        case "state":
            guard let s = f.state.flatMap(RadioState.init) else { throw UnknownAirKind(kind: "state \(f.state ?? "")") }
            return .state(s)
        case "report":
            guard let a = f.address, let rssi = f.rssi else { throw UnknownAirKind(kind: "report without address or rssi") }
            return .report(ScanReport(address: RadioAddress(a), rssi: rssi, txPower: f.txPower, manufacturerData: AirWireCoding.mfr(f.mfr),
                                      serviceUUIDs: (f.uuids ?? []).compactMap(BluetoothUUID.init)))
        case "disconnected":
            guard let a = f.address else { throw UnknownAirKind(kind: "disconnected without address") }
            return .disconnected(RadioAddress(a))
        case "gattRead":
            guard let c = f.characteristic.flatMap(BluetoothUUID.init) else { throw UnknownAirKind(kind: "gattRead without characteristic") }
            return .gattRead(characteristic: c, offset: f.offset ?? 0, central: RadioAddress(f.central ?? ""))
        case "gattWrite":
            guard let c = f.characteristic.flatMap(BluetoothUUID.init), let v = f.value.flatMap({ Data(base64Encoded: $0) }) else {
                throw UnknownAirKind(kind: "gattWrite without characteristic or value")
            }
            return .gattWrite(characteristic: c, value: v, offset: f.offset ?? 0, central: RadioAddress(f.central ?? ""))
        case "centralDisconnected":
            guard let c = f.central else { throw UnknownAirKind(kind: "centralDisconnected without central") }
            return .centralDisconnected(RadioAddress(c))
        default: throw UnknownAirKind(kind: f.t)
        }
    }

    var fields: AirFields {
        var f: AirFields
        func outcome(_ o: AirOutcome) {
            switch o {
            case .done: f.ok = true
            case .services(let s): f.ok = true; f.services = s.map(AirWireCoding.wire)
            case .value(let d): f.ok = true; f.value = d.base64EncodedString()
            case .failed(let e): f.ok = false; (f.errorKind, f.error) = AirWireCoding.errorFields(e)
            }
        }
        switch news {
        case .tick: f = AirFields("tick", id: id)
        case .attached(let a): f = AirFields("hello", id: id); f.ok = true; f.address = a.value
        case .refused(let why): f = AirFields("hello", id: id); f.ok = false; f.error = why
        case .noticeTaken: f = AirFields("notice", id: id); f.ok = true
        case .noticeRefused(let why): f = AirFields("notice", id: id); f.ok = false; f.error = why
        case .reply(let o): f = AirFields("reply", id: id); outcome(o)
        case .state(let s): f = AirFields("state", id: id); f.state = s.rawValue
        case .report(let r):
            f = AirFields("report", id: id)
            f.address = r.address.value
            f.rssi = r.rssi
            f.txPower = r.txPower
            f.mfr = AirWireCoding.mfrWire(r.manufacturerData)
            f.uuids = r.serviceUUIDs.map(\.uuidString)
        case .disconnected(let a): f = AirFields("disconnected", id: id); f.address = a.value
        case .gattRead(let c, let offset, let central):
            f = AirFields("gattRead", id: id); f.characteristic = c.uuidString; f.offset = offset; f.central = central.value
        case .gattWrite(let c, let v, let offset, let central):
            f = AirFields("gattWrite", id: id); f.characteristic = c.uuidString; f.value = v.base64EncodedString(); f.offset = offset; f.central = central.value
        case .centralDisconnected(let c): f = AirFields("centralDisconnected", id: id); f.central = c.value
        }
        f.at = at
        return f
    }
}

/// How the contract's values are written in the wire object.
enum AirWireCoding {
    static func wire(_ s: GATTService) -> AirFields.ServiceWire {
        AirFields.ServiceWire(uuid: s.uuid.uuidString, characteristics: s.characteristics.map { [$0.uuid.uuidString] + $0.properties.bluezFlags })
    }

    static func service(_ w: AirFields.ServiceWire) -> GATTService? {
        guard let u = BluetoothUUID(w.uuid) else { return nil }
        return GATTService(uuid: u, characteristics: w.characteristics.compactMap { c in
            guard let first = c.first, let cu = BluetoothUUID(first) else { return nil }
            var p = CharacteristicProperties()
            for f in c.dropFirst() {
                switch f {
                case "read": p.insert(.read)
                case "write": p.insert(.write)
                case "write-without-response": p.insert(.writeWithoutResponse)
                case "notify": p.insert(.notify)
                default: break
                }
            }
            return GATTCharacteristic(uuid: cu, properties: p)
        })
    }

    static func mfrWire(_ m: [UInt16: Data]) -> [String: String] {
        var out = [String: String]()
        for (k, v) in m { out[String(k)] = v.base64EncodedString() }
        return out
    }

    static func mfr(_ w: [String: String]?) -> [UInt16: Data] {
        var out = [UInt16: Data]()
        for (k, v) in w ?? [:] { if let id = UInt16(k), let d = Data(base64Encoded: v) { out[id] = d } }
        return out
    }

    static func valuesWire(_ v: [BluetoothUUID: Data]) -> [String: String] {
        var out = [String: String]()
        for (k, d) in v { out[k.uuidString] = d.base64EncodedString() }
        return out
    }

    static func values(_ w: [String: String]?) -> [BluetoothUUID: Data] {
        var out = [BluetoothUUID: Data]()
        for (k, v) in w ?? [:] { if let u = BluetoothUUID(k), let d = Data(base64Encoded: v) { out[u] = d } }
        return out
    }

    static func errorFields(_ e: TransportError) -> (String, String) {
        switch e {
        case .adapterUnavailable(let s): return ("adapterUnavailable", s)
        case .timeout(let s): return ("timeout", s)
        case .notConnected: return ("notConnected", "")
        case .connectionFailed(let s): return ("connectionFailed", s)
        case .inProgress: return ("inProgress", "")
        case .notPermitted: return ("notPermitted", "")
        case .notSupported(let s): return ("notSupported", s)
        case .invalidOffset: return ("invalidOffset", "")
        case .invalidValueLength: return ("invalidValueLength", "")
        case .deviceNotFound(let a): return ("deviceNotFound", a.value)
        case .serviceNotFound(let u): return ("serviceNotFound", u.uuidString)
        case .characteristicNotFound(let u): return ("characteristicNotFound", u.uuidString)
        case .failed(let s): return ("failed", s)
        }
    }

    static func transportError(kind: String?, _ message: String?) -> TransportError {
        let m = message ?? ""
        switch kind {
        case "adapterUnavailable": return .adapterUnavailable(m)
        case "timeout": return .timeout(m)
        case "notConnected": return .notConnected
        case "connectionFailed": return .connectionFailed(m)
        case "inProgress": return .inProgress
        case "notPermitted": return .notPermitted
        case "notSupported": return .notSupported(m)
        case "invalidOffset": return .invalidOffset
        case "invalidValueLength": return .invalidValueLength
        case "deviceNotFound": return .deviceNotFound(RadioAddress(m))
        case "serviceNotFound": return BluetoothUUID(m).map { .serviceNotFound($0) } ?? .failed(m)
        case "characteristicNotFound": return BluetoothUUID(m).map { .characteristicNotFound($0) } ?? .failed(m)
        default: return .failed(m)
        }
    }
}
