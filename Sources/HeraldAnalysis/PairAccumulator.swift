import Foundation
import HeraldCore

/// Everything kept about one ordered pair (observer, observed) while the logs stream past:
/// bounded by the rows seen (sparse bitsets and bins), never by the size of the logs or the
/// length of the contact event. One thread fills an accumulator (the observer's), so its
/// properties skip the run-time exclusivity checks (a measurable share of the row loop).
final class PairAccumulator {
    // herald mode
    @exclusivity(unchecked) var heraldSeconds: Bitset
    @exclusivity(unchecked) var heraldDetected = false
    // strict mode
    @exclusivity(unchecked) var strictBins: Bitset
    @exclusivity(unchecked) var strictDetected = false
    // beyond Herald (strict time base)
    @exclusivity(unchecked) var firstObservation: Double?
    @exclusivity(unchecked) var firstRead: Double?
    @exclusivity(unchecked) var rssiSamples = 0
    @exclusivity(unchecked) var lastSample: Double?
    @exclusivity(unchecked) var intervalCount = 0
    @exclusivity(unchecked) var intervalSum = 0.0
    @exclusivity(unchecked) var intervalSumSquares = 0.0
    @exclusivity(unchecked) var intervalMin = Double.infinity
    @exclusivity(unchecked) var intervalMax = 0.0
    /// Sparse: only buckets that intervals fall in take memory (a pair costs what its rows cost).
    @exclusivity(unchecked) var intervalHistogram: SparseChunks<UInt32>
    @exclusivity(unchecked) var firstSample: Double?
    /// Samples per dBm from `rssiMin` (a buffer of the accumulator's own: an array in an object
    /// is checked for sharing at every write).
    let rssiHistogram: UnsafeMutableBufferPointer<UInt32>
    /// Per 30 s bin of the contact event (sparse: only bins with samples take memory).
    @exclusivity(unchecked) var binRSSISum: SparseChunks<Float>
    @exclusivity(unchecked) var binRSSICount: SparseChunks<UInt16>

    static let intervalBucket = 0.05
    static let intervalBuckets = 2400 // 120 s; more goes to the last bucket
    static let rssiMin = -130
    static let rssiBuckets = 161 // -130 ... 30 dBm

    init(ceSeconds: Int, bins: Int) {
        heraldSeconds = Bitset(count: ceSeconds + 1)
        strictBins = Bitset(count: bins)
        intervalHistogram = SparseChunks(count: Self.intervalBuckets, zero: 0)
        binRSSISum = SparseChunks(count: bins, zero: 0)
        binRSSICount = SparseChunks(count: bins, zero: 0)
        rssiHistogram = .allocate(capacity: Self.rssiBuckets)
        rssiHistogram.initialize(repeating: 0)
    }

    deinit { rssiHistogram.deallocate() }

    func addSample(at t: Double, rssi: Int?, bin: Int) {
        rssiSamples += 1
        if firstSample == nil { firstSample = t }
        if let last = lastSample {
            let dt = abs(t - last)
            intervalCount += 1
            intervalSum += dt
            intervalSumSquares += dt * dt
            if dt < intervalMin { intervalMin = dt }
            if dt > intervalMax { intervalMax = dt }
            intervalHistogram.update(min(Self.intervalBuckets - 1, Saturating.rowInt(dt / Self.intervalBucket))) { if $0 < UInt32.max { $0 += 1 } }
        }
        lastSample = t
        if let rssi {
            let k = max(0, min(Self.rssiBuckets - 1, rssi - Self.rssiMin))
            if rssiHistogram[k] < UInt32.max { rssiHistogram[k] += 1 } // rssi is bounded by the reader
            if bin >= 0, bin < binRSSISum.count, binRSSICount.get(bin) < UInt16.max {
                binRSSISum.update(bin) { $0 += Float(rssi) }
                binRSSICount.update(bin) { $0 += 1 }
            }
        }
    }

    /// Percentile (0...1) of the interval histogram, in seconds (bucket upper edge, capped at max).
    func intervalPercentile(_ q: Double) -> Double? {
        guard intervalCount > 0 else { return nil }
        let target = max(1, Saturating.int((q * Double(intervalCount)).rounded(.up)))
        var seen = 0
        for i in intervalHistogram.indices {
            let c = intervalHistogram.get(i)
            seen += Int(c)
            if seen >= target { return min(intervalMax, Double(i + 1) * Self.intervalBucket) }
        }
        return intervalMax
    }

    func rssiPercentile(_ q: Double) -> Double? {
        let total = rssiHistogram.reduce(0) { $0 + Int($1) }
        guard total > 0 else { return nil }
        let target = max(1, Saturating.int((q * Double(total)).rounded(.up)))
        var seen = 0
        for (i, c) in rssiHistogram.enumerated() {
            seen += Int(c)
            if seen >= target { return Double(i + Self.rssiMin) }
        }
        return nil
    }
}

extension Saturating {
    /// `Saturating.int`, with the common case (a finite value well inside Int's range) inlined
    /// into the row loop: the same result for every value.
    @inline(__always) static func rowInt(_ x: Double) -> Int {
        x > -9.2e18 && x < 9.2e18 ? Int(x) : int(x)
    }
}
