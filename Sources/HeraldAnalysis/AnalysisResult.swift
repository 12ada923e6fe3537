import Foundation

/// Everything an analysis finds; encoded as summary.json (schema in docs/SUMMARY.md).
public struct AnalysisResult: Codable, Sendable {
    public static let formatName = "heraldlab-summary/1"

    public struct Parameters: Codable, Sendable {
        public var ceStart: String
        public var ceEnd: String
        public var filterStart: String
        public var filterEnd: String
        /// Number of 30-second windows in the contact event (ceil).
        public var cetotal: Int
    }

    public struct Device: Codable, Sendable {
        public var index: Int
        public var folder: String
        /// Herald's device label: `<n> - <model> - <OS> <version>`.
        public var label: String
        public var shortName: String
        public var model: String
        public var os: String
        public var osVersion: String
        /// Seconds added to this device's log times (time shift minus clock offset).
        public var shift: Double
        public var rows: Int
        public var malformedLines: Int
        public var measureRows: Int
        public var readRows: Int
        public var shareRows: Int
        public var batterySource: String?
        public var batteryFirst: Double?
        public var batteryLast: Double?
        /// Problems found with this device's files; a flagged device is still analysed where it can be.
        public var problems: [String]
        public var flagged: Bool { !problems.isEmpty }
    }

    public struct PairWindows: Codable, Sendable {
        public var observer: String
        public var observed: String
        public var detected: Bool
        public var windows: Int
        public var scorePct: Double
    }

    /// Headline figures of one mode.
    public struct Mode: Codable, Sendable {
        public var mode: AnalysisMode
        public var phonescount: Int
        public var maxpairs: Int
        public var achieveddetections: Int
        public var detectionpct: Double
        public var maxwindows: Int
        public var achievedwindows: Int
        public var continuitypct: Double
        /// Missed windows, % (100 - continuity).
        public var deltacewindowspct: Double
        public var windowsFirstHour: Int
        public var windowsLastHour: Int
        /// |missed% first hour - missed% last hour|.
        public var longevity: Double
        /// Ordered pairs (observer label, observed label) with windows in the contact event.
        public var pairs: [PairWindows]
        /// Every detected ordered pair, [observer label, observed label].
        public var detectedPairs: [[String]]
    }

    /// Per ordered pair, beyond Herald's figures (strict time base, contact-event window).
    public struct PairMetrics: Codable, Sendable {
        public var observer: String
        public var observed: String
        public var detected: Bool
        public var heraldWindows: Int
        public var strictWindows: Int
        public var strictScorePct: Double
        /// Seconds from the filter-window start to the first observation / payload read.
        public var timeToFirstDetection: Double?
        public var timeToFirstRead: Double?
        public var rssiSamples: Int
        public var intervalMean: Double?
        public var intervalSD: Double?
        public var intervalMin: Double?
        public var intervalP50: Double?
        public var intervalP95: Double?
        public var intervalMax: Double?
        /// Longest time without a sample, counting from the contact-event start and to its end.
        public var longestGap: Double
        public var rssiMedian: Double?
        public var rssiP5: Double?
        public var rssiP95: Double?
        /// Inter-quartile range of RSSI, dB.
        public var rssiSpread: Double?
    }

    public struct Check: Codable, Sendable {
        public var name: String
        public var subject: String
        public var value: Double?
        public var limit: Double
        public var passed: Bool
        public var message: String
    }

    public var format = AnalysisResult.formatName
    public var input: InputDescription
    public var parameters: Parameters
    public var devices: [Device]
    public var herald: Mode
    public var strict: Mode
    public var pairs: [PairMetrics]
    public var thresholds: AnalysisThresholds
    public var checks: [Check]
    public var passed: Bool
    public var problems: [String]
    public var elapsedSeconds: Double
    public var bytesRead: Int64

    /// `observer \u{1F} observed` of every pair detected in herald mode.
    public var heraldDetectedPairs: Set<String> { Set(herald.detectedPairs.map { $0.joined(separator: "\u{1F}") }) }
}

/// Chart series kept beside the result for report.html.
public struct ChartData: Sendable {
    /// Per ordered pair (observer, observed): (bin index, mean RSSI) of the strict bins.
    public var rssiSeries: [String: [(Int, Double)]] = [:]
    /// All pairs' sample intervals, 0.05 s buckets up to 120 s.
    public var intervalHistogram: [UInt32] = []
    public var intervalBucket: Double = 0.05
    /// The run over time: buckets, each node's series (by `AnalysisResult.devices` position) and,
    /// per 30 s window of the contact event, the ordered pairs with an observation (strict).
    public var timeline = Timeline(from: 0, to: 0)
    public var nodeSeries: [NodeSeries] = []
    public var windowPairs: [UInt32] = []
    /// The manifest's settings, positions and node states (empty for a plain folder).
    public var context = ReportContext()
}

public struct AnalysisReport: Sendable {
    public var result: AnalysisResult
    public var charts: ChartData
}

/// The two ways the analyser counts (docs/METRICS.md): `herald` reproduces Herald's reference
/// script; `strict` (judged) aligns windows to the contact-event start and uses millisecond times.
public enum AnalysisMode: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
    case herald
    case strict

    public var description: String { rawValue }
}
