import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The event loops every air connection runs on, in the air and in a node's process: NIO's
/// shared group (one thread a core), so a connection holds no thread of its own.
enum AirLoops {
    static var group: MultiThreadedEventLoopGroup { .singleton }
}

/// One connection of the air's wire (plain or TLS) carrying newline-delimited JSON, on a NIO
/// channel: [NIOSSLHandler when TLS] → `LineFrameDecoder` (a line over the limit closes the
/// connection) → `LineHandler` (hands each line to `startReading`'s callback). Writes go out
/// through a bounded queue: a peer that leaves more than `maxQueued` bytes unread, or takes
/// nothing for `stallLimit` seconds while the channel is full, is dropped.
///
/// Concurrency: what any thread may touch (the reader, the flags) is in a `Mutex`; the write
/// queue's accounting is bound to the channel's event loop (`NIOLoopBoundBox`, checked there).
final class LineSocket: Sendable {
    let channel: Channel
    /// A line longer than this closes the connection: nothing the air or a node says is near it.
    static let maxLine = 1 << 20
    /// Bytes written but not yet taken by the peer beyond which it is dropped at once.
    static let maxQueued = 4 << 20
    /// A channel that stays full (past its high water mark) this long is dropped: a peer that
    /// does not read (as the old writer's 30 s write timeout did).
    static let stallLimit: TimeAmount = .seconds(30)
    /// The channel's write buffer marks: past `high` the channel is not writable (the stall clock runs).
    static let waterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 64 << 10, high: 256 << 10)

    /// What any thread may read or change, under one lock.
    private struct Shared {
        /// `close()` was called: nothing more is queued.
        var closed = false
        /// A write has failed (the peer has gone, or stalled): every write queued after it is
        /// dropped, never tried.
        var broken = false
        /// What the peer said before `startReading` (a node's process only; bounded), and the reader.
        var early: [ByteBuffer] = []
        var reader: (@Sendable (ByteBuffer) -> Void)?
        var ended: (@Sendable () -> Void)?
        var endSeen = false
        /// The longest line accepted now; read by the decoder on the event loop.
        var limit: Int
    }
    private let shared: Mutex<Shared>

    /// The write queue's accounting: on the event loop only.
    private struct OnLoop {
        var queued = 0
        var closeWhenWritten = false
        var stall: Scheduled<Void>?
        var drainWaiters: [EventLoopPromise<Void>] = []
    }
    private let onLoop: NIOLoopBoundBox<OnLoop>

    init(channel: Channel, lineLimit: Int = LineSocket.maxLine) {
        self.channel = channel
        self.shared = Mutex(Shared(limit: lineLimit))
        self.onLoop = .makeBoxSendingValue(OnLoop(), eventLoop: channel.eventLoop)
    }

    /// The longest line accepted from now on (the air allows a small one until a node attaches).
    var lineLimit: Int {
        get { shared.withLock { $0.limit } }
        set { shared.withLock { $0.limit = newValue } }
    }

    /// The peer's numeric address ("?" when unknown).
    var peerHost: String { channel.remoteAddress?.ipAddress ?? "?" }

    /// Makes a new channel's pipeline (on its event loop): TLS when given, the handshake's
    /// watch, the line decoder and the line handler.
    func install(on channel: Channel, tls: ChannelHandler?, watch: HandshakeWatch?) throws {
        let ops = channel.pipeline.syncOperations
        if let tls { try ops.addHandler(tls) }
        if let watch { try ops.addHandler(watch) }
        try ops.addHandler(ByteToMessageHandler(LineFrameDecoder(socket: self)))
        try ops.addHandler(LineHandler(socket: self))
    }

    /// Connects to the air at `host:port` (a name, IPv4 or IPv6), over TLS checked against the lab
    /// CA and the dialled name or address when `tls` is given. Blocks until the connection (and
    /// its handshake) is up, at most `timeout` seconds in all; never call it on an event loop.
    static func connect(host: String, port: UInt16, tls: TLSContext?, timeout: TimeInterval = 10) throws -> LineSocket {
        let bare = HostPort.unbracketed(host)
        let name = "\(HostPort(host: host, port: port))"
        let hint = "is `herald-lab air` running there\(tls == nil ? "" : " with TLS")?"
        do {
            let seconds = max(0.001, timeout)
            let ready = AirLoops.group.next().makePromise(of: LineSocket.self)
            let bootstrap = ClientBootstrap(group: AirLoops.group)
                .connectTimeout(.milliseconds(Saturating.milliseconds(seconds)))
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .channelOption(.allowRemoteHalfClosure, value: true)
                .channelOption(.writeBufferWaterMark, value: waterMark)
                .channelInitializer { channel in
                    do {
                        let socket = LineSocket(channel: channel)
                        // An address is checked against the certificate's IP names; a name is sent
                        // in SNI and checked against its DNS names (NIOSSL's identity check).
                        let handler = try tls?.clientHandler(for: bare)
                        let watch = HandshakeWatch(tls: handler != nil, ready: { ready.succeed(socket) }, failed: { ready.fail($0) })
                        try socket.install(on: channel, tls: handler, watch: watch)
                        return channel.eventLoop.makeSucceededVoidFuture()
                    } catch {
                        return channel.eventLoop.makeFailedFuture(error)
                    }
                }
            let connecting = bootstrap.connect(host: bare, port: Int(port))
            connecting.whenFailure { ready.fail($0) }
            // The handshake too is bounded: the whole connect takes at most `timeout`.
            let deadline = ready.futureResult.eventLoop.scheduleTask(in: .milliseconds(Saturating.milliseconds(seconds))) {
                ready.fail(AirConnectTimeout(seconds: seconds))
            }
            ready.futureResult.whenComplete { _ in deadline.cancel() }
            ready.futureResult.whenFailure { _ in connecting.whenSuccess { $0.close(promise: nil) } }
            return try ready.futureResult.wait()
        } catch {
            throw AirError.socket("\(name): \(AirError.phrase(error)); \(hint)")
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
        guard !shared.withLock({ $0.closed || $0.broken }) else { return }
        channel.eventLoop.execute { self.write(encoded) }
    }

    /// On the event loop: one line out, within the queue's bound.
    private func write(_ encoded: Data) {
        guard !hasFailed else { return }
        let count = encoded.count + 1
        guard onLoop.value.queued + count <= Self.maxQueued else { return fail() }
        onLoop.value.queued += count
        var buffer = channel.allocator.buffer(capacity: count)
        buffer.writeBytes(encoded)
        buffer.writeInteger(UInt8(10))
        channel.writeAndFlush(buffer).whenComplete { result in
            self.onLoop.value.queued -= count
            if case .failure = result { self.fail() }
            if self.onLoop.value.queued == 0 { self.written() }
        }
    }

    /// On the event loop: everything queued has been taken (or dropped).
    private func written() {
        let waiters = onLoop.value.drainWaiters
        onLoop.value.drainWaiters = []
        for w in waiters { w.succeed(()) }
        if onLoop.value.closeWhenWritten { channel.close(promise: nil) }
    }

    /// On the event loop: the channel's buffer passed its high mark (not writable) or fell back.
    fileprivate func writability(_ writable: Bool) {
        onLoop.value.stall?.cancel()
        onLoop.value.stall = writable ? nil : channel.eventLoop.scheduleTask(in: Self.stallLimit) { self.fail() }
    }

    /// Whether a write has failed (the connection is being closed).
    var hasFailed: Bool { shared.withLock { $0.broken } }

    /// The first failed write ends the connection at once: what is still queued is dropped, and
    /// the channel is closed now (not after the queue), so its owner hears of it (`onClose`).
    private func fail() {
        shared.withLock { $0.broken = true }
        channel.close(promise: nil)
    }

    /// Waits until every write queued so far has been taken or dropped (tests; not on an event loop).
    func drain() {
        let done = channel.eventLoop.submit { () -> EventLoopFuture<Void> in
            let p = self.channel.eventLoop.makePromise(of: Void.self)
            if self.onLoop.value.queued == 0 || !self.channel.isActive { p.succeed(()) } else { self.onLoop.value.drainWaiters.append(p) }
            self.channel.closeFuture.whenComplete { _ in p.succeed(()) }
            return p.futureResult
        }.flatMap { $0 }
        do { try done.wait() } catch {
            // The channel closed: nothing is left to wait for.
        }
    }

    /// Hands each line to `onMessage` decoded as `Message`; a line that is not one (junk, an
    /// unknown kind) goes to `onJunk` (dropped when nil: the peer gets no answer, and nothing
    /// else changes). `onClose` runs once, when the peer has ended its side or the connection
    /// has closed: after the last message, on the event loop. The owner then closes the socket
    /// once it has answered what it read (a half-closed peer still gets those answers).
    func startReading<Message: Decodable & Sendable>(_ kind: Message.Type, onMessage: @escaping @Sendable (Message) -> Void, onJunk: (@Sendable () -> Void)? = nil,
                                          onClose: @escaping @Sendable () -> Void) {
        let read: @Sendable (ByteBuffer) -> Void = { line in
            let message: Message
            do { message = try JSONDecoder().decode(Message.self, from: Data(line.readableBytesView)) } catch {
                onJunk?()
                return
            }
            onMessage(message)
        }
        channel.eventLoop.execute {
            let (backlog, endedEarly) = self.shared.withLock { s -> ([ByteBuffer], Bool) in
                s.reader = read
                s.ended = onClose
                defer { s.early = [] }
                return (s.early, s.endSeen)
            }
            for line in backlog { read(line) }
            if endedEarly { onClose() }
        }
    }

    /// On the event loop: a line from the decoder.
    fileprivate func received(_ line: ByteBuffer) {
        let read: (@Sendable (ByteBuffer) -> Void)? = shared.withLock { s in
            if s.reader == nil {
                s.early.append(line)
                if s.early.count > 64 { s.broken = true }
            }
            return s.reader
        }
        if let read { read(line) } else if hasFailed { channel.close(promise: nil) }
    }

    /// On the event loop: the peer ended its side, or the channel closed. Once.
    fileprivate func inputEnded() {
        let onEnd: (@Sendable () -> Void)? = shared.withLock { s in
            guard !s.endSeen else { return nil }
            s.endSeen = true
            return s.ended
        }
        onEnd?()
    }

    func close() {
        guard !shared.withLock({ s in defer { s.closed = true }; return s.closed }) else { return }
        // After what was sent before: a refusal reaches the peer before the connection ends.
        channel.eventLoop.execute {
            if self.onLoop.value.queued == 0 || self.hasFailed { self.channel.close(promise: nil) } else { self.onLoop.value.closeWhenWritten = true }
        }
    }
}

/// A connect that did not finish within its time (the TCP connect and the TLS handshake).
struct AirConnectTimeout: Error, CustomStringConvertible {
    let seconds: Double
    var description: String { String(format: "timed out connecting (%.0f s)", seconds) }
}

/// A line longer than the socket's limit: the connection is closed.
struct AirLineTooLong: Error, CustomStringConvertible {
    let limit: Int
    var description: String { "a line longer than \(limit) bytes" }
}

/// Splits the stream at newlines. Only new bytes are searched for a line end (a long line costs
/// linear time), and a line over the socket's limit fails the channel before it is buffered
/// further (nothing unbounded is kept). A partial line at the end of the stream is dropped.
struct LineFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer
    let socket: LineSocket
    private var scanned = 0

    init(socket: LineSocket) { self.socket = socket }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let view = buffer.readableBytesView
        let limit = socket.lineLimit
        guard let nl = view.dropFirst(scanned).firstIndex(of: 10) else {
            scanned = view.count
            if scanned > limit { throw AirLineTooLong(limit: limit) }
            return .needMoreData
        }
        let length = nl - view.startIndex
        scanned = 0
        guard length <= limit else { throw AirLineTooLong(limit: limit) }
        let line = buffer.readSlice(length: length)!
        buffer.moveReaderIndex(forwardBy: 1)
        context.fireChannelRead(wrapInboundOut(line))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        buffer.moveReaderIndex(to: buffer.writerIndex)
        return .needMoreData
    }
}

/// The end of a line socket's pipeline: lines to the socket's reader, the peer's end and every
/// error to its owner (an error closes the connection).
final class LineHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let socket: LineSocket
    init(socket: LineSocket) { self.socket = socket }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) { socket.received(unwrapInboundIn(data)) }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        socket.writability(context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let e = event as? ChannelEvent, e == .inputClosed { socket.inputEnded() }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        socket.inputEnded()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }
}

/// Whether a connection came up: TCP, and with TLS the handshake (and, on a node's side, the
/// check of the air's certificate). `ready` or `failed` is called once. On the channel's event
/// loop only (not Sendable: it is made in the channel's initializer and lives in its pipeline).
final class HandshakeWatch: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let tls: Bool
    private var ready: (() -> Void)?
    private var failed: ((Error) -> Void)?
    init(tls: Bool, ready: @escaping () -> Void, failed: @escaping (Error) -> Void) { self.tls = tls; self.ready = ready; self.failed = failed }

    private func finish(_ error: Error?) {
        let (r, f) = (ready, failed)
        ready = nil
        failed = nil
        if let error { f?(error) } else { r?() }
    }

    func handlerAdded(context: ChannelHandlerContext) { if !tls && context.channel.isActive { finish(nil) } }

    func channelActive(context: ChannelHandlerContext) {
        if !tls { finish(nil) }
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let e = event as? TLSUserEvent, case .handshakeCompleted = e { finish(nil) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        finish(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }
}

/// The coordinator's side of the air's contract: a signed notice (`NodeTicket.Notice`) on a
/// connection of its own, and the air's answer.
public enum AirNotices {
    /// Sends `signed` to the air at `host:port` (TLS checked against the lab CA when `tls` is
    /// given) and waits at most `timeout` seconds for the answer: nil when the air took it, else
    /// why not (the air's refusal or the connection's error).
    public static func tell(_ signed: String, host: String, port: UInt16, tls: TLSContext?, timeout: TimeInterval = 5) -> String? {
        let socket: LineSocket
        do { socket = try LineSocket.connect(host: host, port: port, tls: tls, timeout: timeout) } catch { return "\(error)" }
        defer { socket.close() }
        let answer = socket.channel.eventLoop.makePromise(of: AirAnswer?.self)
        socket.startReading(AirAnswer.self, onMessage: { answer.succeed($0) }, onClose: { answer.succeed(nil) })
        let late = socket.channel.eventLoop.scheduleTask(in: .milliseconds(Saturating.milliseconds(max(0.001, timeout)))) { answer.succeed(nil) }
        socket.send(AirRequest(id: 1, .notice(signed)))
        let got: AirAnswer?
        do { got = try answer.futureResult.wait() } catch { return "\(error)" }
        late.cancel()
        switch got?.news {
        case nil: return "no answer from the air"
        case .noticeTaken?: return nil
        case .noticeRefused(let why)?: return "the air refused it: \(why)"
        default: return "the air answered with something else than a notice's answer"
        }
    }
}

public enum AirError: Error, CustomStringConvertible {
    case socket(String)
    public var description: String {
        switch self { case .socket(let s): return s }
    }

    /// An error of a connect or a handshake as one short phrase.
    static func phrase(_ error: Error) -> String {
        switch error {
        case let e as NIOConnectionError:
            if let first = e.connectionErrors.first { return phrase(first.error) }
            if let dns = e.dnsAError ?? e.dnsAAAAError { return "cannot resolve \(e.host): \(dns)" }
            return "cannot resolve \(e.host): no address"
        case let e as IOError: return String(cString: strerror(e.errnoCode))
        case let e as ChannelError:
            switch e {
            case .connectTimeout: return "timed out connecting"
            case .ioOnClosedChannel, .eof, .alreadyClosed: return "the connection was closed"
            default: return "\(e)"
            }
        case let e as NIOSSLError: return "TLS: \(e)"
        case let e as NIOSSLExtraError: return "TLS: \(e)"
        default: return "\(error)"
        }
    }
}
