import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// One message between an AirTransport and the air, a JSON object per line.
struct AirMessage: Codable {
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
    /// When the air sent the message (its wall clock): lets a node tell a fresh report from one
    /// that waited in a buffer while the node was paused or its link was down.
    var at: Double?
    /// The lab's token, in a node's hello (an air started with a token refuses a hello without it).
    var token: String?
    /// A node's ticket (`NodeTicket`): lets it attach under its name only.
    var ticket: String?
    /// A coordinator's notice to the air (`NodeTicket.Notice`, signed): a run ended, an agent revoked.
    var notice: String?

    init(_ t: String, id: Int? = nil) { self.t = t; self.id = id }

    struct ServiceWire: Codable {
        var uuid: String
        var characteristics: [[String]] // [uuid, flags...]
    }

    static func wire(_ s: GATTService) -> ServiceWire {
        ServiceWire(uuid: s.uuid.uuidString, characteristics: s.characteristics.map { [$0.uuid.uuidString] + $0.properties.bluezFlags })
    }

    static func service(_ w: ServiceWire) -> GATTService? {
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

/// A connection (plain or TLS) carrying newline-delimited JSON, with a reader thread.
final class LineSocket: @unchecked Sendable {
    let connection: Connection
    private let writeQueue = DispatchQueue(label: "heraldlab.air.write")
    private var closed = false
    /// A write has failed (the peer has gone, or took nothing for the write timeout): every
    /// write queued after it is dropped, never tried.
    private var broken = false
    private let lock = NSLock()
    /// A line longer than this closes the connection: nothing the air or a node says is near it.
    static let maxLine = 1 << 20

    init(_ connection: Connection) {
        self.connection = connection
    }

    /// Connects to the air at `host:port` (a name, IPv4 or IPv6), over TLS checked against the lab
    /// CA when `tls` is given.
    static func connect(host: String, port: UInt16, tls: TLSContext?, timeout: TimeInterval = 10) throws -> LineSocket {
        do {
            let c = try Connection.dial(host: host, port: port, timeout: timeout, tls: tls)
            c.setTimeouts(seconds: 30)
            return LineSocket(c)
        } catch let e as NetError {
            throw AirError.socket("\(e.message); is `herald-lab air` running there\(tls == nil ? "" : " with TLS")?")
        }
    }

    func send(_ message: AirMessage) {
        guard var encoded = try? JSONEncoder().encode(message) else { return }
        encoded.append(10)
        let data = encoded
        lock.lock(); let isClosed = closed || broken; lock.unlock()
        guard !isClosed else { return }
        writeQueue.async { [self] in
            guard !lock.withLock({ broken }) else { return }
            do { try connection.write(data) } catch { fail() }
        }
    }

    /// Whether a write has failed (the connection is being closed).
    var hasFailed: Bool { lock.withLock { broken } }

    /// The first failed write ends the connection at once: what is still queued is dropped, and
    /// the socket is shut down now (not after the queue) so that the reader wakes, ends, and
    /// the connection's owner hears of it (`onClose`).
    private func fail() {
        lock.withLock { broken = true }
        connection.shutdown()
        close()
    }

    /// Waits until every write queued so far has been tried or dropped (tests).
    func drain() { writeQueue.sync {} }

    /// Reads lines until EOF on a thread of its own; `onMessage` gets each decoded message. A
    /// line over `maxLine` bytes ends the connection (nothing unbounded is buffered), and only
    /// new bytes are searched for a line end (a long line costs linear time, not quadratic).
    /// `settle`, when given, runs after the last message and before the socket is closed (the
    /// air waits there until the messages read so far are handled, so that the answers to them,
    /// a refusal included, go out before the close).
    func startReading(onMessage: @escaping @Sendable (AirMessage) -> Void, settle: (@Sendable () -> Void)? = nil,
                      onClose: @escaping @Sendable () -> Void) {
        let connection = self.connection
        let thread = Thread { [self] in
            var pending = [UInt8]()
            var buf = [UInt8](repeating: 0, count: 65536)
            let decoder = JSONDecoder()
            reading: while true {
                let n: Int
                do { n = try connection.read(into: &buf) } catch let e as NetError where e.kind == .timeout { continue } catch { break }
                if n == 0 { break }
                var scan = pending.count
                pending.append(contentsOf: buf[0..<n])
                var start = 0
                while let nl = pending[scan...].firstIndex(of: 10) {
                    let line = Data(pending[start..<nl])
                    start = nl + 1
                    scan = start
                    if let m = try? decoder.decode(AirMessage.self, from: line) { onMessage(m) }
                }
                pending.removeFirst(start)
                if pending.count > Self.maxLine { break reading }
            }
            settle?()
            close()
            onClose()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    func close() {
        lock.lock()
        let was = closed
        closed = true
        lock.unlock()
        if !was {
            // After what was sent before: a refusal reaches the peer before the connection ends.
            writeQueue.async {
                self.connection.shutdown()
                self.connection.close()
            }
        }
    }
}

public enum AirError: Error, CustomStringConvertible {
    case socket(String)
    public var description: String {
        switch self { case .socket(let s): return s }
    }
}
