import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// NTP-style clock probes over one kept-alive HTTP connection (plain or TLS): a round trip of
/// a few hundred microseconds on loopback, where URLSession's jitter alone is milliseconds. The
/// offset of the probe with the smallest round trip is good to half that round trip.
public enum ClockProbe {
    public struct Sample: Sendable {
        /// Agent clock minus local clock, seconds.
        public var offset: Double
        public var roundTrip: Double
    }

    /// Probes run off the Swift concurrency pool: the socket calls block, and the cooperative pool
    /// has only as many threads as cores (blocking them would stall every HTTP server of the
    /// process). Sixteen serial queues bound the threads used whatever the number of agents.
    private static let queues = (0..<16).map { DispatchQueue(label: "heraldlab.clock-probe.\($0)") }

    /// Like `probe`, but says why there are no samples: a `NetError` naming `url` when it cannot
    /// connect or gets no valid answer (an HTTP status other than 200 is named in the message).
    /// `settle`: after that many samples, stop early once a round trip of at most
    /// `settledRoundTrip` has been seen (the offset is then good to half of it); on a slow or
    /// jittery link all `count` are taken.
    public static func measure(_ url: URL, token: String?, count: Int, settle: Int? = nil, settledRoundTrip: Double = 0.001, timeout: TimeInterval = 5) async throws -> [Sample] {
        let queue = queues[abs(url.absoluteString.hashValue) % queues.count]
        return try await withCheckedThrowingContinuation { c in
            queue.async { c.resume(with: Result { try measureBlocking(url, token: token, count: count, settle: settle, settledRoundTrip: settledRoundTrip, timeout: timeout) }) }
        }
    }

    /// The samples of `count` probes, fewer if the connection fails part way; throws when there is
    /// not a single valid sample.
    public static func measureBlocking(_ url: URL, token: String?, count: Int, settle: Int? = nil, settledRoundTrip: Double = 0.001, timeout: TimeInterval = 5) throws -> [Sample] {
        func failure(_ kind: NetError.Kind, _ why: String) -> NetError {
            NetError(kind, "clock probe of \(url.absoluteString): \(why)")
        }
        let target: HostPort
        let connection: Connection
        do {
            target = try HostPort(url: url)
            connection = try Connection.dial(url: url, timeout: timeout)
        } catch let e as NetError { throw failure(e.kind, e.message) }
        defer { connection.close() }
        let fd = connection.fd
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_QUICKACK, &one, socklen_t(MemoryLayout<Int32>.size))
        connection.setTimeouts(seconds: timeout)
        var request = "POST /v1/clock HTTP/1.1\r\nHost: \(target)\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        request += "\r\n{}"
        let bytes = Array(request.utf8)
        var out = [Sample]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        // Why the last probe ended without a sample (thrown only when there is no sample at all).
        var problem: NetError?
        probing: for _ in 0..<count {
            let t0 = Date().timeIntervalSince1970
            do { try connection.write(bytes) } catch let e as NetError { problem = failure(e.kind, e.message); break }
            // Read one response: head, then Content-Length bytes of body.
            var filled = 0
            var status = 0
            var body: [UInt8]?
            // t3 is when the answer's first segment arrives: the agent stamps `sent` just before
            // it writes the head, and the body follows as a second segment whose delay would
            // otherwise count too (on a jittery link, the later of two delays: a bias of a
            // millisecond or more against the request's single segment).
            var firstByte: Double?
            while body == nil {
                let n: Int
                do { n = try connection.read(into: &buffer, from: filled) } catch let e as NetError {
                    problem = failure(e.kind, e.kind == .timeout ? "no answer within \(Int(timeout)) s" : e.message)
                    break probing
                }
                if n > 0 && firstByte == nil { firstByte = Date().timeIntervalSince1970 }
                if n == 0 { problem = failure(.protocolError, "the connection closed before an answer"); break probing }
                // Acknowledge at once: the server writes head and body separately, and a delayed ACK
                // would hold the body back for tens of milliseconds (Nagle on the server side).
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_QUICKACK, &one, socklen_t(MemoryLayout<Int32>.size))
                filled += n
                let text = String(decoding: buffer[0..<filled], as: UTF8.self)
                guard let headEnd = text.range(of: "\r\n\r\n") else {
                    if filled == buffer.count { problem = failure(.protocolError, "answer head too large"); break probing }
                    continue
                }
                let head = text[..<headEnd.lowerBound].lowercased()
                let lines = head.components(separatedBy: "\r\n")
                status = lines.first.map { $0.split(separator: " ") }.flatMap { $0.count >= 2 ? Int($0[1]) : nil } ?? 0
                let length = lines.first { $0.hasPrefix("content-length:") }
                    .flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
                let bodyStart = text.utf8.distance(from: text.utf8.startIndex, to: headEnd.upperBound)
                guard bodyStart + length <= buffer.count else { problem = failure(.protocolError, "answer too large"); break probing }
                if filled - bodyStart >= length { body = Array(buffer[bodyStart..<(bodyStart + length)]) }
            }
            let t3 = firstByte ?? Date().timeIntervalSince1970
            guard status == 200 else {
                let text = String(decoding: body!.prefix(200), as: UTF8.self)
                problem = failure(.protocolError, "HTTP \(status)\(text.isEmpty ? "" : ": \(text)")")
                break
            }
            guard let reply = try? JSONDecoder().decode([String: Double].self, from: Data(body!)),
                  let t1 = reply["received"], let t2 = reply["sent"] else {
                problem = failure(.protocolError, "the answer is not {\"received\": t, \"sent\": t}")
                break
            }
            out.append(Sample(offset: ((t1 - t0) + (t2 - t3)) / 2, roundTrip: (t3 - t0) - (t2 - t1)))
            if let settle, out.count >= settle, let best = out.map(\.roundTrip).min(), best <= settledRoundTrip { break }
            // Let this exchange's last segments (the body, our ACK of it) leave the link before the
            // next request, so the request does not queue behind them: one round trip, at most 0.1 s.
            let pause = min(0.1, max(0.0002, t3 - t0))
            usleep(useconds_t(pause * 1e6))
        }
        if out.isEmpty && count > 0 { throw problem ?? failure(.protocolError, "no answer") }
        return out
    }
}
