import Foundation
import HeraldCore

/// The floor map from the manifest's node positions and RSSI against distance per pair.
extension HTMLReport {
    static func floorSection(_ report: AnalysisReport, _ m: ReportModel) -> String {
        let ctx = report.charts.context
        let positions = m.names.map { ctx.nodes[$0]?.position }
        guard positions.contains(where: { $0 != nil }) else {
            return "<p>The manifest gives no node positions (a lab run on real radios, or a plain folder of logs): no floor map and no RSSI against distance.</p>"
        }
        return "<div class=\"grid\">" + floorMap(report, m, positions) + rssiDistance(report, m, positions) + "</div>"
    }

    static func floorMap(_ report: AnalysisReport, _ m: ReportModel, _ positions: [(x: Double, y: Double)?]) -> String {
        let known = positions.compactMap { $0 }
        let x0 = known.map(\.x).min() ?? 0, x1 = known.map(\.x).max() ?? 0
        let y0 = known.map(\.y).min() ?? 0, y1 = known.map(\.y).max() ?? 0
        let margin = max(0.5, 0.06 * max(x1 - x0, y1 - y0))
        let spanX = x1 - x0 + 2 * margin, spanY = y1 - y0 + 2 * margin
        let scale = min(440 / spanX, 330 / spanY)
        var f = Frame(left: 52, top: 10, width: spanX * scale, height: spanY * scale)
        f.xMin = x0 - margin; f.xMax = x1 + margin
        // y grows downwards on the page as on a floor plan drawn from its top-left corner.
        f.yMin = y0 - margin; f.yMax = y1 + margin
        func py(_ y: Double) -> Double { f.top + (y - f.yMin) * scale }
        let observer = Dictionary(nodeSummaries(m, asObserver: true).map { ($0.node, $0) }, uniquingKeysWith: { a, _ in a })
        let observed = Dictionary(nodeSummaries(m, asObserver: false).map { ($0.node, $0) }, uniquingKeysWith: { a, _ in a })
        let (_, labels) = NaturalOrder.abbreviations(m.names)
        let font = m.n > 40 ? 8 : 11, r = m.n > 40 ? 5.0 : 8.0
        var s = "<div><h3>Floor map</h3>" + svgOpen(Int(f.right + 16), Int(f.bottom + 40), label: "floor map of the nodes")
        s += "<rect x=\"\(n1(f.left))\" y=\"\(n1(f.top))\" width=\"\(n1(f.width))\" height=\"\(n1(f.height))\" fill=\"#fcfcfc\" stroke=\"#bbb\"/>"
        s += numberAxis(f, title: "x (m)")
        // y ticks (metres, downwards).
        let step = valueStep(f.yMax - f.yMin, ticks: 5)
        for v in ticks(f.yMin, f.yMax, step: step, limit: 50) {
            s += "<text x=\"\(n1(f.left - 6))\" y=\"\(n1(py(v) + 4))\" text-anchor=\"end\">\(valueLabel(v, step: step))</text>"
        }
        s += "<text transform=\"translate(14 \(n1(f.top + f.height / 2))) rotate(-90)\" text-anchor=\"middle\">y (m)</text>"
        for (i, p) in positions.enumerated() {
            guard let p else { continue }
            let meanO = observer[i]?.meanContinuity ?? 0, meanD = observed[i]?.meanContinuity ?? 0
            let worst = min(meanO, meanD)
            let color = buckets.first { worst >= $0.min }?.color ?? buckets[buckets.count - 1].color
            let state = report.charts.context.nodes[m.names[i]]?.state ?? .complete
            let ring = state == .complete ? "#333" : "#c62828"
            let title = "\(m.names[i]) at (\(HTMLReport.f(p.x, 1)), \(HTMLReport.f(p.y, 1))) m: sees others \(HTMLReport.f(meanO, 1))%, seen \(HTMLReport.f(meanD, 1))% (mean continuity)\(state == .complete ? "" : ", state \(state)")"
            s += "<circle cx=\"\(n1(f.x(p.x)))\" cy=\"\(n1(py(p.y)))\" r=\"\(r)\" fill=\"\(color)\" stroke=\"\(ring)\" stroke-width=\"\(state == .complete ? 1 : 2.5)\"><title>\(esc(title))</title></circle>"
            s += "<text x=\"\(n1(f.x(p.x)))\" y=\"\(n1(py(p.y) - r - 2))\" text-anchor=\"middle\" style=\"font-size:\(font)px\">\(esc(labels[i]))</text>"
        }
        let missing = positions.filter { $0 == nil }.count
        s += "</svg><p class=\"small\">Node positions from the manifest (metres). Colour: the lower of the node's mean continuity as observer and as observed, in the heatmap's classes; a red ring: a node that is not complete. Point at a node for its figures.\(missing > 0 ? " \(missing) node(s) have no position." : "")</p></div>"
        return s
    }

    static func rssiDistance(_ report: AnalysisReport, _ m: ReportModel, _ positions: [(x: Double, y: Double)?]) -> String {
        var points = [(d: Double, rssi: Double)]()
        var unseen = 0
        for (o, d) in m.orderedPairs {
            guard let a = positions[o], let b = positions[d] else { continue }
            let dist = ((a.x - b.x) * (a.x - b.x) + (a.y - b.y) * (a.y - b.y)).squareRoot()
            if let rssi = m.pairs[o * m.n + d]?.rssiMedian, rssi.isFinite { points.append((dist, rssi)) } else { unseen += 1 }
        }
        guard !points.isEmpty else { return "<div><h3>RSSI against distance</h3><p>No pair with both positions has an RSSI median.</p></div>" }
        let maxD = max(1, points.map(\.d).max() ?? 1)
        let lo = min(-100, (points.map(\.rssi).min() ?? -100) - 3), hi = max(-30, (points.map(\.rssi).max() ?? -30) + 3)
        let f = Frame(left: 56, top: 10, width: 440, height: 300, xMin: 0, xMax: maxD * 1.04, yMin: lo, yMax: hi)
        var s = "<div><h3>RSSI against distance (\(points.count) pairs)</h3>" + svgOpen(Int(f.right + 16), Int(f.bottom + 40), label: "RSSI median against distance per pair")
        s += valueAxis(f, title: "RSSI median of the pair (dBm)") + numberAxis(f, title: "distance between the two nodes (m)")
        // The plan's propagation model, where it has one (simulated radio).
        let radio = report.charts.context.radio
        var items: [(color: String, name: String, dash: Bool)] = [("#1f77b4", "one ordered pair (darker: several on the same spot)", false)]
        if case .number(let p0)? = radio["referencePower"], case .number(let k)? = radio["pathLossExponent"], p0.isFinite, k.isFinite, abs(p0) < 1000, abs(k) < 100 {
            let model = (0...100).map { i -> (x: Double, y: Double?) in
                let d = max(0.1, f.xMax * Double(i) / 100)
                return (d, p0 - 10 * k * log10(d))
            }
            s += path(f, Line(name: "plan's model", color: "#c62828", points: model, width: 1.5, dash: true))
            items.append(("#c62828", "the plan's propagation model: \(HTMLReport.f(p0, 0)) dBm at 1 m, exponent \(HTMLReport.f(k, 1)), no shadowing", true))
        }
        // Pairs on the same 2 px spot are drawn once, as round dots of one path per class of
        // how many pairs share it (darker for more): small at 150 devices (22,350 pairs).
        var spots = [Int: Int](), order = [Int]()
        for p in points {
            let x = Saturating.int((f.x(p.d) / 2).rounded()), y = Saturating.int((f.y(p.rssi) / 2).rounded())
            let key = x * 100_000 + y
            if let n = spots[key] { spots[key] = n + 1 } else { spots[key] = 1; order.append(key) }
        }
        for (opacity, range, what) in [(0.45, 1...1, "one pair"), (0.7, 2...4, "2 to 4 pairs"), (1.0, 5...Int.max, "5 pairs or more")] {
            let d = order.filter { range.contains(spots[$0]!) }.map { "M\(($0 / 100_000) * 2) \(($0 % 100_000) * 2)h0" }.joined()
            if !d.isEmpty { s += "<path d=\"\(d)\" stroke=\"#1f77b4\" stroke-opacity=\"\(opacity)\" stroke-width=\"5\" stroke-linecap=\"round\" fill=\"none\"><title>\(what) on this spot</title></path>" }
        }
        s += "</svg>" + legend(items)
        s += "<p class=\"small\">Each ordered pair's median RSSI against the distance of its two nodes from the manifest's positions.\(unseen > 0 ? " \(unseen) pair(s) without RSSI are not drawn." : "")</p></div>"
        return s
    }
}
