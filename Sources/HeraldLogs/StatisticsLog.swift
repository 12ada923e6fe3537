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
    /// Per payload: when it was last seen, and the intervals so far (one lookup per event).
    private struct Entry { var last: Date; var sample = Sample() }
    private var entries: [String: Entry] = [:]
    /// Payloads seen at least twice, with their intervals.
    public var samples: [String: Sample] { entries.filter { $0.value.sample.count > 0 }.mapValues(\.sample) }
    private var dirty = false
    private var task: ScheduledTask?

    public init(url: URL, scheduler: any Scheduler, ownShortName: String, writeInterval: TimeInterval = 30, writing: LogWriting = .live) {
        self.url = url
        self.scheduler = scheduler
        self.ownShortName = ownShortName
        self.writing = writing
        write()
        guard writing == .live else { return }
        task = scheduler.scheduleRepeating(every: writeInterval) { [weak self] in
            guard let self, self.dirty else { return }
            self.write()
        }
    }

    private func add(_ payload: PayloadData) {
        let name = payload.shortName
        guard name != ownShortName else { return }
        let now = scheduler.now
        if let index = entries.index(forKey: name) {
            entries.values[index].sample.add(now.timeIntervalSince(entries.values[index].last))
            entries.values[index].last = now
            dirty = true
        } else {
            entries[name] = Entry(last: now)
        }
    }

    public var text: String {
        var out = Self.header + "\n"
        for name in entries.keys.sorted() {
            let s = entries[name]!.sample
            guard s.count > 0 else { continue }
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
