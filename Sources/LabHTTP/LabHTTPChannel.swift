import Foundation
import HeraldCore
import HTTPTypes
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOSSL
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Monotonic seconds (deadlines).
func monotonicNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

extension HTTPService {
    /// What one connection may cost before it is refused: each limit is checked before the work
    /// it bounds (a header block is not buffered past its limit, a body over its route's limit
    /// is not read).
    public struct Limits: Sendable, Equatable {
        /// From a request's first byte to the end of its head (408 after).
        public var headerTimeout: Double = 10
        /// A connection without a new request for this long is closed without an answer.
        public var idleTimeout: Double = 10
        /// From the end of the head to the end of the body (408 after).
        public var bodyTimeout: Double = 30
        /// A write of the answer that makes no progress for this long ends the connection (a
        /// client must keep reading a large file).
        public var writeTimeout: Double = 30
        /// The whole head, request line included (431 beyond).
        public var maxHeaderBytes = 16 * 1024
        /// The request line (414 beyond).
        public var maxRequestLine = 8 * 1024
        /// Header fields in one request (431 beyond).
        public var maxHeaderCount = 100
        /// A request body, whatever its route: bytes past it are refused (413) at the connection
        /// as they arrive. Each route collects its body within its own, smaller limit.
        public var maxBodyBytes = HTTPService.defaultBodyLimit
        /// Connections open at once, idle ones included; one more is answered 503 (a TLS alert on
        /// a TLS port) and closed at accept.
        public var maxConnections = 1024
        /// Connections one address that has not authenticated lately may hold.
        public var maxConnectionsPerAddress = 32
        /// Places of `maxConnections` only addresses that authenticated lately may take.
        public var reservedForKnown = 128

        public init(headerTimeout: Double = 10, idleTimeout: Double = 10, bodyTimeout: Double = 30, writeTimeout: Double = 30,
                    maxHeaderBytes: Int = 16 * 1024, maxRequestLine: Int = 8 * 1024, maxHeaderCount: Int = 100, maxBodyBytes: Int = HTTPService.defaultBodyLimit,
                    maxConnections: Int = 1024, maxConnectionsPerAddress: Int = 32, reservedForKnown: Int = 128) {
            self.headerTimeout = headerTimeout
            self.idleTimeout = idleTimeout
            self.bodyTimeout = bodyTimeout
            self.writeTimeout = writeTimeout
            self.maxHeaderBytes = maxHeaderBytes
            self.maxRequestLine = maxRequestLine
            self.maxHeaderCount = maxHeaderCount
            self.maxBodyBytes = maxBodyBytes
            self.maxConnections = maxConnections
            self.maxConnectionsPerAddress = maxConnectionsPerAddress
            self.reservedForKnown = reservedForKnown
        }
    }
}

/// A HeraldLab service's connection on Hummingbird's server: the gate decides at accept
/// (`ConnectionGate`), then TLS (swift-nio-ssl) when the service has it, `HeadGuard` on the
/// bytes, NIO's HTTP/1.1 codec with the head limits, `HeadRules` on the parsed parts (the strict
/// rules of `RequestHead`, every deadline, keep-alive), then Hummingbird's HTTPTypes codec and
/// its request loop (`handleHTTP`).
struct LabHTTPChannel: ServerChildChannel, HTTPChannelHandler {
    typealias Value = NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>

    let responder: HTTPChannelHandler.Responder
    let limits: HTTPService.Limits
    let tls: NIOSSLContext?
    let gate: ConnectionGate
    let serviceLogger: Logger

    /// A plain port's answer over the limit.
    static let busy: [UInt8] = Array(("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 58\r\nConnection: close\r\n\r\n"
                                      + "{\"error\":\"the service is busy; try again in a few seconds\"}").utf8)
    /// A TLS port's: a fatal alert record, internal_error (no plain text a TLS client would take
    /// for a broken handshake).
    static let alert: [UInt8] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50]

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let peer = HTTPService.remote(of: channel)
        let address = peer.address ?? "unknown", remote = peer.text
        let verdict = gate.enter(address, channel)
        return channel.eventLoop.makeCompletedFuture {
            let sync = channel.pipeline.syncOperations
            if case .refused(let why) = verdict {
                // Answered once the socket is active (503, or a TLS alert), then closed; nothing
                // it sends is read.
                GateLog.refused(serviceLogger, remote: remote, why: why)
                try sync.addHandler(Refuser(answer: tls == nil ? Self.busy : Self.alert))
                return try NIOAsyncChannel(wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
            }
            channel.closeFuture.whenComplete { [gate] _ in gate.leave(address, channel) }
            if let tls { try sync.addHandler(NIOSSLServerHandler(context: tls)) }
            try HeadRules.addHTTP(to: sync, limits: limits, remote: remote, logger: serviceLogger)
            try sync.addHandler(HTTP1ToHTTPServerCodec(secure: tls != nil))
            return try NIOAsyncChannel(wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
        }
    }

    func handle(value: Value, logger: Logger) async {
        await handleHTTP(asyncChannel: value, logger: logger)
    }
}

/// A connection refused at accept: its answer, then the end.
final class Refuser: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = HTTPRequestPart
    private let answer: [UInt8]
    private var sent = false
    init(answer: [UInt8]) { self.answer = answer }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { send(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        send(context)
        context.fireChannelActive()
    }

    private func send(_ context: ChannelHandlerContext) {
        guard !sent else { return }
        sent = true
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: answer))).whenComplete { _ in context.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}

/// Log lines about refused connections: at most one every 5 s per service, with the count.
enum GateLog {
    private static let last = Mutex<[String: (at: Double, count: Int)]>([:])

    static func refused(_ logger: Logger, remote: String, why: String) {
        let key = logger[metadataKey: "service"]?.description ?? ""
        let now = monotonicNow()
        let line: Int? = last.withLock { last in
            var entry = last[key] ?? (at: -Double.infinity, count: 0)
            entry.count += 1
            defer { last[key] = entry }
            guard now - entry.at >= 5 else { return nil }
            let n = entry.count
            entry = (at: now, count: 0)
            return n
        }
        if let line {
            logger.warning("refused \(line) connection(s) at accept, the last from \(remote): \(why)", metadata: ["peer": .string(remote)])
        }
    }
}

/// Bytes before NIO's decoder: tells `HeadRules` when a request's first byte comes (its head
/// deadline starts then), and refuses a request line that runs past `maxRequestLine` without
/// its end (414) or a head that runs past `maxHeaderBytes` (431), so the decoder never holds
/// more than one read beyond the limits.
final class HeadGuard: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let rules: HeadRules
    private let limits: HTTPService.Limits

    init(rules: HeadRules, limits: HTTPService.Limits) {
        self.rules = rules
        self.limits = limits
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let n = buffer.readableBytes
        let lineEnd = buffer.readableBytesView.firstIndex(of: 0x0A).map { $0 - buffer.readerIndex }
        let waiting = rules.awaitingHead
        let heads = rules.heads
        if waiting, n > 0 { rules.requestBegan() }
        context.fireChannelRead(data)
        // Counted after the decoder has had them: bytes that completed a head are not held
        // against the next one.
        guard waiting, rules.heads == heads, !rules.refused else { return }
        if !rules.sawLineEnd {
            if let lineEnd {
                rules.sawLineEnd = true
                if rules.headBytes + lineEnd > limits.maxRequestLine { rules.refuse(.uriTooLong, "the request line is longer than \(limits.maxRequestLine) bytes") ; return }
            } else if rules.headBytes + n > limits.maxRequestLine {
                rules.refuse(.uriTooLong, "the request line is longer than \(limits.maxRequestLine) bytes")
                return
            }
        }
        rules.headBytes += n
        if rules.headBytes > limits.maxHeaderBytes + 1024 {
            rules.refuse(.requestHeaderFieldsTooLarge, "the request head is larger than \(limits.maxHeaderBytes) bytes")
        }
    }
}

/// Parsed parts: the strict rules of `RequestHead` on each head, the deadlines (head from its
/// first byte, or from accept for the first request, which covers the TLS handshake; body from
/// the head; idle after an answer; a write that makes no progress), keep-alive as HTTP/1.0 and
/// 1.1 have it, `Expect: 100-continue`, and refusals answered and closed here, before
/// Hummingbird sees the request.
final class HeadRules: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let limits: HTTPService.Limits
    private let remote: String
    private let logger: Logger
    private var context: ChannelHandlerContext?

    /// Between requests: the next head has not been parsed yet.
    private(set) var awaitingHead = true
    private var sawBytes = false
    var sawLineEnd = false
    var headBytes = 0
    private(set) var refused = false
    /// Heads parsed on this connection.
    private(set) var heads = 0
    /// The current request's body so far (`Limits.maxBodyBytes`).
    private var bodyBytes = 0
    /// Requests whose answers have not ended.
    private var pending = 0
    /// Keep-alive as the requests asked, oldest first (one per pending answer).
    private var keepAlive: [(keep: Bool, http10: Bool)] = []
    private var answerCloses = false

    private var idleTimer: Scheduled<Void>?
    private var headTimer: Scheduled<Void>?
    private var bodyTimer: Scheduled<Void>?
    private var stallTimer: Scheduled<Void>?

    init(limits: HTTPService.Limits, remote: String, logger: Logger) {
        self.limits = limits
        self.remote = remote
        self.logger = logger
    }

    /// HeadGuard, NIO's HTTP/1.1 codec with the head limits, then HeadRules: the part of a
    /// connection's pipeline between TLS and Hummingbird's codec (the server's and the tests').
    @discardableResult
    static func addHTTP(to sync: ChannelPipeline.SynchronousOperations, limits: HTTPService.Limits, remote: String, logger: Logger) throws -> HeadRules {
        let rules = HeadRules(limits: limits, remote: remote, logger: logger)
        try sync.addHandler(HeadGuard(rules: rules, limits: limits))
        var decoderLimits = NIOHTTPDecoderLimitConfiguration()
        decoderLimits.maxHeaderFieldSize = limits.maxHeaderBytes
        decoderLimits.maxHeaderListSize = limits.maxHeaderBytes
        decoderLimits.maxHeaderFieldCount = limits.maxHeaderCount
        try sync.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: false, withOutboundHeaderValidation: false,
                                             withEncoderConfiguration: .init(), withDecoderLimitConfiguration: decoderLimits)
        try sync.addHandler(rules)
        return rules
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // From accept: the TLS handshake and the first head together, and silence.
        headTimer = schedule(limits.headerTimeout) { $0.headDeadline() }
        idleTimer = schedule(limits.idleTimeout) { $0.close() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimers()
        self.context = nil
    }

    private func schedule(_ seconds: Double, _ body: @escaping (HeadRules) -> Void) -> Scheduled<Void>? {
        guard let context else { return nil }
        let loop = context.eventLoop
        return loop.assumeIsolated().scheduleTask(in: Self.delay(seconds)) { [self] in body(self) }
    }

    private func cancelTimers() {
        for t in [idleTimer, headTimer, bodyTimer, stallTimer] { t?.cancel() }
        idleTimer = nil; headTimer = nil; bodyTimer = nil; stallTimer = nil
    }

    /// The first byte of a request's head has come.
    func requestBegan() {
        guard !sawBytes else { return }
        sawBytes = true
        idleTimer?.cancel(); idleTimer = nil
        if headTimer == nil { headTimer = schedule(limits.headerTimeout) { $0.headDeadline() } }
    }

    private func headDeadline() {
        headTimer = nil
        guard awaitingHead, !refused else { return }
        if sawBytes {
            refuse(.requestTimeout, "the request head did not come within \(Self.seconds(limits.headerTimeout))")
        } else if pending == 0 {
            close()
        }
    }

    private func close() {
        cancelTimers()
        context?.close(promise: nil)
    }

    /// A limit as a delay: NaN and negative values 0, beyond Int64's nanoseconds its largest (a
    /// limit is configuration, and configuration can say anything; issue 36).
    static func delay(_ seconds: Double) -> TimeAmount { .nanoseconds(Saturating.nanoseconds(seconds)) }

    /// A limit in words: whole seconds as digits, anything else (a fraction, NaN, 1e300) as Swift writes it.
    static func seconds(_ s: Double) -> String { s == s.rounded() && abs(s) < 9.2e18 ? "\(Saturating.int64(s)) s" : "\(s) s" }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !refused else { return }
        switch unwrapInboundIn(data) {
        case .head(let head):
            headTimer?.cancel(); headTimer = nil
            idleTimer?.cancel(); idleTimer = nil
            let line = head.method.rawValue.utf8.count + head.uri.utf8.count + 10
            if line > limits.maxRequestLine {
                refuse(.uriTooLong, "the request line is longer than \(limits.maxRequestLine) bytes")
                return
            }
            let parsed: RequestHead
            do {
                parsed = try RequestHead.parse(method: head.method.rawValue, target: head.uri, major: head.version.major, minor: head.version.minor,
                                               fields: head.headers.map { ($0.name, $0.value) })
            } catch let r as Refusal {
                refuse(r.status, r.message, request: r.request)
                return
            } catch {
                refuse(.badRequest, "\(error)")
                return
            }
            awaitingHead = false
            bodyBytes = 0
            heads += 1
            pending += 1
            keepAlive.append((parsed.keepAlive, parsed.http10))
            if parsed.hasBody {
                bodyTimer = schedule(limits.bodyTimeout) { $0.bodyDeadline() }
            }
            if parsed.expectContinue {
                context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
            }
            context.fireChannelRead(data)
        case .body(let buffer):
            bodyBytes += buffer.readableBytes
            if bodyBytes > limits.maxBodyBytes {
                refuse(.contentTooLarge, "the body is larger than \(limits.maxBodyBytes) bytes")
                return
            }
            context.fireChannelRead(data)
        case .end:
            bodyTimer?.cancel(); bodyTimer = nil
            awaitingHead = true
            sawBytes = false
            sawLineEnd = false
            headBytes = 0
            context.fireChannelRead(data)
        }
    }

    private func bodyDeadline() {
        bodyTimer = nil
        guard !awaitingHead, !refused else { return }
        refuse(.requestTimeout, "the request body did not come within \(Self.seconds(limits.bodyTimeout))")
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        guard !refused else { return }
        if let e = error as? HTTPParserError {
            if e == .headerOverflow {
                refuse(.requestHeaderFieldsTooLarge, "the request head is larger than \(limits.maxHeaderBytes) bytes or has more than \(limits.maxHeaderCount) fields")
            } else {
                refuse(.badRequest, "malformed request (\(e))")
            }
            return
        }
        context.fireErrorCaught(error)
    }

    /// Answers `status` with `{"error": message}`, closes the connection, and drops what else
    /// the peer sends.
    func refuse(_ status: HTTPTypes.HTTPResponse.Status, _ message: String, request: String? = nil) {
        guard !refused, let context else { return }
        refused = true
        cancelTimers()
        let what = request.map { HTTPService.escaped($0) } ?? "a request"
        logger.warning("refused \(what) from \(remote): \(status.code) \(HTTPService.escaped(message))", metadata: ["peer": .string(remote)])
        let body: Data
        do { body = try LabJSON.encoder.encode(["error": message]) } catch { body = Data(#"{"error":"the refusal could not be encoded"}"#.utf8) }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: "\(body.count)")
        headers.add(name: "Connection", value: "close")
        let head = HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: status.code, reasonPhrase: status.reasonPhrase), headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in context.close(promise: nil) }
    }

    // MARK: Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !refused else { promise?.fail(ChannelError.ioOnClosedChannel); return }
        switch unwrapOutboundIn(data) {
        case .head(var head):
            guard head.status.code >= 200 else { context.write(data, promise: promise); return }
            let asked = keepAlive.first ?? (keep: true, http10: false)
            let said = head.headers[canonicalForm: "connection"].map { $0.lowercased() }
            if !asked.keep || said.contains("close") {
                answerCloses = true
                head.headers.replaceOrAdd(name: "Connection", value: "close")
            } else if asked.http10 {
                head.headers.replaceOrAdd(name: "Connection", value: "keep-alive")
            }
            context.write(wrapOutboundOut(.head(head)), promise: promise)
        case .body:
            context.write(data, promise: promise)
        case .end:
            if !keepAlive.isEmpty { keepAlive.removeFirst() }
            pending = max(0, pending - 1)
            if answerCloses {
                cancelTimers()
                let done = context.eventLoop.makePromise(of: Void.self)
                done.futureResult.whenComplete { _ in context.close(promise: nil) }
                promise.map { done.futureResult.cascade(to: $0) }
                context.writeAndFlush(data, promise: done)
                return
            }
            context.write(data, promise: promise)
            if pending == 0, awaitingHead, !sawBytes, idleTimer == nil {
                idleTimer = schedule(limits.idleTimeout) { $0.close() }
            }
        }
    }

    /// A peer that stops reading: once NIO's outbound buffer is over its mark, the write must
    /// make progress within `writeTimeout`.
    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            stallTimer?.cancel(); stallTimer = nil
        } else if stallTimer == nil {
            stallTimer = schedule(limits.writeTimeout) { rules in
                rules.logger.warning("closed the connection from \(rules.remote): it does not read its answers", metadata: ["peer": .string(rules.remote)])
                rules.close()
            }
        }
        context.fireChannelWritabilityChanged()
    }
}
