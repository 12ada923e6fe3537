import Foundation

/// report.html: one self-contained page (inline CSS and SVG, no scripts, no network).
enum HTMLReport {
    static func esc(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }
    static func f(_ v: Double?, _ digits: Int = 2) -> String { v.map { String(format: "%.\(digits)f", $0) } ?? "–" }

    static func render(_ report: AnalysisReport) -> String {
        let r = report.result
        let title = "HeraldLab report: \(r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent)"
        var h = """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"><title>\(esc(title))</title>
        <style>
        body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
        h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
        table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
        th{background:#f3f3f3}td.l,th.l{text-align:left}.pass{color:#1a7f37;font-weight:bold}.fail{color:#c62828;font-weight:bold}
        .cards{display:flex;gap:16px;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:10px 16px;min-width:180px}
        .card b{font-size:22px;display:block}.small{font-size:12px;color:#666}.grid{display:flex;flex-wrap:wrap;gap:12px}
        </style></head><body>
        <h1>\(esc(title))</h1>
        <p class="small">\(esc(r.input.kind)) \(esc(r.input.path))\(r.input.plan.map { " · plan " + esc($0) } ?? "")\(r.input.variant.map { $0.isEmpty ? "" : " · variant " + esc($0) } ?? "") · contact event \(esc(r.parameters.ceStart)) to \(esc(r.parameters.ceEnd)) (\(r.parameters.cetotal) windows of 30 s) · filter \(esc(r.parameters.filterStart)) to \(esc(r.parameters.filterEnd))</p>
        <p>Verdict: <span class="\(r.passed ? "pass" : "fail")">\(r.passed ? "PASS" : "FAIL")</span> (\(r.checks.filter(\.passed).count) of \(r.checks.count) checks passed)</p>
        """
        h += "<div class=\"cards\">"
        for m in [r.strict, r.herald] {
            h += "<div class=\"card\"><span class=\"small\">\(m.mode) mode</span><b>\(f(m.detectionpct))% detection</b>\(m.achieveddetections) of \(m.maxpairs) pairs<br><b>\(f(m.continuitypct, 3))% continuity</b>\(m.achievedwindows) of \(m.maxwindows) windows<br>longevity \(f(m.longevity, 4))</div>"
        }
        h += "</div><p class=\"small\">herald mode reproduces Herald's reference script (windows from each observer's first observation, longevity pooled per observed device); strict mode aligns windows to the contact-event start, uses millisecond times and counts longevity per pair.</p>"

        h += "<h2>Detection matrix</h2>" + matrix(r)
        h += "<h2>Continuity per pair (strict)</h2>" + continuityBars(r)
        h += "<h2>RSSI over time per pair</h2><div class=\"grid\">" + rssiCharts(report) + "</div>"
        h += "<h2>Interval between RSSI samples (all pairs)</h2>" + histogram(report.charts)
        h += "<h2>Nodes</h2>" + nodes(r)
        h += "<h2>Pairs</h2>" + pairsTable(r)
        let failed = r.checks.filter { !$0.passed }
        if !failed.isEmpty {
            h += "<h2>Failed checks</h2><table><tr><th class=\"l\">check</th><th class=\"l\">subject</th><th class=\"l\">finding</th></tr>"
            for c in failed.prefix(200) { h += "<tr><td class=\"l\">\(esc(c.name))</td><td class=\"l\">\(esc(c.subject))</td><td class=\"l\">\(esc(c.message))</td></tr>" }
            h += "</table>"
        }
        if !r.problems.isEmpty {
            h += "<h2>Problems with the input</h2><ul>" + r.problems.map { "<li>\(esc($0))</li>" }.joined() + "</ul>"
        }
        h += "<p class=\"small\">Written by herald-lab in \(f(r.elapsedSeconds, 3)) s from \(r.bytesRead) bytes of logs.</p></body></html>\n"
        return h
    }

    static func matrix(_ r: AnalysisResult) -> String {
        let n = r.devices.count
        let cell = 34, left = 150, top = 110
        let w = left + n * cell + 90, hgt = top + n * cell + 10
        var s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(w)\" height=\"\(hgt)\" role=\"img\" aria-label=\"detection matrix\"><style>text{font-size:11px;font-family:sans-serif}</style>"
        let detected = r.heraldDetectedPairs
        let strict = Set(r.strict.detectedPairs.map { $0.joined(separator: "\u{1F}") })
        for (j, d) in r.devices.enumerated() {
            s += "<text transform=\"translate(\(left + j * cell + cell / 2 + 4),\(top - 6)) rotate(-60)\">\(esc(d.folder))</text>"
        }
        for (i, o) in r.devices.enumerated() {
            s += "<text x=\"\(left - 6)\" y=\"\(top + i * cell + cell / 2 + 4)\" text-anchor=\"end\">\(esc(o.folder))</text>"
            for (j, d) in r.devices.enumerated() {
                let key = o.label + "\u{1F}" + d.label
                let color = i == j ? "#eee" : (strict.contains(key) || detected.contains(key) ? "#2e7d32" : "#c62828")
                s += "<rect x=\"\(left + j * cell)\" y=\"\(top + i * cell)\" width=\"\(cell - 2)\" height=\"\(cell - 2)\" fill=\"\(color)\"><title>\(esc(o.folder)) sees \(esc(d.folder))</title></rect>"
            }
        }
        return s + "</svg><p class=\"small\">Row: observer; column: observed. Green: detected; red: not detected.</p>"
    }

    static func continuityBars(_ r: AnalysisResult) -> String {
        let pairs = r.pairs
        let barH = 14, left = 220, width = 500
        let hgt = pairs.count * (barH + 3) + 30
        var s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(left + width + 80)\" height=\"\(hgt)\" role=\"img\" aria-label=\"continuity per pair\"><style>text{font-size:11px;font-family:sans-serif}</style>"
        let limit = r.thresholds.pairContinuityPct
        for (i, p) in pairs.enumerated() {
            let y = 10 + i * (barH + 3)
            let w = Int(Double(width) * min(100, p.strictScorePct) / 100)
            s += "<text x=\"\(left - 6)\" y=\"\(y + barH - 3)\" text-anchor=\"end\">\(esc(p.observer)) → \(esc(p.observed))</text>"
            s += "<rect x=\"\(left)\" y=\"\(y)\" width=\"\(w)\" height=\"\(barH)\" fill=\"\(p.strictScorePct >= limit ? "#1976d2" : "#c62828")\"/>"
            s += "<text x=\"\(left + w + 4)\" y=\"\(y + barH - 3)\">\(f(p.strictScorePct, 1))%</text>"
        }
        let lx = left + Int(Double(width) * limit / 100)
        s += "<line x1=\"\(lx)\" y1=\"5\" x2=\"\(lx)\" y2=\"\(hgt - 15)\" stroke=\"#555\" stroke-dasharray=\"4 3\"/><text x=\"\(lx + 3)\" y=\"\(hgt - 3)\">threshold \(f(limit, 0))%</text>"
        return s + "</svg>"
    }

    static func rssiCharts(_ report: AnalysisReport) -> String {
        let r = report.result
        let bins = max(1, r.parameters.cetotal)
        let w = 360, hgt = 140, pad = 30
        var out = ""
        var shown = 0
        for p in r.pairs {
            guard let series = report.charts.rssiSeries["\(p.observer)\u{1F}\(p.observed)"], !series.isEmpty else { continue }
            shown += 1
            if shown > 120 { out += "<p class=\"small\">(more pairs in pairs.csv)</p>"; break }
            let lo = min(-100.0, series.map(\.1).min() ?? -100), hi = max(-30.0, series.map(\.1).max() ?? -30)
            func x(_ b: Int) -> Double { Double(pad) + Double(w - pad - 5) * Double(b) / Double(bins) }
            func y(_ v: Double) -> Double { 10 + Double(hgt - 30) * (hi - v) / (hi - lo) }
            // Break the line where windows are missing.
            var path = ""
            var last = -2
            for (b, v) in series {
                path += (b == last + 1 ? "L" : "M") + String(format: "%.1f %.1f ", x(b), y(v))
                last = b
            }
            out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(w)\" height=\"\(hgt)\" role=\"img\" aria-label=\"RSSI \(esc(p.observer)) sees \(esc(p.observed))\"><style>text{font-size:10px;font-family:sans-serif}</style>"
            out += "<rect x=\"\(pad)\" y=\"10\" width=\"\(w - pad - 5)\" height=\"\(hgt - 30)\" fill=\"#fafafa\" stroke=\"#ddd\"/>"
            out += "<text x=\"2\" y=\"14\">\(Int(hi))</text><text x=\"2\" y=\"\(hgt - 20)\">\(Int(lo))</text>"
            out += "<path d=\"\(path)\" fill=\"none\" stroke=\"#1976d2\" stroke-width=\"1.2\"/>"
            out += "<text x=\"\(pad)\" y=\"\(hgt - 5)\">\(esc(p.observer)) sees \(esc(p.observed)) · median \(f(p.rssiMedian, 0)) dBm · mean per 30 s window</text></svg>"
        }
        return shown == 0 ? "<p>No RSSI samples in the contact event.</p>" : out
    }

    static func histogram(_ c: ChartData) -> String {
        guard let lastNonZero = c.intervalHistogram.lastIndex(where: { $0 > 0 }) else { return "<p>No intervals.</p>" }
        // Group into at most 60 bars.
        let buckets = lastNonZero + 1
        let group = max(1, (buckets + 59) / 60)
        var bars = [(Double, UInt64)]()
        var i = 0
        while i < buckets {
            let sum = c.intervalHistogram[i..<min(buckets, i + group)].reduce(UInt64(0)) { $0 + UInt64($1) }
            bars.append((Double(i) * c.intervalBucket, sum))
            i += group
        }
        let maxCount = max(1, bars.map(\.1).max() ?? 1)
        let w = 720, hgt = 200, left = 50
        let bw = Double(w - left - 10) / Double(bars.count)
        var s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(w)\" height=\"\(hgt + 30)\" role=\"img\" aria-label=\"interval histogram\"><style>text{font-size:10px;font-family:sans-serif}</style>"
        for (k, (start, count)) in bars.enumerated() {
            let bh = Double(hgt - 10) * Double(count) / Double(maxCount)
            s += String(format: "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#6a1b9a\"><title>%.2f s: %d</title></rect>", Double(left) + Double(k) * bw, Double(hgt) - bh, max(1, bw - 1), bh, start, count)
        }
        s += "<text x=\"\(left)\" y=\"\(hgt + 14)\">0 s</text><text x=\"\(w - 60)\" y=\"\(hgt + 14)\">\(f(Double(buckets) * c.intervalBucket, 1)) s</text><text x=\"2\" y=\"12\">\(maxCount)</text>"
        return s + "</svg>"
    }

    static func nodes(_ r: AnalysisResult) -> String {
        var s = "<table><tr><th>#</th><th class=\"l\">folder</th><th class=\"l\">model</th><th class=\"l\">OS</th><th class=\"l\">shortName</th><th>shift s</th><th>rows</th><th>RSSI rows</th><th>reads</th><th>shares</th><th>malformed</th><th class=\"l\">battery</th><th class=\"l\">problems</th></tr>"
        for d in r.devices {
            let battery = d.batterySource.map { "\($0) \(f(d.batteryFirst, 0))→\(f(d.batteryLast, 0))%" } ?? "–"
            s += "<tr><td>\(d.index)</td><td class=\"l\">\(esc(d.folder))</td><td class=\"l\">\(esc(d.model))</td><td class=\"l\">\(esc(d.os)) \(esc(d.osVersion))</td><td class=\"l\">\(esc(d.shortName))</td><td>\(f(d.shift, 3))</td><td>\(d.rows)</td><td>\(d.measureRows)</td><td>\(d.readRows)</td><td>\(d.shareRows)</td><td>\(d.malformedLines)</td><td class=\"l\">\(esc(battery))</td><td class=\"l\">\(esc(d.problems.joined(separator: "; ")))</td></tr>"
        }
        return s + "</table>"
    }

    static func pairsTable(_ r: AnalysisResult) -> String {
        var s = "<table><tr><th class=\"l\">observer</th><th class=\"l\">observed</th><th>herald windows</th><th>strict %</th><th>first detection s</th><th>first read s</th><th>samples</th><th>interval p50 s</th><th>p95 s</th><th>longest gap s</th><th>RSSI median</th><th>spread</th></tr>"
        for p in r.pairs {
            s += "<tr><td class=\"l\">\(esc(p.observer))</td><td class=\"l\">\(esc(p.observed))</td><td>\(p.heraldWindows)</td><td>\(f(p.strictScorePct))</td><td>\(f(p.timeToFirstDetection, 1))</td><td>\(f(p.timeToFirstRead, 1))</td><td>\(p.rssiSamples)</td><td>\(f(p.intervalP50))</td><td>\(f(p.intervalP95))</td><td>\(f(p.longestGap, 1))</td><td>\(f(p.rssiMedian, 0))</td><td>\(f(p.rssiSpread, 0))</td></tr>"
        }
        return s + "</table>"
    }
}
