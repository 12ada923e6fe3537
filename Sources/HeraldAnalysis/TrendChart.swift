import Foundation
import HeraldCore

/// One metric over a series of runs as inline SVG, drawn with report.html's chart primitives
/// (HTMLReport+Charts): the value per run, the noise band the regression check allows around
/// its baseline, and the runs judged regressions marked in red. The coordinator's dashboard
/// (Trends) uses it; every label is escaped.
public enum TrendChart {
    public struct Point: Sendable {
        /// The run (shown on hover).
        public var label: String
        public var value: Double?
        /// The noise band from the runs before it (nil: too few of them).
        public var bandLow: Double?
        public var bandHigh: Double?
        public var regressed: Bool
        /// The run's infrastructure faults, when it has any (issue 40): its point is marked
        /// (grey, hollow), outside the line, the band and the y-scale (drawn at the frame's edge
        /// when its value lies beyond).
        public var infra: String?
        public init(label: String, value: Double?, bandLow: Double? = nil, bandHigh: Double? = nil, regressed: Bool = false, infra: String? = nil) {
            self.label = label; self.value = value; self.bandLow = bandLow; self.bandHigh = bandHigh; self.regressed = regressed; self.infra = infra
        }
    }

    public static func svg(title: String, points: [Point], width: Int = 520, height: Int = 170) -> String {
        typealias R = HTMLReport
        // The scale is the clean runs' and their bands': an infra run's fall does not squash it.
        let values = points.filter { $0.infra == nil }.flatMap { [$0.value, $0.bandLow, $0.bandHigh] }.compactMap { $0 }.filter(\.isFinite)
        var f = R.Frame(left: 52, top: 10, width: Double(width - 64), height: Double(height - 50))
        f.xMin = 0
        f.xMax = Double(max(1, points.count - 1))
        let lo = values.min() ?? 0, hi = values.max() ?? 1
        let pad = max(0.5, (hi - lo) * 0.1)
        f.yMin = lo - pad
        f.yMax = hi + pad
        var s = R.svgOpen(width, height, label: title)
        s += R.valueAxis(f, title: title)
        let step = max(1, R.valueStep(f.xMax, ticks: 8).rounded(.up))
        s += R.xAxis(f, step: step, title: "run (oldest first)") { String(Saturating.int($0.rounded() + 1)) }
        // The band, in pieces where the runs before had enough history to give one.
        var xs = [Double](), los = [Double](), his = [Double]()
        func flushBand() {
            if !xs.isEmpty { s += R.band(f, xs: xs, lo: los, hi: his, color: "#9ecae1", title: "noise band (the regression check's bound)") }
            xs = []; los = []; his = []
        }
        for (i, p) in points.enumerated() {
            if p.infra == nil, let l = p.bandLow, let h = p.bandHigh, l.isFinite, h.isFinite { xs.append(Double(i)); los.append(l); his.append(h) } else { flushBand() }
        }
        flushBand()
        s += R.path(f, R.Line(name: title, color: "#1f77b4", points: points.enumerated().filter { $0.element.infra == nil }.map { (Double($0.offset), $0.element.value) }))
        for (i, p) in points.enumerated() {
            guard let v = p.value, v.isFinite else { continue }
            if let infra = p.infra {
                let y = min(max(v, f.yMin), f.yMax)
                s += "<circle cx=\"\(R.n1(f.x(Double(i))))\" cy=\"\(R.n1(f.y(y)))\" r=\"4\" fill=\"none\" stroke=\"#8c8c8c\" stroke-width=\"1.5\" class=\"infra\"><title>\(R.esc(p.label)): \(R.f(v)) (infra: \(R.esc(infra)); not in the line, the band or the scale)</title></circle>"
                continue
            }
            let color = p.regressed ? "#d62728" : "#1f77b4"
            s += "<circle cx=\"\(R.n1(f.x(Double(i))))\" cy=\"\(R.n1(f.y(v)))\" r=\"\(p.regressed ? 5 : 3)\" fill=\"\(color)\"\(p.regressed ? " class=\"regressed\"" : "")><title>\(R.esc(p.label)): \(R.f(v))\(p.regressed ? " (regression)" : "")</title></circle>"
        }
        return s + "</svg>"
    }
}
