import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// NTP-style clock probes over one kept-alive HTTP connection on a plain socket: a round trip of
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

    public static func probe(_ url: URL, token: String?, count: Int, timeout: TimeInterval = 5) async -> [Sample] {
        let queue = queues[abs(url.absoluteString.hashValue) % queues.count]
        return await withCheckedContinuation { c in
            queue.async { c.resume(returning: probeBlocking(url, token: token, count: count, timeout: timeout)) }
        }
    }

    /// Sends `count` `POST /v1/clock` requests to `url` (http://host:port) and returns the samples.
    public static func probeBlocking(_ url: URL, token: String?, count: Int, timeout: TimeInterval = 5) -> [Sample] {
        guard let host = url.host, let port = url.port, host == "127.0.0.1" || host == "localhost" || inet_addr(host) != INADDR_NONE else { return [] }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_QUICKACK, &one, socklen_t(MemoryLayout<Int32>.size))
        var tv = timeval(tv_sec: Int(timeout), tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host, &addr.sin_addr)
        let c = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard c == 0 else { return [] }
        var request = "POST /v1/clock HTTP/1.1\r\nHost: \(host):\(port)\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        request += "\r\n{}"
        let bytes = Array(request.utf8)
        var out = [Sample]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<count {
            let t0 = Date().timeIntervalSince1970
            let sent = bytes.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent == bytes.count else { break }
            // Read one response: head, then Content-Length bytes of body.
            var filled = 0
            var body: [UInt8]?
            while body == nil {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + filled, $0.count - filled, 0) }
                if n <= 0 { return out }
                // Acknowledge at once: the server writes head and body separately, and a delayed ACK
                // would hold the body back for tens of milliseconds (Nagle on the server side).
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_QUICKACK, &one, socklen_t(MemoryLayout<Int32>.size))
                filled += n
                let text = String(decoding: buffer[0..<filled], as: UTF8.self)
                guard let headEnd = text.range(of: "\r\n\r\n") else { continue }
                let head = text[..<headEnd.lowerBound].lowercased()
                let length = head.components(separatedBy: "\r\n").first { $0.hasPrefix("content-length:") }
                    .flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
                let bodyStart = text.utf8.distance(from: text.utf8.startIndex, to: headEnd.upperBound)
                if filled - bodyStart >= length { body = Array(buffer[bodyStart..<(bodyStart + length)]) }
            }
            let t3 = Date().timeIntervalSince1970
            guard let reply = try? JSONDecoder().decode([String: Double].self, from: Data(body!)),
                  let t1 = reply["received"], let t2 = reply["sent"] else { break }
            out.append(Sample(offset: ((t1 - t0) + (t2 - t3)) / 2, roundTrip: (t3 - t0) - (t2 - t1)))
        }
        return out
    }
}
