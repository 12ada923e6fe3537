import Foundation
import HeraldCore

/// The run over time (pairs detected so far, continuity per window, rows, reads and battery per
/// node) and the distributions of time to first detection and first read.
extension HTMLReport {
    /// Run time: 0 is the filter window's start (in a bundle, the plan's start: warm-up included).
    struct RunClock {
        var zero: String
        var span: Double
        /// The contact event in run time.
        var ceFrom: Double, ceTo: Double
        var axisTitle: String { "run time (0 = \(zero), log clock; grey: warm-up before the contact event)" }
    }

    static func runClock(_ r: AnalysisResult) -> RunClock {
        let fs = LogTime.parse(text: r.parameters.filterStart), fe = LogTime.parse(text: r.parameters.filterEnd)
        let cs = LogTime.parse(text: r.parameters.ceStart), ce = LogTime.parse(text: r.parameters.ceEnd)
        let origin = fs ?? cs ?? 0
        let end = max(fe ?? 0, ce ?? 0)
        let span = end > origin ? end - origin : Double(r.parameters.cetotal * 30)
        return RunClock(zero: r.parameters.filterStart, span: max(1, span), ceFrom: cs.map { $0 - origin } ?? 0,
                        ceTo: ce.map { $0 - origin } ?? span)
    }

    static let chartWidth = 1100

    /// A chart over the whole run with a time axis; `body` draws into the frame.
    static func runChart(_ clock: RunClock, label: String, yTitle: String, yMin: Double = 0, yMax: Double, height: Double = 150,
                         body: (Frame) -> String) -> String {
        let f = Frame(left: 64, top: 10, width: Double(chartWidth) - 90, height: height, xMin: 0, xMax: clock.span, yMin: yMin, yMax: max(yMax, yMin + 1e-9))
        var s = svgOpen(chartWidth, Int(f.bottom + 40), label: label)
        s += shade(f, from: 0, to: clock.ceFrom, color: "#ececec", title: "warm-up (before the contact event)")
        s += valueAxis(f, title: yTitle) + timeAxis(f, title: clock.axisTitle)
        return s + body(f) + "</svg>"
    }

    // MARK: the run over time

    static func runSection(_ report: AnalysisReport, _ m: ReportModel) -> String {
        let r = report.result, c = report.charts
        let clock = runClock(r)
        let nn = Double(m.n * max(0, m.n - 1))
        var s = ""
        guard nn > 0 else { return "<p>Fewer than two devices: no pairs over time.</p>" }

        // Pairs detected (and read) so far.
        func soFar(_ values: [Double], name: String, color: String) -> Line {
            let sorted = values.filter { $0.isFinite }.sorted()
            var pts: [(x: Double, y: Double?)] = [(0, 0)]
            let every = max(1, sorted.count / 400)
            for (i, v) in sorted.enumerated() where (i + 1) % every == 0 || i == sorted.count - 1 { pts.append((max(0, v), 100 * Double(i + 1) / nn)) }
            pts.append((clock.span, 100 * Double(sorted.count) / nn))
            return Line(name: name, color: color, points: pts, width: 2, step: true)
        }
        let detected = soFar(r.pairs.compactMap(\.timeToFirstDetection), name: "pairs detected so far (first RSSI or share row)", color: "#1f77b4")
        let read = soFar(r.pairs.compactMap(\.timeToFirstRead), name: "pairs whose payload was read so far", color: "#ff7f0e")
        s += "<h3>Pairs detected so far</h3>" + runChart(clock, label: "pairs detected so far over run time", yTitle: "% of \(Int(nn)) ordered pairs", yMax: 100) { f in
            path(f, read) + path(f, detected)
        } + legend([("#1f77b4", detected.name, false), ("#ff7f0e", read.name, false)])
        func when(_ values: [Double?]) -> String {
            let v = values.compactMap { $0 }.filter(\.isFinite)
            return "\(v.count) of \(Int(nn))" + (v.isEmpty ? "" : " by \(runTimeText(v.max()!)) (h:mm:ss)")
        }
        s += "<p class=\"small\">Detected: \(when(r.pairs.map(\.timeToFirstDetection))); read: \(when(r.pairs.map(\.timeToFirstRead))). The distributions are below, in <a href=\"#first\">time to first detection and first read</a>.</p>"

        // Continuity per 30 s window.
        if !c.windowPairs.isEmpty {
            let bins = c.windowPairs.count, group = max(1, (bins + 499) / 500)
            var pts = [(x: Double, y: Double?)](), lows = [(x: Double, y: Double?)]()
            var b = 0
            while b < bins {
                let slice = c.windowPairs[b..<min(bins, b + group)]
                let mean = Double(slice.reduce(0) { $0 + Int($1) }) / Double(slice.count)
                let x = clock.ceFrom + 30 * (Double(b) + Double(slice.count) / 2)
                pts.append((x, 100 * mean / nn))
                lows.append((x, 100 * Double(slice.min() ?? 0) / nn))
                b += group
            }
            let limit = r.thresholds.continuityPct
            let lo = min(pts.compactMap(\.y).min() ?? 0, lows.compactMap(\.y).min() ?? 0, limit)
            let yMin = max(0, (lo / 10).rounded(.down) * 10 - (lo > 5 ? 5 : 0))
            s += "<h3>Continuity per 30-second window</h3>" + runChart(clock, label: "continuity per window over run time", yTitle: "% of pairs with an observation", yMin: yMin, yMax: 100) { fr in
                var g = hline(fr, at: limit, color: "#c62828", title: "plan threshold for overall continuity: \(f(limit, 1))%")
                if group > 1 { g += path(fr, Line(name: "lowest window in each group of \(group)", color: "#9ecae1", points: lows, width: 1)) }
                return g + path(fr, Line(name: "continuity per window", color: "#08519c", points: pts, width: 1.4))
            } + legend([("#08519c", group > 1 ? "mean of \(group) consecutive windows" : "each 30 s window of the contact event", false)]
                        + (group > 1 ? [("#9ecae1", "lowest window among them", false)] : [])
                        + [("#c62828", "threshold for overall continuity (\(f(limit, 1))%)", true)])
            s += "<p class=\"small\">Share of the \(Int(nn)) ordered pairs with at least one RSSI or share row in each window (strict mode: windows aligned to the contact-event start). 100% is best; a dip marks a time when many pairs went unseen.</p>"
        }

        // Per node: RSSI rows, reads, battery.
        let position = Dictionary(r.devices.enumerated().map { ($0.element.folder, $0.offset) }, uniquingKeysWith: { a, _ in a })
        let series: [NodeSeries?] = m.devices.map { d in position[d.folder].flatMap { $0 < c.nodeSeries.count ? c.nodeSeries[$0] : nil } }
        guard c.timeline.count > 0, series.contains(where: { $0 != nil }) else {
            return s + "<p class=\"small\">No per-node series (the logs were analysed without a time line).</p>"
        }
        let t = c.timeline
        func perMinute(_ counts: [UInt32]) -> [Double?] {
            (0..<t.count).map { k in
                let d = t.duration(of: k)
                return d >= 1 && k < counts.count ? Double(counts[k]) * 60 / d : nil
            }
        }
        let rows = series.map { $0.map { perMinute($0.rssiRows) } ?? [] }
        let reads = series.map { $0.map { perMinute($0.reads) } ?? [] }
        // A level holds until the next one (battery.csv is written every few buckets).
        let battery = series.map { s -> [Double?] in
            var last: Double?
            return (s?.battery ?? []).map { v in
                if !v.isNaN { last = Double(v) }
                return last
            }
        }
        s += "<h3>RSSI rows per minute, per node</h3>" + nodeChart(report, m, clock, rows, label: "RSSI rows per minute per node", yTitle: "RSSI rows per minute")
        s += "<p class=\"small\">Rows a node wrote with an RSSI (event 3 in contacts.csv), per minute in buckets of \(widthText(t.width)). A node whose line drops to 0 stopped scanning or logging; red stretches are gaps the coordinator recorded.</p>"
        s += "<h3>Payload reads per minute, per node</h3>" + nodeChart(report, m, clock, reads, label: "payload reads per minute per node", yTitle: "reads per minute")
        s += "<p class=\"small\">Read rows (event 2: a peer's payload read over GATT) per minute.</p>"
        if battery.contains(where: { $0.contains { $0 != nil } }) {
            let sources = Set(r.devices.compactMap(\.batterySource)).sorted()
            s += "<h3>Battery level, per node</h3>" + nodeChart(report, m, clock, battery, label: "battery level per node", yTitle: "battery %", fixed: (0, 105))
            s += "<p class=\"small\">From each node's battery.csv (last level in each bucket)\(sources.isEmpty ? "" : "; source: " + esc(sources.joined(separator: ", "))).</p>"
        } else {
            s += "<p class=\"small\">No node has a battery.csv with levels: no battery chart.</p>"
        }
        return s
    }

    static func widthText(_ w: Double) -> String {
        guard w.isFinite else { return "–" }
        return w < 60 ? "\(Saturating.int(w)) s" : w < 3600 ? "\(Saturating.int(w / 60)) min" : "\(Saturating.int(w / 3600)) h"
    }

    /// Lines per node (up to 12 nodes), or for more nodes the range over nodes, the median node
    /// and the three lowest nodes; the coordinator's gaps shaded red.
    static func nodeChart(_ report: AnalysisReport, _ m: ReportModel, _ clock: RunClock, _ values: [[Double?]], label: String, yTitle: String,
                          fixed: (Double, Double)? = nil) -> String {
        let t = report.charts.timeline
        let offset = t.origin - (LogTime.parse(text: report.result.parameters.filterStart) ?? t.origin)
        let xs = (0..<t.count).map { offset + (Double($0) + 0.5) * t.width }
        let all = values.flatMap { $0.compactMap { $0 } }
        let top = fixed?.1 ?? max(1, (all.max() ?? 1) * 1.08)
        var lines = [Line](), items = [(color: String, name: String, dash: Bool)]()
        var bandPath: ((Frame) -> String)?
        if m.n <= palette.count {
            for (i, v) in values.enumerated() where !v.isEmpty {
                let pts: [(x: Double, y: Double?)] = zip(xs, v).map { ($0, $1) }
                lines.append(Line(name: m.names[i], color: palette[i], points: pts))
                items.append((palette[i], m.names[i], false))
            }
        } else {
            var lo = [Double](), hi = [Double](), med = [(x: Double, y: Double?)]()
            for k in 0..<t.count {
                let col = values.compactMap { k < $0.count ? $0[k] : nil }.sorted()
                lo.append(col.first ?? 0)
                hi.append(col.last ?? 0)
                med.append((xs[k], col.isEmpty ? nil : col[col.count / 2]))
            }
            bandPath = { f in band(f, xs: xs, lo: lo, hi: hi, color: "#c6dbef", title: "lowest to highest node") }
            items.append(("#c6dbef", "all \(m.n) nodes: lowest to highest", false))
            lines.append(Line(name: "median node", color: "#08519c", points: med, width: 1.6))
            items.append(("#08519c", "median node", false))
            // The three nodes with the lowest mean stand out.
            var means = [(node: Int, mean: Double)]()
            for (i, v) in values.enumerated() {
                let present = v.compactMap { $0 }
                if !present.isEmpty { means.append((i, present.reduce(0, +) / Double(present.count))) }
            }
            means.sort { a, b in a.mean != b.mean ? a.mean < b.mean : a.node < b.node }
            // Only nodes clearly below the median node stand out (none when all are alike).
            let typical = means.isEmpty ? 0 : means[means.count / 2].mean
            for (k, i) in means.prefix(3).filter({ $0.mean < 0.9 * typical }).map(\.node).enumerated() {
                let color = ["#d62728", "#ff7f0e", "#9467bd"][k]
                let pts: [(x: Double, y: Double?)] = zip(xs, values[i]).map { ($0, $1) }
                lines.append(Line(name: m.names[i], color: color, points: pts, width: 1.2))
                items.append((color, "lowest: \(m.names[i])", false))
            }
        }
        // The coordinator's gaps of each node.
        var gaps = [(Double, Double, String)]()
        for name in m.names {
            for g in report.charts.context.nodes[name]?.gaps ?? [] {
                let from = (g.from ?? t.origin) - t.origin + offset, to = (g.to ?? t.end) - t.origin + offset
                gaps.append((from, to, "\(name): \(g.reason)"))
            }
        }
        if !gaps.isEmpty { items.append(("#f4b4b4", "a node's gap (point at it for the reason)", false)) }
        let chart = runChart(clock, label: label, yTitle: yTitle, yMin: fixed?.0 ?? 0, yMax: top) { f in
            var g = bandPath?(f) ?? ""
            for (a, b, why) in gaps.prefix(200) { g += shade(f, from: a, to: b, color: "rgba(214,39,40,0.25)", title: why) }
            for l in lines { g += path(f, l) }
            return g
        }
        return chart + legend(items)
    }

    // MARK: distributions of time to first detection and first read

    static func firstTimesSection(_ r: AnalysisResult) -> String {
        let nn = r.pairs.count
        guard nn > 0 else { return "<p>No pairs.</p>" }
        func quantile(_ v: [Double], _ q: Double) -> Double? { v.isEmpty ? nil : v[min(v.count - 1, max(0, Saturating.int((q * Double(v.count)).rounded(.up)) - 1))] }
        let kinds: [(String, [Double], Double, String)] = [
            ("time to first detection", r.pairs.compactMap(\.timeToFirstDetection).filter(\.isFinite).sorted(), r.thresholds.timeToFirstDetection, "#1f77b4"),
            ("time to first read", r.pairs.compactMap(\.timeToFirstRead).filter(\.isFinite).sorted(), r.thresholds.timeToFirstRead, "#ff7f0e"),
        ]
        var s = "<div class=\"grid\">"
        for (name, v, limit, color) in kinds { s += histogramOfTimes(name, v, limit: limit, color: color, pairs: nn) }
        s += "</div><table><tr><th class=\"l\">from the run's start</th><th>pairs with one</th><th>median s</th><th>90% s</th><th>95% s</th><th>longest s</th><th>plan limit s</th><th>over the limit</th><th>never</th></tr>"
        for (name, v, limit, _) in kinds {
            let over = v.filter { $0 > limit + 1e-9 }.count
            s += "<tr><td class=\"l\">\(name)</td><td>\(v.count) of \(nn)</td><td>\(f(quantile(v, 0.5), 1))</td><td>\(f(quantile(v, 0.9), 1))</td><td>\(f(quantile(v, 0.95), 1))</td><td>\(f(v.last, 1))</td><td>\(f(limit, 0))</td><td class=\"\(over > 0 ? "fail" : "pass")\">\(over)</td><td class=\"\(nn - v.count > 0 ? "fail" : "pass")\">\(nn - v.count)</td></tr>"
        }
        return s + "</table><p class=\"small\">Seconds from the run's start (the filter window's start: warm-up included) to a pair's first observation (an RSSI or share row) and to the first read of the observed payload. Lower is better; a pair counts against the plan when it is over the limit or never happens.</p>"
    }

    static func histogramOfTimes(_ name: String, _ v: [Double], limit: Double, color: String, pairs: Int) -> String {
        let w = 540, f0 = Frame(left: 56, top: 10, width: Double(w) - 72, height: 140)
        guard let hi = v.last else { return "<div><h3>\(name)</h3><p>No pair has one.</p></div>" }
        let top = max(1, max(hi, limit) * 1.05)
        let width = valueStep(top, ticks: 40)
        // At most 100 bars (valueStep makes about 40): times from outside near Double's largest
        // make `top` infinite and its step 1, and a bar each would not fit in memory.
        let bins = min(100, max(1, Saturating.int((top / width).rounded(.up))))
        var counts = [Int](repeating: 0, count: bins)
        for x in v { counts[min(bins - 1, max(0, Saturating.int(x / width)))] += 1 }
        var fr = f0
        fr.xMax = Double(bins) * width
        fr.yMax = Double(max(1, counts.max() ?? 1)) * 1.1
        var s = "<div><h3>\(name) (\(v.count) of \(pairs) pairs)</h3>" + svgOpen(w, Int(fr.bottom + 40), label: "histogram of \(name)")
        s += valueAxis(fr, title: "pairs", ticks: 4) + timeAxis(fr, title: "time from the run's start, bars of \(valueLabel(width, step: width)) s")
        for (k, c) in counts.enumerated() where c > 0 {
            let x = fr.x(Double(k) * width), y = fr.y(Double(c))
            s += "<rect x=\"\(n1(x))\" y=\"\(n1(y))\" width=\"\(n1(max(1, fr.x(Double(k + 1) * width) - x - 1)))\" height=\"\(n1(fr.bottom - y))\" fill=\"\(color)\"><title>\(valueLabel(Double(k) * width, step: width))–\(valueLabel(Double(k + 1) * width, step: width)) s: \(c) pairs</title></rect>"
        }
        s += vline(fr, at: limit, color: "#c62828", title: "plan limit \(f(limit, 0)) s")
        s += "<text x=\"\(n1(min(fr.right - 4, fr.x(limit) + 4)))\" y=\"\(n1(fr.top + 12))\" text-anchor=\"\(fr.x(limit) > fr.right - 80 ? "end" : "start")\" fill=\"#c62828\">limit \(f(limit, 0)) s</text>"
        return s + "</svg></div>"
    }
}
