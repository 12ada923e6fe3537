import HeraldCore

extension LabWire {
    /// What an agent may say of itself (heartbeats, status answers, file lists), checked where
    /// it enters the coordinator (issue 36): an enrolled agent is still outside. A report with a
    /// field outside these bounds is refused whole, naming the field, and nothing of it is kept:
    /// an instant of -inf or a count of Int.max would otherwise reach the run record, the
    /// dashboard's sums and the manifest.
    public enum Bounds {
        /// Instants (Unix seconds, the agent's clock): 1970 to 2100.
        public static let instant: ClosedRange<Double> = 0...4_102_444_800
        /// Seconds a node started after its start instant (either sign).
        public static let lateness: ClosedRange<Double> = -1_000_000...1_000_000
        /// Counters (peers, reads, RSSI rows).
        public static let counter: ClosedRange<Int> = 0...1_000_000_000_000
        /// Entries of a list (peers, gaps, held runs, recoveries).
        public static let entries = 10_000
        /// Characters of a free text (a message, a gap's reason, a kernel release).
        public static let text = 4_096
        /// Characters of a peer's short name.
        public static let peerName = 128

        static func instant(_ v: Double?, _ field: String) -> String? {
            guard let v else { return nil }
            return v.isFinite && instant.contains(v) ? nil : "\(field) is not an instant between 1970 and 2100"
        }
        static func count(_ v: Int, _ field: String) -> String? {
            counter.contains(v) ? nil : "\(field) is outside 0...\(counter.upperBound)"
        }
        static func text(_ v: String?, _ field: String) -> String? {
            guard let v else { return nil }
            return v.unicodeScalars.count <= text ? nil : "\(field) is longer than \(text) characters"
        }
        static func list<T>(_ v: [T]?, _ field: String) -> String? {
            guard let v else { return nil }
            return v.count <= entries ? nil : "\(field) has more than \(entries) entries"
        }
        static func name(_ v: String?, _ field: String) -> String? {
            guard let v else { return nil }
            return SafeName.isValid(v) ? nil : "\(field) is not a safe name"
        }
        static func gaps(_ v: [Gap]?, _ field: String) -> String? {
            if let p = list(v, field) { return p }
            for (i, g) in (v ?? []).enumerated() {
                if let p = instant(g.from, "\(field)[\(i)].from") ?? instant(g.to, "\(field)[\(i)].to") ?? text(g.reason, "\(field)[\(i)].reason") { return p }
                if g.from > g.to { return "\(field)[\(i)] ends before it begins" }
            }
            return nil
        }
        static func recoveries(_ v: [Recovery]?, _ field: String) -> String? {
            if let p = list(v, field) { return p }
            for (i, r) in (v ?? []).enumerated() {
                if let p = instant(r.at, "\(field)[\(i)].at") ?? text(r.reason, "\(field)[\(i)].reason") ?? text(r.detail, "\(field)[\(i)].detail") { return p }
            }
            return nil
        }
    }
}

extension LabWire.AgentStatus {
    /// The first field outside `LabWire.Bounds`, named (never echoed), or nil when all are in.
    public var problem: String? {
        typealias B = LabWire.Bounds
        if let p = B.name(runId, "runId") ?? B.name(node, "node") { return p }
        if let p = B.instant(startAt, "startAt") ?? B.instant(startedAt, "startedAt") ?? B.instant(endsAt, "endsAt") { return p }
        if let late = lateBy, !(late.isFinite && B.lateness.contains(late)) { return "lateBy is outside \(Int(B.lateness.lowerBound))...\(Int(B.lateness.upperBound)) s" }
        if let p = B.count(peersDetected, "peersDetected") ?? B.count(payloadsRead, "payloadsRead") ?? B.count(rssiLastMinute, "rssiLastMinute")
            ?? B.count(rssiTotal, "rssiTotal") { return p }
        if let p = B.text(message, "message") ?? B.text(writeError, "writeError") ?? B.text(kernel, "kernel") ?? B.text(bluez, "bluez")
            ?? B.text(radio, "radio") ?? B.text(boot, "boot") { return p }
        if let p = B.gaps(gaps, "gaps") ?? B.recoveries(recoveries, "recoveries") { return p }
        if let p = B.list(held, "held") ?? B.list(peers, "peers") ?? B.list(recentPeers, "recentPeers") { return p }
        for (i, h) in (held ?? []).enumerated() { if let p = B.name(h, "held[\(i)]") { return p } }
        for (field, names) in [("peers", peers), ("recentPeers", recentPeers)] {
            for (i, n) in (names ?? []).enumerated() where n.unicodeScalars.count > B.peerName || n.unicodeScalars.contains(where: OutsideText.isEscaped) {
                return "\(field)[\(i)] is not a peer's short name (at most \(B.peerName) printable characters)"
            }
        }
        return nil
    }
}

extension LabWire.FileList {
    /// The first field outside `LabWire.Bounds` (besides the files themselves, which the
    /// coordinator checks against the Herald set), named, or nil.
    public var problem: String? {
        typealias B = LabWire.Bounds
        if let p = B.instant(startedAt, "startedAt") ?? B.instant(startAt, "startAt") { return p }
        if let p = B.text(failure, "failure") ?? B.text(writeError, "writeError") { return p }
        if let p = B.list(files, "files") ?? B.gaps(gaps, "gaps") ?? B.recoveries(recoveries, "recoveries") { return p }
        return nil
    }
}
