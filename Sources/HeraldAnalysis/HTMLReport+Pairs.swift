import Foundation
import HeraldCore

extension HTMLReport {
    static let worstPairCount = 20
    static let pageSize = 50

    /// Detected pairs, worst first: lowest strict continuity, then longest gap, then natural order.
    static func worstPairs(_ m: ReportModel, limit: Int = worstPairCount) -> [(o: Int, d: Int)] {
        let detected = m.orderedPairs.filter { m.detected[$0.o * m.n + $0.d] }
        let sorted = detected.sorted { a, b in
            let ca = m.continuity(a.o, a.d), cb = m.continuity(b.o, b.d)
            if ca != cb { return ca < cb }
            let ga = m.gap(a.o, a.d) ?? 0, gb = m.gap(b.o, b.d) ?? 0
            if ga != gb { return ga > gb }
            return (a.o, a.d) < (b.o, b.d)
        }
        return Array(sorted.prefix(limit))
    }

    static func worstSection(_ report: AnalysisReport, _ m: ReportModel) -> String {
        let undetected = m.orderedPairs.filter { !m.detected[$0.o * m.n + $0.d] }
        var s = ""
        if !undetected.isEmpty {
            let shown = undetected.prefix(40).map { "\(esc(m.names[$0.o])) → \(esc(m.names[$0.d]))" }.joined(separator: ", ")
            s += "<p><b>\(undetected.count) pair\(undetected.count == 1 ? "" : "s") not detected</b>: \(shown)\(undetected.count > 40 ? ", … (choose “detected: no” in the table of all pairs)" : "").</p>"
        }
        let worst = worstPairs(m)
        guard !worst.isEmpty else { return s + "<p>No detected pairs.</p>" }
        s += "<p>The \(worst.count) detected pair\(worst.count == 1 ? "" : "s") with the lowest strict continuity, longest gap first among equals.</p>"
        s += "<table><tr><th>#</th><th class=\"l\">observer</th><th class=\"l\">observed</th><th>continuity %</th><th>windows</th><th>longest gap s</th><th>samples</th><th>interval p95 s</th><th>RSSI median</th></tr>"
        for (k, w) in worst.enumerated() {
            let p = m.pairs[w.o * m.n + w.d]
            s += "<tr><td>\(k + 1)</td><td class=\"l\">\(esc(m.names[w.o]))</td><td class=\"l\">\(esc(m.names[w.d]))</td><td>\(f(p?.strictScorePct, 1))</td><td>\(p?.strictWindows ?? 0)</td><td>\(f(p?.longestGap, 1))</td><td>\(p?.rssiSamples ?? 0)</td><td>\(f(p?.intervalP95))</td><td>\(f(p?.rssiMedian, 0))</td></tr>"
        }
        s += "</table><div class=\"grid\">"
        for w in worst { s += pairChart(report, m, w.o, w.d) }
        return s + "</div>"
    }

    /// One pair's RSSI (mean per 30 s window) over the contact event, with a strip below marking
    /// windows without RSSI; at most one point per two pixels, so long runs stay small.
    static func pairChart(_ report: AnalysisReport, _ m: ReportModel, _ o: Int, _ d: Int) -> String {
        let r = report.result
        let observer = m.names[o], observed = m.names[d]
        let p = m.pairs[o * m.n + d]
        let series = report.charts.rssiSeries["\(observer)\u{1F}\(observed)"] ?? []
        let bins = max(1, r.parameters.cetotal)
        let w = 380, plotH = 110, pad = 30, stripY = 128, stripH = 12, hgt = 204
        let plotW = w - pad - 5
        func x(_ b: Double) -> Double { Double(pad) + Double(plotW) * b / Double(bins) }
        var out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(w)\" height=\"\(hgt)\" role=\"img\" aria-label=\"RSSI and gaps: \(esc(observer)) sees \(esc(observed))\"><style>text{font-size:10px;font-family:sans-serif}</style>"
        out += "<rect x=\"\(pad)\" y=\"10\" width=\"\(plotW)\" height=\"\(plotH)\" fill=\"#fafafa\" stroke=\"#ddd\"/>"
        // Run time under the gap strip (the contact event's windows start at its start).
        let clock = runClock(r)
        out += timeAxis(Frame(left: Double(pad), top: 10, width: Double(plotW), height: Double(stripY + stripH - 10), xMin: clock.ceFrom, xMax: clock.ceFrom + 30 * Double(bins)), title: "run time")
        if !series.isEmpty {
            let lo = min(-100.0, series.map(\.1).min() ?? -100), hi = max(-30.0, series.map(\.1).max() ?? -30)
            func y(_ v: Double) -> Double { 10 + Double(plotH) * (hi - v) / (hi - lo) }
            out += "<text x=\"2\" y=\"14\">\(Saturating.int(hi))</text><text x=\"2\" y=\"\(10 + plotH)\">\(Saturating.int(lo))</text>"
            // Consecutive windows that fall on the same 2 px column are averaged into one point;
            // the line breaks where windows are missing.
            let group = max(1, Int((Double(bins) / Double(plotW / 2)).rounded(.up)))
            var path = "", previousGroup = -2, previousBin = -2, i = 0
            while i < series.count {
                let g = series[i].0 / group
                var j = i, sum = 0.0
                while j < series.count, series[j].0 / group == g { sum += series[j].1; j += 1 }
                let px = x(min(Double(bins), Double(g * group) + Double(group) / 2)), py = y(sum / Double(j - i))
                // A lone point is a dot: a zero-length segment with round caps.
                path += g == previousGroup + 1 && series[i].0 == previousBin + 1
                    ? String(format: "L%.1f %.1f ", px, py) : String(format: "M%.1f %.1f l0 0 ", px, py)
                previousGroup = g
                previousBin = series[j - 1].0
                i = j
            }
            out += "<path d=\"\(path)\" fill=\"none\" stroke=\"#1976d2\" stroke-width=\"1.2\"/>"
        } else {
            out += "<text x=\"\(pad + 8)\" y=\"\(10 + plotH / 2)\">no RSSI in the contact event</text>"
        }
        // Gap strip: windows without RSSI in red, merged into runs.
        out += "<rect x=\"\(pad)\" y=\"\(stripY)\" width=\"\(plotW)\" height=\"\(stripH)\" fill=\"#9ccc65\"/>"
        var have = [Bool](repeating: false, count: bins)
        for (b, _) in series where b >= 0 && b < bins { have[b] = true }
        var b = 0
        while b < bins {
            guard !have[b] else { b += 1; continue }
            var e = b
            while e < bins, !have[e] { e += 1 }
            out += String(format: "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#c62828\"/>", x(Double(b)), stripY, max(1, x(Double(e)) - x(Double(b))), stripH)
            b = e
        }
        out += "<text x=\"2\" y=\"\(stripY + 10)\">gaps</text>"
        out += "<text x=\"\(pad)\" y=\"\(hgt - 16)\">\(esc(observer)) sees \(esc(observed)) · \(f(p?.strictScorePct, 1))% · longest gap \(f(p?.longestGap, 0)) s</text>"
        out += "<text x=\"\(pad)\" y=\"\(hgt - 3)\">mean RSSI per 30 s window (median \(f(p?.rssiMedian, 0)) dBm); red: none</text></svg>"
        return out
    }
}
