import Foundation
import HeraldCore
import HTTPTypes
import Hummingbird
import LabPlan
import NIOCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The answers HeraldLab's routes give, as Hummingbird's `Response`: JSON (errors as
/// `{"error": message}`), bytes, a file streamed from disk with ranges, server-sent events.
extension Response {
    /// `body` with `headers` (names as they are to be sent).
    public init(_ status: HTTPResponse.Status = .ok, headers: [String: String] = [:], body: Data = Data()) {
        var fields = HTTPFields()
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) {
            if let n = HTTPField.Name(name) { fields.append(HTTPField(name: n, value: value)) }
        }
        self.init(status: status, headers: fields, body: ResponseBody(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// A header field by its name as sent (`r["Set-Cookie"] = ...`).
    public subscript(field: String) -> String? {
        get { HTTPField.Name(field).flatMap { headers[$0] } }
        set { if let n = HTTPField.Name(field) { headers[n] = newValue } }
    }

    /// A JSON body (LabJSON: keys sorted).
    public static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        do {
            return Response(status, headers: ["Content-Type": "application/json"], body: try LabJSON.encoder.encode(value))
        } catch {
            // Never an empty object in place of the answer: the client is told it has none.
            return .error(.internalServerError, "cannot encode the answer: \(error)")
        }
    }

    /// `{"error": message}` with a status.
    public static func error(_ status: HTTPResponse.Status, _ message: String) -> Response {
        json(["error": message], status: status)
    }

    /// The body's bytes, written out (tests of pages and small answers); nil for a stream.
    public var data: Data? {
        get async {
            guard body.contentLength != nil else { return nil }
            let collector = Collector()
            do { try await body.write(collector) } catch { return nil }
            return collector.bytes.withLock { $0 }
        }
    }

    /// A body written over time (server-sent events): `produce` writes chunks with `write` until
    /// it returns; `write` throws once the peer has gone or the stream's time is up. Sent
    /// chunked, never buffered whole, and the connection ends with it; at most `maxStreams` at
    /// once (503 beyond), each at most `streamSeconds`.
    public static func stream(headers: [String: String], _ produce: @escaping @Sendable (_ write: (Data) async throws -> Void) async throws -> Void) throws -> Response {
        guard let slot = StreamSlot() else {
            throw HTTPError(.serviceUnavailable, headers: [.connection: "close"], message: "too many event streams open; try again later")
        }
        var r = Response(.ok, headers: headers)
        r.headers[.connection] = "close"
        r.body = ResponseBody { writer in
            let deadline = monotonicNow() + streamSeconds
            do {
                try await produce { data in
                    guard !data.isEmpty else { return }
                    guard monotonicNow() < deadline else { throw HTTPError(.requestTimeout, message: "the stream's time is up") }
                    try await writer.write(ByteBuffer(bytes: data))
                }
            } catch {
                // The peer has gone or the time is up: the stream ends here.
            }
            withExtendedLifetime(slot) {}
            do { try await writer.finish(nil) } catch {
                // The peer has gone: nothing is left to end.
            }
        }
        return r
    }

    static let maxStreams = 32
    static let streamSeconds = 300.0
}

/// One of the `maxStreams` places of the event streams, taken while its answer lives (given
/// back when the body has been written, or dropped unwritten, as for HEAD).
final class StreamSlot: Sendable {
    static let open = Mutex(0)
    init?() {
        guard Self.open.withLock({ open in guard open < Response.maxStreams else { return false }; open += 1; return true }) else { return nil }
    }
    deinit { Self.open.withLock { $0 -= 1 } }
}

/// A body writer that keeps what is written (`Response.data`).
final class Collector: ResponseBodyWriter, Sendable {
    let bytes = Mutex(Data())
    func write(_ buffer: ByteBuffer) async throws { bytes.withLock { $0.append(contentsOf: buffer.readableBytesView) } }
    func finish(_ trailingHeaders: HTTPFields?) async throws {}
}
