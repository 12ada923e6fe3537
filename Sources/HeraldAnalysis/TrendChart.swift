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
        /// When the run was recorded (Unix seconds): the x axis is by date when every point has one.
        public var at: Double?
        /// Where the run's page is (the point links there), if it has one.
        public var link: String?
        public init(label: String, value: Double?, bandLow: Double? = nil, bandHigh: Double? = nil, regressed: Bool = false, infra: String? = nil,
                    at: Double? = nil, link: String? = nil) {
            self.label = label; self.value = value; self.bandLow = bandLow; self.bandHigh = bandHigh; self.regressed = regressed; self.infra = infra
            self.at = at; self.link = link
        }
    }

    /// Steps of a date axis (seconds), the first giving at most 8 ticks is used.
    static let dateSteps: [Double] = [60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86_400, 2 * 86_400, 7 * 86_400, 14 * 86_400, 30 * 86_400, 91 * 86_400, 365 * 86_400]

    /// `domain`: the values the metric can take (0 to 100 for a percentage that cannot exceed
    /// it, 0 and up for a time): the axis never reaches past it (no 100.4 % detection, no -0.2 s).
    /// `inlineStyle`: false leaves out the SVG's own <style> (a page that allows none styles it).
    public static func svg(title: String, points: [Point], domain: ClosedRange<Double>? = nil, width: Int = 520, height: Int = 170, inlineStyle: Bool = true) -> String {
        typealias R = HTMLReport
        // The scale is the clean runs' and their bands': an infra run's fall does not squash it.
        let values = points.filter { $0.infra == nil }.flatMap { [$0.value, $0.bandLow, $0.bandHigh] }.compactMap { $0 }.filter(\.isFinite)
        var f = R.Frame(left: 52, top: 10, width: Double(width - 64), height: Double(height - 50))
        // By date when every run has one (and they span some time), else by the run's place.
        let dates = points.compactMap(\.at).filter(\.isFinite)
        let byDate = !points.isEmpty && dates.count == points.count
        func x(_ i: Int) -> Double { byDate ? points[i].at! : Double(i) }
        // Runs all recorded in one second (or one run) get an hour either side.
        let flat = byDate && dates.max()! - dates.min()! < 1
        f.xMin = byDate ? dates.min()! - (flat ? 3600 : 0) : 0
        f.xMax = byDate ? dates.max()! + (flat ? 3600 : 0) : Double(max(1, points.count - 1))
        let lo = values.min() ?? 0, hi = values.max() ?? 1
        let pad = max(0.5, (hi - lo) * 0.1)
        f.yMin = lo - pad
        f.yMax = hi + pad
        if let domain {
            f.yMin = max(f.yMin, domain.lowerBound)
            f.yMax = min(f.yMax, domain.upperBound)
            if f.yMax <= f.yMin { f.yMin = max(domain.lowerBound, f.yMax - 1); f.yMax = f.yMin + 1 }
        }
        var s = R.svgOpen(width, height, label: title, inlineStyle: inlineStyle)
        s += R.valueAxis(f, title: title)
        if byDate {
            let span = f.xMax - f.xMin
            let step = dateSteps.first { span / $0 <= 8 } ?? 365 * 86_400
            let daily = step >= 86_400
            s += R.xAxis(f, step: step, title: "recorded (UTC)") { t in
                let text = AnalysisTime.format(t)  // YYYY-MM-DD HH:MM:SS
                return daily ? String(text.dropFirst(5).prefix(5)) : String(text.dropFirst(5).prefix(11))
            }
        } else {
            let step = max(1, R.valueStep(f.xMax, ticks: 8).rounded(.up))
            s += R.xAxis(f, step: step, title: "run (oldest first)") { String(Saturating.int($0.rounded() + 1)) }
        }
        // The band, in pieces where the runs before had enough history to give one.
        var xs = [Double](), los = [Double](), his = [Double]()
        func flushBand() {
            if !xs.isEmpty { s += R.band(f, xs: xs, lo: los, hi: his, color: "#9ecae1", title: "noise band (the regression check's bound)") }
            xs = []; los = []; his = []
        }
        for (i, p) in points.enumerated() {
            if p.infra == nil, let l = p.bandLow, let h = p.bandHigh, l.isFinite, h.isFinite {
                xs.append(x(i)); los.append(min(max(l, f.yMin), f.yMax)); his.append(min(max(h, f.yMin), f.yMax))
            } else { flushBand() }
        }
        flushBand()
        s += R.path(f, R.Line(name: title, color: "#1f77b4", points: points.enumerated().filter { $0.element.infra == nil }.map { (x($0.offset), $0.element.value) }))
        for (i, p) in points.enumerated() {
            guard let v = p.value, v.isFinite else { continue }
            // Hover: the run, when it was recorded, the value; a click opens the run's page.
            let when = p.at.map { " (" + AnalysisTime.format($0) + " UTC)" } ?? ""
            let open = p.link.map { "<a href=\"\(R.esc($0))\">" } ?? "", close = p.link == nil ? "" : "</a>"
            if let infra = p.infra {
                let y = min(max(v, f.yMin), f.yMax)
                s += "\(open)<circle cx=\"\(R.n1(f.x(x(i))))\" cy=\"\(R.n1(f.y(y)))\" r=\"4\" fill=\"none\" stroke=\"#8c8c8c\" stroke-width=\"1.5\" class=\"infra\"><title>\(R.esc(p.label))\(when): \(R.f(v)) (infra: \(R.esc(infra)); not in the line, the band or the scale)</title></circle>\(close)"
                continue
            }
            let color = p.regressed ? "#d62728" : "#1f77b4"
            s += "\(open)<circle cx=\"\(R.n1(f.x(x(i))))\" cy=\"\(R.n1(f.y(v)))\" r=\"\(p.regressed ? 5 : 3)\" fill=\"\(color)\"\(p.regressed ? " class=\"regressed\"" : "")><title>\(R.esc(p.label))\(when): \(R.f(v))\(p.regressed ? " (regression)" : "")</title></circle>\(close)"
        }
        return s + "</svg>"
    }
}
