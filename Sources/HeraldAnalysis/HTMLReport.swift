import Foundation

/// report.html: one self-contained page (inline CSS, SVG and one small script; no network).
/// It scales with the number of devices: a heatmap of one table cell per ordered pair, charts
/// only for the worst pairs, and the full per-pair detail as compact data paged by the script
/// (HTMLReport+Heatmap, +Pairs, +Tables). Devices appear in natural order (NaturalOrder).
enum HTMLReport {
    static func esc(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }
    static func f(_ v: Double?, _ digits: Int = 2) -> String { v.map { String(format: "%.\(digits)f", $0) } ?? "–" }

    static func render(_ report: AnalysisReport) -> String {
        let r = report.result
        let model = ReportModel(r)
        let n = model.n
        let layout = heatmapLayout(model)
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
        h3{font-size:15px;margin:8px 0}.scroll{max-height:420px;overflow-y:auto}.filters{font-size:13px}.filters input,.filters select{font-size:13px}
        \(heatmapStyle(layout))
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

        h += "<p class=\"small\">\(n) devices, \(n * max(0, n - 1)) ordered pairs.</p>"
        h += "<h2>Detection and continuity</h2>" + heatmap(model, layout)
        h += "<h2>Worst pairs</h2>" + worstSection(report, model)
        h += "<h2>Per node</h2>" + nodeSummariesSection(model)
        h += "<h2>Interval between RSSI samples (all pairs)</h2>" + histogram(report.charts)
        h += "<h2>Nodes</h2>" + nodes(model)
        h += "<h2 id=\"all\">All pairs</h2>" + allPairsSection(model)
        let failed = naturallySorted(r.checks.filter { !$0.passed }, by: \.subject)
        if !failed.isEmpty {
            h += "<h2>Failed checks</h2><table><tr><th class=\"l\">check</th><th class=\"l\">subject</th><th class=\"l\">finding</th></tr>"
            for c in failed.prefix(200) { h += "<tr><td class=\"l\">\(esc(c.name))</td><td class=\"l\">\(esc(c.subject))</td><td class=\"l\">\(esc(c.message))</td></tr>" }
            h += "</table>"
        }
        if !r.problems.isEmpty {
            h += "<h2>Problems with the input</h2><ul>" + naturallySorted(r.problems, by: \.self).map { "<li>\(esc($0))</li>" }.joined() + "</ul>"
        }
        h += "<p class=\"small\">Written by herald-lab in \(f(r.elapsedSeconds, 3)) s from \(r.bytesRead) bytes of logs.</p></body></html>\n"
        return h
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

    /// Natural order of a text (device names lead subjects and problems); equal texts keep their order.
    static func naturallySorted<T>(_ items: [T], by key: (T) -> String) -> [T] {
        items.enumerated().sorted { a, b in
            let c = NaturalOrder.compare(key(a.element), key(b.element))
            return c == .orderedSame ? a.offset < b.offset : c == .orderedAscending
        }.map(\.element)
    }

    static func nodes(_ m: ReportModel) -> String {
        var s = "<div class=\"scroll\"><table><tr><th title=\"Herald numbers devices in alphabetical order of folder name\">Herald #</th><th class=\"l\">folder</th><th class=\"l\">model</th><th class=\"l\">OS</th><th class=\"l\">shortName</th><th>shift s</th><th>rows</th><th>RSSI rows</th><th>reads</th><th>shares</th><th>malformed</th><th class=\"l\">battery</th><th class=\"l\">problems</th></tr>"
        for d in m.devices {
            let battery = d.batterySource.map { "\($0) \(f(d.batteryFirst, 0))→\(f(d.batteryLast, 0))%" } ?? "–"
            s += "<tr><td>\(d.index)</td><td class=\"l\">\(esc(d.folder))</td><td class=\"l\">\(esc(d.model))</td><td class=\"l\">\(esc(d.os)) \(esc(d.osVersion))</td><td class=\"l\">\(esc(d.shortName))</td><td>\(f(d.shift, 3))</td><td>\(d.rows)</td><td>\(d.measureRows)</td><td>\(d.readRows)</td><td>\(d.shareRows)</td><td>\(d.malformedLines)</td><td class=\"l\">\(esc(battery))</td><td class=\"l\">\(esc(d.problems.joined(separator: "; ")))</td></tr>"
        }
        return s + "</table></div>"
    }
}
