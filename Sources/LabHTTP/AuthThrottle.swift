import Foundation
import Synchronization
import HeraldCore
import Logging

/// Credential guessing slowed per peer address (issue 36: one stranger made 1,872-1,999 sign-in
/// guesses a second and 3,257 bearer guesses a second, and each failure wrote its own log line).
///
/// After `free` failures in a row from one address, each further attempt must wait: `base`
/// seconds after the first, doubling with each failure up to `cap`. An attempt inside the wait
/// is answered 429 with Retry-After and not even checked. An address's failures are forgotten
/// after twice `cap` without one (a success does not forget them: a lab's agent heartbeating from
/// the guesser's address would otherwise give it `free` more guesses a heartbeat).
/// Failures are logged once per `logInterval` per address, with the count since the last line.
/// At most `maxPeers` addresses are remembered (the longest quiet forgotten first), so a crowd of
/// addresses costs bounded memory. Time is injected (`now`, seconds on a monotonic clock).
///
/// A credential that succeeded from an address within `remember` keeps working from it while the
/// address waits (`isKnown`): a lab's agents and operator often share an address with whoever
/// guesses (loopback, a NAT), and a stranger's guesses must not lock them out. That answers a
/// guess of exactly such a credential at once, as without the throttle; every other guess waits.
public final class AuthThrottle: Sendable {
    public struct Rules: Sendable, Equatable {
        public var free = 5
        public var base = 1.0
        public var cap = 300.0
        public var logInterval = 10.0
        public var maxPeers = 4096
        public var remember = 3600.0
        public init(free: Int = 5, base: Double = 1, cap: Double = 300, logInterval: Double = 10, maxPeers: Int = 4096, remember: Double = 3600) {
            self.free = free; self.base = base; self.cap = cap; self.logInterval = logInterval; self.maxPeers = maxPeers; self.remember = remember
        }
    }

    struct Peer {
        var failures = 0
        var blockedUntil = 0.0
        var lastSeen = 0.0
        var unlogged = 0
        var loggedAt = -Double.infinity
    }

    public let rules: Rules
    private let now: @Sendable () -> Double
    private let logger: Logger
    /// The addresses' failures, and who succeeded from which address and when (address, then
    /// principal; bounded like `peers`), under one lock.
    private struct Table {
        var peers: [String: Peer] = [:]
        var known: [String: [String: Double]] = [:]
    }
    private let table = Mutex(Table())

    public init(rules: Rules = Rules(), logger: Logger, now: @escaping @Sendable () -> Double = { ProcessInfo.processInfo.systemUptime }) {
        self.rules = rules
        self.logger = logger
        self.now = now
    }

    /// Seconds `peer` must still wait before its credential is checked again; nil when it may try.
    public func retryAfter(_ peer: String) -> Double? {
        let t = now()
        return table.withLock { s in
            guard let p = s.peers[peer], p.blockedUntil > t else { return nil }
            return p.blockedUntil - t
        }
    }

    /// A wrong credential from `peer` (`what`: "sign-in", "bearer token"); logs at most once per
    /// interval per address, with the count.
    public func failed(_ peer: String, _ what: String) {
        let t = now()
        var line: (count: Int, failures: Int, wait: Double)?
        table.withLock { s in
            var p = s.peers[peer] ?? Peer()
            if t - p.lastSeen > 2 * rules.cap { p.failures = 0 }
            p.failures += 1
            p.lastSeen = t
            p.unlogged += 1
            if p.failures > rules.free {
                let doublings = Double(min(p.failures - rules.free - 1, 60))
                p.blockedUntil = t + min(rules.cap, rules.base * pow(2, doublings))
            }
            if t - p.loggedAt >= rules.logInterval {
                line = (p.unlogged, p.failures, max(0, p.blockedUntil - t))
                p.unlogged = 0
                p.loggedAt = t
            }
            s.peers[peer] = p
            if s.peers.count > rules.maxPeers, let quietest = s.peers.min(by: { $0.value.lastSeen < $1.value.lastSeen })?.key { s.peers[quietest] = nil }
        }
        if let line {
            logger.warning("refused \(line.count) wrong \(what) credential(s) from \(OutsideText.line(peer)) since the last such line; \(line.failures) in a row, next attempt in \(String(format: "%.0f", line.wait)) s",
                           metadata: ["peer": .string(peer), "failures": .stringConvertible(line.failures)])
        }
    }

    /// A right credential from `peer` (`who`: the principal it proved): the principal is known
    /// there for `remember`.
    public func succeeded(_ peer: String, _ who: String) {
        let t = now()
        table.withLock { s in
            s.known[peer, default: [:]][who] = t
            if s.known.count > rules.maxPeers, let quietest = s.known.min(by: { ($0.value.values.max() ?? 0) < ($1.value.values.max() ?? 0) })?.key { s.known[quietest] = nil }
            if s.known[peer]!.count > 64, let oldest = s.known[peer]!.min(by: { $0.value < $1.value })?.key { s.known[peer]![oldest] = nil }
        }
    }

    /// Whether `who` succeeded from `peer` within `remember`: it passes while the address waits.
    public func isKnown(_ peer: String, _ who: String) -> Bool {
        let t = now()
        return table.withLock { s in s.known[peer]?[who].map { t - $0 <= rules.remember } ?? false }
    }

    /// The `Retry-After` value for a wait: whole seconds, at least 1.
    public static func retryAfterHeader(_ seconds: Double) -> String { String(max(1, Saturating.int64(seconds.rounded(.up)))) }
}
