import Foundation

/// What the report draws from: devices in natural order and every ordered pair by position.
struct ReportModel {
    let result: AnalysisResult
    /// Devices in natural order of folder name.
    let devices: [AnalysisResult.Device]
    var names: [String] { devices.map(\.folder) }
    var n: Int { devices.count }
    /// `pairs[o * n + d]`: observer o sees observed d (nil on the diagonal or if the result lacks it).
    let pairs: [AnalysisResult.PairMetrics?]
    /// Detected in either mode (as the detection matrix always showed).
    let detected: [Bool]

    init(_ r: AnalysisResult) {
        result = r
        devices = r.devices.sorted { NaturalOrder.less($0.folder, $1.folder) }
        let n = devices.count
        var position = [String: Int]()
        for (i, d) in devices.enumerated() where position[d.folder] == nil { position[d.folder] = i }
        var pairs = [AnalysisResult.PairMetrics?](repeating: nil, count: n * n)
        for p in r.pairs {
            guard let o = position[p.observer], let d = position[p.observed], o != d else { continue }
            pairs[o * n + d] = p
        }
        let herald = r.heraldDetectedPairs
        var detected = [Bool](repeating: false, count: n * n)
        for o in 0..<n {
            for d in 0..<n where d != o {
                detected[o * n + d] = pairs[o * n + d]?.detected == true
                    || herald.contains(devices[o].label + "\u{1F}" + devices[d].label)
            }
        }
        self.pairs = pairs
        self.detected = detected
    }

    /// Every ordered pair (observer, observed) in natural order, diagonal left out.
    var orderedPairs: [(o: Int, d: Int)] {
        var out = [(o: Int, d: Int)]()
        out.reserveCapacity(n * max(0, n - 1))
        for o in 0..<n { for d in 0..<n where d != o { out.append((o, d)) } }
        return out
    }

    func continuity(_ o: Int, _ d: Int) -> Double { pairs[o * n + d]?.strictScorePct ?? 0 }
    func gap(_ o: Int, _ d: Int) -> Double? { pairs[o * n + d]?.longestGap }
}

extension HTMLReport {
    /// Continuity classes of the heatmap; `u` is an undetected pair, `s` the diagonal.
    struct Bucket {
        let cls: String, color: String, label: String, min: Double
    }
    static let buckets: [Bucket] = [
        .init(cls: "a", color: "#006837", label: "100%", min: 100),
        .init(cls: "b", color: "#31a354", label: "95–99.9%", min: 95),
        .init(cls: "c", color: "#a1d99b", label: "90–95%", min: 90),
        .init(cls: "d", color: "#fee08b", label: "80–90%", min: 80),
        .init(cls: "e", color: "#fdae61", label: "50–80%", min: 50),
        .init(cls: "f", color: "#f46d43", label: "20–50%", min: 20),
        .init(cls: "g", color: "#d73027", label: "0–20%", min: 0),
    ]
    static let undetectedColor = "#1a1a1a", selfColor = "#e8e8e8"

    static func bucket(_ m: ReportModel, _ o: Int, _ d: Int) -> Int? {
        guard m.detected[o * m.n + d] else { return nil }
        let c = m.continuity(o, d)
        return buckets.firstIndex { c >= $0.min } ?? buckets.count - 1
    }

    /// Cell size in px (gap included) so that the matrix fits a 1280 px page.
    static func cellSize(_ n: Int) -> Int { max(5, min(24, 1100 / max(1, n))) }

    /// Class counts, the default (most frequent) class and the cell size for a result.
    struct HeatmapLayout {
        let counts: [Int], undetected: Int, common: Int, cell: Int, sparse: Bool, font: Int
    }

    static func heatmapLayout(_ m: ReportModel) -> HeatmapLayout {
        var counts = [Int](repeating: 0, count: buckets.count)
        var undetected = 0
        for (o, d) in m.orderedPairs { if let b = bucket(m, o, d) { counts[b] += 1 } else { undetected += 1 } }
        // Most frequent class first; ties go to the better class (lower index).
        let common = counts.indices.max { counts[$0] < counts[$1] || (counts[$0] == counts[$1] && $0 > $1) } ?? 0
        let cell = cellSize(m.n), sparse = cell < 10
        return HeatmapLayout(counts: counts, undetected: undetected, common: common, cell: cell, sparse: sparse, font: sparse ? 9 : min(11, cell - 1))
    }

    /// The heatmap's CSS, for the page's head.
    static func heatmapStyle(_ l: HeatmapLayout) -> String {
        let inner = l.cell - 1
        var s = "#hm{border-collapse:separate;border-spacing:1px;font-size:\(l.font)px;line-height:\(inner)px}"
        s += "#hm td{width:\(inner)px;height:\(inner)px;padding:0;border:0;background:\(buckets[l.common].color)}"
        s += "#hm th{padding:0 3px 0 0;border:0;background:none;font-weight:normal;white-space:nowrap;overflow:visible}"
        s += "#hm thead th{padding:0 0 3px 0;vertical-align:bottom;width:\(inner)px;max-width:\(inner)px}"
        s += "#hm thead i{writing-mode:vertical-rl;transform:rotate(180deg);font-style:normal;display:inline-block;line-height:\(inner)px}"
        for (k, b) in buckets.enumerated() where k != l.common { s += "#hm td.\(b.cls){background:\(b.color)}" }
        s += "#hm td.u{background:\(undetectedColor)}#hm td.s{background:\(selfColor)}#hm td:hover{outline:2px solid #1976d2}"
        s += ".sw{display:inline-block;width:12px;height:12px;vertical-align:middle;margin:0 4px 0 12px;border:1px solid #999}"
        return s
    }

    /// One table cell per ordered pair: the cheapest markup (`<td>` or `<td class=x>`, end tags
    /// omitted as HTML allows), so that 150 devices (22,350 cells) stay a few hundred kB. The most
    /// frequent class is the table's default colour and is written without a class.
    static func heatmap(_ m: ReportModel, _ l: HeatmapLayout) -> String {
        let n = m.n
        guard n > 1 else { return "<p>Fewer than two devices: no pairs.</p>" }
        let (counts, undetected, common, sparse) = (l.counts, l.undetected, l.common, l.sparse)
        let (prefix, labels) = NaturalOrder.abbreviations(m.names)
        func shown(_ i: Int) -> Bool { !sparse || i == 0 || (i + 1) % 5 == 0 }
        var s = ""

        // Legend with the number of pairs in each class.
        s += "<p class=\"legend\">"
        for (k, b) in buckets.enumerated() { s += "<span class=\"sw\" style=\"background:\(b.color)\"></span>\(b.label) (\(counts[k]))" }
        s += "<span class=\"sw\" style=\"background:\(undetectedColor)\"></span>not detected (\(undetected))"
        s += "<span class=\"sw\" style=\"background:\(selfColor)\"></span>self</p>"

        s += "<div style=\"overflow-x:auto\"><table id=\"hm\" aria-label=\"continuity heatmap\"><thead><tr><th>"
        for (j, name) in m.names.enumerated() {
            s += "<th title=\"\(esc(name))\">" + (shown(j) ? "<i>\(esc(labels[j]))</i>" : "")
        }
        s += "</thead><tbody>"
        for o in 0..<n {
            s += "<tr><th title=\"\(esc(m.names[o]))\">" + (shown(o) ? esc(labels[o]) : "")
            for d in 0..<n {
                if d == o { s += "<td class=s>"; continue }
                if let b = bucket(m, o, d) { s += b == common ? "<td>" : "<td class=\(buckets[b].cls)>" } else { s += "<td class=u>" }
            }
        }
        s += "</tbody></table></div>"
        s += "<p class=\"small\" id=\"hmi\">Row: observer; column: observed; colour: strict continuity of the pair (share of the \(m.result.parameters.cetotal) contact-event windows of 30 s with an observation). "
        s += (prefix.isEmpty ? "" : "Labels leave out the common prefix “\(esc(prefix))”. ")
        s += (sparse ? "Every fifth device is labelled. " : "")
        s += "Point at a cell for the pair's figures; click it to show the pair in the table of all pairs.</p>"
        return s
    }
}
