import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One connected byte stream, as every part of the product reads and writes sockets: a blocking
/// TCP socket from `Dialer` or `Listener`, with or without TLS over it. Reads and writes are
/// bounded by the socket's timeouts (`setTimeouts`); a timeout is a `NetError(.timeout)`.
/// Not safe for concurrent readers or concurrent writers (one of each is fine for plain
/// sockets; TLS needs one thread at a time).
public final class Connection: @unchecked Sendable {
    /// The socket; owned by the connection, closed by `close()`.
    public let fd: Int32
    /// What the connection is to, for error messages ("n1.lab:8701", "10.0.0.5:40022").
    public let name: String
    private var closed = false
    private let lock = NSLock()

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

    /// Bounds every following read and write (blocking sockets).
    public func setTimeouts(seconds: Double) { Sockets.setTimeouts(fd, seconds: seconds) }

    /// Reads at most `buffer.count` bytes; 0 at the end of the stream.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        while true {
            let n = recv(fd, base, buffer.count, 0)
            if n >= 0 { return n }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { throw NetError(.timeout, "\(name): timed out waiting for data") }
            throw NetError(.protocolError, "\(name): receive failed: \(NetError.text(errno: e))")
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
        var off = 0
        while off < bytes.count {
            let n = send(fd, base + off, bytes.count - off, Int32(MSG_NOSIGNAL))
            if n > 0 { off += n; continue }
            let e = errno
            if n < 0 && e == EINTR { continue }
            if n < 0 && (e == EAGAIN || e == EWOULDBLOCK) { throw NetError(.timeout, "\(name): timed out sending") }
            throw NetError(.protocolError, "\(name): send failed: \(NetError.text(errno: e))")
        }
    }

    public func write(_ data: Data) throws { try data.withUnsafeBytes { try write($0) } }
    public func write(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try write($0) } }
    public func write(_ text: String) throws { try write(Data(text.utf8)) }

    /// Stops reads and writes in both directions (a reader blocked on another thread returns 0).
    public func shutdown() { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) }

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
