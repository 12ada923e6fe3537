import CTLS
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One connected byte stream, as every part of the product reads and writes sockets: a blocking
/// TCP socket from `Dialer` or `Listener`, with or without TLS over it. Reads and writes are
/// bounded by the socket's timeouts (`setTimeouts`); a timeout is a `NetError(.timeout)`. A peer
/// that has gone (reset, broken pipe, TLS close under a write, a fatal alert) is a
/// `NetError(.closed)` at the first read or write that meets it, never a retry: the caller closes
/// the connection and drops what it still had to send.
/// Not safe for concurrent readers or concurrent writers (one of each is fine for plain
/// sockets; TLS needs one thread at a time).
public final class Connection: @unchecked Sendable {
    /// The socket; owned by the connection, closed by `close()`.
    public let fd: Int32
    /// What the connection is to, for error messages ("n1.lab:8701", "10.0.0.5:40022").
    public let name: String
    private var closed = false
    private let lock = NSLock()
    /// The TLS session (ctls_conn), when the stream is TLS. After the handshake its socket is
    /// non-blocking; reads and writes wait with poll() for at most `timeout`, and the session is
    /// used by one thread at a time (`tlsLock`), so that one reader and one writer can share it.
    private var tls: OpaquePointer?
    private let tlsLock = NSLock()
    private var timeout: Double?

    /// Takes ownership of a connected socket (plain).
    public init(fd: Int32, name: String) {
        self.fd = fd
        self.name = name
    }

    /// Whether the stream is TLS (set once, at the handshake; stays true after close).
    public private(set) var isTLS = false

    /// Dials `host:port` (see `Dialer.connect`); with `tls`, handshakes and checks that the
    /// server's certificate is the lab CA's and names `host`.
    public static func dial(host: String, port: UInt16, timeout: TimeInterval = 10, tls: TLSContext? = nil) throws -> Connection {
        let fd = try Dialer.connect(host: host, port: port, timeout: timeout)
        let c = Connection(fd: fd, name: "\(HostPort(host: host, port: port))")
        if let tls {
            c.setTimeouts(seconds: timeout)
            var err = [CChar](repeating: 0, count: 512)
            guard let session = ctls_connect(tls.raw, fd, HostPort.unbracketed(host), &err, err.count) else {
                c.close()
                throw NetError(.tls, "\(c.name): \(NetError.text(cBuffer: err))")
            }
            c.tls = session
            c.isTLS = true
        }
        return c
    }

    /// Takes an accepted socket; with `tls`, handshakes as the server, bounded by `timeout` in
    /// all. When it throws, the socket is still the caller's to close.
    public static func accepted(fd: Int32, name: String, tls: TLSContext?, timeout: TimeInterval = 10) throws -> Connection {
        guard let tls else { return Connection(fd: fd, name: name) }
        let c = try acceptingTLS(fd: fd, name: name, tls: tls)
        c.setTimeouts(seconds: timeout)
        do {
            guard try c.handshake(waiting: timeout) else { throw NetError(.tls, "\(name): TLS handshake: timed out") }
        } catch {
            c.abandon()
            throw error
        }
        return c
    }

    /// Frees the session and leaves the descriptor open (the caller closes it).
    private func abandon() {
        lock.withLock { closed = true }
        tlsLock.withLock {
            if let session = tls { ctls_free(session) }
            tls = nil
        }
    }

    /// Whether a server handshake begun with `acceptingTLS` is still to finish (`handshake`).
    public var isHandshaking: Bool { tlsLock.withLock { handshaking } }
    private var handshaking = false

    /// Starts a server TLS session on an accepted socket without waiting for the handshake:
    /// `handshake(waiting:)` moves it on, a little at a time, so that a peer that sends its
    /// handshake slowly holds no thread between the steps. When it throws, the socket is still
    /// the caller's to close.
    public static func acceptingTLS(fd: Int32, name: String, tls: TLSContext) throws -> Connection {
        let c = Connection(fd: fd, name: name)
        var err = [CChar](repeating: 0, count: 512)
        guard let session = ctls_accept_begin(tls.raw, fd, &err, err.count) else {
            c.abandon()
            throw NetError(.tls, "\(name): \(NetError.text(cBuffer: err))")
        }
        c.tls = session
        c.isTLS = true
        c.handshaking = true
        return c
    }

    /// Moves a handshake begun with `acceptingTLS` on for at most `seconds` in all (the socket is
    /// non-blocking and each wait is for what is left, so a peer trickling its bytes cannot
    /// stretch it): true once it is done, false when the time is up (call again once the socket
    /// is readable). Throws when the handshake fails.
    public func handshake(waiting seconds: Double) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        var err = [CChar](repeating: 0, count: 512)
        while true {
            tlsLock.lock()
            guard handshaking else { tlsLock.unlock(); return true }
            guard let session = tls else { tlsLock.unlock(); throw NetError(.closed, "\(name): the connection was closed") }
            let rc = ctls_handshake(session, &err, err.count)
            if rc == 1 { handshaking = false }
            tlsLock.unlock()
            let events: Int16
            switch rc {
            case 1: return true
            case Int32(CTLS_WANT_READ): events = Int16(POLLIN)
            case Int32(CTLS_WANT_WRITE): events = Int16(POLLOUT)
            default: throw NetError(.tls, "\(name): \(NetError.text(cBuffer: err))")
            }
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else { return false }
            timeout = left
            do { try wait(events, doing: "the TLS handshake") } catch let e as NetError where e.kind == .timeout { return false }
        }
    }

    /// Bytes already received and decrypted, waiting to be read (TLS; 0 for a plain socket):
    /// a reader that waits for the socket to become readable must read these first.
    public var pendingBytes: Int {
        guard let session = tls else { return 0 }
        tlsLock.lock(); defer { tlsLock.unlock() }
        return Int(ctls_pending(session))
    }

    deinit { close() }

    /// Bounds every following read and write.
    public func setTimeouts(seconds: Double) {
        timeout = seconds
        Sockets.setTimeouts(fd, seconds: seconds)
    }

    /// Waits until the socket is ready for `events`, for at most the timeout.
    private func wait(_ events: Int16, doing what: String) throws {
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        while true {
            let left = deadline.map { max(0, $0.timeIntervalSinceNow) }
            if let left, left <= 0 { throw NetError(.timeout, "\(name): timed out \(what)") }
            var p = pollfd(fd: fd, events: events, revents: 0)
            let rc = poll(&p, 1, left.map { Int32(min($0 * 1000, 2_000_000_000).rounded(.up)) } ?? -1)
            if rc > 0 { return }
            if rc == 0 { continue }
            if errno == EINTR { continue }
            throw NetError(.protocolError, "\(name): poll failed: \(NetError.text(errno: errno))")
        }
    }

    /// One TLS record operation, waiting while OpenSSL wants the socket. The session is looked
    /// up under the lock each time: `close()` on another thread frees it.
    private func tlsIO(doing what: String, _ op: (OpaquePointer, UnsafeMutablePointer<CChar>, Int) -> Int32) throws -> Int {
        var err = [CChar](repeating: 0, count: 256)
        while true {
            tlsLock.lock()
            guard let session = tls else {
                tlsLock.unlock()
                throw NetError(.protocolError, "\(name): the connection was closed")
            }
            let rc = op(session, &err, err.count)
            tlsLock.unlock()
            if rc >= 0 { return Int(rc) }
            switch rc {
            case Int32(CTLS_WANT_READ): try wait(Int16(POLLIN), doing: what)
            case Int32(CTLS_WANT_WRITE): try wait(Int16(POLLOUT), doing: what)
            // The session is dead (ctls never retries it): the peer has gone, or failed.
            case Int32(CTLS_CLOSED): throw NetError(.closed, "\(name): \(NetError.text(cBuffer: err))")
            default: throw NetError(.tls, "\(name): \(NetError.text(cBuffer: err))")
            }
        }
    }

    /// A closed connection's descriptor number may already belong to another socket: nothing is
    /// read from or written to it.
    private func ensureOpen() throws {
        if lock.withLock({ closed }) { throw NetError(.closed, "\(name): the connection was closed") }
    }

    /// Reads at most `buffer.count` bytes; 0 at the end of the stream.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        try ensureOpen()
        if isTLS {
            let len = Int32(clamping: buffer.count)
            return try tlsIO(doing: "waiting for data") { ctls_read($0, base, len, $1, $2) }
        }
        while true {
            let n = recv(fd, base, buffer.count, 0)
            if n >= 0 { return n }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { throw NetError(.timeout, "\(name): timed out waiting for data") }
            throw NetError(NetError.peerGone(e) ? .closed : .protocolError, "\(name): receive failed: \(NetError.text(errno: e))")
        }
    }

    /// Reads into a byte array's free space from `from` on; returns the count (0 at the end).
    public func read(into bytes: inout [UInt8], from: Int = 0) throws -> Int {
        try bytes.withUnsafeMutableBytes { raw in
            try read(into: UnsafeMutableRawBufferPointer(rebasing: raw[from...]))
        }
    }

    /// Writes every byte.
    public func write(_ bytes: UnsafeRawBufferPointer) throws {
        guard let base = bytes.baseAddress else { return }
        try ensureOpen()
        var off = 0
        if isTLS {
            while off < bytes.count {
                let len = Int32(clamping: bytes.count - off)
                let p = base + off
                let n = try tlsIO(doing: "sending") { ctls_write($0, p, len, $1, $2) }
                // A write moves at least one byte or throws (ctls never returns 0 for one); a 0
                // here would loop for ever, so it ends the connection instead.
                guard n > 0 else { throw NetError(.closed, "\(name): send failed: the connection took no bytes") }
                off += n
            }
            return
        }
        while off < bytes.count {
            let n = send(fd, base + off, bytes.count - off, Int32(MSG_NOSIGNAL))
            if n > 0 { off += n; continue }
            let e = errno
            if n < 0 && e == EINTR { continue }
            if n < 0 && (e == EAGAIN || e == EWOULDBLOCK) { throw NetError(.timeout, "\(name): timed out sending") }
            throw NetError(NetError.peerGone(e) || n == 0 ? .closed : .protocolError, "\(name): send failed: \(NetError.text(errno: e))")
        }
    }

    /// sendfile(2) has no MSG_NOSIGNAL: a peer that has gone raises SIGPIPE, which would end the
    /// process. It is ignored once, before the first sendfile (as before the first TLS context);
    /// the send then fails with EPIPE.
    private static let ignoreSIGPIPE: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// Sends `count` bytes of the open file `file` from `offset` with sendfile(2): the kernel
    /// passes the file's pages to the socket, and no byte is copied through user memory. Plain
    /// streams only (TLS must encrypt in user space: use `write`). Partial sends are continued;
    /// when the socket does not take a byte for the timeout (`setTimeouts`; EAGAIN) it is a
    /// `NetError(.timeout)`, as for `write`. Returns the bytes sent: fewer than `count` only
    /// when the file ends first (it shrank).
    public func sendFile(_ file: Int32, offset: Int, count: Int) throws -> Int {
        precondition(!isTLS, "sendFile on a TLS stream")
        Self.ignoreSIGPIPE
        var position = off_t(offset)
        let end = off_t(offset + count)
        while position < end {
            // At most 1 GiB a call (sendfile moves at most 0x7ffff000 bytes at once).
            let n = sendfile(fd, file, &position, Int(min(end - position, 1 << 30)))
            if n > 0 { continue } // `position` has moved on by n
            if n == 0 { break } // the end of the file
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK {
                // A blocking socket gave up after its send timeout; a non-blocking one waits here
                // as long (poll), then gives up the same way.
                let flags = fcntl(fd, F_GETFL)
                if flags >= 0 && flags & O_NONBLOCK != 0 {
                    try wait(Int16(POLLOUT), doing: "sending")
                    continue
                }
                throw NetError(.timeout, "\(name): timed out sending")
            }
            throw NetError(NetError.peerGone(e) ? .closed : .protocolError, "\(name): sendfile failed: \(NetError.text(errno: e))")
        }
        return Int(position) - offset
    }

    public func write(_ data: Data) throws { try data.withUnsafeBytes { try write($0) } }
    public func write(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try write($0) } }
    public func write(_ text: String) throws { try write(Data(text.utf8)) }

    /// Stops reads and writes in both directions (a reader blocked on another thread returns 0).
    /// Nothing once closed: the descriptor's number may belong to another socket by then.
    public func shutdown() { lock.withLock { if !closed { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) } } }

    /// Closes the socket (once).
    public func close() {
        lock.lock(); defer { lock.unlock() }
        guard !closed else { return }
        closed = true
        if let session = tls {
            tlsLock.lock()
            ctls_free(session)
            tls = nil
            tlsLock.unlock()
        }
        _ = Glibc.close(fd)
    }

    /// The peer's numeric address (no brackets), when connected.
    public var peerHost: String? { Sockets.peerHost(fd) }
}
