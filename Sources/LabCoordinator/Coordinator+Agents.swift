import Foundation
import HeraldCore
import LabHTTP
import LabPlan
import Logging

/// What agents say about themselves: registration and heartbeats, and the rules that make them
/// fresh and bound. Each carries the agent's per-boot id and a counter that grows with every
/// message of that boot: a message whose counter is not above the last one seen for its boot is
/// a replay and is refused, so a captured heartbeat does not keep a stopped agent alive. A name
/// alive at one host is not taken over from another host until it stops heartbeating.
extension Coordinator {
    /// The boots seen per agent name, each with the last counter taken (at most `keptBoots`, the
    /// newest last); `current` is the boot of the last registration.
    struct Freshness {
        var boots: [(id: String, last: UInt64)] = []
        var current: String?
        static let keptBoots = 16

        /// Takes message `sequence` of boot `boot`, or says why it is refused.
        mutating func take(boot: String, sequence: UInt64, registering: Bool) -> String? {
            if let i = boots.firstIndex(where: { $0.id == boot }) {
                guard sequence > boots[i].last else { return "a replayed message (boot \(OutsideText.escaped(boot, limit: 64)), counter \(sequence), already at \(boots[i].last))" }
                boots[i].last = sequence
            } else {
                // A boot never seen: a registration, or (after a coordinator restart, when no
                // boot is known) the first heartbeat.
                guard registering || current == nil else { return "a boot that never registered" }
                boots.append((boot, sequence))
                if boots.count > Self.keptBoots { boots.removeFirst(boots.count - Self.keptBoots) }
            }
            if registering || current == nil { current = boot }
            return nil
        }
    }

    /// The boot id and counter every registration and heartbeat carries, checked for shape.
    static func freshnessFields(_ boot: String?, _ sequence: UInt64?) throws -> (String, UInt64) {
        guard let boot, let sequence else { throw LabRefusal(.invalid, "boot and sequence are required: every registration and heartbeat carries the agent's boot id and its message counter") }
        guard (8...64).contains(boot.utf8.count), SafeName.isValid(boot) else { throw LabRefusal(.invalid, "boot: 8 to 64 letters, digits, '-', '_' or '.'") }
        return (boot, sequence)
    }

    /// An agent registers (POST /v1/agents/register).
    /// Bounds on what a registration may say (issue 36: a 600-character version, 100 tags and
    /// URLs holding `"><`, spaces or U+202E were stored and shown): the field and its problem.
    static func registrationProblem(_ info: LabWire.AgentInfo) -> String? {
        let esc = { (s: String) in OutsideText.escaped(s, limit: 80, quotes: true) }
        if info.url.utf8.count > 200 { return "url: longer than 200 characters" }
        if let c = info.url.unicodeScalars.first(where: { !($0.value > 0x20 && $0.value < 0x7f) || "\"<>\\^`{|}".unicodeScalars.contains($0) }) {
            return "url: \(esc(info.url)) holds \(esc(String(c))), which a URL may not (printable ASCII without spaces, quotes or <>)"
        }
        if info.version.count > 64 { return "version: longer than 64 characters" }
        if let c = info.version.unicodeScalars.first(where: { !($0.value > 0x20 && $0.value < 0x7f) }) {
            return "version: \(esc(info.version)) holds \(esc(String(c))); printable ASCII without spaces only"
        }
        if info.tags.count > PlanLimits.maximumTags { return "tags: \(info.tags.count) tags, at most \(PlanLimits.maximumTags)" }
        if let (i, t) = info.tags.enumerated().first(where: { !SafeName.isValid($0.element) }) { return "tags[\(i)]: \(esc(t)) \(OutsideText.line(SafeName.problem(with: t)!))" }
        if let a = info.adapter, a.count > 64 || SafeName.problem(with: a.replacingOccurrences(of: ":", with: "-")) != nil {
            return "adapter: \(esc(a)) is not an adapter name (hci0) or address"
        }
        if let b = info.boot, b.count > 64 { return "boot: longer than 64 characters" }
        if let c = info.controller, c.count > 32 || c.contains(where: { $0.key.count > 64 || $0.value.count > 500 }) { return "controller: more than 32 fields, or a name over 64 or a value over 500 characters" }
        return nil
    }

    func register(_ given: LabWire.AgentInfo, principal: HTTPService.Principal?, peerHost: String?) throws {
        var info = given
        guard SafeName.isValid(info.name) else { throw LabRefusal(.invalid, "agent name \"\(HTTPService.escaped(info.name))\" \(SafeName.problem(with: info.name)!)") }
        if let problem = Self.registrationProblem(info) { throw LabRefusal(.invalid, problem) }
        try identities.mayActAs(info.name, principal)
        let (boot, sequence) = try Self.freshnessFields(info.boot, info.sequence)
        info.dongle = info.radio == .bluez ? info.dongle?.sanitised(agent: info.name) : nil
        let announced = info.url
        info.url = try Self.reachableURL(info, peerHost: peerHost)
        try identities.checkCallable(info.name, at: info.url)
        let t = now
        let esc = HTTPService.escaped
        let from = peerHost.map { " from \($0)" } ?? ""
        let refusal: String? = withLock { s in
            // The same name alive at another host: the first keeps it until it goes quiet.
            if let old = s.agents[info.name], liveness(old.lastSeen) == .alive, s.freshness[info.name]?.current != boot,
               let oldHost = Self.host(of: old.info.url), let newHost = Self.host(of: info.url), oldHost != newHost {
                return "agent \(info.name) is alive at \(esc(old.info.url)); a second agent presenting this name\(from) at \(esc(info.url)) is refused while the first heartbeats"
            }
            // In a TLS lab a URL is one agent's: another name alive there keeps it.
            if config.tls != nil, let holder = s.agents.values.first(where: { $0.info.name != info.name && $0.info.url == info.url && liveness($0.lastSeen) == .alive }) {
                return "agent \(info.name) registers \(esc(info.url)), where agent \(holder.info.name) is alive; refused"
            }
            var f = s.freshness[info.name] ?? Freshness()
            let sameBoot = f.current == boot
            if let why = f.take(boot: boot, sequence: sequence, registering: true) { return "registration of agent \(info.name) refused: \(why)" }
            s.freshness[info.name] = f
            let old = s.agents[info.name]
            var record = AgentRecord(info: info, lastSeen: t, persistedSeen: t, status: old?.status, lastError: old?.lastError, lastErrorAt: old?.lastErrorAt)
            // The same agent process registering again at the same URL (a heartbeat of it failed)
            // keeps its clock samples; a new boot starts afresh.
            if sameBoot, let old, old.info.url == info.url { record.clocks = old.clocks }
            s.agents[info.name] = record
            return nil
        }
        if let refusal {
            logger.warning("\(refusal)", metadata: ["agent": .string(info.name)])
            agentError(info.name, refusal)
            throw LabRefusal(.conflict, refusal)
        }
        try store.saveAgent(info, lastSeen: t)
        if let d = info.dongle, info.radio == .bluez { noteDongle(d, agent: info.name) }
        var ids: Logger.Metadata = ["agent": .string(info.name)]
        if let d = info.dongle { ids["dongle"] = .string(d.name) }
        logger.info("agent \(info.name) registered\(from) at \(esc(info.url))\(announced != info.url ? " (it announced \(esc(announced)))" : "") (radio \(info.radio.rawValue), tags \(esc(info.tags.joined(separator: ","))))",
                    metadata: ids)
    }

    /// An agent's heartbeat (POST /v1/agents/NAME/heartbeat), `received` when it arrived. The
    /// answer is when it arrived and when it was answered: the agent's next heartbeat reports its
    /// own stamps of this one (`LabWire.HeartbeatClock`), a clock sample (Coordinator+Clock).
    @discardableResult
    func heartbeat(_ name: String, _ given: LabWire.AgentStatus, principal: HTTPService.Principal?, received: Double? = nil) throws -> LabWire.ClockReply {
        let received = received ?? now
        guard SafeName.isValid(name) else { throw LabRefusal(.invalid, "agent name \(SafeName.problem(with: name) ?? "is invalid")") }
        try identities.mayActAs(name, principal)
        let (boot, sequence) = try Self.freshnessFields(given.boot, given.sequence)
        try Self.checkClock(given.clock)
        if let problem = given.problem {
            // Said once per kind of refusal (logged, and the agent's last error on the
            // dashboard), not once per heartbeat.
            let why = "heartbeat refused: \(problem)"
            if withLock({ s in s.agents[name] != nil && s.agents[name]?.lastError != why }) {
                logger.warning("agent \(name): \(why)", metadata: ["agent": .string(name)])
                agentError(name, why)
            }
            throw LabRefusal(.invalid, "heartbeat of agent \(name) refused: \(problem)")
        }
        var status = given
        status.dongle = status.dongle?.sanitised(agent: name)
        let clock = status.clock
        status.clock = nil
        let t = now
        enum Outcome { case taken(persist: Bool), unregistered, refused(String) }
        let outcome = withLock { s -> Outcome in
            guard var a = s.agents[name] else { return .unregistered }
            var f = s.freshness[name] ?? Freshness()
            // A boot other than the registered one registers first (the agent does on a 404).
            if let current = f.current, current != boot { return .unregistered }
            if let why = f.take(boot: boot, sequence: sequence, registering: false) { return .refused(why) }
            s.freshness[name] = f
            a.lastSeen = t
            a.status = status
            if let clock { a.takeClock(clock, boot: boot) }
            let due = t - a.persistedSeen >= 5
            if due { a.persistedSeen = t }
            s.agents[name] = a
            return .taken(persist: due)
        }
        switch outcome {
        case .unregistered: throw LabRefusal(.notFound, "agent \(name) is not registered (or registered from another boot); register first")
        case .refused(let why): throw LabRefusal(.conflict, "heartbeat of agent \(name) refused: \(why)")
        case .taken(let persist):
            if persist { persistSeen(name, at: t) }
            if let d = status.dongle { noteDongle(d, agent: name) }
            noteLive(name, status, at: t)
        }
        return withLock { s in
            let sent = now
            s.agents[name]?.clockPending = PendingClock(boot: boot, sequence: sequence, received: received, sent: sent)
            return LabWire.ClockReply(received: received, sent: sent)
        }
    }

    /// The host of an agent URL, as certificates compare it.
    static func host(of url: String) -> String? {
        URLComponents(string: url)?.host.map { IdentityService.canonicalHost($0.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))) }
    }
}
