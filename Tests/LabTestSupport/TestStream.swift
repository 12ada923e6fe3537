import Foundation
import LabNet
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// The event loops of every `TestStream` and `TestServer`: one group for all the tests.
public enum TestLoops {
    public static let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
}

/// Why a `TestStream` or `TestServer` call failed.
public struct StreamError: Error, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// No TCP connection: refused, unreachable, no such name.
        case connect
        /// Nothing came before the deadline.
        case timeout
        /// The TLS handshake failed (`refusal` says how).
        case tls
        /// The peer has gone: a reset, a broken pipe, the stream closed under a write.
        case closed
    }

    /// How a TLS handshake failed.
    public enum Refusal: Sendable, Equatable {
        /// The peer sent a fatal alert: BoringSSL's name for it ("TLSV1_ALERT_INTERNAL_ERROR").
        case alert(String)
        /// The peer's certificate is not signed by a CA this side trusts.
        case untrusted
        /// The certificate is the lab CA's but names neither the name nor the address dialled.
        case wrongName
        /// What the peer sent is not TLS.
        case notTLS
        /// Something else (the cause says what).
        case other
    }

    public let kind: Kind
    public let message: String
    /// The error NIO or swift-nio-ssl gave, when there was one.
    public let cause: Error?

    public var description: String { message }

    /// For a `.tls` failure: how the handshake was refused.
    public var refusal: Refusal? {
        guard kind == .tls, let cause else { return nil }
        if let extra = cause as? NIOSSLExtraError, extra == .failedToValidateHostname { return .wrongName }
        let text = "\(cause)"
        if text.contains("CERTIFICATE_VERIFY_FAILED") { return .untrusted }
        if text.contains("WRONG_VERSION_NUMBER") || text.contains("HTTP_REQUEST") { return .notTLS }
        // BoringSSL names a received alert SSLV3_ALERT_… or TLSV1_ALERT_… (its reason codes
        // 1000 and up are the alerts).
        if let range = text.range(of: #"(SSLV3|TLSV1)_ALERT_[A-Z_]+"#, options: .regularExpression) {
            return .alert(String(text[range]))
        }
        return .other
    }
}

/// One blocking TCP stream for tests, plain or TLS (swift-nio-ssl with the product's
/// `TLSContext`), on a NIO channel: a handler hands what arrives (bytes, the end, an error) to
/// the blocked reader, which waits on a condition with a deadline (no polling). Dial it with
/// `connect`, or take one a `TestServer` accepted. One reader and one writer at a time.
public final class TestStream: @unchecked Sendable {
    public let channel: Channel
    /// Whether the stream is TLS.
    public var isTLS: Bool { inbox.tls }
    /// What the stream is to, for messages ("127.0.0.1:8443").
    public let name: String
    /// How long a read or a write may wait.
    public var timeout: TimeInterval
    let inbox: Inbox

    init(channel: Channel, name: String, inbox: Inbox, timeout: TimeInterval) {
        self.channel = channel
        self.name = name
        self.inbox = inbox
        self.timeout = timeout
    }

    /// Dials `host:port` with LabNet's `Dialer` (bounded by `timeout`); with `tls`, handshakes as
    /// a client checking the server's certificate against the context's CA and the dialled name
    /// or address (`TLSContext.clientHandler(for:)`). Returns once the stream is ready (the
    /// handshake done), at most `timeout` in all.
    public static func connect(host: String, port: UInt16, timeout: TimeInterval = 10, tls: TLSContext? = nil) throws -> TestStream {
        let name = "\(HostPort(host: host, port: port))"
        let deadline = Date().addingTimeInterval(timeout)
        let fd: Int32
        do { fd = try Dialer.connect(host: host, port: port, timeout: timeout) } catch let e as NetError {
            throw StreamError(kind: e.kind == .timeout ? .timeout : .connect, message: e.message, cause: e)
        }
        let inbox = Inbox(tls: tls != nil)
        let made = ClientBootstrap(group: TestLoops.group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls { try channel.pipeline.syncOperations.addHandler(try tls.clientHandler(for: host)) }
                    try channel.pipeline.syncOperations.addHandler(StreamHandler(inbox: inbox))
                }
            }
            .withConnectedSocket(fd)
        let channel = try wait(made, until: deadline, name: name, doing: "setting up the channel")
        let stream = TestStream(channel: channel, name: name, inbox: inbox, timeout: timeout)
        do { try inbox.waitReady(until: deadline, name: name) } catch {
            stream.close()
            throw error
        }
        return stream
    }

    /// Writes every byte; returns once they are with the kernel.
    public func write(_ bytes: [UInt8]) throws {
        let written = channel.writeAndFlush(channel.allocator.buffer(bytes: bytes))
        do { _ = try Self.wait(written, until: Date().addingTimeInterval(timeout), name: name, doing: "writing") } catch let e as StreamError {
            // The handler may know better why the channel is over (a reset it read).
            throw inbox.failure(name: name) ?? e
        }
    }

    public func write(_ text: String) throws { try write(Array(text.utf8)) }
    public func write(_ data: Data) throws { try write(Array(data)) }

    /// Some bytes (at most `max`), waiting up to `timeout` for the first; empty at the end of the
    /// stream. Throws the stream's failure once nothing received is left to read.
    public func read(max: Int = 65536) throws -> [UInt8] {
        try inbox.take(max: max, until: Date().addingTimeInterval(timeout), name: name)
    }

    /// Reads until `done` holds for what was read (true: returns it), the stream ends (returns
    /// what came) or `timeout` has passed in all (throws `.timeout`).
    public func read(until done: ([UInt8]) -> Bool) throws -> [UInt8] {
        let deadline = Date().addingTimeInterval(timeout)
        var got = [UInt8]()
        while !done(got) {
            let some = try inbox.take(max: 65536, until: deadline, name: name)
            if some.isEmpty { break }
            got += some
        }
        return got
    }

    /// Reads up to and with the first `byte` (a line: 10), or to the end of the stream.
    public func read(through byte: UInt8) throws -> [UInt8] {
        try read(until: { $0.contains(byte) })
    }

    /// Reads to the end of the stream.
    public func readToEnd() throws -> [UInt8] { try read(until: { _ in false }) }

    /// Closes the stream and waits, at most `timeout`, until it is closed; nothing when it
    /// already is. Over TLS, close_notify is sent first (the output closed through the TLS
    /// handler), then the socket is closed without waiting for the peer's close_notify (a peer
    /// that does not read would hold the close for swift-nio-ssl's shutdown timeout).
    public func close() {
        let deadline = Date().addingTimeInterval(timeout)
        do {
            if isTLS {
                do { _ = try Self.wait(channel.close(mode: .output), until: deadline, name: name, doing: "sending close_notify") } catch {
                    // Closed already, or no session to notify: the socket is closed below all the same.
                }
            }
            _ = try Self.wait(closeSocket(), until: deadline, name: name, doing: "closing")
        } catch {
            // Already closed (by the peer, or before): nothing left to do.
        }
    }

    /// Resets the connection: SO_LINGER 0, then the socket is closed under the TLS layer (no
    /// close_notify), so that the peer gets a reset at once. Waits until it is closed; nothing
    /// when it already is (the peer closed it first). Throws only when it cannot tell in `timeout`.
    public func reset() throws {
        let deadline = Date().addingTimeInterval(timeout)
        guard let options = channel as? SocketOptionProvider else { preconditionFailure("\(name): a TestStream's channel is a socket's") }
        do {
            _ = try Self.wait(options.setSoLinger(linger(l_onoff: 1, l_linger: 0)), until: deadline, name: name, doing: "setting SO_LINGER")
            _ = try Self.wait(closeSocket(), until: deadline, name: name, doing: "resetting")
        } catch let e as StreamError where e.kind == .closed {
            // Closed already.
        }
    }

    /// Closes the socket itself: from the TLS handler's context when there is one, which goes
    /// straight to the socket (swift-nio-ssl would otherwise wait for the peer's close_notify).
    private func closeSocket() -> EventLoopFuture<Void> {
        channel.eventLoop.flatSubmit { () -> EventLoopFuture<Void> in
            let below: ChannelHandlerContext?
            do { below = try self.channel.pipeline.syncOperations.context(handlerType: NIOSSLHandler.self) } catch { below = nil }
            let promise = self.channel.eventLoop.makePromise(of: Void.self)
            if let below { below.close(promise: promise) } else { self.channel.close(promise: promise) }
            return promise.futureResult
        }
    }

    /// The future's value, waiting for it at most until `deadline` (a semaphore: no polling).
    static func wait<T>(_ future: EventLoopFuture<T>, until deadline: Date, name: String, doing what: String) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox<T>()
        future.whenComplete { box.result = $0; done.signal() }
        guard done.wait(timeout: .now() + max(0, deadline.timeIntervalSinceNow)) == .success, let result = box.result else {
            throw StreamError(kind: .timeout, message: "\(name): timed out \(what)", cause: nil)
        }
        switch result {
        case .success(let value): return value
        case .failure(let error): throw StreamError.from(error, name: name, handshaking: false)
        }
    }
}

final class ResultBox<T>: @unchecked Sendable {
    var result: Result<T, Error>?
}

extension StreamError {
    /// The kind of a NIO or swift-nio-ssl error: in the handshake, a TLS error is `.tls`; after
    /// it, a TLS error (an unclean shutdown, a record after a reset) means the peer has gone.
    static func from(_ error: Error, name: String, handshaking: Bool) -> StreamError {
        if let e = error as? StreamError { return e }
        let kind: Kind
        switch error {
        case is NIOSSLError, is BoringSSLError, is NIOSSLExtraError: kind = handshaking ? .tls : .closed
        case let e as IOError where NetError.peerGone(e.errnoCode): kind = .closed
        case ChannelError.ioOnClosedChannel, ChannelError.eof, ChannelError.alreadyClosed, ChannelError.outputClosed: kind = .closed
        default: kind = handshaking ? .tls : .closed
        }
        return StreamError(kind: kind, message: "\(name): \(error)", cause: error)
    }
}

/// What a stream's handler has received, for its blocked reader.
final class Inbox: @unchecked Sendable {
    private let condition = NSCondition()
    private var bytes = [UInt8]()
    private var ready: Bool
    let tls: Bool
    private var ended = false
    private var error: Error?
    /// Whether the failure came before the stream was ready (a handshake's).
    private var failedHandshaking = false

    /// A plain stream is ready at once; a TLS one once its handshake is done.
    init(tls: Bool) {
        self.tls = tls
        ready = !tls
    }

    func becameReady() { condition.withLock { ready = true; condition.broadcast() } }
    func received(_ more: ByteBuffer) { condition.withLock { bytes += more.readableBytesView; condition.broadcast() } }
    func end() { condition.withLock { ended = true; condition.broadcast() } }
    func fail(_ e: Error) {
        condition.withLock {
            if error == nil { error = e; failedHandshaking = !ready }
            condition.broadcast()
        }
    }

    /// The stream's failure, if it has failed.
    func failure(name: String) -> StreamError? {
        condition.withLock { error.map { StreamError.from($0, name: name, handshaking: failedHandshaking) } }
    }

    /// Waits until the stream is ready; throws when it fails or ends first, or at `deadline`.
    func waitReady(until deadline: Date, name: String) throws {
        condition.lock(); defer { condition.unlock() }
        while !ready && error == nil && !ended {
            if !condition.wait(until: deadline) && !ready && error == nil && !ended {
                throw StreamError(kind: .timeout, message: "\(name): timed out in the TLS handshake", cause: nil)
            }
        }
        if ready { return }
        if let error { throw StreamError.from(error, name: name, handshaking: true) }
        throw StreamError(kind: .tls, message: "\(name): the peer closed the connection in the TLS handshake", cause: nil)
    }

    /// Up to `max` received bytes, waiting until there are some, the end, a failure or `deadline`.
    func take(max: Int, until deadline: Date, name: String) throws -> [UInt8] {
        condition.lock(); defer { condition.unlock() }
        while bytes.isEmpty && error == nil && !ended {
            if !condition.wait(until: deadline) && bytes.isEmpty && error == nil && !ended {
                throw StreamError(kind: .timeout, message: "\(name): timed out waiting for data", cause: nil)
            }
        }
        if !bytes.isEmpty {
            let n = min(max, bytes.count)
            defer { bytes.removeFirst(n) }
            return Array(bytes[..<n])
        }
        if let error { throw StreamError.from(error, name: name, handshaking: failedHandshaking) }
        return []
    }
}

/// Hands a channel's bytes, end and errors to its `Inbox`.
final class StreamHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    let inbox: Inbox

    init(inbox: Inbox) { self.inbox = inbox }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        inbox.received(Self.unwrapInboundIn(data))
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event { inbox.becameReady() }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        inbox.fail(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        inbox.end()
        context.fireChannelInactive()
    }
}

/// A server for tests on loopback: accepts connections (TLS with the product's `TLSContext`,
/// through `NIOSSLServerHandler`, or plain) and hands each to the test as a `TestStream`.
public final class TestServer: @unchecked Sendable {
    public let port: UInt16
    private let listener: Channel
    private let condition = NSCondition()
    private var accepted = [(stream: TestStream, inbox: Inbox)]()

    /// Listens on 127.0.0.1, any free port.
    public init(tls: TLSContext? = nil, timeout: TimeInterval = 10) throws {
        let server = ServerRef()
        let bootstrap = ServerBootstrap(group: TestLoops.group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let inbox = Inbox(tls: tls != nil)
                    if let tls { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls.nio)) }
                    try channel.pipeline.syncOperations.addHandler(StreamHandler(inbox: inbox))
                    let name = channel.remoteAddress.map { "\($0)" } ?? "client"
                    server.value?.add(TestStream(channel: channel, name: name, inbox: inbox, timeout: timeout), inbox)
                }
            }
        listener = try TestStream.wait(bootstrap.bind(host: "127.0.0.1", port: 0), until: Date().addingTimeInterval(timeout), name: "127.0.0.1:0", doing: "binding")
        guard let bound = listener.localAddress?.port else { throw StreamError(kind: .connect, message: "the test server has no port", cause: nil) }
        port = UInt16(bound)
        server.value = self
    }

    private func add(_ stream: TestStream, _ inbox: Inbox) {
        condition.withLock { accepted.append((stream, inbox)); condition.broadcast() }
    }

    /// The next connection accepted, once ready (its TLS handshake done); throws when its
    /// handshake fails (`.tls`), or nothing is accepted within `timeout`.
    public func accept(timeout: TimeInterval = 10) throws -> TestStream {
        let deadline = Date().addingTimeInterval(timeout)
        let next: (stream: TestStream, inbox: Inbox)
        condition.lock()
        while accepted.isEmpty {
            if !condition.wait(until: deadline) && accepted.isEmpty {
                condition.unlock()
                throw StreamError(kind: .timeout, message: "127.0.0.1:\(port): nothing accepted within \(timeout) s", cause: nil)
            }
        }
        next = accepted.removeFirst()
        condition.unlock()
        do { try next.inbox.waitReady(until: deadline, name: next.stream.name) } catch {
            next.stream.close()
            throw error
        }
        return next.stream
    }

    /// Stops listening (the accepted streams stay open).
    public func close() {
        do { _ = try TestStream.wait(listener.close(), until: Date().addingTimeInterval(10), name: "127.0.0.1:\(port)", doing: "closing the listener") } catch {
            // Already closed.
        }
    }

    deinit { listener.close(promise: nil) }
}

/// The server, for its channels' initializer (set once it is made; connections accepted
/// before that cannot happen, the port being unknown until then).
private final class ServerRef: @unchecked Sendable {
    weak var value: TestServer?
}
