import Foundation
import HeraldCore

/// report.html: one self-contained page (inline CSS, SVG and one small script; no network).
/// It scales with the number of devices: a heatmap of one table cell per ordered pair, charts
/// only for the worst pairs, and the full per-pair detail as compact data paged by the script
/// (HTMLReport+Heatmap, +Pairs, +Tables). Devices appear in natural order (NaturalOrder).
enum HTMLReport {
    static func esc(_ s: String) -> String { OutsideText.html(s) }
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
        .cards{display:flex;gap:16px;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:10px 16px;min-width:180px;max-width:520px}
        .card b{font-size:22px;display:block}.small{font-size:12px;color:#666}.grid{display:flex;flex-wrap:wrap;gap:12px}.grid>div{max-width:560px}
        .verdict{display:flex;gap:20px;align-items:flex-start;border:2px solid #c62828;border-radius:8px;padding:12px 16px;margin:8px 0 16px}.verdict.vp{border-color:#1a7f37}.verdict.va{border-color:#6e7781}.badge b.aborted{color:#6e7781}
        .badge{min-width:200px;max-width:300px}.badge b{font-size:34px;display:block}.badge span{display:block;margin-top:4px}
        table.checks td,table.checks th{font-size:13px;vertical-align:top}table.settings th{width:130px}.links{font-size:14px}.links a{margin:0 2px}
        .card b.sub{font-size:16px}pre{background:#f6f6f6;padding:8px;font-size:12px;max-height:300px;overflow:auto}nav{margin:8px 0}
        h3{font-size:15px;margin:8px 0}.scroll{max-height:420px;overflow-y:auto}.filters{font-size:13px}.filters input,.filters select{font-size:13px}
        \(heatmapStyle(layout))
        </style></head><body>
        <h1>\(esc(title))</h1>
        """
        h += verdictSection(r) + headlineCards(r)
        h += "<p class=\"small\">Strict mode (judged) aligns windows to the contact-event start and uses millisecond times; herald mode reproduces Herald's reference script (windows from each observer's first observation, longevity pooled per observed device). \(n) devices, \(n * max(0, n - 1)) ordered pairs.</p>"
        h += linksLine()
        h += "<nav class=\"small\">On this page: <a href=\"#settings\">settings</a> · <a href=\"#time\">the run over time</a> · <a href=\"#heatmap\">detection and continuity</a> · <a href=\"#first\">first detection and read</a> · <a href=\"#floor\">floor map</a> · <a href=\"#worst\">worst pairs</a> · <a href=\"#nodes\">nodes</a> · <a href=\"#intervals\">sample intervals</a> · <a href=\"#all\">all pairs</a>\(r.checks.contains { !$0.passed } ? " · <a href=\"#failed\">failed checks</a>" : "")</nav>"
        h += "<h2 id=\"settings\">What ran</h2>" + settingsSection(report)
        h += "<h2 id=\"time\">The run over time</h2>" + runSection(report, model)
        h += "<h2 id=\"heatmap\">Detection and continuity</h2>" + heatmap(model, layout)
        h += "<h2 id=\"first\">Time to first detection and first read</h2>" + firstTimesSection(r)
        h += "<h2 id=\"floor\">Floor map and RSSI against distance</h2>" + floorSection(report, model)
        h += "<h2 id=\"worst\">Worst pairs</h2>" + worstSection(report, model)
        h += "<h2>Per node</h2>" + nodeSummariesSection(model)
        h += "<h2 id=\"nodes\">Nodes</h2>" + nodeStatesSection(report, model) + nodes(model, report.charts.context)
        h += "<h2 id=\"intervals\">Interval between RSSI samples (all pairs)</h2>" + histogram(report.charts)
        h += "<h2 id=\"all\">All pairs</h2>" + allPairsSection(model)
        let failed = naturallySorted(r.checks.filter { !$0.passed }, by: \.subject)
        if !failed.isEmpty {
            h += "<h2 id=\"failed\">Failed checks</h2><p class=\"small\">\(failed.count) of \(r.checks.count)\(failed.count > 200 ? "; the first 200 in natural order (every check is in junit.xml)" : "").</p><table><tr><th class=\"l\">check</th><th class=\"l\">subject</th><th class=\"l\">finding</th></tr>"
            for c in failed.prefix(200) { h += "<tr><td class=\"l\">\(esc(c.name))</td><td class=\"l\">\(esc(c.subject))</td><td class=\"l\">\(esc(c.message))</td></tr>" }
            h += "</table>"
        }
        if !r.problems.isEmpty {
            h += "<h2>Problems with the input</h2><ul>" + naturallySorted(r.problems, by: \.self).map { "<li>\(esc($0))</li>" }.joined() + "</ul>"
        }
        h += "<p class=\"small\">Written by herald-lab in \(f(r.elapsedSeconds, 3)) s from \(r.bytesRead) bytes of logs.</p></body></html>\n"
        return h
    }

    /// All pairs' intervals between consecutive RSSI samples, at most 60 bars, with titled axes.
    static func histogram(_ c: ChartData) -> String {
        guard let lastNonZero = c.intervalHistogram.lastIndex(where: { $0 > 0 }) else { return "<p>No intervals.</p>" }
        let buckets = lastNonZero + 1
        let group = max(1, (buckets + 59) / 60)
        var bars = [(Double, UInt64)]()
        var i = 0
        while i < buckets {
            let sum = c.intervalHistogram[i..<min(buckets, i + group)].reduce(UInt64(0)) { $0 + UInt64($1) }
            bars.append((Double(i) * c.intervalBucket, sum))
            i += group
        }
        let width = Double(group) * c.intervalBucket
        let maxCount = max(1, bars.map(\.1).max() ?? 1)
        let fr = Frame(left: 72, top: 10, width: 700, height: 180, xMin: 0, xMax: Double(bars.count) * width, yMin: 0, yMax: Double(maxCount) * 1.05)
        var s = svgOpen(Int(fr.right + 20), Int(fr.bottom + 40), label: "interval histogram")
        s += valueAxis(fr, title: "intervals (count)") + numberAxis(fr, title: "seconds between consecutive RSSI samples of a pair (bars of \(f(width, 2)) s; the last bar holds 120 s and more)")
        for (start, count) in bars where count > 0 {
            let x = fr.x(start), y = fr.y(Double(count))
            s += "<rect x=\"\(n1(x))\" y=\"\(n1(y))\" width=\"\(n1(max(1, fr.x(start + width) - x - 1)))\" height=\"\(n1(fr.bottom - y))\" fill=\"#6a1b9a\"><title>\(f(start, 2))–\(f(start + width, 2)) s: \(count)</title></rect>"
        }
        return s + "</svg><p class=\"small\">Shorter is better: Herald aims at an RSSI sample in every 30-second window; a long tail means pairs went unseen for a while.</p>"
    }

    /// Natural order of a text (device names lead subjects and problems); equal texts keep their order.
    static func naturallySorted<T>(_ items: [T], by key: (T) -> String) -> [T] {
        items.enumerated().sorted { a, b in
            let c = NaturalOrder.compare(key(a.element), key(b.element))
            return c == .orderedSame ? a.offset < b.offset : c == .orderedAscending
        }.map(\.element)
    }

    static func nodes(_ m: ReportModel, _ ctx: ReportContext = ReportContext()) -> String {
        var s = "<div class=\"scroll\"><table><tr><th>#</th><th class=\"l\">folder</th><th title=\"Herald's own number (its reference script numbers devices in alphabetical order of folder name, as in formal-continuity.csv)\">Herald's #</th><th class=\"l\">model</th><th class=\"l\">OS</th><th class=\"l\">shortName</th><th class=\"l\">state</th><th class=\"l\">position m</th><th>shift s</th><th>rows</th><th>RSSI rows</th><th>reads</th><th>shares</th><th>malformed</th><th class=\"l\">battery</th><th class=\"l\">problems</th></tr>"
        for (k, d) in m.devices.enumerated() {
            let battery = d.batterySource.map { "\($0) \(f(d.batteryFirst, 0))→\(f(d.batteryLast, 0))%" } ?? "–"
            let node = ctx.nodes[d.folder]
            let position = node?.position.map { "\(f($0.x, 1)), \(f($0.y, 1))" } ?? "–"
            s += "<tr><td>\(k + 1)</td><td class=\"l\">\(esc(d.folder))</td><td>\(d.index)</td><td class=\"l\">\(esc(d.model))</td><td class=\"l\">\(esc(d.os)) \(esc(d.osVersion))</td><td class=\"l\">\(esc(d.shortName))</td><td class=\"l\">\(esc(node?.state?.rawValue ?? "–"))</td><td class=\"l\">\(position)</td><td>\(f(d.shift, 3))</td><td>\(d.rows)</td><td>\(d.measureRows)</td><td>\(d.readRows)</td><td>\(d.shareRows)</td><td>\(d.malformedLines)</td><td class=\"l\">\(esc(battery))</td><td class=\"l\">\(esc(d.problems.joined(separator: "; ")))</td></tr>"
        }
        return s + "</table></div><p class=\"small\"># is this page's order (natural: node2 before node10); Herald's # is the number in Herald's device labels and CSV files (alphabetical: node10 before node2).</p>"
    }
}
