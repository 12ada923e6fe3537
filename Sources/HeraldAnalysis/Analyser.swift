import Foundation
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// Turns a bundle or a folder of device folders into Herald's efficacy figures, in both modes,
/// from one streaming parse (two passes over each contacts.csv: read rows first, since an id's
/// RSSI rows come before its read row).
public enum Analyser {
    public static func analyse(_ path: URL, options: AnalysisOptions = AnalysisOptions()) throws -> AnalysisReport {
        let clockStart = Date()
        let (input, inputs, opts, manifest) = try InputLoader.load(path, options: options)
        guard let ceStart = opts.ceStart, let ceEnd = opts.ceEnd else {
            throw AnalysisError.missingWindow("give --ce-start and --ce-end (YYYY-MM-DD HH:MM:SS, in the logs' time base), or analyse a bundle whose manifest has one")
        }
        let filterStart = opts.filterStart ?? ceStart
        let filterEnd = opts.filterEnd ?? ceEnd
        for (flag, t) in [("--ce-start", ceStart), ("--ce-end", ceEnd), ("--filter-start", filterStart), ("--filter-end", filterEnd)] {
            if let problem = InputLimits.timeProblem(t) { throw AnalysisError.badFlag("\(flag) \(problem)") }
        }
        guard ceEnd > ceStart else { throw AnalysisError.missingWindow("--ce-end must be after --ce-start") }
        guard ceEnd - ceStart <= InputLimits.maximumContactEvent else {
            throw AnalysisError.badFlag("--ce-end: the contact event lasts \(Saturating.int((ceEnd - ceStart) / 86400)) days; at most \(Saturating.int(InputLimits.maximumContactEvent / 86400))")
        }
        let cetotal = Saturating.int((ceEnd - ceStart) / 30).advanced(by: (ceEnd - ceStart).truncatingRemainder(dividingBy: 30) > 0 ? 1 : 0)
        let ceStartSec = Saturating.int64(ceStart.rounded(.down)), ceEndSec = Saturating.int64(ceEnd.rounded(.down))
        let ceSeconds = Int(ceEndSec - ceStartSec)

        let n = inputs.count
        var byShortName = [String: Int]()
        for (i, d) in inputs.enumerated() where !d.shortName.isEmpty && byShortName[d.shortName] == nil { byShortName[d.shortName] = i }
        var acc = AccumulatorShape(ceSeconds: ceSeconds, bins: cetotal)
        acc.timeline = Timeline(from: filterStart, to: filterEnd)
        let window: Window = (ceStart, ceEnd, ceStartSec, filterStart, filterEnd, cetotal)

        // Each observer's files on their own, on every core (an observer's contacts.csv fills only
        // its row of pairs); merged in device order, so the result is the same for any number of threads.
        let scanned = Parallel.map(inputs.indices, threads: opts.threads, cost: { Self.contactsSize(inputs[$0]) }) { o in
            Self.scanDevice(o, inputs: inputs, byShortName: byShortName, make: acc, window: window)
        }
        var pairs = [[PairAccumulator?]]()
        var devices = [AnalysisResult.Device]()
        var problems = [String]()
        var bytesRead: Int64 = 0
        var charts = ChartData()
        charts.timeline = acc.timeline
        charts.context = manifest.map(ReportContext.init) ?? ReportContext()
        for (summary, row, bytes, series) in scanned {
            for p in summary.problems { problems.append("\(summary.folder): \(p)") }
            devices.append(summary)
            pairs.append(row)
            bytesRead += bytes
            charts.nodeSeries.append(series)
        }

        // herald mode: per observer, 30 s bins from its first observation in the window (to the second).
        var heraldPairs = [AnalysisResult.PairWindows](), strictPairs = [AnalysisResult.PairWindows]()
        var heraldDetected = [[String]](), strictDetected = [[String]]()
        var heraldWindows = [[Int]](repeating: [Int](repeating: 0, count: n), count: n)
        for o in 0..<n {
            var start: Int?
            for d in 0..<n where d != o { if let f = pairs[o][d]?.heraldSeconds.first { start = min(start ?? f, f) } }
            guard let s = start else { continue }
            for d in 0..<n where d != o {
                guard let a = pairs[o][d], !a.heraldSeconds.isEmpty else { continue }
                heraldWindows[o][d] = a.heraldSeconds.distinctBins(origin: s, width: 30)
            }
        }
        for o in 0..<n {
            for d in 0..<n where d != o {
                let a = pairs[o][d]
                let hw = heraldWindows[o][d]
                if a?.heraldDetected == true { heraldDetected.append([devices[o].label, devices[d].label]) }
                if a?.strictDetected == true { strictDetected.append([devices[o].label, devices[d].label]) }
                if hw > 0 {
                    heraldPairs.append(.init(observer: devices[o].label, observed: devices[d].label, detected: a?.heraldDetected ?? false, windows: hw, scorePct: 100 * Double(hw) / Double(cetotal)))
                }
                let sw = a?.strictBins.cardinality ?? 0
                strictPairs.append(.init(observer: devices[o].label, observed: devices[d].label, detected: a?.strictDetected ?? false, windows: sw, scorePct: 100 * Double(sw) / Double(cetotal)))
            }
        }
        // Herald orders formal-continuity by observer, then observed label.
        // (By the first device with the observer's label, looked up once per label.)
        var labelIndex = [String: Int]()
        for (i, d) in devices.enumerated() where labelIndex[d.label] == nil { labelIndex[d.label] = i }
        heraldPairs.sort { (labelIndex[$0.observer] ?? Int.max, $0.observed) < (labelIndex[$1.observer] ?? Int.max, $1.observed) }

        let herald = mode(.herald, n: n, cetotal: cetotal, pairs: heraldPairs, detected: heraldDetected,
                          longevity: heraldLongevity(pairs, n: n, ceStartSec: ceStartSec, ceEndSec: ceEndSec))
        let strict = mode(.strict, n: n, cetotal: cetotal, pairs: strictPairs, detected: strictDetected,
                          longevity: strictLongevity(pairs, n: n, cetotal: cetotal))

        // Beyond Herald, per pair.
        var metrics = [AnalysisResult.PairMetrics]()
        charts.windowPairs = [UInt32](repeating: 0, count: cetotal)
        charts.intervalHistogram = [UInt32](repeating: 0, count: PairAccumulator.intervalBuckets)
        for o in 0..<n {
            for d in 0..<n where d != o {
                let a = pairs[o][d]
                var m = AnalysisResult.PairMetrics(observer: devices[o].folder, observed: devices[d].folder, detected: a?.strictDetected ?? false,
                                                   heraldWindows: heraldWindows[o][d], strictWindows: a?.strictBins.cardinality ?? 0,
                                                   strictScorePct: 100 * Double(a?.strictBins.cardinality ?? 0) / Double(cetotal),
                                                   rssiSamples: a?.rssiSamples ?? 0, longestGap: ceEnd - ceStart)
                if let a {
                    a.strictBins.forEach { b in if b >= 0, b < cetotal { charts.windowPairs[b] += 1 } }
                    m.timeToFirstDetection = a.firstObservation.map { $0 - filterStart }
                    m.timeToFirstRead = a.firstRead.map { max(0, $0 - filterStart) }
                    if a.intervalCount > 0 {
                        let mean = a.intervalSum / Double(a.intervalCount)
                        m.intervalMean = mean
                        m.intervalSD = a.intervalCount > 1 ? max(0, (a.intervalSumSquares - Double(a.intervalCount) * mean * mean) / Double(a.intervalCount - 1)).squareRoot() : 0
                        m.intervalMin = a.intervalMin
                        m.intervalMax = a.intervalMax
                        m.intervalP50 = a.intervalPercentile(0.5)
                        m.intervalP95 = a.intervalPercentile(0.95)
                    }
                    if let first = a.firstSample, let last = a.lastSample {
                        m.longestGap = max(first - ceStart, a.intervalMax, ceEnd - last)
                    }
                    m.rssiMedian = a.rssiPercentile(0.5)
                    m.rssiP5 = a.rssiPercentile(0.05)
                    m.rssiP95 = a.rssiPercentile(0.95)
                    if let q3 = a.rssiPercentile(0.75), let q1 = a.rssiPercentile(0.25) { m.rssiSpread = q3 - q1 }
                    for i in a.intervalHistogram.indices {
                        let sum = UInt64(charts.intervalHistogram[i]) + UInt64(a.intervalHistogram.get(i))
                        charts.intervalHistogram[i] = UInt32(min(sum, UInt64(UInt32.max)))
                    }
                    var series = [(Int, Double)]()
                    let size = SparseChunks<UInt16>.chunkSize
                    for (chunk, base) in a.binRSSICount.chunks {
                        for k in 0..<size {
                            let b = chunk * size + k, n = a.binRSSICount.storage[base + k]
                            if n > 0 { series.append((b, Double(a.binRSSISum.get(b)) / Double(n))) }
                        }
                    }
                    charts.rssiSeries["\(devices[o].folder)\u{1F}\(devices[d].folder)"] = series
                }
                metrics.append(m)
            }
        }

        let thresholds = opts.thresholds ?? AnalysisThresholds()
        let checks = Verdict.checks(strict: strict, pairs: metrics, thresholds: thresholds)
        let result = AnalysisResult(
            input: input,
            parameters: .init(ceStart: LogTime.format(ceStart), ceEnd: LogTime.format(ceEnd), filterStart: LogTime.format(filterStart), filterEnd: LogTime.format(filterEnd), cetotal: cetotal),
            devices: devices, herald: herald, strict: strict, pairs: metrics, thresholds: thresholds, checks: checks,
            passed: checks.allSatisfy(\.passed), problems: problems, elapsedSeconds: Date().timeIntervalSince(clockStart), bytesRead: bytesRead)
        return AnalysisReport(result: result, charts: charts)
    }

    /// Size of a device's contacts.csv for scheduling (0 when it cannot be read).
    static func contactsSize(_ dev: DeviceInput) -> Int64 {
        (try? LogFileAccess.size(dev.url.appendingPathComponent("contacts.csv"), root: dev.root)) ?? 0
    }

    /// One observer: its battery, its contacts.csv (two passes), its problems; its row of pairs.
    static func scanDevice(_ o: Int, inputs: [DeviceInput], byShortName: [String: Int], make: AccumulatorShape,
                           window: Window) -> (AnalysisResult.Device, [PairAccumulator?], Int64, NodeSeries) {
        let dev = inputs[o]
        var summary = AnalysisResult.Device(index: o + 1, folder: dev.folder, label: "\(o + 1) - \(dev.model) - \(dev.os) \(dev.osVersion)",
                                            shortName: dev.shortName, model: dev.model, os: dev.os, osVersion: dev.osVersion, shift: dev.shift,
                                            rows: 0, malformedLines: 0, measureRows: 0, readRows: 0, shareRows: 0, problems: dev.problems)
        var row = [PairAccumulator?](repeating: nil, count: inputs.count)
        var bytesRead: Int64 = 0
        var series = NodeSeries(buckets: make.timeline.count)
        readBattery(dev.url, root: dev.root, into: &summary, timeline: make.timeline, shift: dev.shift, series: &series)
        let contacts = dev.url.appendingPathComponent("contacts.csv")
        do {
            let size = try LogFileAccess.size(contacts, root: dev.root)
            if size == 0 {
                summary.problems.append("contacts.csv is empty")
            } else {
                bytesRead += size
                try scanContacts(contacts, observer: o, inputs: inputs, byShortName: byShortName, summary: &summary, pairs: &row, make: make, window: window, series: &series)
            }
        } catch let problem as LogFileAccess.Problem {
            summary.problems.append(problem.description)
        } catch {
            summary.problems.append("contacts.csv cannot be read: \(error.localizedDescription)")
        }
        if summary.malformedLines > 0 { summary.problems.append("contacts.csv: \(summary.malformedLines) malformed line(s) skipped") }
        return (summary, row, bytesRead, series)
    }

    static func mode(_ name: AnalysisMode, n: Int, cetotal: Int, pairs: [AnalysisResult.PairWindows], detected: [[String]], longevity: (Int, Int)) -> AnalysisResult.Mode {
        let nn = n * (n - 1)
        let achieved = pairs.reduce(0) { $0 + $1.windows }
        let maxwindows = nn * cetotal
        let cehourtotal = Double(120 * nn)
        let errStart = cehourtotal > 0 ? 100 * (1 - Double(longevity.0) / cehourtotal) : 0
        let errEnd = cehourtotal > 0 ? 100 * (1 - Double(longevity.1) / cehourtotal) : 0
        return AnalysisResult.Mode(
            mode: name, phonescount: n, maxpairs: nn, achieveddetections: detected.count,
            detectionpct: nn > 0 ? 100 * Double(detected.count) / Double(nn) : 0,
            maxwindows: maxwindows, achievedwindows: achieved,
            continuitypct: maxwindows > 0 ? 100 * Double(achieved) / Double(maxwindows) : 0,
            deltacewindowspct: maxwindows > 0 ? 100 * (1 - Double(achieved) / Double(maxwindows)) : 0,
            windowsFirstHour: longevity.0, windowsLastHour: longevity.1, longevity: abs(errStart - errEnd), pairs: pairs, detectedPairs: detected)
    }

    /// Herald's longevity count: observations of all observers pooled, grouped by (observed, bin)
    /// without the observer (the reference script's undercount), bins from the first observation
    /// of the hour.
    static func heraldLongevity(_ pairs: [[PairAccumulator?]], n: Int, ceStartSec: Int64, ceEndSec: Int64) -> (Int, Int) {
        func count(_ from: Int, _ to: Int) -> Int {
            guard to >= from else { return 0 }
            // Per observed device, the seconds any observer saw it, as bits from `from`.
            let words = (to - from) / 64 + 1
            var perObserved = [[UInt64]](repeating: [], count: n)
            for o in 0..<n {
                for d in 0..<n where d != o {
                    guard let a = pairs[o][d] else { continue }
                    if perObserved[d].isEmpty { perObserved[d] = [UInt64](repeating: 0, count: words) }
                    a.heraldSeconds.or(from: from, to: to, into: &perObserved[d])
                }
            }
            var start: Int?
            for bits in perObserved {
                if let w = bits.firstIndex(where: { $0 != 0 }) {
                    let s = from + w * 64 + bits[w].trailingZeroBitCount
                    start = min(start ?? s, s)
                }
            }
            guard let s0 = start else { return 0 }
            var total = 0
            for bits in perObserved {
                var last = Int.min
                for (w, word) in bits.enumerated() {
                    var x = word
                    while x != 0 {
                        let bin = (from + w * 64 + x.trailingZeroBitCount - s0) / 30
                        if bin != last { total += 1; last = bin }
                        x &= x - 1
                    }
                }
            }
            return total
        }
        let ce = Int(ceEndSec - ceStartSec)
        return (count(0, min(3600, ce)), count(max(0, ce - 3600), ce))
    }

    /// Strict longevity: windows per ordered pair, bins aligned to the contact-event start.
    static func strictLongevity(_ pairs: [[PairAccumulator?]], n: Int, cetotal: Int) -> (Int, Int) {
        var first = 0, last = 0
        for o in 0..<n {
            for d in 0..<n where d != o {
                guard let a = pairs[o][d] else { continue }
                for b in 0..<min(120, cetotal) where a.strictBins.contains(b) { first += 1 }
                for b in max(0, cetotal - 120)..<cetotal where a.strictBins.contains(b) { last += 1 }
            }
        }
        return (first, last)
    }

    static func readBattery(_ dir: URL, root: URL?, into summary: inout AnalysisResult.Device, timeline: Timeline, shift: Double, series: inout NodeSeries) {
        let url = dir.appendingPathComponent("battery.csv")
        var st = stat()
        guard lstat(url.path, &st) == 0 else { return } // optional file
        do { _ = try LogFileAccess.size(url, root: root) } catch {
            summary.problems.append("\(error)")
            return
        }
        // A read that fails part-way is a problem of the device, as a file that cannot be opened is.
        do {
            _ = try CSVScanner.scan(url: url, root: root) { p, line, _ in
                guard line.count >= 3, let t = LogTime.parse(p, line.starts[0], line.ends[0]) else {
                    return p.equals(line.starts[0], line.ends[0], "time") // header (optional) is fine
                }
                let source = p.string(line.starts[1], line.ends[1])
                guard let level = Double(p.string(line.starts[2], line.ends[2])), level.isFinite, level >= 0, level <= 100 else { return false }
                summary.batterySource = source
                if summary.batteryFirst == nil { summary.batteryFirst = level }
                summary.batteryLast = level
                if let k = timeline.index(t.absolute + shift), k < series.battery.count { series.battery[k] = Float(level) }
                return true
            }
        } catch {
            summary.problems.append("\(error)")
        }
    }
}
