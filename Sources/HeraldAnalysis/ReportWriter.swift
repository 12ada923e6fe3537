import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Times given on the command line, in the logs' own time base.
public enum AnalysisTime {
    public static func parse(_ text: String) -> Double? { LogTime.parse(text: text) }
    public static func format(_ seconds: Double) -> String { LogTime.format(seconds) }
}

/// Writes every output of an analysis into one folder (never inside a node's folder).
public enum ReportWriter {
    /// A bundle's `report/`; beside a plain folder of device folders, `<folder>-report`.
    public static func defaultOutput(for input: URL, kind: String) -> URL {
        kind == "bundle" ? input.appendingPathComponent("report")
            : input.deletingLastPathComponent().appendingPathComponent(input.lastPathComponent + "-report")
    }

    /// `junitPerPair`: one JUnit test case per pair and metric instead of per node and metric.
    public static func write(_ report: AnalysisReport, to dir: URL, junitPerPair: Bool = false) throws {
        // Never write through a link: a bundle's report/ that is a symbolic link could send the
        // report anywhere. (Each file is then written atomically, replacing any link in its place.)
        if let kind = try? FileManager.default.attributesOfItem(atPath: dir.path)[.type] as? FileAttributeType, kind != .typeDirectory {
            throw CocoaError(.fileWriteFileExists, userInfo: [NSFilePathErrorKey: dir.path, NSLocalizedDescriptionKey: "\(dir.path) exists and is not a folder (a link or a file): not written"])
        }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let r = report.result
        // Each file on its own, on every core (a 150-device report is 40,000 checks and 22,000
        // pairs), the largest first; the first failure in this order is thrown.
        let writers: [(cost: Int64, write: () throws -> Void)] = [
            (0, { try RCSV.formalSummary(r.herald).write(to: dir.appendingPathComponent("formal-summary.csv"), atomically: true, encoding: .utf8) }),
            (0, { try RCSV.formalContinuity(r.herald).write(to: dir.appendingPathComponent("formal-continuity.csv"), atomically: true, encoding: .utf8) }),
            (0, { try RCSV.discoveryPairs(r).write(to: dir.appendingPathComponent("summary-discovery-pairs.csv"), atomically: true, encoding: .utf8) }),
            (1, { try pairsCSV(r).write(to: dir.appendingPathComponent("pairs.csv"), atomically: true, encoding: .utf8) }),
            (3, { try summaryJSON(r).write(to: dir.appendingPathComponent("summary.json"), options: .atomic) }),
            (2, { try JUnit.xml(r, perPair: junitPerPair).write(to: dir.appendingPathComponent("junit.xml"), atomically: true, encoding: .utf8) }),
            (4, { try HTMLReport.render(report).write(to: dir.appendingPathComponent("report.html"), atomically: true, encoding: .utf8) }),
        ]
        let threads = min(8, max(1, ProcessInfo.processInfo.activeProcessorCount))
        let failures = Parallel.map(writers.indices, threads: threads, cost: { writers[$0].cost }) { i -> (any Error)? in
            do { try writers[i].write(); return nil } catch { return error }
        }
        if let first = failures.compactMap({ $0 }).first { throw first }
    }

    public static func summaryJSON(_ r: AnalysisResult) throws -> Data {
        let e = JSONEncoder()
        e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        e.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try e.encode(r)
    }

    public static func readSummary(_ url: URL, root: URL? = nil) throws -> AnalysisResult {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try d.decode(AnalysisResult.self, from: LogFileAccess.read(url, root: root, limit: InputLimits.maximumJSONBytes))
    }

    static func pairsCSV(_ r: AnalysisResult) -> String {
        var out = "observer,observed,detected,herald_windows,strict_windows,strict_score_pct,time_to_first_detection_s,time_to_first_read_s,rssi_samples,interval_mean_s,interval_sd_s,interval_min_s,interval_p50_s,interval_p95_s,interval_max_s,longest_gap_s,rssi_median,rssi_p5,rssi_p95,rssi_spread\n"
        func f(_ v: Double?) -> String { v.map { FixedPoint.string($0, digits: 3) } ?? "" }
        for p in r.pairs {
            out += [p.observer, p.observed, p.detected ? "true" : "false", String(p.heraldWindows), String(p.strictWindows), f(p.strictScorePct),
                    f(p.timeToFirstDetection), f(p.timeToFirstRead), String(p.rssiSamples), f(p.intervalMean), f(p.intervalSD), f(p.intervalMin),
                    f(p.intervalP50), f(p.intervalP95), f(p.intervalMax), f(p.longestGap), f(p.rssiMedian), f(p.rssiP5), f(p.rssiP95), f(p.rssiSpread)]
                .map(csvField).joined(separator: ",") + "\n"
        }
        return out
    }

    static func csvField(_ s: String) -> String {
        // The bytes tell: a comma or a quote is one byte in UTF-8, never part of another character's.
        let quoted = s.utf8.contains { $0 == 44 || $0 == 34 }
        return quoted ? "\"" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : s
    }
}

/// `String(format: "%.Nf", v)`: the C library formats it, as Foundation's formatting does,
/// without Foundation's parsing of the format (a 150-device report has a million numbers).
enum FixedPoint {
    static func string(_ v: Double, digits: Int) -> String {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { buffer in
            let n = withVaList([Int32(digits), v]) { vsnprintf(buffer.baseAddress!, 64, "%.*f", $0) }
            guard n >= 0, n < 64 else { return String(format: "%.\(digits)f", v) }
            return String(cString: buffer.baseAddress!)
        }
    }
}

/// The reference script's files, as R's write.csv writes them: a quoted header with an empty
/// first name, a row-number column, quoted strings, NA for missing, numbers with 15 significant digits.
enum RCSV {
    static func number(_ v: Double) -> String {
        if v.isNaN { return "NA" }
        if v == v.rounded(), abs(v) < 1e15 { return String(Int64(v)) }
        var s = String(format: "%.15g", v)
        if s.contains("e") { return s }
        if s.contains(".") { while s.hasSuffix("0") { s.removeLast() }; if s.hasSuffix(".") { s.removeLast() } }
        return s
    }
    static func q(_ s: String) -> String { "\"" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }

    static func formalSummary(_ m: AnalysisResult.Mode) -> String {
        let header = ["", "phonescount", "maxpairs", "achieveddetections", "detectionpct", "maxwindows", "achievedwindows", "deltacewindowspct", "longevity"].map(q).joined(separator: ",")
        let row = [q("1"), String(m.phonescount), String(m.maxpairs), String(m.achieveddetections), number(m.detectionpct), String(m.maxwindows),
                   String(m.achievedwindows), number(m.deltacewindowspct), number(m.longevity)].joined(separator: ",")
        return header + "\n" + row + "\n"
    }

    static func formalContinuity(_ m: AnalysisResult.Mode) -> String {
        var out = ["", "shortname", "windows", "seenby", "scorepct", "deltacewindowspct"].map(q).joined(separator: ",") + "\n"
        for (i, p) in m.pairs.enumerated() {
            out += [q(String(i + 1)), q(p.observed), String(p.windows), q(p.observer), number(p.scorePct), number(100 - p.scorePct)].joined(separator: ",") + "\n"
        }
        return out
    }

    static func discoveryPairs(_ r: AnalysisResult) -> String {
        let labels = r.devices.map(\.label)
        let detected = r.heraldDetectedPairs
        var out = (["", "observer"] + labels).map(q).joined(separator: ",") + "\n"
        for (i, o) in labels.enumerated() {
            var row = [q(String(i + 1)), q(o)]
            for d in labels { row.append(o != d && detected.contains(o + "\u{1F}" + d) ? "TRUE" : "NA") }
            out += row.joined(separator: ",") + "\n"
        }
        return out
    }
}
