import Foundation
import HeraldCore
import LabPlan

/// What the coordinator keeps of one dongle (SQLite table `dongle`; its history in
/// `dongle_event`). Keyed by the dongle's stable identity: its controller's address.
public struct DongleRecord: Codable, Sendable, Equatable {
    public var id: String
    public var info: LabWire.DongleInfo
    public var health: LabWire.DongleHealth = .unknown
    public var healthReason: String?
    public var healthSince: Double?
    /// Failed checks, and runs it was the outlier of, in a row.
    public var failures = 0
    public var outliers = 0
    public var firstSeen: Double
    public var lastSeen: Double
    /// Where it was reported before its last move, and when it was last reported there: a report
    /// from there again soon after the move means two controllers share its address (clones).
    public var previousPlace: String?
    public var previousSeen: Double?

    public init(id: String, info: LabWire.DongleInfo, at t: Double) {
        self.id = id
        self.info = info
        firstSeen = t
        lastSeen = t
    }

    /// The key a dongle is kept under: its address, or (address unknown) its agent and name.
    public static func key(_ d: LabWire.DongleInfo) -> String {
        d.id ?? "unknown@\(d.agent ?? d.name)"
    }

    /// Where a dongle is plugged, as far as its reports say: host, agent, and its USB port (the
    /// adapter name when it has none).
    public static func place(_ d: LabWire.DongleInfo) -> String {
        [d.host, d.agent, d.usb.map { "USB port \($0.port)" } ?? d.adapter].compactMap { $0 }.joined(separator: "/")
    }

    /// Seconds within which a report from a dongle's previous place, after it was reported
    /// somewhere else, means two dongles and not a move back (agents report every few seconds;
    /// moving a dongle and back takes longer).
    public static let cloneWindow = 120.0

    /// Whether its health was set because two controllers report its address.
    public var isClone: Bool { health == .bad && healthReason?.hasPrefix(DongleRecord.cloneReason) == true }
    static let cloneReason = "clone: two controllers report address"
}

/// The coordinator's rules for dongles, as pure functions (LabCoordinatorTests): who passed a
/// pre-flight check, who is the outlier of a run, and when a dongle is quarantined.
public enum DongleRules {
    /// One dongle of a check: its agent's report, or why the agent gave none.
    public struct Entry: Sendable {
        public var name: String
        public var id: String?
        public var agent: String
        public var beacon: UInt32
        public var report: LabWire.PreflightReport?
        public var error: String?
        /// The host the dongle is plugged into (one bluetoothd serves all of a host's dongles).
        public var host: String?
        public init(name: String, id: String?, agent: String, beacon: UInt32, report: LabWire.PreflightReport?, error: String?, host: String? = nil) {
            self.name = name; self.id = id; self.agent = agent; self.beacon = beacon; self.report = report; self.error = error; self.host = host
        }

        /// How far the check got: 0 nothing, 1 present, 2 powered, 3 advertising, 4 scanning.
        var stage: Int {
            guard let r = report else { return 0 }
            return r.scanning ? 4 : r.advertising ? 3 : r.powered ? 2 : r.present ? 1 : 0
        }
    }

    /// Verdicts, in the entries' order. A dongle fails its own check when it is not present,
    /// cannot power on, advertise or scan, or (three dongles or more) heard none of the others or
    /// was heard by none of them while the others heard each other. A stage failure counts
    /// against the dongle only when another dongle of its host got past that stage (one
    /// bluetoothd and one kernel serve all of a host's dongles: when all of them fail alike, the
    /// host is at fault), or, alone on its host, when a dongle elsewhere did. When nobody heard
    /// anybody, or two dongles did not both hear each other, the check fails without blaming any
    /// dongle (the room, bluetoothd, or either of the two). Pairs missing between dongles that
    /// otherwise hear and are heard are warnings.
    public static func judge(_ entries: [Entry], bound: Double) -> [LabWire.PreflightVerdict] {
        let within = "within \(Saturating.int(bound.rounded())) s"
        let active = entries.filter { $0.error == nil && $0.report != nil && $0.report?.problem == nil }
        func heard(_ a: Entry, _ b: Entry) -> Bool { a.report?.seen.contains { $0.beacon == b.beacon } ?? false }
        return entries.map { e in
            if let error = e.error {
                return LabWire.PreflightVerdict(dongle: e.name, dongleId: e.id, agent: e.agent, ok: false, blame: false,
                                                reason: "the agent did not take the check: \(error)")
            }
            guard let r = e.report else {
                return LabWire.PreflightVerdict(dongle: e.name, dongleId: e.id, agent: e.agent, ok: false, blame: false, reason: "no report")
            }
            if let problem = r.problem {
                let sameHost = entries.filter { $0.beacon != e.beacon && $0.error == nil && $0.host == e.host }
                let witnesses = sameHost.isEmpty ? entries.filter { $0.beacon != e.beacon && $0.error == nil } : sameHost
                let blame = witnesses.contains { $0.stage > e.stage }
                var v = LabWire.PreflightVerdict(dongle: e.name, dongleId: e.id, agent: e.agent, ok: false, blame: blame, reason: problem)
                if !blame, !witnesses.isEmpty {
                    v.reason = "\(problem); every other dongle \(sameHost.isEmpty ? "checked" : "of host \(e.host ?? "unknown")") failed as far: its bluetoothd or kernel is at fault, not this dongle"
                }
                return v
            }
            let others = active.filter { $0.beacon != e.beacon }
            let saw = others.filter { heard(e, $0) }
            let seenBy = others.filter { heard($0, e) }
            // When it had heard every dongle it heard (its check's time, the check's own start included).
            let heardAll = r.seen.filter { s in others.contains { $0.beacon == s.beacon } }.map(\.after).max()
            var v = LabWire.PreflightVerdict(dongle: e.name, dongleId: e.id, agent: e.agent, ok: true, blame: false, reason: nil,
                                             saw: saw.map(\.name), seenBy: seenBy.map(\.name), seconds: heardAll)
            guard !others.isEmpty else { return v } // alone: nothing to hear
            if others.count == 1 {
                if saw.isEmpty || seenBy.isEmpty {
                    v.ok = false
                    v.reason = "\(e.name) and \(others[0].name) did not both hear each other \(within): cannot tell which one is at fault"
                }
                return v
            }
            // Does the radio environment work: are the dongles that hear nobody, or that nobody
            // hears, a small minority (at most a third, the others hearing and heard)?
            let silent = active.filter { a in
                let o = active.filter { $0.beacon != a.beacon }
                return !o.contains { heard(a, $0) } || !o.contains { heard($0, a) }
            }
            let othersWork = active.count - silent.count >= max(2, 2 * silent.count)
            let deaf = saw.isEmpty, mute = seenBy.isEmpty
            if deaf || mute {
                v.ok = false
                if othersWork {
                    v.blame = true
                    v.reason = deaf && mute ? "it heard none of the \(others.count) other dongles and none heard it \(within), while they heard each other"
                        : deaf ? "it heard none of the \(others.count) other dongles \(within), while they heard each other (its scan finds nothing)"
                        : "none of the \(others.count) other dongles heard it \(within), while they heard each other (it is not advertising)"
                } else if silent.count == active.count {
                    v.reason = "no dongle heard any other \(within): the room, bluetoothd or every dongle is at fault, not one of them"
                } else {
                    v.reason = "\(silent.count) of \(active.count) dongles heard nobody or were heard by nobody \(within): too many to blame one; the room or bluetoothd is at fault"
                }
                return v
            }
            var warnings = [String]()
            let missed = others.filter { !heard(e, $0) }.map(\.name)
            if !missed.isEmpty { warnings.append("did not hear \(missed.joined(separator: ", ")) \(within)") }
            v.warnings = warnings.isEmpty ? nil : warnings
            return v
        }
    }

    /// The outliers of a run: nodes (three or more) that detected none of the others, or that
    /// none of the others detected, when they are a small minority (at most a third of the
    /// nodes, the rest detecting and detected: the radio environment worked). `detected` holds
    /// "observer\u{1F}observed" of every pair detected.
    public static func outliers(nodes: [String], detected: Set<String>) -> [String: String] {
        guard nodes.count >= 3 else { return [:] }
        func d(_ a: String, _ b: String) -> Bool { detected.contains("\(a)\u{1F}\(b)") }
        let silent = nodes.filter { n in
            let others = nodes.filter { $0 != n }
            return !others.contains { d(n, $0) } || !others.contains { d($0, n) }
        }
        guard !silent.isEmpty, nodes.count - silent.count >= max(2, 2 * silent.count) else { return [:] }
        var out = [String: String]()
        for n in silent {
            let others = nodes.filter { $0 != n }
            let saw = others.filter { d(n, $0) }, seenBy = others.filter { d($0, n) }
            if saw.isEmpty && seenBy.isEmpty { out[n] = "detected none of the \(others.count) other nodes and none detected it" }
            else if saw.isEmpty { out[n] = "detected none of the \(others.count) other nodes, which detected each other" }
            else if seenBy.isEmpty { out[n] = "none of the \(others.count) other nodes detected it, while they detected each other" }
        }
        return out
    }

    /// What happened to a dongle, for its record.
    public enum Outcome: Sendable {
        /// A pre-flight check (`kind` "preflight", with its run) or a health check ("check").
        case check(kind: LabWire.DongleEventKind, ok: Bool, blame: Bool, message: String, run: String?, evidence: String?)
        /// A run it took part in: whether it was the run's outlier.
        case run(outlier: Bool, message: String, run: String, evidence: String?)
        /// Its node's radio recovered it (or tried).
        case recovery(ok: Bool, message: String, run: String?)
    }

    /// Evidence as stored in a dongle's history: sorted-key JSON, or, should the object not
    /// serialise, a JSON note saying why (evidence is never dropped silently).
    static func evidenceJSON(_ object: Any) -> String {
        do {
            return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
        } catch {
            return #"{"unrecorded":"\#(String(describing: error).replacingOccurrences(of: "\"", with: "'"))"}"#
        }
    }

    /// Applies an outcome to a record: its history events and, after `quarantineAfter` failed
    /// checks or outlier runs in a row, quarantine (health bad) with the evidence. A passing
    /// check makes an unknown dongle good; it never releases a quarantined one (the operator
    /// does, after looking).
    public static func apply(_ outcome: Outcome, to record: inout DongleRecord, at t: Double, quarantineAfter: Int,
                             recent: [LabWire.DongleEvent]) -> [LabWire.DongleEvent] {
        var events = [LabWire.DongleEvent]()
        let k = max(1, quarantineAfter)
        func quarantine(_ why: String, _ kinds: Set<LabWire.DongleEventKind>, _ count: Int) {
            guard record.health.selectable else { return }
            // The evidence: the failures the quarantine rests on, newest first.
            let failures = (events + recent).filter { kinds.contains($0.kind) && !$0.ok }.prefix(count)
            let evidence = failures.map { ["at": String(format: "%.0f", $0.at), "kind": $0.kind.rawValue, "run": $0.run ?? "", "message": $0.message, "evidence": $0.evidence ?? ""] }
            let json = evidenceJSON(evidence)
            record.health = .bad
            record.healthReason = "quarantined: \(why)"
            record.healthSince = t
            events.append(LabWire.DongleEvent(kind: .health, at: t, ok: false, message: "bad: quarantined automatically: \(why)", evidence: json))
        }
        switch outcome {
        case .check(let kind, let ok, let blame, let message, let run, let evidence):
            events.append(LabWire.DongleEvent(kind: kind, at: t, ok: ok, message: message, run: run, evidence: evidence))
            if ok {
                record.failures = 0
                if record.health == .unknown {
                    record.health = .good
                    record.healthReason = "passed its \(kind == .check ? "health check" : "pre-flight check")"
                    record.healthSince = t
                    events.append(LabWire.DongleEvent(kind: .health, at: t, ok: true, message: "good: \(record.healthReason!)", run: run))
                }
            } else if blame {
                record.failures += 1
                if record.failures >= k { quarantine("failed \(record.failures) checks in a row (last: \(message))", [.check, .preflight], record.failures) }
            }
        case .run(let outlier, let message, let run, let evidence):
            events.append(LabWire.DongleEvent(kind: .run, at: t, ok: !outlier, message: message, run: run, evidence: evidence))
            if outlier {
                record.outliers += 1
                if record.outliers >= k { quarantine("the outlier of \(record.outliers) runs in a row (last: \(message))", [.run], record.outliers) }
            } else {
                record.outliers = 0
            }
        case .recovery(let ok, let message, let run):
            events.append(LabWire.DongleEvent(kind: .recovery, at: t, ok: ok, message: message, run: run))
        }
        return events
    }
}
