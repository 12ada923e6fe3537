import Foundation
import Synchronization
import HeraldCore
import LabPlan
import Logging

/// The lab's dongles: every dongle an agent reports is kept by its address (SQLite), with its
/// health (LAVA's good, bad, maintenance, retired, and unknown) and its history. A dongle that
/// fails `quarantineAfter` checks in a row, or is the outlier of that many runs, is quarantined
/// with the evidence and never selected until the operator releases it. The checks themselves
/// (pre-flight and health checks, which call agents) are the coordinator's (Coordinator+Dongles);
/// their outcomes come here (`apply`).
///
/// Owns its state (`Mutex<State>`, never held across an await): the records, and the agents
/// whose dongles are being checked.
final class DongleService: Sendable {
    struct State {
        var dongles: [String: DongleRecord] = [:]
        var checking: Set<String> = []
    }
    private let state: Mutex<State>
    private let store: CoordinatorStore
    private let clock: any LabClock
    private let logger: Logger
    private let quarantineAfter: Int

    init(store: CoordinatorStore, quarantineAfter: Int, clock: any LabClock, logger: Logger) throws {
        var initial = State()
        for d in try store.dongles() { initial.dongles[d.id] = d }
        state = Mutex(initial)
        self.store = store
        self.quarantineAfter = quarantineAfter
        self.clock = clock
        self.logger = logger
    }

    /// Runs `body` with the service's state, under its lock (never across an await).
    func withState<T>(_ body: (inout State) throws -> T) rethrows -> T { try state.withLock { s in try body(&s) } }

    /// The agents whose dongles are being checked now.
    var checking: Set<String> { state.withLock { $0.checking } }

    /// Marks `agents` as checking (true) or done (false).
    func setChecking(_ agents: [String], _ on: Bool) {
        state.withLock { s in for a in agents { if on { s.checking.insert(a) } else { s.checking.remove(a) } } }
    }

    /// Every dongle's health (the metrics).
    var healths: [LabWire.DongleHealth] { state.withLock { $0.dongles.values.map(\.health) } }

    // MARK: The registry

    /// An agent reports its dongle (registration, heartbeat, a check): new, moved, or seen again.
    func note(_ reported: LabWire.DongleInfo, agent: String) {
        var info = reported
        info.agent = agent
        let key = DongleRecord.key(info)
        let t = clock.now()
        let change: (DongleRecord, [LabWire.DongleEvent])? = state.withLock { s in
            guard var r = s.dongles[key] else {
                let r = DongleRecord(id: key, info: info, at: t)
                s.dongles[key] = r
                let where_ = [info.host.map { "host \($0)" }, "agent \(agent)", info.adapter, info.usb.map { "USB port \($0.port)" }].compactMap { $0 }.joined(separator: ", ")
                return (r, [LabWire.DongleEvent(kind: .registered, at: t, ok: true, message: "first seen: \(where_)")])
            }
            var events = [LabWire.DongleEvent]()
            let old = r.info
            let (here, there) = (DongleRecord.place(info), DongleRecord.place(old))
            if here != there, r.isClone {
                // Known clones: their reports alternate; nothing new to say.
            } else if here != there, r.previousPlace == here, let seen = r.previousSeen, t - seen <= DongleRecord.cloneWindow {
                // Reported here, then there, then here again within the window: not a dongle
                // that moves but two that share one address. Neither can be told apart from the
                // other (plans, manifests and history go by address), so neither is selected.
                r.health = .bad
                r.healthSince = t
                r.healthReason = "\(DongleRecord.cloneReason) \(key): at \(here) and at \(there); give one a new address (btmgmt public-addr, where its controller allows it) or unplug it, then release"
                events.append(LabWire.DongleEvent(kind: .health, at: t, ok: false, message: "bad: \(r.healthReason ?? "")"))
            } else if old.host != info.host || old.agent != info.agent || (info.usb != nil && old.usb?.port != info.usb?.port) {
                let from = [old.host, old.agent, old.usb?.port].compactMap { $0 }.joined(separator: "/")
                let to = [info.host, info.agent, info.usb?.port].compactMap { $0 }.joined(separator: "/")
                events.append(LabWire.DongleEvent(kind: .moved, at: t, ok: true, message: "now \(to) (was \(from))"))
            }
            if here != there {
                r.previousPlace = there
                r.previousSeen = r.lastSeen
            }
            // Fields a later look may not have (identity read once) are kept.
            if info.manufacturer == nil, old.manufacturer != nil {
                info.manufacturer = old.manufacturer; info.manufacturerName = old.manufacturerName
                info.hciVersion = old.hciVersion; info.hciRevision = old.hciRevision
                info.lmpVersion = old.lmpVersion; info.lmpSubversion = old.lmpSubversion
            }
            let due = t - r.lastSeen >= 60
            guard info != old || due || !events.isEmpty else { r.lastSeen = t; s.dongles[key] = r; return nil }
            r.info = info
            r.lastSeen = t
            s.dongles[key] = r
            return (r, events)
        }
        if let (r, events) = change { persist(r, events) }
    }

    /// A dongle's history, newest first; a store that cannot give it is logged (the record is
    /// then judged and shown without it).
    func history(_ key: String, limit: Int) -> [LabWire.DongleEvent] {
        do { return try store.dongleEvents(key, limit: limit) } catch {
            logger.error("cannot read dongle \(key)'s history: \(error)", metadata: ["dongle": .string(key)])
            return []
        }
    }

    func persist(_ r: DongleRecord, _ events: [LabWire.DongleEvent]) {
        do { try store.saveDongle(r, events: events) } catch { logger.error("cannot save dongle \(r.id): \(error)", metadata: ["dongle": .string(r.info.name), "dongleId": .string(r.id)]) }
        for e in events where ![.preflight, .check, .run].contains(e.kind) {
            logger.notice("dongle \(r.info.name) (\(r.id)): \(e.kind): \(e.message)", metadata: ["dongle": .string(r.info.name), "dongleId": .string(r.id)])
        }
    }

    /// Applies an outcome to a dongle's record; returns the dongle's name when it was quarantined by it.
    @discardableResult
    func apply(_ outcome: DongleRules.Outcome, to key: String) -> String? {
        let recent = history(key, limit: 100)
        let t = clock.now()
        let k = quarantineAfter
        let result: (DongleRecord, [LabWire.DongleEvent], Bool)? = state.withLock { s in
            guard var r = s.dongles[key] else { return nil }
            let before = r.health
            let events = DongleRules.apply(outcome, to: &r, at: t, quarantineAfter: k, recent: recent)
            s.dongles[key] = r
            return (r, events, before != .bad && r.health == .bad)
        }
        guard let (r, events, quarantined) = result else { return nil }
        persist(r, events)
        return quarantined ? r.info.name : nil
    }

    /// The record key of a dongle named by the operator: its address (any case), its key, or
    /// its name when that is unique.
    func key(_ ref: String) throws -> String {
        try state.withLock { s in
            if let a = LabWire.normalisedAddress(ref), s.dongles[a] != nil { return a }
            if s.dongles[ref] != nil { return ref }
            let named = s.dongles.values.filter { $0.info.name == ref }
            if named.count == 1 { return named[0].id }
            if named.count > 1 {
                throw LabRefusal(.conflict, "\(named.count) dongles are named \(ref) (\(named.map(\.id).sorted().joined(separator: ", "))): give the address")
            }
            throw LabRefusal(.notFound, "no dongle \(ref) (dongles: \(s.dongles.values.map(\.info.name).sorted().joined(separator: ", ")))")
        }
    }

    /// The operator sets a dongle's health: quarantine (bad), release (unknown: checked again
    /// before use), maintenance, retired.
    func setHealth(_ ref: String, _ request: LabWire.HealthRequest) throws -> DongleRecord {
        guard ref.utf8.count <= 128 else { throw LabRefusal(.invalid, "dongle name too long") }
        let reason = request.reason.map { String($0.prefix(500)) }
        if let r = reason, r.unicodeScalars.contains(where: { $0.value < 0x20 }) { throw LabRefusal(.invalid, "reason holds control characters") }
        let key = try key(ref)
        let t = clock.now()
        let updated: (DongleRecord, LabWire.DongleEvent)? = state.withLock { s in
            guard var r = s.dongles[key] else { return nil }
            let was = r.health
            r.health = request.health
            r.healthSince = t
            r.healthReason = reason.map { "set by the operator: \($0)" } ?? "set by the operator"
            if request.health == .unknown { r.failures = 0; r.outliers = 0 }
            s.dongles[key] = r
            let verb = request.health == .unknown && was == .bad ? "released" : request.health == .bad ? "quarantined" : "set to \(request.health.rawValue)"
            return (r, LabWire.DongleEvent(kind: .health, at: t, ok: request.health.selectable,
                                           message: "\(request.health.rawValue): \(verb) by the operator (was \(was.rawValue))\(reason.map { ": \($0)" } ?? "")"))
        }
        guard let (r, e) = updated else { throw LabRefusal(.notFound, "no dongle \(ref)") }
        persist(r, [e])
        return r
    }

    /// Every dongle with its agent's liveness (`agentStates`, by agent name), the run it is busy
    /// with (`busy`, by agent name), and its newest history.
    func views(history: Int, agentStates: [String: String], busy: [String: String]) -> [LabWire.DongleView] {
        let records = state.withLock { s in
            s.dongles.values.sorted { ($0.info.host ?? "", $0.info.name, $0.id) < ($1.info.host ?? "", $1.info.name, $1.id) }
        }
        return records.map { r in
            var v = LabWire.DongleView(id: r.id, info: r.info, health: r.health, failures: r.failures, outliers: r.outliers,
                                       firstSeen: r.firstSeen, lastSeen: r.lastSeen,
                                       history: history > 0 ? self.history(r.id, limit: history) : [])
            v.healthReason = r.healthReason
            v.healthSince = r.healthSince
            v.agentState = r.info.agent.flatMap { agentStates[$0] }
            v.busyWith = r.info.agent.flatMap { busy[$0] }
            return v
        }
    }

    /// The record of the dongle an agent drives, if it reported one.
    func record(of agent: LabWire.AgentInfo) -> DongleRecord? {
        guard let d = agent.dongle else { return nil }
        return state.withLock { s in s.dongles[DongleRecord.key(d)] }
    }
}
