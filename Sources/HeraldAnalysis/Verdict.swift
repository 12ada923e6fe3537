import Foundation

/// Judges an analysis against a plan's thresholds: one check per pair and metric, and the
/// headline figures.
enum Verdict {
    static func checks(strict: AnalysisResult.Mode, pairs: [AnalysisResult.PairMetrics], thresholds t: AnalysisThresholds) -> [AnalysisResult.Check] {
        var out = [AnalysisResult.Check]()
        func add(_ name: String, _ subject: String, _ value: Double?, _ limit: Double, atLeast: Bool, unit: String) {
            let passed: Bool
            if let value { passed = atLeast ? value >= limit - 1e-9 : value <= limit + 1e-9 } else { passed = false }
            let shown = value.map { FixedPoint.string($0, digits: 2) + unit } ?? "none"
            let message = passed ? "\(shown) \(atLeast ? ">=" : "<=") \(FixedPoint.string(limit, digits: 2))\(unit)"
                : "\(shown), expected \(atLeast ? "at least" : "at most") \(FixedPoint.string(limit, digits: 2))\(unit)"
            out.append(.init(name: name, subject: subject, value: value, limit: limit, passed: passed, message: message))
        }
        add("detection", "overall", strict.detectionpct, t.detectionPct, atLeast: true, unit: "%")
        add("continuity", "overall", strict.continuitypct, t.continuityPct, atLeast: true, unit: "%")
        // A plan that allows undetected pairs (detectionPct below 100) judges detection as a whole:
        // an undetected pair is then no failure by itself, and has no times to judge.
        let everyPair = t.detectionPct >= 100 - 1e-9
        for p in pairs {
            let subject = "\(p.observer) sees \(p.observed)"
            if !p.detected && !everyPair {
                out.append(.init(name: "detected", subject: subject, value: 0, limit: 0, passed: true,
                                 message: "not detected (the plan allows \(String(format: "%.2f", 100 - t.detectionPct))% of pairs undetected)"))
                continue
            }
            out.append(.init(name: "detected", subject: subject, value: p.detected ? 1 : 0, limit: 1, passed: p.detected,
                             message: p.detected ? "detected" : "\(p.observer) never detected \(p.observed)"))
            add("continuity", subject, p.strictScorePct, t.pairContinuityPct, atLeast: true, unit: "%")
            add("timeToFirstDetection", subject, p.timeToFirstDetection, t.timeToFirstDetection, atLeast: false, unit: "s")
            add("timeToFirstRead", subject, p.timeToFirstRead, t.timeToFirstRead, atLeast: false, unit: "s")
        }
        return out
    }
}
