import Foundation
import HeraldCore
import HeraldRadio

/// What a running node reports: the agent serves it, `herald-lab run` shows it live.
public struct NodeStatus: Codable, Sendable, Equatable {
    public enum State: String, Codable, Sendable { case idle, armed, running, stopped, failed }
    public var state: State
    /// Distinct peers whose payload is known (read or shared).
    public var peersDetected: Int
    /// Payload reads (didRead events).
    public var payloadsRead: Int
    /// RSSI measurements in the last 60 seconds of the node's clock.
    public var rssiLastMinute: Int
    public var rssiTotal: Int
    /// ShortNames of the peers detected, sorted.
    public var peers: [String]
    /// ShortNames of the peers read or measured in the last `NodeCounters.recentSeconds` (the
    /// dashboard's pairs x time strip), sorted.
    public var recentPeers: [String]?
    /// The OS version the node writes to detection.csv: its kernel release (`uname -r`) on a
    /// Linux node. The coordinator copies it into the manifest's node entry.
    public var osVersion: String?
    /// What the node's radio is coping with (bluetoothd answering slowly, discovery retried, an
    /// outage); absent when all is well.
    public var radio: String?
    public init(state: State, peersDetected: Int = 0, payloadsRead: Int = 0, rssiLastMinute: Int = 0, rssiTotal: Int = 0, peers: [String] = [],
                osVersion: String? = nil, radio: String? = nil) {
        self.state = state
        self.peersDetected = peersDetected
        self.payloadsRead = payloadsRead
        self.rssiLastMinute = rssiLastMinute
        self.rssiTotal = rssiTotal
        self.peers = peers
        self.osVersion = osVersion
        self.radio = radio
    }
}

/// Counts what the sensor sees, for `NodeStatus`. Used on the scheduler's executor.
final class NodeCounters: SensorDelegate {
    private let scheduler: any Scheduler
    private let ownShortName: String
    // Touched on every measurement, from one executor at a time: no run-time exclusivity checks.
    @exclusivity(unchecked) private(set) var peers = Set<String>()
    @exclusivity(unchecked) private(set) var payloadsRead = 0
    @exclusivity(unchecked) private(set) var rssiTotal = 0
    /// RSSI counts per whole second, for the last minute (a ring of 60 buckets).
    @exclusivity(unchecked) private var buckets = [Int](repeating: 0, count: 60)
    @exclusivity(unchecked) private var bucketSecond = [Int64](repeating: -1, count: 60)
    /// A peer (by the short name its payload gave) and the last second it was read or measured.
    private final class Peer {
        let name: String
        var last: Int64
        init(name: String, last: Int64) { self.name = name; self.last = last }
    }
    /// The peer each target's payload named (a measurement costs one lookup), and the peers by name.
    @exclusivity(unchecked) private var targets = [TargetIdentifier: Peer]()
    @exclusivity(unchecked) private var byName = [String: Peer]()
    static let recentSeconds: Int64 = 10

    init(scheduler: any Scheduler, ownShortName: String) {
        self.scheduler = scheduler
        self.ownShortName = ownShortName
    }

    func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) {
        payloadsRead += 1
        let name = didRead.shortName
        if name != ownShortName {
            peers.insert(name)
            let now = second
            let peer = byName[name] ?? Peer(name: name, last: now)
            byName[name] = peer
            peer.last = now
            targets[fromTarget] = peer
        }
    }

    private var second: Int64 { Self.second(of: scheduler.now) }

    /// The whole second of a time. A clock can say anything (NaN, 1e300, before 1970): saturated,
    /// then held to ±2^62 s so that `now - 60` cannot overflow (issue 36).
    static func second(of date: Date) -> Int64 {
        min(max(Saturating.int64(date.timeIntervalSince1970.rounded(.down)), -(1 << 62)), 1 << 62)
    }

    /// Peers heard in the last `recentSeconds`, sorted.
    var recentPeers: [String] {
        let now = second
        return byName.values.filter { $0.last > now - Self.recentSeconds }.map(\.name).sorted()
    }

    func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) {
        for p in didShare where p.shortName != ownShortName { peers.insert(p.shortName) }
    }

    func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier) {
        rssiTotal += 1
        let second = self.second
        targets[fromTarget]?.last = second
        // A second before 1970 has a negative remainder, and the ring's index must not be negative.
        let i = Int((second % 60 + 60) % 60)
        if bucketSecond[i] != second { bucketSecond[i] = second; buckets[i] = 0 }
        buckets[i] += 1
    }

    var rssiLastMinute: Int {
        let now = second
        var total = 0
        for i in 0..<60 where bucketSecond[i] > now - 60 && bucketSecond[i] <= now { total += buckets[i] }
        return total
    }
}
