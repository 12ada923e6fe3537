import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet
#if canImport(Glibc)
import Glibc
#endif

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

    /// Queues one message (an `AirRequest` or an `AirAnswer`) as a line.
    func send<Message: Encodable>(_ message: Message) {
        let encoded: Data
        do { encoded = try JSONEncoder().encode(message) } catch {
            // Every field of the contract encodes; a value that does not (a NaN position) ends
            // the connection rather than leaving the peer waiting for a message that never comes.
            fail()
            return
        }
        var line = encoded
        line.append(10)
        let data = line
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
    func startReading<Message: Decodable>(_ kind: Message.Type, onMessage: @escaping @Sendable (Message) -> Void, settle: (@Sendable () -> Void)? = nil,
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
                    // A line that is not a message of the contract (junk, an unknown kind) is
                    // dropped: the peer gets no answer to it, and nothing else changes.
                    if let m = try? decoder.decode(Message.self, from: line) { onMessage(m) }
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

/// The coordinator's side of the air's contract: a signed notice (`NodeTicket.Notice`) on a
/// connection of its own, and the air's answer.
public enum AirNotices {
    /// Sends `signed` to the air at `host:port` (TLS checked against the lab CA when `tls` is
    /// given) and waits at most `timeout` seconds for the answer: nil when the air took it, else
    /// why not (the air's refusal or the connection's error).
    public static func tell(_ signed: String, host: String, port: UInt16, tls: TLSContext?, timeout: TimeInterval = 5) -> String? {
        do {
            let c = try Connection.dial(host: host, port: port, timeout: timeout, tls: tls)
            defer { c.close() }
            c.setTimeouts(seconds: timeout)
            try c.write(try JSONEncoder().encode(AirRequest(id: 1, .notice(signed))) + Data([10]))
            var got = [UInt8](), buf = [UInt8](repeating: 0, count: 1024)
            while !got.contains(10) && got.count < 4096 {
                let n = try c.read(into: &buf)
                if n == 0 { break }
                got += buf[0..<n]
            }
            guard let end = got.firstIndex(of: 10) else { return "no answer from the air" }
            switch try JSONDecoder().decode(AirAnswer.self, from: Data(got[..<end])).news {
            case .noticeTaken: return nil
            case .noticeRefused(let why): return "the air refused it: \(why)"
            default: return "the air answered with something else than a notice's answer"
            }
        } catch {
            return "\(error)"
        }
    }
}

public enum AirError: Error, CustomStringConvertible {
    case socket(String)
    public var description: String {
        switch self { case .socket(let s): return s }
    }
}
