import Foundation
import NIOCore
import Synchronization

/// Who may hold a connection to a service, decided when it is accepted (before a byte of TLS or
/// HTTP is read). A stranger (an address that has not authenticated lately) may hold at most
/// `perAddress` connections, and strangers together at most `total - reserved`; the last
/// `reserved` places are kept for addresses that presented a valid credential within
/// `rememberSeconds` (agents heartbeat every few seconds; the operator's first answered request
/// counts). So idle, slow or half-done connections from one address, or from many, never take
/// the places enrolled agents and the operator need.
final class ConnectionGate: Sendable {
    enum Verdict: Equatable {
        case admitted
        case refused(String)
    }

    let total: Int
    let perAddress: Int
    let reserved: Int
    let rememberSeconds: Double
    private let now: @Sendable () -> Double

    /// What the gate counts, under one lock.
    private struct Counts {
        var open = 0
        var byAddress: [String: Int] = [:]
        var known: [String: Double] = [:]
        var channels: [ObjectIdentifier: any Channel] = [:]
        var closed = false
    }
    private let counts = Mutex(Counts())

    init(total: Int, perAddress: Int, reserved: Int, rememberSeconds: Double = 600, now: @escaping @Sendable () -> Double = monotonicNow) {
        self.total = max(1, total)
        self.perAddress = max(1, perAddress)
        self.reserved = min(max(0, reserved), max(1, total) - 1)
        self.rememberSeconds = rememberSeconds
        self.now = now
    }

    /// Admits a connection from `address` (its numeric address) or says why not. An admitted
    /// one must `leave` once.
    func enter(_ address: String, _ channel: (any Channel)?) -> Verdict {
        counts.withLock { s in
            if s.closed { return .refused("the service is stopping") }
            if s.open >= total { return .refused("\(total) connections are open") }
            if !isKnown(address, in: s) {
                if s.open >= total - reserved {
                    return .refused("the places left are kept for agents and operators that have authenticated (\(reserved))")
                }
                if s.byAddress[address, default: 0] >= perAddress {
                    return .refused("\(perAddress) connections are open from this address")
                }
            }
            s.open += 1
            s.byAddress[address, default: 0] += 1
            if let channel { s.channels[ObjectIdentifier(channel)] = channel }
            return .admitted
        }
    }

    func leave(_ address: String, _ channel: (any Channel)?) {
        counts.withLock { s in
            s.open -= 1
            let left = s.byAddress[address, default: 1] - 1
            s.byAddress[address] = left > 0 ? left : nil
            if let channel { s.channels[ObjectIdentifier(channel)] = nil }
        }
    }

    /// `address` presented a valid credential: it is not a stranger for `rememberSeconds`.
    func vouch(for address: String) {
        counts.withLock { s in
            s.known[address] = now()
            // Forget the oldest when an attacker with many credentials-less addresses cannot be
            // the cause: only vouched addresses are kept, at most a few thousand.
            if s.known.count > 4096 {
                let cutoff = now() - rememberSeconds
                s.known = s.known.filter { $0.value >= cutoff }
            }
        }
    }

    private func isKnown(_ address: String, in s: Counts) -> Bool {
        guard let at = s.known[address] else { return false }
        return now() - at < rememberSeconds
    }

    /// Open connections in all, and from `address`.
    func count(_ address: String? = nil) -> Int {
        counts.withLock { s in address.map { s.byAddress[$0, default: 0] } ?? s.open }
    }

    /// Refuses new connections and closes every open one.
    func closeAll() {
        let all = counts.withLock { s -> [any Channel] in
            s.closed = true
            return Array(s.channels.values)
        }
        for c in all { c.close(promise: nil) }
    }
}
