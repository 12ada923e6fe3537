import Foundation

/// What a plan needs of a lab (issue 40, item 5): one agent per node, with the plan's radio and
/// every one of its tags, or the agents or dongles it names; with radio bluez, dongles of the
/// makes and firmware it asks for. Pure, so that `plan check` says it, `run STUDY` checks the lab
/// against it before its first submission, and the coordinator selects by the same rule
/// (`Coordinator.select`).
public struct AgentNeeds: Codable, Sendable, Equatable, CustomStringConvertible {
    /// Agents (one a node).
    public var agents: Int
    public var radio: RadioKind
    /// Every chosen agent carries all of them.
    public var tags: [String]
    /// These agents, in node order (`agents.names`).
    public var names: [String]?
    /// The agents driving these dongles, in node order (`agents.dongles`, radio bluez).
    public var dongles: [String]?
    /// Dongles of any of these makes, and of any of these firmware (radio bluez).
    public var manufacturer: [String]?
    public var firmware: [String]?
    /// Matching agents checked beside the chosen ones, if there are any (never required).
    public var spares: Int
    /// The study's levels these needs are of (a factor that selects dongles or the radio gives
    /// each level its own); nil: the plan's, or every level's.
    public var levels: [String]?

    public init(agents: Int, radio: RadioKind, tags: [String] = [], names: [String]? = nil, dongles: [String]? = nil,
                manufacturer: [String]? = nil, firmware: [String]? = nil, spares: Int = 0, levels: [String]? = nil) {
        self.agents = agents; self.radio = radio; self.tags = tags; self.names = names; self.dongles = dongles
        self.manufacturer = manufacturer; self.firmware = firmware; self.spares = spares; self.levels = levels
    }

    /// The selection the needs are read from (names, tags and dongle criteria as the plan gives them).
    public var selection: AgentSelection {
        var a = AgentSelection(names: names, tags: tags.isEmpty ? nil : tags)
        a.dongles = dongles; a.manufacturer = manufacturer; a.firmware = firmware
        return a
    }

    /// "4 agents with radio bluez, tags lab,east and dongles of make Intel, firmware 8870" (the
    /// coordinator's refusal says it in the same words).
    public var description: String {
        var s = "\(agents) agent\(agents == 1 ? "" : "s")"
        if let names { s += " named \(names.joined(separator: ", "))" }
        if let dongles { s += " driving dongles \(dongles.joined(separator: ", "))" }
        s += " with radio \(radio.rawValue)"
        if !tags.isEmpty { s += " with tags \(tags.joined(separator: ","))" }
        if let d = dongleText { s += " and dongles of \(d)" }
        return s
    }

    /// "make Intel/2, firmware 8870", nil when the needs say nothing of makes or firmware.
    public var dongleText: String? {
        let parts = [manufacturer.flatMap { $0.isEmpty ? nil : "make \($0.joined(separator: "/"))" },
                     firmware.flatMap { $0.isEmpty ? nil : "firmware \($0.joined(separator: "/"))" }].compactMap { $0 }
        return parts.isEmpty ? nil : parts.joined(separator: ", ")
    }

    /// Whether an agent could run one of the plan's nodes by what it is (radio, tags, its
    /// dongle's make and firmware); names, liveness and whether it is busy are the fit's.
    public func admits(_ info: LabWire.AgentInfo) -> Bool {
        guard info.radio == radio, Set(tags).isSubset(of: Set(info.tags)) else { return false }
        guard radio == .bluez else { return true }
        return selection.matches(info.dongle ?? LabWire.DongleInfo(id: nil, name: "", present: false))
    }
}

extension Plan {
    /// What this plan needs of a lab.
    public var needs: AgentNeeds {
        AgentNeeds(agents: nodes.count, radio: radio.kind, tags: agents.tags ?? [], names: agents.names, dongles: agents.dongles,
                   manufacturer: agents.manufacturer, firmware: agents.firmware, spares: agents.spares ?? 0)
    }

    /// What a study's runs need, one entry per distinct need in the order first met, each with
    /// the levels that need it when the levels differ (a factor on `agents.firmware`,
    /// `agents.manufacturer` or `radio.kind`); the runs run one at a time, so each entry must fit
    /// the lab on its own.
    public static func needs(of runs: [StudyRun]) -> [AgentNeeds] {
        var out = [AgentNeeds]()
        var levels = [[String]]()
        for r in runs {
            let n = r.plan.needs
            if let i = out.firstIndex(of: n) {
                if !levels[i].contains(r.level) { levels[i].append(r.level) }
            } else {
                out.append(n)
                levels.append([r.level])
            }
        }
        guard out.count > 1 else { return out }
        for i in out.indices { out[i].levels = levels[i] }
        return out
    }
}

/// An agent as the lab offers it to a plan: what it is and whether it can be chosen now.
public struct AgentOffer: Sendable, Equatable {
    public var info: LabWire.AgentInfo
    /// Heard from lately (the coordinator's `alive`).
    public var alive: Bool
    /// Taken by a run that has not ended (or a dongle check).
    public var busy: Bool
    /// Why its dongle may not be chosen (quarantined, in maintenance, retired); nil when it may.
    public var unusable: String?
    public init(info: LabWire.AgentInfo, alive: Bool, busy: Bool = false, unusable: String? = nil) {
        self.info = info; self.alive = alive; self.busy = busy; self.unusable = unusable
    }
}

/// How a lab meets a plan's needs: the agents that fit now and why the others do not.
public struct AgentFit: Sendable, Equatable {
    public var needs: AgentNeeds
    /// Agents that fit, in the lab's order (one a URL: one agent slot never runs two nodes).
    public var fitting: [String]
    /// Agents that would fit but are busy, not alive, or whose dongle may not be chosen (with why).
    public var busy: [String]
    public var notAlive: [String]
    public var unusable: [String]
    /// Named agents or dongles (`agents.names`, `agents.dongles`) that no agent of the lab is, or
    /// drives with the plan's radio.
    public var unknown: [String]

    /// Whether the lab can take a run with these needs now.
    public var fits: Bool {
        if needs.names != nil || needs.dongles != nil { return unknown.isEmpty && busy.isEmpty && notAlive.isEmpty && unusable.isEmpty && fitting.count == needs.agents }
        return fitting.count >= needs.agents
    }

    /// Why it does not fit, in one sentence naming how many agents are needed and how many fit;
    /// nil when it fits.
    public var reason: String? {
        guard !fits else { return nil }
        var s = "needs \(needs)"
        if let levels = needs.levels { s += " (level\(levels.count == 1 ? "" : "s") \(levels.joined(separator: "; ")))" }
        s += ", but \(fitting.count) fit\(fitting.count == 1 ? "s" : "")"
        if !fitting.isEmpty { s += " (\(fitting.joined(separator: ", ")))" }
        var why = [String]()
        if !unknown.isEmpty { why.append("not in the lab: \(unknown.joined(separator: ", "))") }
        if !notAlive.isEmpty { why.append("not alive: \(notAlive.joined(separator: ", "))") }
        if !busy.isEmpty { why.append("busy with another run: \(busy.joined(separator: ", "))") }
        if !unusable.isEmpty { why.append("not selectable: \(unusable.joined(separator: "; "))") }
        if !why.isEmpty { s += "; " + why.joined(separator: "; ") }
        return s
    }
}

extension AgentNeeds {
    /// The lab's agents measured against these needs (the coordinator's rule: alive, free,
    /// the radio, every tag, the dongle's make and firmware; names and dongles by name).
    public func fit(_ lab: [AgentOffer]) -> AgentFit {
        var fit = AgentFit(needs: self, fitting: [], busy: [], notAlive: [], unusable: [], unknown: [])
        var urls = Set<String>()
        func place(_ o: AgentOffer) {
            if !o.alive { fit.notAlive.append(o.info.name) }
            else if o.busy { fit.busy.append(o.info.name) }
            else if radio == .bluez, let why = o.unusable { fit.unusable.append("\(o.info.name): \(why)") }
            else if urls.insert(o.info.url).inserted { fit.fitting.append(o.info.name) }
        }
        if let names {
            for n in names {
                guard let o = lab.first(where: { $0.info.name == n }), o.info.radio == radio else { fit.unknown.append("agent \(n)"); continue }
                place(o)
            }
            return fit
        }
        if let dongles {
            for n in dongles {
                let driving = lab.filter { $0.info.radio == .bluez && $0.info.dongle?.name == n }
                guard let o = driving.first(where: \.alive) ?? driving.first else { fit.unknown.append("dongle \(n)"); continue }
                place(o)
            }
            return fit
        }
        for o in lab where admits(o.info) { place(o) }
        return fit
    }
}
