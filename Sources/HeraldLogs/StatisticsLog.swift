import Foundation
import HeraldCore
import HeraldRadio

/// statistics.csv: `payload,count,mean,sd,min,max`, one row per other shortName: the number of
/// intervals and the mean, standard deviation, min and max of the seconds between successive
/// didRead / didMeasure(withPayload) / didShare events for that payload. Rewritten whole
/// (atomically) every `writeInterval` seconds of scheduler time and on close, not per event.
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
    private var lastTime: [String: Date] = [:]
    public private(set) var samples: [String: Sample] = [:]
    private var dirty = false
    private var task: ScheduledTask?

    public init(url: URL, scheduler: any Scheduler, ownShortName: String, writeInterval: TimeInterval = 30) {
        self.url = url
        self.scheduler = scheduler
        self.ownShortName = ownShortName
        write()
        task = scheduler.scheduleRepeating(every: writeInterval) { [weak self] in
            guard let self, self.dirty else { return }
            self.write()
        }
    }

    private func add(_ payload: PayloadData) {
        let name = payload.shortName
        guard name != ownShortName else { return }
        let now = scheduler.now
        if let last = lastTime[name] {
            samples[name, default: Sample()].add(now.timeIntervalSince(last))
            dirty = true
        }
        lastTime[name] = now
    }

    public var text: String {
        var out = Self.header + "\n"
        for name in samples.keys.sorted() {
            let s = samples[name]!
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
        writeError = AtomicFile.write(text, to: url)
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
