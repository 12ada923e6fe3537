import Foundation
import HeraldCore
import LabNet
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// NTP-style clock probes over one kept-alive connection of its own to the agent (plain or TLS),
/// on NIO: both local stamps are taken on the connection's event loop, t0 just before the request
/// is written and t3 as the answer's head is read, so the true exchange lies within [t0, t3] and
/// the offset of the probe with the smallest round trip is good to half that round trip.
///
/// Not AsyncHTTPClient (ARCHITECTURE.md, "Clock probes"): its t0 can only be taken before the
/// request is handed to it (it reports a request written once the write's promise is done, which
/// can be after the agent has answered), and the hand-over counts in every round trip: arming
/// 1,000 agents, its best round trips had a median of 1.5 ms and 18 to 21% were within 1 ms,
/// against 0.2 ms and all but a few here (`make bench`).
public enum ClockProbe {
    public struct Sample: Sendable {
        /// Agent clock minus local clock, seconds.
        public var offset: Double
        public var roundTrip: Double
    }

    /// Probes `url`'s `/v1/clock` up to `count` times and returns the samples, fewer if the
    /// connection fails part way. Throws a `NetError` naming `url` when there is not a single
    /// valid sample (an HTTP status other than 200 is named in its message).
    /// `settle`: after that many samples, stop early once a round trip of at most
    /// `settledRoundTrip` has been seen (the offset is then good to half of it); on a slow or
    /// jittery link all `count` are taken. `timeout` bounds the connection and each exchange.
    public static func measure(_ url: URL, path: String, token: String?, count: Int, settle: Int? = nil, settledRoundTrip: Double = 0.001, timeout: TimeInterval = 5) async throws -> [Sample] {
        func failure(_ kind: NetError.Kind, _ why: String) -> NetError {
            NetError(kind, "clock probe of \(url.absoluteString): \(why)")
        }
        guard timeout.isFinite, timeout > 0, timeout <= 3600 else { throw failure(.badAddress, "timeout \(timeout) s is not 0 to 3600 s") }
        let target: HostPort
        let tls: TLSContext?
        do {
            target = try HostPort(url: url)
            tls = try LabTrust.context(for: url)
        } catch let e as NetError { throw failure(e.kind, e.message) }
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: path)
        head.headers.add(name: "Host", value: "\(target)")
        head.headers.add(name: "Content-Type", value: "application/json")
        head.headers.add(name: "Content-Length", value: "2")
        if let token { head.headers.add(name: "Authorization", value: "Bearer \(token)") }
        let request = head

        await slots.acquire()
        defer { Task { await slots.release() } }
        let ticks = TimeAmount.nanoseconds(Saturating.nanoseconds(timeout))
        // The handler lives on the connection's event loop: it is made for that loop and only
        // touched there (the initializer and each exchange run on it).
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let handler = NIOLoopBoundBox.makeBoxSendingValue(ProbeHandler(), eventLoop: loop)
        let channel: Channel
        do {
            let host = HostPort.unbracketed(target.host)
            channel = try await ClientBootstrap(group: loop)
                .connectTimeout(ticks)
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    do {
                        let ops = channel.pipeline.syncOperations
                        if let tls { try ops.addHandler(tls.clientHandler(for: host)) }
                        try ops.addHTTPClientHandlers()
                        try ops.addHandler(handler.value)
                        return channel.eventLoop.makeSucceededVoidFuture()
                    } catch {
                        return channel.eventLoop.makeFailedFuture(error)
                    }
                }
                .connect(host: host, port: Int(target.port)).get()
        } catch {
            throw failure(.connect, LabHTTPClient.describe(error, url: url, timeout: timeout))
        }
        defer { channel.close(promise: nil) }

        var out = [Sample]()
        // Why the last probe ended without a sample (thrown only when there is no sample at all).
        var problem: NetError?
        for _ in 0..<max(0, count) {
            let exchange: Exchange
            do {
                exchange = try await channel.eventLoop.flatSubmit { handler.value.exchange(request, on: channel, within: ticks) }.get()
            } catch let e as NetError {
                problem = failure(e.kind, e.message)
                break
            } catch {
                // A handshake the lab CA does not vouch for fails here, at the first exchange.
                let tlsFailure = error is NIOSSLError || error is BoringSSLError || error is NIOSSLExtraError
                problem = failure(tlsFailure ? .tls : .closed, LabHTTPClient.describe(error, url: url, timeout: timeout))
                break
            }
            guard exchange.status == 200 else {
                let text = String(decoding: exchange.body.prefix(200), as: UTF8.self)
                problem = failure(.protocolError, "HTTP \(exchange.status)\(text.isEmpty ? "" : ": \(text)")")
                break
            }
            guard let reply = try? JSONDecoder().decode([String: Double].self, from: Data(exchange.body)),
                  let t1 = reply["received"], let t2 = reply["sent"], t1.isFinite, t2.isFinite else {
                problem = failure(.protocolError, "the answer is not {\"received\": t, \"sent\": t}")
                break
            }
            let (t0, t3) = (exchange.sent, exchange.answered)
            out.append(Sample(offset: ((t1 - t0) + (t2 - t3)) / 2, roundTrip: (t3 - t0) - (t2 - t1)))
            if let settle, out.count >= settle, let best = out.map(\.roundTrip).min(), best <= settledRoundTrip { break }
            guard exchange.keepAlive else { break }
            // Let this exchange's last segments (the body, our ACK of it) leave the link before the
            // next request, so the request does not queue behind them: one round trip, at most 0.1 s.
            let pause = min(0.1, max(0.0002, t3 - t0))
            try? await Task.sleep(nanoseconds: UInt64(Saturating.nanoseconds(pause)))
        }
        if out.isEmpty && count > 0 { throw problem ?? failure(.protocolError, "no answer") }
        return out
    }

    /// Probes of at most 16 agents at a time, whatever the number armed: a thousand at once would
    /// queue behind each other on the event loops, and every round trip would count that wait.
    static let slots = Slots(16)

    actor Slots {
        private var free: Int
        private var waiting: [CheckedContinuation<Void, Never>] = []
        init(_ count: Int) { free = count }
        func acquire() async {
            if free > 0 { free -= 1; return }
            await withCheckedContinuation { waiting.append($0) }
        }
        func release() {
            if waiting.isEmpty { free += 1 } else { waiting.removeFirst().resume() }
        }
    }

    /// One exchange: its status, body, whether the connection stays open, and the local stamps
    /// (wall clock, as the agent's are).
    struct Exchange: Sendable {
        var status = 0
        var body: [UInt8] = []
        var keepAlive = true
        var sent = 0.0
        var answered = 0.0
    }

    /// Writes one request at a time and stamps it; everything runs on the channel's event loop
    /// (not Sendable: `measure` reaches it through a `NIOLoopBoundBox`).
    final class ProbeHandler: ChannelInboundHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundOut = HTTPClientRequestPart
        /// A clock answer is a few dozen bytes; a peer that sends more is cut off.
        static let maxBody = 4096
        private var current = Exchange()
        private var pending: EventLoopPromise<Exchange>?
        private var deadline: Scheduled<Void>?
        private var context: ChannelHandlerContext?
        /// Why the connection ended before an exchange was asked for: a TLS handshake the lab CA
        /// does not vouch for can fail before the first request is written (a loaded machine
        /// connects, and the handshake fails, before `exchange` runs). The next exchange fails
        /// with it at once instead of writing to a closed channel and waiting for its deadline.
        private var ended: Error?

        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

        func exchange(_ head: HTTPRequestHead, on channel: Channel, within timeout: TimeAmount) -> EventLoopFuture<Exchange> {
            let promise = channel.eventLoop.makePromise(of: Exchange.self)
            if let ended {
                promise.fail(ended)
                return promise.futureResult
            }
            guard let context, pending == nil else {
                promise.fail(NetError(.closed, "the connection closed before an answer"))
                return promise.futureResult
            }
            pending = promise
            current = Exchange()
            deadline = channel.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
                self?.finish(.failure(NetError(.timeout, "no answer within \(Int((Double(timeout.nanoseconds) / 1e9).rounded(.up))) s")))
                channel.close(promise: nil)
            }
            current.sent = Date().timeIntervalSince1970
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "{}")))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            return promise.futureResult
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard pending != nil else { return }
            switch unwrapInboundIn(data) {
            case .head(let head):
                current.answered = Date().timeIntervalSince1970
                current.status = Int(head.status.code)
                current.keepAlive = head.isKeepAlive
            case .body(let buffer):
                guard current.body.count + buffer.readableBytes <= Self.maxBody else {
                    finish(.failure(NetError(.protocolError, "answer over \(Self.maxBody) bytes")))
                    context.close(promise: nil)
                    return
                }
                current.body += buffer.readableBytesView
            case .end:
                finish(.success(current))
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            if ended == nil { ended = error }
            finish(.failure(error))
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            let closed = NetError(.closed, "the connection closed before an answer")
            if ended == nil { ended = closed }
            finish(.failure(closed))
            context.fireChannelInactive()
        }

        private func finish(_ result: Result<Exchange, Error>) {
            deadline?.cancel()
            deadline = nil
            guard let promise = pending else { return }
            pending = nil
            promise.completeWith(result)
        }
    }
}
