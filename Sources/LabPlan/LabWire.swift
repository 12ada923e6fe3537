import Foundation

/// What agents and the coordinator say to each other over HTTP (docs/API.md). Times on the wire
/// are seconds since 1970 as numbers, each in the clock of the side that took them.
public enum LabWire {
    public static let apiVersion = "v1"

    /// An agent introduces itself.
    public struct AgentInfo: Codable, Sendable, Equatable {
        public var name: String
        public var url: String
        public var tags: [String]
        /// `sim` (attached to the air) or `bluez`.
        public var radio: RadioKind
        public var adapter: String?
        public var controller: [String: String]?
        public var version: String
        /// The port the agent listens on. With `url` on a wildcard host (an agent bound to
        /// 0.0.0.0 or ::, and no --advertise-url), the coordinator records the agent at the
        /// address its registration came from, on this port.
        public var port: UInt16?
        /// The dongle it drives (radio bluez), as it found it at start.
        public var dongle: DongleInfo?
        /// Freshness: the agent process's boot id (new at every start) and a counter that grows
        /// with every registration and heartbeat of that boot; the coordinator refuses a
        /// counter it has seen (a replay).
        public var boot: String?
        public var sequence: UInt64?
        public init(name: String, url: String, tags: [String], radio: RadioKind, adapter: String?, controller: [String: String]?, version: String = HeraldLabVersion.version, port: UInt16? = nil) {
            self.name = name; self.url = url; self.tags = tags; self.radio = radio; self.adapter = adapter; self.controller = controller; self.version = version; self.port = port
        }
    }

    /// A period in which a node logged nothing it could vouch for (the agent was stopped or
    /// restarted, or its radio was lost), in the agent's clock. Rows are never written for it.
    public struct Gap: Codable, Sendable, Equatable {
        public var from: Double
        public var to: Double
        public var reason: String
        public init(from: Double, to: Double, reason: String) { self.from = from; self.to = to; self.reason = reason }
    }

    /// A run an agent holds on disk (GET /v1/runs on the agent).
    public struct HeldRun: Codable, Sendable, Equatable {
        public var runId: String
        public var node: String
        public var state: AgentState
        public var startAt: Double?
        public var bytes: Int64
        public init(runId: String, node: String, state: AgentState, startAt: Double?, bytes: Int64) {
            self.runId = runId; self.node = node; self.state = state; self.startAt = startAt; self.bytes = bytes
        }
    }

    public enum AgentState: String, Codable, Sendable { case idle, armed, running, finished, failed }

    /// An agent's state, in heartbeats and on GET /v1/status.
    public struct AgentStatus: Codable, Sendable, Equatable {
        public var name: String
        public var state: AgentState
        public var runId: String?
        public var node: String?
        /// Agent clock.
        public var startAt: Double?
        public var startedAt: Double?
        public var endsAt: Double?
        /// The run was resumed after the agent restarted (its logs have a gap).
        public var resumed: Bool
        public var peersDetected: Int
        public var payloadsRead: Int
        public var rssiLastMinute: Int
        public var rssiTotal: Int
        public var message: String?
        /// Periods without trustworthy rows so far (agent clock).
        public var gaps: [Gap]?
        /// Seconds the node started after the instant it was given (agent clock, exact).
        public var lateBy: Double?
        /// The last failure to write a log file (disk full, ...), if any.
        public var writeError: String?
        /// Every run this agent holds on disk, ungathered ones included.
        public var held: [String]?
        /// The agent host's kernel release (`uname -r`) and, with radio bluez, the version of the
        /// bluetoothd it talks to (read when it last armed), or why that is unknown.
        public var kernel: String?
        public var bluez: String?
        /// The dongle (radio bluez) as last looked at, and what the running node did to recover it.
        public var dongle: DongleInfo?
        public var recoveries: [Recovery]?
        /// Freshness, as in `AgentInfo` (heartbeats only).
        public var boot: String?
        public var sequence: UInt64?
        /// What the node's radio copes with now (bluetoothd answering slowly, discovery retried,
        /// an outage): `NodeStatus.radio`; absent when all is well.
        public var radio: String?
        /// The node's peers (Herald shortNames): all detected so far, and those heard in the last
        /// 10 s (the dashboard's detection matrix and pairs x time strip).
        public var peers: [String]?
        public var recentPeers: [String]?
        /// The clock stamps of this agent's previous heartbeat (heartbeats only): with the
        /// coordinator's own stamps from its answer, one clock sample (`HeartbeatClock`).
        public var clock: HeartbeatClock?
        public init(name: String, state: AgentState) {
            self.name = name; self.state = state; resumed = false; peersDetected = 0; payloadsRead = 0; rssiLastMinute = 0; rssiTotal = 0
        }
    }

    /// Answer to a clock probe: when the agent received it and when it answered (agent clock).
    /// The coordinator answers a heartbeat with the same two stamps, in its own clock.
    public struct ClockReply: Codable, Sendable, Equatable {
        public var received: Double
        public var sent: Double
        public init(received: Double, sent: Double) { self.received = received; self.sent = sent }
    }

    /// When an agent sent its heartbeat number `sequence` and when the answer reached it (agent
    /// clock), reported in the next heartbeat. The coordinator kept when it received that
    /// heartbeat and when it answered (its `ClockReply`), so it holds an NTP exchange's four
    /// stamps: a clock sample per heartbeat, and arming needs no clock probes (AgentRegistry+Clock).
    public struct HeartbeatClock: Codable, Sendable, Equatable {
        public var sequence: UInt64
        public var sent: Double
        public var answered: Double
        public init(sequence: UInt64, sent: Double, answered: Double) { self.sequence = sequence; self.sent = sent; self.answered = answered }
    }

    /// The air an agent with a simulated radio attaches to.
    public struct AirAddress: Codable, Sendable, Equatable {
        public var host: String
        public var port: UInt16
        /// The node's ticket for the air (`NodeTicket`), set by the coordinator when it arms a node
        /// and the lab has an air key.
        public var ticket: String?
        public init(host: String, port: UInt16, ticket: String? = nil) { self.host = host; self.port = port; self.ticket = ticket }
    }

    /// An operator's request to enrol an agent (`herald-lab agents enrol`).
    public struct EnrolRequest: Codable, Sendable {
        public var name: String
        /// Host names and addresses the agent's certificate is valid for.
        public var hosts: [String]
        /// The coordinator URL to write into the enrolment.
        public var coordinator: String?
        public var days: Int?
        public init(name: String, hosts: [String], coordinator: String?, days: Int? = nil) {
            self.name = name; self.hosts = hosts; self.coordinator = coordinator; self.days = days
        }
    }

    public struct ArmRequest: Codable, Sendable {
        public var assignment: NodeAssignment
        public var air: AirAddress?
        public init(assignment: NodeAssignment, air: AirAddress?) { self.assignment = assignment; self.air = air }
    }

    public struct StartRequest: Codable, Sendable {
        public var runId: String
        /// Start instant in the agent's clock.
        public var startAt: Double
        public init(runId: String, startAt: Double) { self.runId = runId; self.startAt = startAt }
    }

    public struct FileInfo: Codable, Sendable, Equatable {
        public var name: String
        public var bytes: Int64
        public var sha256: String
        public init(name: String, bytes: Int64, sha256: String) { self.name = name; self.bytes = bytes; self.sha256 = sha256 }
    }

    public struct FileList: Codable, Sendable {
        public var runId: String
        public var node: String
        public var resumed: Bool
        public var startedAt: Double?
        public var files: [FileInfo]
        /// The instant the node was told to start (agent clock).
        public var startAt: Double?
        public var gaps: [Gap]?
        /// The run was stopped before its planned end (abort).
        public var aborted: Bool?
        public var writeError: String?
        /// Why the node failed, when it did (what it logged, if anything, is still listed).
        public var failure: String?
        /// Recoveries of the node's dongle during the run.
        public var recoveries: [Recovery]?
        public init(runId: String, node: String, resumed: Bool, startedAt: Double?, files: [FileInfo]) {
            self.runId = runId; self.node = node; self.resumed = resumed; self.startedAt = startedAt; self.files = files
        }
    }

    /// NTP-style estimate from one probe: t0 sent and t3 received in the coordinator's clock,
    /// t1 received and t2 sent in the agent's: offset = agent - coordinator.
    public struct ClockSample: Codable, Sendable, Equatable {
        public var offset: Double
        public var roundTrip: Double
        /// How a node's clock was measured, where the coordinator records it (a run's nodes).
        public var from: Source?
        public enum Source: String, Codable, Sendable { case heartbeats, probes }
        public init(t0: Double, t1: Double, t2: Double, t3: Double) {
            offset = ((t1 - t0) + (t2 - t3)) / 2
            roundTrip = (t3 - t0) - (t2 - t1)
        }
        public init(offset: Double, roundTrip: Double, from: Source? = nil) { self.offset = offset; self.roundTrip = roundTrip; self.from = from }
        /// The sample with the smallest round trip is the most trustworthy.
        public static func best(_ samples: [ClockSample]) -> ClockSample? { samples.min { $0.roundTrip < $1.roundTrip } }

        /// The offset from the smallest delay seen in each direction, over all samples: with
        /// f = t1 − t0 (forward delay + offset) and b = t3 − t2 (backward delay − offset),
        /// offset = (min f − min b) / 2, exact when the two directions' least delays are equal.
        /// On a jittery link this converges much faster than the best single sample, which
        /// needs both of its directions to be fast at once. `roundTrip` is min f + min b.
        public static func combined(_ samples: [ClockSample]) -> ClockSample? {
            bounds(samples.filter(\.isUsable)).map(within)
        }

        /// `combined`, or nil when the samples contradict each other: each bounds the offset to
        /// [offset − roundTrip/2, offset + roundTrip/2], and those bounds do not all overlap (a
        /// clock stepped or drifted between them). `combined` would then report a round trip of 0,
        /// a perfect sample; over seconds of heartbeats that is a real risk, over a burst of probes
        /// hardly. An unusable sample is not skipped: nil.
        public static func agreeing(_ samples: [ClockSample]) -> ClockSample? {
            guard samples.allSatisfy(\.isUsable), let b = bounds(samples), b.lower <= b.upper else { return nil }
            return within(b)
        }

        /// Finite, with a round trip of at least 0.
        /// A sample whose arithmetic can be trusted: finite, a round trip of 0 to `maxRoundTrip`,
        /// an offset within `maxOffset`. Heartbeat stamps and probe answers come from outside: an
        /// agent that answered a probe with `{"received": 5e10, "sent": 1}` made a round trip of
        /// 5e10 s, and with it a start margin of 5e11 s (issue 36).
        public var isUsable: Bool {
            offset.isFinite && roundTrip.isFinite && roundTrip >= 0 && roundTrip <= Self.maxRoundTrip && abs(offset) <= Self.maxOffset
        }
        /// A round trip beyond this is no clock to start a run on (a lab's links answer in ms).
        public static let maxRoundTrip = 5.0
        /// An offset beyond 10 years is no clock at all (a node that never set its clock is off by
        /// decades: its rows could not be stamped with the time they happened).
        public static let maxOffset = 10 * 365.25 * 86_400.0

        /// The tightest bounds all samples put on the offset: the greatest lower bound
        /// (offset − roundTrip/2, the least delay back) and the least upper one (offset +
        /// roundTrip/2, the least delay forth); nil for no samples.
        static func bounds(_ samples: [ClockSample]) -> (lower: Double, upper: Double)? {
            guard !samples.isEmpty else { return nil }
            return (samples.map { $0.offset - $0.roundTrip / 2 }.max()!, samples.map { $0.offset + $0.roundTrip / 2 }.min()!)
        }

        /// The sample for bounds: their middle, and their width as the round trip (0 when they cross).
        static func within(_ b: (lower: Double, upper: Double)) -> ClockSample {
            ClockSample(offset: (b.upper + b.lower) / 2, roundTrip: max(0, b.upper - b.lower))
        }
    }
}
