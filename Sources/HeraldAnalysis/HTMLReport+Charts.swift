import Foundation
import HeraldCore

/// Chart primitives of report.html: inline SVG with labelled axes. Every time axis is in run time
/// (seconds since the filter window's start, which is the plan's start in a bundle), labelled in
/// s, min, or h as the span needs, with the clock time of 0 in its title.
extension HTMLReport {
    /// A plot area and the ranges it maps.
    struct Frame {
        var left = 64.0, top = 12.0, width = 1000.0, height = 150.0
        var xMin = 0.0, xMax = 1.0, yMin = 0.0, yMax = 1.0
        func x(_ v: Double) -> Double { left + width * (xMax > xMin ? (v - xMin) / (xMax - xMin) : 0) }
        func y(_ v: Double) -> Double { top + height * (yMax > yMin ? (yMax - min(yMax, max(yMin, v))) / (yMax - yMin) : 1) }
        var bottom: Double { top + height }
        var right: Double { left + width }
    }

    /// A line; nil values break it. `step`: drawn as a staircase (counts so far).
    struct Line {
        var name: String
        var color: String
        var points: [(x: Double, y: Double?)]
        var width = 1.4
        var dash = false
        var step = false
    }

    static let palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"]

    /// `inlineStyle`: false for a page whose Content-Security-Policy allows no inline style (the
    /// dashboard's style sheet styles the text instead).
    static func svgOpen(_ width: Int, _ height: Int, label: String, inlineStyle: Bool = true) -> String {
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(width)\" height=\"\(height)\" role=\"img\" aria-label=\"\(esc(label))\">"
            + (inlineStyle ? "<style>text{font-size:11px;font-family:sans-serif;fill:#333}</style>" : "")
    }

    static func n1(_ v: Double) -> String { String(format: "%.1f", v) }

    // MARK: axes

    static let timeSteps: [Double] = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172_800, 604_800, 2_592_000]

    /// About `ticks` ticks over `span` seconds, at round times.
    static func timeStep(_ span: Double, ticks: Double = 10) -> Double { timeSteps.first { span / $0 <= ticks } ?? 2_592_000 }

    /// A tick label: seconds for spans to 2 minutes, minutes (m:ss between) to 2 hours, then hours (h:mm between).
    static func timeLabel(_ s: Double, span: Double, step: Double) -> String {
        let t = Saturating.int(s.rounded())
        if span <= 120 { return "\(t) s" }
        if span <= 7200 { return step.truncatingRemainder(dividingBy: 60) == 0 ? "\(t / 60) min" : String(format: "%d:%02d", t / 60, t % 60) }
        if step.truncatingRemainder(dividingBy: 86400) == 0, span > 3 * 86400 { return "\(t / 86400) d" }
        return step.truncatingRemainder(dividingBy: 3600) == 0 ? "\(t / 3600) h" : String(format: "%d:%02d h", t / 3600, (t % 3600) / 60)
    }

    /// Grid lines, tick labels and a title under the frame: run time.
    static func timeAxis(_ f: Frame, title: String) -> String {
        let span = f.xMax - f.xMin
        guard span > 0 else { return "" }
        let step = timeStep(span, ticks: max(4, f.width / 80))
        return xAxis(f, step: step, title: title) { timeLabel($0, span: span, step: step) }
    }

    /// The same for a numeric x axis (metres, seconds of an interval).
    static func numberAxis(_ f: Frame, title: String, ticks: Double = 6) -> String {
        let step = valueStep(f.xMax - f.xMin, ticks: ticks)
        return xAxis(f, step: step, title: title) { valueLabel($0, step: step) }
    }

    /// Multiples of `step` from `lo` to `hi`, at most `limit` of them.
    static func ticks(_ lo: Double, _ hi: Double, step: Double, limit: Int = 100) -> [Double] {
        guard step > 0, lo.isFinite, hi.isFinite else { return [] }
        let first = (lo / step).rounded(.up)
        return (0..<limit).map { (first + Double($0)) * step }.filter { $0 <= hi + 1e-9 }
    }

    static func xAxis(_ f: Frame, step: Double, title: String, label: (Double) -> String) -> String {
        var s = "<g stroke=\"#e4e4e4\">", labels = ""
        for t in ticks(f.xMin, f.xMax, step: step) {
            let x = f.x(t)
            s += "<line x1=\"\(n1(x))\" y1=\"\(n1(f.top))\" x2=\"\(n1(x))\" y2=\"\(n1(f.bottom + 4))\"/>"
            // Labels at the frame's edges stay inside the chart.
            let anchor = x - f.left < 14 ? "start" : f.right - x < 14 ? "end" : "middle"
            labels += "<text x=\"\(n1(x))\" y=\"\(n1(f.bottom + 15))\" text-anchor=\"\(anchor)\">\(label(t))</text>"
        }
        return s + "</g>" + labels + "<text x=\"\(n1(f.left + f.width / 2))\" y=\"\(n1(f.bottom + 30))\" text-anchor=\"middle\">\(esc(title))</text>"
    }

    /// A round step for a value axis (1, 2 or 5 times a power of ten).
    static func valueStep(_ span: Double, ticks: Double = 5) -> Double {
        guard span > 0, span.isFinite else { return 1 }
        let raw = span / ticks, p = pow(10, (log10(raw)).rounded(.down))
        return [1.0, 2, 5, 10].map { $0 * p }.first { $0 >= raw } ?? 10 * p
    }

    static func valueLabel(_ v: Double, step: Double) -> String {
        guard v.isFinite else { return "–" }
        return step >= 1 || v == 0 ? String(Saturating.int(v.rounded())) : String(format: step >= 0.1 ? "%.1f" : "%.2f", v)
    }

    /// Horizontal grid lines, labels left of the frame and a vertical title.
    static func valueAxis(_ f: Frame, title: String, ticks: Double = 5) -> String {
        let step = valueStep(f.yMax - f.yMin, ticks: ticks)
        var s = "<g stroke=\"#eeeeee\">", labels = ""
        for v in Self.ticks(f.yMin, f.yMax, step: step, limit: 50) {
            let y = f.y(v)
            s += "<line x1=\"\(n1(f.left - 4))\" y1=\"\(n1(y))\" x2=\"\(n1(f.right))\" y2=\"\(n1(y))\"/>"
            labels += "<text x=\"\(n1(f.left - 6))\" y=\"\(n1(y + 4))\" text-anchor=\"end\">\(valueLabel(v, step: step))</text>"
        }
        let cy = f.top + f.height / 2
        return s + "</g>" + labels + "<text transform=\"translate(14 \(n1(cy))) rotate(-90)\" text-anchor=\"middle\">\(esc(title))</text>"
            + "<rect x=\"\(n1(f.left))\" y=\"\(n1(f.top))\" width=\"\(n1(f.width))\" height=\"\(n1(f.height))\" fill=\"none\" stroke=\"#bbb\"/>"
    }

    // MARK: marks

    /// Whole pixels, and one `L` for a run of segments (SVG repeats it): long runs stay small.
    /// A lone point (between missing values) is a zero-length segment, drawn by its round cap.
    static func path(_ f: Frame, _ line: Line) -> String {
        var d = "", run = [(Int, Int)]()
        func flush() {
            guard let first = run.first else { return }
            // A point on the same pixel row as both its neighbours adds nothing (flat stretches).
            if !line.step, run.count > 2 {
                var kept = [run[0]]
                for i in 1..<(run.count - 1) where !(run[i].1 == kept[kept.count - 1].1 && run[i].1 == run[i + 1].1) { kept.append(run[i]) }
                kept.append(run[run.count - 1])
                run = kept
            }
            d += "M\(first.0) \(first.1)"
            if run.count == 1 { d += "l0 0" }
            else if line.step { for p in run.dropFirst() { d += "H\(p.0)V\(p.1)" } }
            else { d += "L" + run.dropFirst().map { "\($0.0) \($0.1)" }.joined(separator: " ") }
            run.removeAll()
        }
        for p in line.points {
            guard let v = p.y, v.isFinite, p.x.isFinite else { flush(); continue }
            run.append((Saturating.int(f.x(p.x).rounded()), Saturating.int(f.y(v).rounded())))
        }
        flush()
        guard !d.isEmpty else { return "" }
        return "<path d=\"\(d)\" fill=\"none\" stroke=\"\(line.color)\" stroke-width=\"\(line.width)\"\(line.dash ? " stroke-dasharray=\"5 3\"" : "") stroke-linejoin=\"round\" stroke-linecap=\"round\"><title>\(esc(line.name))</title></path>"
    }

    /// A filled band between two series on the same x values.
    static func band(_ f: Frame, xs: [Double], lo: [Double], hi: [Double], color: String, title: String) -> String {
        guard !xs.isEmpty, xs.count == lo.count, xs.count == hi.count else { return "" }
        var d = "M\(n1(f.x(xs[0]))) \(n1(f.y(hi[0])))"
        for i in xs.indices.dropFirst() { d += "L\(n1(f.x(xs[i]))) \(n1(f.y(hi[i])))" }
        for i in xs.indices.reversed() { d += "L\(n1(f.x(xs[i]))) \(n1(f.y(lo[i])))" }
        return "<path d=\"\(d)Z\" fill=\"\(color)\" stroke=\"none\"><title>\(esc(title))</title></path>"
    }

    /// A shaded stretch of time (warm-up, a node's gap) with a tooltip.
    static func shade(_ f: Frame, from: Double, to: Double, color: String, title: String) -> String {
        let a = max(f.xMin, min(from, to)), b = min(f.xMax, max(from, to))
        guard b > a else { return "" }
        return "<rect x=\"\(n1(f.x(a)))\" y=\"\(n1(f.top))\" width=\"\(n1(max(1, f.x(b) - f.x(a))))\" height=\"\(n1(f.height))\" fill=\"\(color)\"><title>\(esc(title))</title></rect>"
    }

    static func hline(_ f: Frame, at v: Double, color: String, title: String) -> String {
        guard v >= f.yMin, v <= f.yMax else { return "" }
        return "<line x1=\"\(n1(f.left))\" y1=\"\(n1(f.y(v)))\" x2=\"\(n1(f.right))\" y2=\"\(n1(f.y(v)))\" stroke=\"\(color)\" stroke-dasharray=\"6 3\"><title>\(esc(title))</title></line>"
    }

    static func vline(_ f: Frame, at v: Double, color: String, title: String) -> String {
        guard v >= f.xMin, v <= f.xMax else { return "" }
        return "<line x1=\"\(n1(f.x(v)))\" y1=\"\(n1(f.top))\" x2=\"\(n1(f.x(v)))\" y2=\"\(n1(f.bottom))\" stroke=\"\(color)\" stroke-dasharray=\"6 3\"><title>\(esc(title))</title></line>"
    }

    /// An HTML legend (names escaped) for lines and shaded areas.
    static func legend(_ items: [(color: String, name: String, dash: Bool)]) -> String {
        guard !items.isEmpty else { return "" }
        return "<p class=\"legend small\">" + items.map { item in
            let style = item.dash ? "border-top:2px dashed \(item.color);height:0" : "background:\(item.color)"
            return "<span class=\"sw\" style=\"\(style)\"></span>\(esc(item.name))"
        }.joined() + "</p>"
    }
}
