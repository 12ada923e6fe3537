import Foundation
import LabNet
import NIOCore
import NIOPosix
import NIOSSL
#if canImport(Glibc)
import Glibc
#endif

/// NTP-style clock probes over one kept-alive HTTP connection (plain or TLS): a round trip of
/// a few hundred microseconds on loopback, where URLSession's jitter alone is milliseconds. The
/// offset of the probe with the smallest round trip is good to half that round trip.
/// The connection is dialled by LabNet's `Dialer` (its names, addresses and messages) and then
/// runs on a NIO channel (swift-nio-ssl for https): the time an answer arrives is taken on the
/// event loop as its first bytes are read, and no thread waits on the socket.
public enum ClockProbe {
    public struct Sample: Sendable {
        /// Agent clock minus local clock, seconds.
        public var offset: Double
        public var roundTrip: Double
    }

    /// The dial blocks (a bounded connect(2) for each address): it runs off the Swift concurrency
    /// pool, whose threads are as many as cores. Sixteen serial queues bound the threads used
    /// whatever the number of agents.
    private static let queues = (0..<16).map { DispatchQueue(label: "heraldlab.clock-probe.\($0)") }

    static let quickAck = ChannelOptions.Types.SocketOption(level: .tcp, name: NIOBSDSocket.Option(rawValue: TCP_QUICKACK))

    /// The samples of `count` probes, fewer if the connection fails part way; throws a `NetError`
    /// naming `url` when there is not a single valid sample (it cannot connect, or gets no valid
    /// answer; an HTTP status other than 200 is named in the message). `settle`: after that many
    /// samples, stop early once a round trip of at most `settledRoundTrip` has been seen (the
    /// offset is then good to half of it); on a slow or jittery link all `count` are taken.
    public static func measure(_ url: URL, token: String?, count: Int, settle: Int? = nil, settledRoundTrip: Double = 0.001, timeout: TimeInterval = 5) async throws -> [Sample] {
        func failure(_ kind: NetError.Kind, _ why: String) -> NetError {
            NetError(kind, "clock probe of \(url.absoluteString): \(why)")
        }
        let target: HostPort
        let tls: TLSContext?
        let fd: Int32
        do {
            target = try HostPort(url: url)
            tls = try LabTrust.context(for: url)
            let queue = queues[abs(url.absoluteString.hashValue) % queues.count]
            fd = try await withCheckedThrowingContinuation { c in
                queue.async { c.resume(with: Result { try Dialer.connect(host: target.host, port: target.port, timeout: timeout) }) }
            }
        } catch let e as NetError { throw failure(e.kind, e.message) }
        let reader = AnswerReader()
        let channel: Channel
        do {
            channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelOption(quickAck, value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let tls { try channel.pipeline.syncOperations.addHandler(try tls.clientHandler(for: target.host)) }
                        try channel.pipeline.syncOperations.addHandler(reader)
                    }
                }
                .withConnectedSocket(fd).get()
        } catch {
            throw failure(.protocolError, "\(target): \(error)")
        }
        defer { channel.close(promise: nil) }

        var request = "POST /v1/clock HTTP/1.1\r\nHost: \(target)\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        request += "\r\n{}"
        let bytes = Array(request.utf8)
        var out = [Sample]()
        // Why the last probe ended without a sample (thrown only when there is no sample at all).
        var problem: NetError?
        for _ in 0..<count {
            let answer: Answer
            do { answer = try await reader.exchange(bytes, on: channel, timeout: timeout) } catch {
                let why = error is AnswerTimeout ? "no answer within \(Int(timeout)) s" : (error as? NetError)?.message ?? "\(target): \(error)"
                problem = failure(kind(of: error), why)
                break
            }
            // t0 is when the request was handed to the socket (on the event loop, so that the hop
            // to it does not count); t3 is when the answer's first segment arrived: the agent stamps `sent` just before it
            // writes the head, and the body follows as a second segment whose delay would otherwise
            // count too (on a jittery link, the later of two delays: a bias of a millisecond or
            // more against the request's single segment).
            let t0 = answer.sent
            let t3 = answer.firstByte
            guard answer.status == 200 else {
                let text = String(decoding: answer.body.prefix(200), as: UTF8.self)
                problem = failure(.protocolError, "HTTP \(answer.status)\(text.isEmpty ? "" : ": \(text)")")
                break
            }
            let reply: [String: Double]
            do { reply = try JSONDecoder().decode([String: Double].self, from: Data(answer.body)) } catch {
                problem = failure(.protocolError, "the answer is not {\"received\": t, \"sent\": t}")
                break
            }
            guard let t1 = reply["received"], let t2 = reply["sent"] else {
                problem = failure(.protocolError, "the answer is not {\"received\": t, \"sent\": t}")
                break
            }
            out.append(Sample(offset: ((t1 - t0) + (t2 - t3)) / 2, roundTrip: (t3 - t0) - (t2 - t1)))
            if let settle, out.count >= settle, let best = out.map(\.roundTrip).min(), best <= settledRoundTrip { break }
            // Let this exchange's last segments (the body, our ACK of it) leave the link before the
            // next request, so the request does not queue behind them: one round trip, at most 0.1 s.
            let pause = min(0.1, max(0.0002, t3 - t0))
            try await Task.sleep(nanoseconds: UInt64(pause * 1e9))
        }
        if out.isEmpty && count > 0 { throw problem ?? failure(.protocolError, "no answer") }
        return out
    }

    /// What a failed exchange was: a peer that has gone, a refused TLS handshake, a timeout.
    static func kind(of error: Error) -> NetError.Kind {
        switch error {
        case let e as NetError: return e.kind
        case is AnswerTimeout: return .timeout
        case is NIOSSLError, is BoringSSLError, is NIOSSLExtraError: return .tls
        case let e as IOError where NetError.peerGone(e.errnoCode): return .closed
        case ChannelError.ioOnClosedChannel, ChannelError.eof: return .closed
        default: return .protocolError
        }
    }

    struct Answer {
        var status: Int
        var body: [UInt8]
        /// When the request was written (seconds since 1970).
        var sent: Double
        /// When its first bytes were read (seconds since 1970).
        var firstByte: Double
    }

    struct AnswerTimeout: Error, CustomStringConvertible {
        var description: String { "no answer in time" }
    }

    /// Reads one HTTP answer (head, then Content-Length bytes of body) for each request written
    /// through `exchange`. Its state is only touched on the channel's event loop.
    final class AnswerReader: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private var pending: EventLoopPromise<Answer>?
        private var received = [UInt8]()
        private var firstByte: Double?
        private var sent = 0.0
        /// Why the connection can answer no more (it closed or failed), once it cannot.
        private var over: Error?

        /// Writes `request` and waits for its answer, at most `timeout` seconds.
        func exchange(_ request: [UInt8], on channel: Channel, timeout: TimeInterval) async throws -> Answer {
            let promise = channel.eventLoop.makePromise(of: Answer.self)
            channel.eventLoop.execute {
                if let over = self.over { return promise.fail(over) }
                self.pending = promise
                self.received.removeAll(keepingCapacity: true)
                self.firstByte = nil
                self.sent = Date().timeIntervalSince1970
                channel.writeAndFlush(channel.allocator.buffer(bytes: request)).whenFailure { self.finish(.failure($0)) }
            }
            let late = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(max(0.001, timeout) * 1e9))) { self.finish(.failure(AnswerTimeout())) }
            defer { late.cancel() }
            return try await promise.futureResult.get()
        }

        private func finish(_ result: Result<Answer, Error>) {
            guard let promise = pending else { return }
            pending = nil
            promise.completeWith(result)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if firstByte == nil { firstByte = Date().timeIntervalSince1970 }
            received += Self.unwrapInboundIn(data).readableBytesView
            // Acknowledge at once: the server writes head and body separately, and a delayed ACK
            // would hold the body back for tens of milliseconds (Nagle on the server side).
            do { try context.channel.syncOptions?.setOption(ClockProbe.quickAck, value: 1) } catch {
                // A hint to the kernel only: without it the probe is slower, not wrong.
            }
            parse()
        }

        private func parse() {
            guard pending != nil, let firstByte else { return }
            guard let headEnd = received.firstRange(of: [13, 10, 13, 10]) else {
                if received.count > 4096 { fail(NetError(.protocolError, "answer head too large")) }
                return
            }
            let head = String(decoding: received[..<headEnd.lowerBound], as: UTF8.self).lowercased()
            let lines = head.components(separatedBy: "\r\n")
            let statusLine: [Substring] = lines.first?.split(separator: " ") ?? []
            let status: Int = statusLine.count >= 2 ? Int(statusLine[1]) ?? 0 : 0
            let lengthLine: String? = lines.first { $0.hasPrefix("content-length:") }
            let length: Int = lengthLine.flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
            guard length <= 4096 else { return fail(NetError(.protocolError, "answer too large")) }
            guard received.count - headEnd.upperBound >= length else { return }
            finish(.success(Answer(status: status, body: Array(received[headEnd.upperBound..<(headEnd.upperBound + length)]), sent: sent, firstByte: firstByte)))
        }

        private func fail(_ error: Error) {
            if over == nil { over = error }
            finish(.failure(error))
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            fail(error)
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            fail(NetError(.protocolError, "the connection closed before an answer"))
            context.fireChannelInactive()
        }
    }
}
