import Foundation

/// A node's permission to attach to the air, signed by the coordinator with the lab's air key
/// (HMAC-SHA256): "run|node|agent|issued|expires|mac". It is bound to one run, one node of it,
/// the agent that runs the node, and an expiry at the run's latest end; the air checks it with
/// the same key and needs no list of agents. A node holding one cannot attach as another node,
/// for another run or after the run.
///
/// What a ticket cannot know (the run ended early, its agent was revoked), the coordinator tells
/// the air in a `notice` signed with the same key: "ended|RUN|at|mac" or "revoked|AGENT|at|mac".
/// The air then drops what such tickets attached and refuses them from then on.
public enum NodeTicket {
    /// What a valid ticket says.
    public struct Claims: Sendable, Equatable {
        public var run: String
        public var node: String
        public var agent: String
        public var issued: Double
        public var expires: Double
        public init(run: String, node: String, agent: String, issued: Double, expires: Double) {
            self.run = run; self.node = node; self.agent = agent; self.issued = issued; self.expires = expires
        }
    }

    public static func issue(run: String, node: String, agent: String, issued: Double, expires: Double, key: Data) -> String {
        sign("\(run)|\(node)|\(agent)|\(seconds(issued))|\(seconds(expires))", key: key)
    }

    /// The claims of a ticket signed with `key`, or why it is not one.
    public static func claims(_ ticket: String, key: Data) -> Result<Claims, Refusal> {
        guard let fields = verified(ticket, count: 5, key: key) else { return .failure(Refusal(reason: ticket.utf8.count > 512 || ticket.split(separator: "|").count != 6 ? "malformed ticket" : "ticket not signed by this lab's air key")) }
        guard let issued = Int64(fields[3]), let expires = Int64(fields[4]) else { return .failure(Refusal(reason: "malformed ticket")) }
        return .success(Claims(run: fields[0], node: fields[1], agent: fields[2], issued: Double(issued), expires: Double(expires)))
    }

    /// Why `ticket` does not let `node` attach at `now` (nil: it does), on its own terms; the
    /// air also checks its notices (run ended, agent revoked).
    public static func problem(_ ticket: String, node: String, now: Double, key: Data) -> String? {
        switch claims(ticket, key: key) {
        case .failure(let r): return r.reason
        case .success(let c):
            guard c.node == node else { return "ticket is for node \(c.node), not \(node)" }
            guard c.expires > now else { return "ticket expired (run \(c.run) ended)" }
            return nil
        }
    }

    public struct Refusal: Error, Sendable {
        public var reason: String
        public init(reason: String) { self.reason = reason }
    }

    /// A notice from the coordinator to the air.
    public enum Notice: Sendable, Equatable {
        /// The run ended: its tickets attach nothing any more.
        case ended(run: String, at: Double)
        /// The agent was revoked: its tickets issued before `at` attach nothing any more.
        case revoked(agent: String, at: Double)

        public func signed(key: Data) -> String {
            switch self {
            case .ended(let run, let at): return NodeTicket.sign("ended|\(run)|\(NodeTicket.seconds(at))", key: key)
            case .revoked(let agent, let at): return NodeTicket.sign("revoked|\(agent)|\(NodeTicket.seconds(at))", key: key)
            }
        }

        /// The notice in `text` when it is signed with `key`.
        public static func verify(_ text: String, key: Data) -> Notice? {
            guard let f = NodeTicket.verified(text, count: 3, key: key), let at = Int64(f[2]) else { return nil }
            switch f[0] {
            case "ended": return .ended(run: f[1], at: Double(at))
            case "revoked": return .revoked(agent: f[1], at: Double(at))
            default: return nil
            }
        }
    }

    /// The air's side: which tickets attach now, given the notices it was sent. Pure rules
    /// (no sockets), used by the air on its queue.
    public struct Gate: Sendable {
        public let key: Data
        /// Runs that ended, and agents revoked (with when), as the coordinator told.
        public private(set) var ended: [String: Double] = [:]
        public private(set) var revoked: [String: Double] = [:]
        /// Notices kept: the oldest ended runs are forgotten first (their tickets have expired
        /// long before a lab ends 10,000 more runs).
        static let keptNotices = 10_000
        private var endedOrder: [String] = []

        public init(key: Data) { self.key = key }

        /// The ticket's claims when it lets `node` attach at `now`, or why it does not.
        public func admit(_ ticket: String, node: String, now: Double) -> Result<Claims, Refusal> {
            if let p = NodeTicket.problem(ticket, node: node, now: now, key: key) { return .failure(Refusal(reason: p)) }
            guard case .success(let c) = NodeTicket.claims(ticket, key: key) else { return .failure(Refusal(reason: "malformed ticket")) }
            if let why = refusal(c, now: now) { return .failure(Refusal(reason: why)) }
            return .success(c)
        }

        /// Why a ticket with claims `c` holds no more (nil: it holds).
        public func refusal(_ c: Claims, now: Double) -> String? {
            if c.expires <= now { return "ticket expired (run \(c.run) ended)" }
            if ended[c.run] != nil { return "run \(c.run) has ended" }
            if let at = revoked[c.agent], c.issued <= at { return "agent \(c.agent) was revoked" }
            return nil
        }

        /// Whether a hello admitted with `new` (nil: the lab token) may replace the node attached
        /// under the same name with `old`: a node reattaching (same run, same agent) does, and so
        /// does a later run's node (a ticket issued after the attached one's: after an air
        /// restart an ended run's ticket may hold again until it expires); another agent's ticket
        /// for the same run, or an earlier run's, never drops a node whose ticket still holds.
        public func mayReplace(old: Claims?, new: Claims?, now: Double) -> Bool {
            guard let old, refusal(old, now: now) == nil else { return true }
            guard let new else { return false }
            if new.run == old.run { return new.agent == old.agent }
            return new.issued > old.issued
        }

        /// Takes a signed notice; returns it when it was one.
        public mutating func take(_ text: String) -> Notice? {
            guard let n = Notice.verify(text, key: key) else { return nil }
            switch n {
            case .ended(let run, let at):
                if ended.updateValue(at, forKey: run) == nil { endedOrder.append(run) }
                if endedOrder.count > Self.keptNotices { ended[endedOrder.removeFirst()] = nil }
            case .revoked(let agent, let at):
                revoked[agent] = max(at, revoked[agent] ?? at)
            }
            return n
        }
    }

    static func seconds(_ t: Double) -> Int64 { t.isFinite ? Int64(clamping: Int64(max(-1e15, min(1e15, t)))) : 0 }

    static func sign(_ body: String, key: Data) -> String { "\(body)|\(SHA256.hmac(key: key, message: Data(body.utf8)))" }

    /// The `count` fields before the MAC, when the MAC is right (compared in constant time).
    static func verified(_ text: String, count: Int, key: Data) -> [String]? {
        guard text.utf8.count <= 512 else { return nil }
        let parts = text.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == count + 1 else { return nil }
        let body = parts[0..<count].joined(separator: "|")
        let want = Array(SHA256.hmac(key: key, message: Data(body.utf8)).utf8), given = Array(parts[count].utf8)
        var diff = UInt8(want.count == given.count ? 0 : 1)
        for (a, b) in zip(want, given) { diff |= a ^ b }
        return diff == 0 ? Array(parts[0..<count]) : nil
    }
}
