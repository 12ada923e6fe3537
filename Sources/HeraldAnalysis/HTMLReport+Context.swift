import Foundation
import HeraldCore

/// The buckets of the run-over-time charts: from the filter window's start (run time 0: the
/// plan's start, warm-up included) to its end, at most `maximumBuckets` of a round width, so that
/// a 3-minute run has 30-second buckets (several scan cycles each) and an 8-hour one 1-minute buckets.
public struct Timeline: Sendable, Equatable {
    /// Seconds since 1970 (the logs' time base, shifts applied) of run time 0.
    public var origin: Double
    public var end: Double
    /// Seconds per bucket.
    public var width: Double
    public var count: Int

    static let widths: [Double] = [30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    static let maximumBuckets = 600

    public init(from: Double, to: Double) {
        let span = from.isFinite && to.isFinite ? max(0, to - from) : 0
        origin = from.isFinite ? from : 0
        end = origin + span
        width = Self.widths.first { span / $0 <= Double(Self.maximumBuckets) } ?? 86400
        count = span > 0 ? min(Self.maximumBuckets * 4, max(1, Saturating.int((span / width).rounded(.up)))) : 0
    }

    /// The bucket of a time, nil outside the window.
    @inline(__always) func index(_ t: Double) -> Int? {
        guard count > 0, t >= origin, t <= end else { return nil }
        return min(count - 1, max(0, Saturating.rowInt((t - origin) / width)))
    }

    /// Seconds of bucket `k` inside the window (the last one may be short).
    func duration(of k: Int) -> Double { max(0, min(width, end - origin - Double(k) * width)) }
}

/// One node's rows over time, in the buckets of a `Timeline`.
public struct NodeSeries: Sendable {
    /// RSSI (measure) rows the node wrote, matched to a device or not.
    public var rssiRows: [UInt32]
    /// Payload read rows.
    public var reads: [UInt32]
    /// Battery level (%) last written in the bucket; NaN: none.
    public var battery: [Float]
    public init(buckets: Int) {
        rssiRows = [UInt32](repeating: 0, count: buckets)
        reads = [UInt32](repeating: 0, count: buckets)
        battery = [Float](repeating: .nan, count: buckets)
    }
}

/// What the report says about the run beyond the logs: the manifest's plan settings, node
/// positions, states and gaps. Read leniently: a field of the wrong type or out of range is left
/// out (and never stops the analysis); every text is escaped where the page shows it.
public struct ReportContext: Sendable {
    public struct Gap: Sendable {
        /// Seconds since 1970, coordinator time (the analysis's time base).
        public var from: Double?, to: Double?
        public var reason: String
    }
    public struct Node: Sendable {
        public var position: (x: Double, y: Double)?
        public var state: BundleNodeState?
        public var message: String?
        public var persona: String?
        public var gaps: [Gap] = []
    }
    public var mode: BundleMode?
    public var description: String?
    public var duration: Double?
    public var warmup: Double?
    public var radio: [String: JSONValue] = [:]
    public var planText: String?
    /// By node (folder) name.
    public var nodes: [String: Node] = [:]
    public init() {}

    /// Positions beyond this (metres) are not drawn: a corrupt manifest cannot stretch the map.
    static let maximumCoordinate = 1_000_000.0

    init(_ m: BundleManifest) {
        mode = m.mode
        description = m.plan?.description?.text.map { Self.cut($0, 2000) }
        duration = m.plan?.duration
        warmup = m.plan?.warmup
        if let r = m.plan?.radio { radio = r }
        planText = m.planText?.text
        for n in m.nodes ?? [] {
            var node = Node()
            if case .array(let xy)? = n.position, xy.count == 2, case .number(let x) = xy[0], case .number(let y) = xy[1],
               x.isFinite, y.isFinite, abs(x) <= Self.maximumCoordinate, abs(y) <= Self.maximumCoordinate {
                node.position = (x, y)
            }
            node.state = n.state
            node.message = n.message?.text.map { Self.cut($0, 1000) }
            node.persona = n.persona?.text.map { Self.cut($0, 100) }
            if case .array(let gaps)? = n.gaps {
                for g in gaps.prefix(1000) {
                    guard case .object(let o) = g else { continue }
                    func time(_ key: String) -> Double? {
                        guard let t = o[key]?.text, let v = LogTime.parse(text: t), InputLimits.timeProblem(v) == nil else { return nil }
                        return v
                    }
                    node.gaps.append(Gap(from: time("from"), to: time("to"), reason: Self.cut(o["reason"]?.text ?? "no reason given", 1000)))
                }
            }
            nodes[n.name] = node
        }
    }

    /// A text from the manifest cut to `limit` characters (a manifest may hold megabytes of one).
    static func cut(_ s: String, _ limit: Int) -> String { s.count <= limit ? s : String(s.prefix(limit)) + "…" }

    /// Crowding on or off (`radio.crowding` present and not null), nil when the manifest has no radio.
    var crowding: Bool? {
        guard !radio.isEmpty else { return nil }
        if let c = radio["crowding"], c != .null { return true }
        return false
    }
}

extension JSONValue {
    /// A string's text (numbers and booleans as written); nil for null, arrays and objects.
    var text: String? {
        switch self {
        case .string(let s): return s
        case .number, .bool: return description
        default: return nil
        }
    }
}
