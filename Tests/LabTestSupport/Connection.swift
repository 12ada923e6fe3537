import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// One connected byte stream for tests: a blocking TCP socket from `Dialer` or `Listener`
/// (plain; TLS streams are `TestStream`s). Once the product's every socket; since the HTTP
/// server, the air, downloads and clock probes moved to NIO, only tests use it. Reads and
/// writes are bounded by the socket's timeouts (`setTimeouts`); a timeout is a
/// `NetError(.timeout)`. A peer that has gone (reset, broken pipe) is a `NetError(.closed)` at
/// the first read or write that meets it, never a retry: the caller closes the connection and
/// drops what it still had to send.
/// Not safe for concurrent readers or concurrent writers (one of each is fine).
public final class Connection: @unchecked Sendable {
    /// The socket; owned by the connection, closed by `close()`.
    public let fd: Int32
    /// What the connection is to, for error messages ("n1.lab:8701", "10.0.0.5:40022").
    public let name: String
    private var closed = false
    private let lock = NSLock()
    private var timeout: Double?

    /// Takes ownership of a connected socket.
    public init(fd: Int32, name: String) {
        self.fd = fd
        self.name = name
    }

    /// Dials `host:port` (see `Dialer.connect`).
    public static func dial(host: String, port: UInt16, timeout: TimeInterval = 10) throws -> Connection {
        let fd = try Dialer.connect(host: host, port: port, timeout: timeout)
        return Connection(fd: fd, name: "\(HostPort(host: host, port: port))")
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

    /// A closed connection's descriptor number may already belong to another socket: nothing is
    /// read from or written to it.
    private func ensureOpen() throws {
        if lock.withLock({ closed }) { throw NetError(.closed, "\(name): the connection was closed") }
    }

    /// Reads at most `buffer.count` bytes; 0 at the end of the stream.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        try ensureOpen()
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
    /// process. It is ignored once, before the first sendfile;
    /// the send then fails with EPIPE.
    private static let ignoreSIGPIPE: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// Sends `count` bytes of the open file `file` from `offset` with sendfile(2): the kernel
    /// passes the file's pages to the socket, and no byte is copied through user memory. Partial
    /// sends are continued;
    /// when the socket does not take a byte for the timeout (`setTimeouts`; EAGAIN) it is a
    /// `NetError(.timeout)`, as for `write`. Returns the bytes sent: fewer than `count` only
    /// when the file ends first (it shrank).
    public func sendFile(_ file: Int32, offset: Int, count: Int) throws -> Int {
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
        _ = Glibc.close(fd)
    }

    /// The peer's numeric address (no brackets), when connected.
    public var peerHost: String? { Sockets.peerHost(fd) }
}
