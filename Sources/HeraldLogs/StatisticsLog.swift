import Foundation
import HeraldCore
import HeraldRadio

/// statistics.csv: `payload,count,mean,sd,min,max`, one row per other shortName: the number of
/// intervals and the mean, standard deviation, min and max of the seconds between successive
/// didRead / didMeasure(withPayload) / didShare events for that payload. Rewritten whole
/// (atomically) every `writeInterval` seconds of scheduler time and on close, not per event
/// (`.batch` writing: only on `write()` and close).
public final class StatisticsLog: SensorDelegate {
    public static let header = "payload,count,mean,sd,min,max"

    /// Running statistics (Welford).
    public struct Sample: Equatable, Sendable {
        public private(set) var count = 0
        public private(set) var mean = 0.0
        private var m2 = 0.0
        public private(set) var min = Double.infinity
        public private(set) var max = -Double.infinity
        public init() {}
        public mutating func add(_ x: Double) {
            count += 1
            let d = x - mean
            mean += d / Double(count)
            m2 += d * (x - mean)
            if x < min { min = x }
            if x > max { max = x }
        }
        /// Sample standard deviation (n - 1), 0 for fewer than two values.
        public var sd: Double { count > 1 ? (m2 / Double(count - 1)).squareRoot() : 0 }
    }

    public let url: URL
    private let scheduler: any Scheduler
    private let ownShortName: String
    private let writing: LogWriting
    /// Per payload (by short-name code): when it was last seen, and the intervals so far.
    private struct Entry { var last: Date; var sample = Sample() }
    @exclusivity(unchecked) private var entries = CodeTable<Entry>(empty: Entry(last: .distantPast))
    private let ownCode: UInt64?
    /// Payloads seen at least twice, with their intervals.
    public var samples: [String: Sample] {
        var out = [String: Sample]()
        entries.forEach { code, e in if e.sample.count > 0 { out[PayloadData.shortName(code: code)] = e.sample } }
        return out
    }
    @exclusivity(unchecked) private var dirty = false
    private var task: ScheduledTask?

    public init(url: URL, scheduler: any Scheduler, ownShortName: String, writeInterval: TimeInterval = 30, writing: LogWriting = .live) {
        self.url = url
        self.scheduler = scheduler
        self.ownShortName = ownShortName
        self.writing = writing
        ownCode = CodeTable<Entry>.code(of: ownShortName)
        write()
        guard writing == .live else { return }
        task = scheduler.scheduleRepeating(every: writeInterval) { [weak self] in
            guard let self, self.dirty else { return }
            self.write()
        }
    }

    private func add(_ payload: PayloadData) {
        let code = payload.shortNameCode
        guard code != ownCode else { return }
        let now = scheduler.now
        entries.update(code, default: Entry(last: now)) { e, found in
            guard found else { return }
            e.sample.add(now.timeIntervalSince(e.last))
            e.last = now
            dirty = true
        }
    }

    public var text: String {
        var out = Self.header + "\n"
        var named = [(String, Sample)]()
        entries.forEach { code, e in if e.sample.count > 0 { named.append((PayloadData.shortName(code: code), e.sample)) } }
        for (name, s) in named.sorted(by: { $0.0 < $1.0 }) {
            var line = [UInt8]()
            Bytes.appendCSV(name, to: &line)
            out += String(decoding: line, as: UTF8.self)
            out += ",\(s.count),\(s.mean),\(s.sd),\(s.min),\(s.max)\n"
        }
        return out
    }

    /// The last failure to write the file, if any.
    public private(set) var writeError: String?

    public func write() {
        writeError = AtomicFile.write(text, to: url, durable: writing == .live)
        dirty = writeError != nil
    }

    public func close() {
        task?.cancel()
        write()
    }

    public func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) { add(didRead) }
    public func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier, withPayload: PayloadData) { add(withPayload) }
    public func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) {
        for p in didShare { add(p) }
    }
}

/// A map from short-name codes (`PayloadData.shortNameCode`) to values: open addressing with
/// one multiplication to hash, each code beside its value (one cache line per lookup). Short
/// names are compared as codes, so no String is made or hashed per event.
struct CodeTable<Value> {
    /// `code | 1 << 63` for a used slot (codes never set that bit), 0 for an empty one.
    private struct Slot { var key: UInt64; var value: Value }
    private var slots: [Slot]
    private let empty: Value
    private(set) var count = 0

    init(empty: Value) {
        self.empty = empty
        slots = [Slot](repeating: Slot(key: 0, value: empty), count: 16)
    }

    /// The code of a name, or nil if no payload can have it (longer than six bytes).
    static func code(of name: String) -> UInt64? {
        let bytes = Array(name.utf8)
        guard bytes.count <= 6 else { return nil }
        var code = UInt64(bytes.count) << 56
        for (k, b) in bytes.enumerated() { code |= UInt64(b) << UInt64(8 * k) }
        return code
    }

    @inline(__always) private static func slot(_ key: UInt64, _ size: Int) -> Int {
        Int(truncatingIfNeeded: (key &* 0x9E37_79B9_7F4A_7C15) >> UInt64(64 - size.trailingZeroBitCount))
    }

    /// Calls `body` with the value for `code` (inserting `value` first if absent; `found` says which).
    @inline(__always) mutating func update(_ code: UInt64, default value: @autoclosure () -> Value, _ body: (inout Value, _ found: Bool) -> Void) {
        let key = code | 1 << 63
        let mask = slots.count - 1
        var i = Self.slot(key, slots.count)
        while true {
            let k = slots[i].key
            if k == key { body(&slots[i].value, true); return }
            if k == 0 { break }
            i = (i + 1) & mask
        }
        slots[i] = Slot(key: key, value: value())
        count += 1
        body(&slots[i].value, false)
        if count * 2 > slots.count { rehash() }
    }

    private mutating func rehash() {
        let old = slots
        slots = [Slot](repeating: Slot(key: 0, value: empty), count: old.count * 2)
        let mask = slots.count - 1
        for s in old where s.key != 0 {
            var i = Self.slot(s.key, slots.count)
            while slots[i].key != 0 { i = (i + 1) & mask }
            slots[i] = s
        }
    }

    func forEach(_ body: (UInt64, Value) -> Void) {
        for s in slots where s.key != 0 { body(s.key & ~(1 << 63), s.value) }
    }
}
