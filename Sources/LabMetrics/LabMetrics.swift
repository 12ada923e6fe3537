import CoreMetrics
import Foundation
import Synchronization
import LabBuildInfo
import Prometheus

/// One service's metrics (a coordinator's, an agent's): swift-metrics handles for the code that
/// counts and records, kept in this service's own swift-prometheus registry, which writes the
/// Prometheus text format for `GET /metrics`. Each family is made here with its help text, as
/// Prometheus practice (and `promtool check metrics`) asks; a family's names follow it too:
/// `heraldlab_` prefix, base units, `_total` on counters, counts rather than percentages.
/// A registry of its own per service (not the process-wide MetricsSystem) keeps two services in
/// one process (tests, `herald-lab bench arm`) apart.
public final class LabMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    /// The handles made so far, by series key, under one lock.
    private struct Handles {
        var counters: [String: CoreMetrics.Counter] = [:]
        var gauges: [String: CoreMetrics.Recorder] = [:]
        /// Each gauge series' registry handle and labels, so a series can be removed.
        var gaugeSeries: [String: (name: String, labels: [String: String], gauge: Prometheus.Gauge)] = [:]
        var timers: [String: CoreMetrics.Timer] = [:]
        /// Last value a `mirror` counter was brought to, per series.
        var mirrored: [String: Int64] = [:]
    }
    private let handles = Mutex(Handles())

    public init(service: String) {
        gauge("heraldlab_build_info", "The herald-lab release and commit this service runs (always 1).",
              ["service": service, "version": BuildInfo.version, "commit": BuildInfo.commit]).record(1)
    }

    static func key(_ name: String, _ labels: [(String, String)]) -> String {
        ([name] + labels.map { "\($0.0)=\($0.1)" }).joined(separator: "\u{1F}")
    }

    static func sorted(_ labels: [String: String]) -> [(String, String)] { labels.sorted { $0.key < $1.key } }

    /// A counter (`name` ends in `_total`).
    public func counter(_ name: String, _ help: String, _ labels: [String: String] = [:]) -> CoreMetrics.Counter {
        let l = Self.sorted(labels)
        return handles.withLock { h in
            if let c = h.counters[Self.key(name, l)] { return c }
            let c = CoreMetrics.Counter(label: name, dimensions: l, handler: registry.makeCounter(name: name, labels: l, help: help))
            h.counters[Self.key(name, l)] = c
            return c
        }
    }

    /// A gauge: a value that goes up and down (swift-metrics' non-aggregating recorder).
    public func gauge(_ name: String, _ help: String, _ labels: [String: String] = [:]) -> CoreMetrics.Recorder {
        let l = Self.sorted(labels)
        return handles.withLock { h in
            if let g = h.gauges[Self.key(name, l)] { return g }
            let handle = registry.makeGauge(name: name, labels: l, help: help)
            let g = CoreMetrics.Recorder(label: name, dimensions: l, aggregate: false, handler: handle)
            h.gauges[Self.key(name, l)] = g
            h.gaugeSeries[Self.key(name, l)] = (name, labels, handle)
            return g
        }
    }

    /// Removes every series of gauge `name` but those whose labels are in `keep` (a node's
    /// clock offset once its run ended, an agent's node gauges of its previous run): they are
    /// gone from the next scrape instead of holding their last value for ever.
    public func pruneGauges(_ name: String, keep: [[String: String]]) {
        let kept = Set(keep.map { Self.key(name, Self.sorted($0)) })
        handles.withLock { h in
            for (key, series) in h.gaugeSeries where series.name == name && !kept.contains(key) {
                registry.unregisterGauge(series.gauge)
                h.gaugeSeries[key] = nil
                h.gauges[key] = nil
            }
        }
    }

    /// A histogram of durations in seconds (`name` ends in `_seconds`).
    public func timer(_ name: String, _ help: String, buckets: [Duration], _ labels: [String: String] = [:]) -> CoreMetrics.Timer {
        let l = Self.sorted(labels)
        return handles.withLock { h in
            if let t = h.timers[Self.key(name, l)] { return t }
            let t = CoreMetrics.Timer(label: name, dimensions: l, handler: registry.makeDurationHistogram(name: name, labels: l, buckets: buckets, help: help))
            h.timers[Self.key(name, l)] = t
            return t
        }
    }

    /// Brings a counter up to `total`, a count the service keeps anyway (runs ended, bytes
    /// gathered): a total that went down (a counter of the service's own that was reset, or a
    /// new run on an agent) adds what is new since.
    public func mirror(_ name: String, _ help: String, _ labels: [String: String] = [:], to total: Int64) {
        let c = counter(name, help, labels)
        let key = Self.key(name, Self.sorted(labels))
        let delta: Int64 = handles.withLock { h in
            let last = h.mirrored[key] ?? 0
            h.mirrored[key] = total
            return total >= last ? total - last : total
        }
        if delta > 0 { c.increment(by: delta) }
    }

    /// The Prometheus text exposition (version 0.0.4).
    public func exposition() -> [UInt8] { registry.emitToBuffer() }

    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"
}
