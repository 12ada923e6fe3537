import Foundation
import Logging
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// How reading from a connection ended early.
enum ReadEnd: Error {
    /// The peer closed (or reset) the connection.
    case closed
    /// The deadline passed.
    case timeout
    /// The head is incomplete and the worker's slice is over: the event loop waits for more.
    case parked
}

/// Where the scan of a head that arrives in pieces stopped (indices into the connection's input).
struct HeadScan {
    var scan = 0
    var lineStart = 0
    /// After any empty lines before the request line.
    var headStart = 0
    var requestLine: Range<Int>?
    var lines: [Range<Int>] = []
    var isFresh: Bool { scan == 0 }
}

/// Serving one connection, on a worker thread: the request's head and body are read with their
/// deadlines and limits, the handler runs as a task (no worker waits for it), and its answer is
/// written by a worker again; then the connection goes back to the event loop.
extension HTTPService {
    private static let chunkLineLimit = 1024
    private static let fileBuffer = 256 * 1024

    /// Reads and dispatches the next request on `c`. Called by the event loop when `c` has
    /// bytes, and after an answer when bytes of a next request are already read.
    func serve(_ c: ServerConnection) {
        let loop = EventLoop.shared
        if c.connection == nil {
            do { c.connection = try wrapConnection(c) } catch {
                logger.notice("connection from \(c.remote) failed: \(Self.escaped("\(error)"))", metadata: ["peer": .string(c.remote)])
                loop.release(c)
                return
            }
        }
        if let connection = c.connection, connection.isHandshaking {
            // The TLS handshake, a slice at a time within the header deadline: a peer that sends
            // it slowly waits in the loop, holding no worker.
            let deadline = c.headStarted + limits.headerTimeout
            do {
                if try !connection.handshake(waiting: max(0.001, min(Self.headSlice, deadline - monotonicNow()))) {
                    if monotonicNow() < deadline { loop.park(c, deadline: deadline) } else { loop.release(c) }
                    return
                }
            } catch {
                logger.notice("connection from \(c.remote) failed: \(Self.escaped("\(error)"))", metadata: ["peer": .string(c.remote)])
                loop.release(c)
                return
            }
        }
        let head: RequestHead
        do {
            head = try readHead(c)
        } catch let r as Refusal {
            refuse(c, r, head: nil)
            return
        } catch ReadEnd.parked {
            // Part of a head: the loop waits for the rest, until the header deadline.
            loop.park(c, deadline: c.headStarted + limits.headerTimeout)
            return
        } catch ReadEnd.timeout where c.input.available > 0 {
            refuse(c, Refusal(.requestTimeout, "the request head did not arrive within \(Self.seconds(limits.headerTimeout))"), head: nil)
            return
        } catch {
            // Closed, or nothing sent at all: closed without an answer.
            loop.release(c)
            return
        }

        let route: Route, parameters: [String: String], principal: Principal?
        switch admit(head) {
        case .refuse(let status, let message, let logged):
            if let logged { logger.warning("refused \(head.method) \(Self.escaped(head.path)) from \(c.remote): \(logged)", metadata: ["peer": .string(c.remote)]) }
            respondEarly(c, .error(status, message), head: head)
            return
        case .route(let r, let p, let who):
            (route, parameters, principal) = (r, p, who)
        }
        if let length = head.contentLength, length > route.bodyLimit {
            refuse(c, Refusal(.payloadTooLarge, "request body over \(route.bodyLimit) bytes"), head: head,
                   logged: "body of \(length) bytes over the \(route.bodyLimit)-byte limit")
            return
        }
        var body = Data()
        if head.hasBody {
            do {
                if head.expectContinue { try c.connection!.write("HTTP/1.1 100 Continue\r\n\r\n") }
                body = try readBody(c, head, limit: route.bodyLimit, deadline: monotonicNow() + limits.bodyTimeout)
            } catch let r as Refusal {
                refuse(c, r, head: head, logged: r.status == .payloadTooLarge ? "chunked body over the \(route.bodyLimit)-byte limit" : nil)
                return
            } catch ReadEnd.timeout {
                refuse(c, Refusal(.requestTimeout, "the request body did not arrive within \(Self.seconds(limits.bodyTimeout))"), head: head)
                return
            } catch {
                loop.release(c)
                return
            }
        }
        let request = Request(method: head.method, path: head.path, parameters: parameters, query: head.query, headers: head.headers,
                              body: body, remote: c.remote, peerHost: c.peerHost, principal: principal)
        Task.detached { [self] in
            let response = await self.respond(route, request)
            loop.workers.run { self.finish(c, head, response) }
        }
    }

    /// Whether the peer leaves answers unread: the socket is no longer writable (the kernel
    /// holds more than about two thirds of its send buffer for the peer). Such a connection gets
    /// no further request served: a client that sends requests without reading the answers
    /// would otherwise leave a worker blocked writing to it.
    private func answersPileUp(_ c: ServerConnection) -> Bool {
        var p = pollfd(fd: c.fd, events: Int16(POLLOUT), revents: 0)
        return poll(&p, 1, 0) == 0
    }

    /// Writes a handler's answer, then serves the next request or parks the connection.
    private func finish(_ c: ServerConnection, _ head: RequestHead, _ response: HTTPResponse) {
        if case .stream(let produce) = response.body {
            stream(c, head, response, produce)
            return
        }
        answer(c, response, head: head, keepAlive: head.keepAlive, onClose: { EventLoop.shared.release($0) })
    }

    /// Writes an answer; then, on a kept-alive connection, serves the next request or parks it;
    /// otherwise ends it with `onClose`.
    private func answer(_ c: ServerConnection, _ response: HTTPResponse, head: RequestHead, keepAlive wanted: Bool,
                        onClose: (ServerConnection) -> Void) {
        let loop = EventLoop.shared
        let keepAlive = wanted && !loop.lock.withLock { stopping }
        do {
            try write(response, to: c, head: head, close: !keepAlive)
        } catch {
            loop.release(c)
            return
        }
        if !keepAlive {
            onClose(c)
        } else if answersPileUp(c) {
            logger.warning("closed the connection from \(c.remote): it does not read its answers", metadata: ["peer": .string(c.remote)])
            loop.linger(c)
        } else if c.input.available > 0 {
            next(c)
        } else {
            loop.park(c)
        }
    }

    /// Serves a pipelined request (already partly read) as a new job: a client pipelining
    /// thousands of requests never deepens a worker's stack, and waits its turn.
    private func next(_ c: ServerConnection) {
        c.headStarted = monotonicNow()
        EventLoop.shared.workers.run { [self] in serve(c) }
    }

    /// An answer given before the body was read (auth, routing): the connection stays open only
    /// when there is no body to skip, and is otherwise closed after lingering.
    private func respondEarly(_ c: ServerConnection, _ response: HTTPResponse, head: RequestHead) {
        answer(c, response, head: head, keepAlive: head.keepAlive && !head.hasBody, onClose: { EventLoop.shared.linger($0) })
    }

    /// Answers a request that breaks a rule, logs why, and closes the connection (after
    /// lingering: the client may still be sending what was refused).
    private func refuse(_ c: ServerConnection, _ r: Refusal, head: RequestHead?, logged: String? = nil) {
        let what = head.map { "\($0.method) \(Self.escaped($0.path))" } ?? r.request.map(Self.escaped) ?? "a request"
        logger.warning("refused \(what) from \(c.remote): \(r.status.code) \(Self.escaped(logged ?? r.message))", metadata: ["peer": .string(c.remote)])
        do {
            try write(.error(r.status, r.message), to: c, head: head, close: true)
        } catch {
            EventLoop.shared.release(c)
            return
        }
        EventLoop.shared.linger(c)
    }

    static func seconds(_ t: Double) -> String {
        t == t.rounded() ? "\(Int(t)) s" : "\(t) s"
    }

    // MARK: Reading

    /// Reads once into `c.input` (at most `max` bytes), waiting until `deadline` at most.
    private func fill(_ c: ServerConnection, deadline: Double, max: Int = 16 * 1024) throws {
        let remaining = deadline - monotonicNow()
        guard remaining > 0 else { throw ReadEnd.timeout }
        guard let connection = c.connection else { throw ReadEnd.closed }
        connection.setTimeouts(seconds: remaining)
        let scratch = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: max)
        defer { scratch.deallocate() }
        let n: Int
        do {
            n = try connection.read(into: UnsafeMutableRawBufferPointer(scratch))
        } catch let e as NetError where e.kind == .timeout {
            throw ReadEnd.timeout
        } catch {
            throw ReadEnd.closed
        }
        if n == 0 { throw ReadEnd.closed }
        c.input.bytes.append(contentsOf: UnsafeBufferPointer(rebasing: scratch[0..<n]))
        // Plaintext TLS holds decrypted (the rest of a record) is taken too: a connection parked
        // to wait for a readable socket must leave nothing behind in the session (one record,
        // 16 KiB at most, beyond `max`).
        var left = connection.pendingBytes
        while left > 0 {
            let more = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: left)
            defer { more.deallocate() }
            let m: Int
            do { m = try connection.read(into: UnsafeMutableRawBufferPointer(more)) } catch { throw ReadEnd.closed }
            c.input.bytes.append(contentsOf: UnsafeBufferPointer(rebasing: more[0..<m]))
            left = m > 0 ? connection.pendingBytes : 0
        }
    }

    /// Moves `count` bytes of the connection's input to `body`.
    private func take(_ count: Int, from c: ServerConnection, to body: inout Data) {
        let start = c.input.start
        c.input.bytes.withUnsafeBufferPointer { body.append(UnsafeBufferPointer(rebasing: $0[start..<(start + count)])) }
        c.input.consume(count)
    }

    /// How long a worker waits for the rest of a head before it gives the connection back to
    /// the event loop (with what it has read, and the same header deadline): a client sending
    /// its head slowly holds a connection, never a worker.
    static let headSlice = 0.05

    /// Reads a request's head within the header deadline and the size limits: 414 for a request
    /// line over `maxRequestLine`, 431 for a head over `maxHeaderBytes` or with more than
    /// `maxHeaderCount` fields; nothing beyond the limit is buffered. Throws `ReadEnd.parked`
    /// when the head is still incomplete after `headSlice` (the scan resumes where it stopped).
    func readHead(_ c: ServerConnection) throws -> RequestHead {
        let deadline = c.headStarted + limits.headerTimeout
        let slice = monotonicNow() + Self.headSlice
        if c.scan.isFresh { c.input.compact() }
        while true {
            if let head = try scanHead(c) { return head }
            // The head is not complete: nothing more is read once a limit is passed.
            let h = c.scan
            if h.requestLine == nil && h.scan - h.lineStart > limits.maxRequestLine {
                throw Refusal(.uriTooLong, "request line over \(limits.maxRequestLine) bytes")
            }
            if h.scan - h.headStart > limits.maxHeaderBytes {
                throw Refusal(.requestHeaderFieldsTooLarge, "request head over \(limits.maxHeaderBytes) bytes")
            }
            if h.headStart > limits.maxHeaderBytes {
                throw Refusal(.badRequest, "too many empty lines before the request")
            }
            do {
                // Never more than one byte past the head's limit is read.
                try fill(c, deadline: min(deadline, slice), max: max(1, limits.maxHeaderBytes + 1 - (c.input.bytes.count - h.headStart)))
            } catch ReadEnd.timeout where monotonicNow() < deadline {
                throw ReadEnd.parked
            }
        }
    }

    /// Scans the bytes read since the last call for line ends; the head once it is complete.
    private func scanHead(_ c: ServerConnection) throws -> RequestHead? {
        var h = c.scan
        defer { c.scan = h }
        var end = 0
        let head = try c.input.bytes.withUnsafeBufferPointer { bytes -> RequestHead? in
            while h.scan < bytes.count {
                // The next line end (memchr: a byte loop is slow in debug builds).
                guard let base = bytes.baseAddress, let found = memchr(base + h.scan, 0x0A, bytes.count - h.scan) else {
                    h.scan = bytes.count
                    break
                }
                h.scan = base.distance(to: found.assumingMemoryBound(to: UInt8.self)) + 1
                guard h.scan - 2 >= h.lineStart, bytes[h.scan - 2] == 0x0D else {
                    throw Refusal(.badRequest, "bare LF in the request head")
                }
                let line = h.lineStart..<(h.scan - 2)
                h.lineStart = h.scan
                if h.requestLine == nil {
                    if line.isEmpty {
                        // Empty lines before a request line are skipped (RFC 9112 2.2).
                        h.headStart = h.scan
                        continue
                    }
                    guard line.count <= limits.maxRequestLine else { throw Refusal(.uriTooLong, "request line over \(limits.maxRequestLine) bytes") }
                    h.requestLine = line
                } else if line.isEmpty {
                    guard h.scan - h.headStart <= limits.maxHeaderBytes else {
                        throw Refusal(.requestHeaderFieldsTooLarge, "request head over \(limits.maxHeaderBytes) bytes")
                    }
                    let all = Array(bytes)
                    let head = try RequestHead.parse(requestLine: all[h.requestLine!], lines: h.lines.map { all[$0] })
                    end = h.scan
                    h = HeadScan()
                    return head
                } else {
                    h.lines.append(line)
                    guard h.lines.count <= limits.maxHeaderCount else {
                        throw Refusal(.requestHeaderFieldsTooLarge, "more than \(limits.maxHeaderCount) header fields")
                    }
                }
                guard h.scan - h.headStart <= limits.maxHeaderBytes else {
                    throw Refusal(.requestHeaderFieldsTooLarge, "request head over \(limits.maxHeaderBytes) bytes")
                }
            }
            return nil
        }
        if head != nil { c.input.start = end }
        return head
    }

    /// Reads a body of `Content-Length` bytes or a chunked one, within `deadline`; a chunked body
    /// is refused (413) as soon as its count passes `limit`, before the chunk is read.
    private func readBody(_ c: ServerConnection, _ head: RequestHead, limit: Int, deadline: Double) throws -> Data {
        if let length = head.contentLength {
            var body = Data(capacity: length)
            while body.count < length {
                if c.input.available == 0 { try fill(c, deadline: deadline, max: min(256 * 1024, length - body.count)) }
                take(min(c.input.available, length - body.count), from: c, to: &body)
            }
            return body
        }
        var body = Data()
        while true {
            let sizeLine = try readLine(c, deadline: deadline, max: Self.chunkLineLimit, what: "chunk size line")
            let digits = sizeLine.prefix { $0 != UInt8(ascii: ";") }
            guard !digits.isEmpty, digits.count <= 16, digits.allSatisfy({ RequestHead.hexValue($0) != nil }),
                  let size = Int(String(decoding: digits, as: UTF8.self), radix: 16), size >= 0 else {
                throw Refusal(.badRequest, "malformed chunk size")
            }
            for b in sizeLine where b < 0x20 && b != 0x09 || b == 0x7F { throw Refusal(.badRequest, "control character in a chunk line") }
            if size == 0 { break }
            guard size <= limit - body.count else { throw Refusal(.payloadTooLarge, "request body over \(limit) bytes") }
            var left = size
            while left > 0 {
                if c.input.available == 0 { try fill(c, deadline: deadline, max: min(256 * 1024, left + 2)) }
                let count = min(c.input.available, left)
                take(count, from: c, to: &body)
                left -= count
            }
            guard try readLine(c, deadline: deadline, max: 0, what: "chunk end").isEmpty else {
                throw Refusal(.badRequest, "chunk data longer than its size")
            }
        }
        // Trailer fields: read and ignored, within the head's limit.
        var trailers = 0
        while true {
            let line = try readLine(c, deadline: deadline, max: limits.maxHeaderBytes, what: "trailer")
            if line.isEmpty { return body }
            trailers += line.count + 2
            guard trailers <= limits.maxHeaderBytes else { throw Refusal(.requestHeaderFieldsTooLarge, "trailer fields over \(limits.maxHeaderBytes) bytes") }
        }
    }

    /// The next CRLF-ended line of at most `max` bytes (without its CRLF).
    private func readLine(_ c: ServerConnection, deadline: Double, max: Int, what: String) throws -> [UInt8] {
        var scan = c.input.start
        while true {
            let bytes = c.input.bytes
            while scan < bytes.count {
                if bytes[scan] == 0x0A {
                    guard scan > c.input.start, bytes[scan - 1] == 0x0D else { throw Refusal(.badRequest, "bare LF in a \(what)") }
                    let line = Array(bytes[c.input.start..<(scan - 1)])
                    c.input.consume(scan + 1 - c.input.start)
                    return line
                }
                scan += 1
            }
            guard bytes.count - c.input.start <= max + 1 else { throw Refusal(.badRequest, "\(what) over \(max) bytes") }
            try fill(c, deadline: deadline, max: 4096)
        }
    }

    // MARK: Writing

    /// Writes an answer: status line, the response's fields (those that are not valid field
    /// text are dropped), Content-Length and Connection, then the body (none for HEAD); a file
    /// goes with sendfile on a plain connection, and is read and written 256 KiB at a time over
    /// TLS.
    func write(_ response: HTTPResponse, to c: ServerConnection, head: RequestHead?, close: Bool) throws {
        guard let connection = c.connection else { throw ReadEnd.closed }
        connection.setTimeouts(seconds: limits.writeTimeout)
        var text = "HTTP/1.1 \(response.status.code) \(response.status.phrase)\r\n"
        for (k, v) in response.headers.sorted(by: { $0.key < $1.key }) {
            let lower = k.lowercased()
            guard !["content-length", "connection", "transfer-encoding"].contains(lower), !k.isEmpty,
                  k.utf8.allSatisfy(RequestHead.isTokenByte), !v.utf8.contains(where: { $0 < 0x20 && $0 != 0x09 || $0 == 0x7F }) else { continue }
            text += "\(k): \(v)\r\n"
        }
        if case .stream = response.body {
            text += "Transfer-Encoding: chunked\r\n"
        } else {
            text += "Content-Length: \(response.body.count)\r\n"
        }
        if close {
            text += "Connection: close\r\n"
        } else if head?.http10 == true {
            text += "Connection: keep-alive\r\n"
        }
        text += "\r\n"
        let withBody = head?.method != "HEAD"
        switch response.body {
        case .data(let data):
            var out = Data(text.utf8)
            if withBody { out.append(data) }
            try connection.write(out)
        case .stream:
            // Only the head: `stream` writes the chunks.
            try connection.write(text)
        case .file(let file, let range):
            try connection.write(text)
            guard withBody else { return }
            if !connection.isTLS {
                // Plain: the kernel sends the file's pages itself (sendfile), no copy through here.
                let sent = try connection.sendFile(file.fd, offset: range.lowerBound, count: range.count)
                // The file shrank under us: the promised length cannot be sent; the connection ends.
                guard sent == range.count else { throw ReadEnd.closed }
                return
            }
            var buffer = [UInt8](repeating: 0, count: Self.fileBuffer)
            var offset = range.lowerBound
            while offset < range.upperBound {
                let n = buffer.withUnsafeMutableBytes { file.read(into: $0, count: range.upperBound - offset, at: offset) }
                // The file shrank under us: the promised length cannot be sent; the connection ends.
                guard n > 0 else { throw ReadEnd.closed }
                try buffer.withUnsafeBytes { try connection.write(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                offset += n
            }
        }
    }
}
