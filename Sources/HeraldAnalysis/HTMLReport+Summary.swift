import Foundation
import HeraldCore

/// The top of report.html: the verdict with its reasons summarised by check, the headline
/// figures labelled with what good looks like, the plan's settings, and links to the
/// machine-readable files; further down, the nodes' states and gap reasons.
extension HTMLReport {
    /// The checks of one kind (the headline ones apart from the per-pair ones).
    struct CheckGroup {
        var title: String
        var requirement: String
        var checks: [AnalysisResult.Check]
        var failed: [AnalysisResult.Check] { checks.filter { !$0.passed } }
        var overall: Bool
    }

    static func checkGroups(_ r: AnalysisResult) -> [CheckGroup] {
        let t = r.thresholds
        var groups = [CheckGroup](), index = [String: Int]()
        for c in r.checks {
            let overall = c.subject == "overall"
            let key = c.name + (overall ? "\u{1F}overall" : "")
            if let i = index[key] { groups[i].checks.append(c); continue }
            let title: String, requirement: String
            switch (c.name, overall) {
            case ("detection", true): (title, requirement) = ("Detection, all pairs", "at least \(f(t.detectionPct, 1))% of ordered pairs")
            case ("continuity", true): (title, requirement) = ("Continuity, all pairs", "at least \(f(t.continuityPct, 1))% of windows")
            case ("detected", false): (title, requirement) = ("Each pair detected", "an RSSI or share row in the filter window")
            case ("continuity", false): (title, requirement) = ("Continuity of each pair", "at least \(f(t.pairContinuityPct, 1))% of windows")
            case ("timeToFirstDetection", false): (title, requirement) = ("Time to first detection, each pair", "at most \(f(t.timeToFirstDetection, 0)) s")
            case ("timeToFirstRead", false): (title, requirement) = ("Time to first read, each pair", "at most \(f(t.timeToFirstRead, 0)) s")
            default: (title, requirement) = (c.name + (overall ? "" : ", each"), "limit \(f(c.limit, 2))")
            }
            index[key] = groups.count
            groups.append(CheckGroup(title: title, requirement: requirement, checks: [c], overall: overall))
        }
        return groups
    }

    static func verdictSection(_ r: AnalysisResult) -> String {
        let groups = checkGroups(r)
        let passed = r.checks.filter(\.passed).count
        var reasons = [String]()
        for g in groups where !g.failed.isEmpty {
            reasons.append(g.overall ? "\(esc(g.title.lowercased())): \(esc(g.failed[0].message))" : "\(esc(g.title.lowercased())) fails for \(g.failed.count) of \(g.checks.count)")
        }
        var s: String
        if r.input.aborted == true {
            // Issue 40: an aborted run has no verdict; its checks are shown for what was logged.
            s = "<div class=\"verdict va\"><div class=\"badge\"><b class=\"aborted\">ABORTED</b>"
            s += "<span>no verdict</span><span class=\"small\">the run was aborted: its logs stop early, so the checks below (\(passed) of \(r.checks.count) hold) judge nothing</span>"
        } else {
            s = "<div class=\"verdict \(r.passed ? "vp" : "vf")\"><div class=\"badge\"><b class=\"\(r.passed ? "pass" : "fail")\">\(r.passed ? "PASS" : "FAIL")</b>"
            s += "<span>\(passed) of \(r.checks.count) checks passed</span>"
            s += r.passed ? "<span class=\"small\">every check of the plan's thresholds holds</span>" : "<span class=\"small\">because: \(reasons.joined(separator: "; "))</span>"
        }
        s += "</div><table class=\"checks\"><tr><th class=\"l\">check (strict mode)</th><th class=\"l\">requires</th><th>result</th><th class=\"l\">failing (worst first), or closest to the limit</th></tr>"
        for g in groups {
            let failed = naturallySorted(g.failed, by: \.subject)
            let ok = failed.isEmpty
            let result = g.overall ? esc(g.checks[0].value.map { f($0, 2) } ?? "none") + (g.checks[0].name.lowercased().contains("pct") || ["detection", "continuity"].contains(g.checks[0].name) ? "%" : "")
                : ok ? "all \(g.checks.count) pass" : "\(failed.count) of \(g.checks.count) fail"
            var detail = ""
            if ok, !g.overall, g.checks.count > 1, g.checks[0].name != "detected",
               let closest = naturallySorted(g.checks, by: \.subject).filter({ $0.value?.isFinite == true }).min(by: { abs($0.value! - $0.limit) < abs($1.value! - $1.limit) }) {
                detail = "closest to the limit: \(esc(closest.subject)): \(esc(closest.message))"
            }
            if !ok {
                if g.overall { detail = esc(failed[0].message) } else {
                    // The worst value first (farthest from its limit), then the first in natural order.
                    let worst = failed.max { a, b in abs((a.value ?? .infinity) - a.limit) < abs((b.value ?? .infinity) - b.limit) } ?? failed[0]
                    detail = "worst: \(esc(worst.subject)): \(esc(worst.message))"
                    let others = failed.filter { $0.subject != worst.subject }.prefix(3).map { esc($0.subject) }
                    if !others.isEmpty { detail += "<br>also: " + others.joined(separator: ", ") + (failed.count > 4 ? ", … (<a href=\"#failed\">all</a>)" : "") }
                }
            }
            s += "<tr><td class=\"l\"><span class=\"\(ok ? "pass" : "fail")\">\(ok ? "✓" : "✗")</span> \(esc(g.title))</td><td class=\"l\">\(esc(g.requirement))</td><td class=\"\(ok ? "" : "fail")\">\(result)</td><td class=\"l\">\(detail)</td></tr>"
        }
        return s + "</table></div>"
    }

    static func headlineCards(_ r: AnalysisResult) -> String {
        var h = "<div class=\"cards\">"
        for m in [r.strict, r.herald] {
            let judged = m.mode == .strict
            h += "<div class=\"card\"><span class=\"small\">\(m.mode) mode\(judged ? " (judged)" : " (Herald's script)")</span>"
            h += "<b>\(f(m.detectionpct))% detection</b>\(m.achieveddetections) of \(m.maxpairs) ordered pairs seen at least once <span class=\"small\">(100% is best)</span><br>"
            h += "<b>\(f(m.continuitypct, 3))% continuity</b>\(m.achievedwindows) of \(m.maxwindows) pair-windows of 30 s with an observation <span class=\"small\">(100% is best)</span><br>"
            h += "<b class=\"sub\">longevity change \(f(m.longevity, 4))</b><span class=\"small\">missed windows, % points: first hour against last hour (0 is best; Herald publishes 100 − this = \(f(100 - m.longevity, 4)))\(r.parameters.cetotal < 240 ? "; this contact event is under 2 h, so the hours overlap and the figure says little" : "")</span></div>"
        }
        return h + "</div>"
    }

    /// Durations in seconds shown with a unit (ms below 1 s). A value from outside that is not a
    /// number of seconds is –; one beyond Int64's range is written as it is (issue 36).
    static func seconds(_ v: Double) -> String {
        guard v.isFinite else { return "–" }
        guard abs(v) < 9.2e18 else { return String(format: "%g s", v) }
        if v > 0, v < 1 { return "\(Saturating.int((v * 1000).rounded())) ms" }
        let whole = Saturating.int(v)
        if v >= 3600, v.truncatingRemainder(dividingBy: 60) == 0 { return "\(whole / 3600) h " + String(format: "%02d min", (whole % 3600) / 60) }
        if v >= 120, v.truncatingRemainder(dividingBy: 60) == 0 { return "\(whole / 60) min" }
        return v == v.rounded() ? "\(whole) s" : String(format: "%.3f s", v)
    }

    static let durationKeys: Set<String> = ["advertInterval", "scanOn", "scanRest", "scanOff", "connectionTimeout", "purgeAfter", "connectLatency", "macRotation",
                                            "scanWindow", "scanInterval", "discoveryTime"]
    static let units: [String: String] = ["referencePower": "dBm", "sensitivity": "dBm", "txPower": "dBm", "shadowing": "dB"]

    static func setting(_ key: String, _ v: JSONValue) -> String {
        if case .number(let n) = v, n.isFinite {
            if durationKeys.contains(key) { return seconds(n) }
            if let u = units[key] { return "\(v) \(u)" }
        }
        if case .object(let o) = v { return o.keys.sorted().map { "\($0) \(setting($0, o[$0]!))" }.joined(separator: ", ") }
        return v.description
    }

    static func settingsSection(_ report: AnalysisReport) -> String {
        let r = report.result, ctx = report.charts.context, i = r.input
        var rows = [(String, String)]()
        // Rows without a value are left out (a plain folder of logs has no manifest).
        if let plan = i.plan { rows.append(("plan", plan + ((i.variant ?? "").isEmpty ? "" : " (variant \(i.variant!))") + (ctx.description.map { ": " + $0 } ?? ""))) }
        if let run = i.runId { rows.append(("run", "\(run) · \(ctx.mode?.rawValue ?? i.kind)\(i.createdAt.map { " · written \($0)" } ?? "")")) }
        if let seed = i.seed { rows.append(("seed", String(seed))) }
        var times = "contact event \(r.parameters.ceStart) to \(r.parameters.ceEnd) (\(r.parameters.cetotal) windows of 30 s)"
        if let d = ctx.duration { times = "duration \(seconds(d))" + (ctx.warmup.map { ", warm-up \(seconds($0))" } ?? "") + " · " + times }
        rows.append(("time", times))
        let radio = ctx.radio
        if let crowding = ctx.crowding { rows.append(("radio", (radio["kind"]?.text ?? "–") + " · crowding " + (crowding ? "on" : "off"))) }
        if case .object? = radio["crowding"] { rows.append(("crowding model", setting("crowding", radio["crowding"]!))) }
        let radioRest = radio.keys.filter { $0 != "kind" && $0 != "crowding" }.sorted()
        if !radioRest.isEmpty { rows.append(("radio settings", radioRest.map { "\($0) \(setting($0, radio[$0]!))" }.joined(separator: " · "))) }
        if let sensor = i.sensor, !sensor.isEmpty {
            let first = ["advertInterval", "scanOn", "scanRest", "scanOff"].filter { sensor[$0] != nil }
            let rest = sensor.keys.filter { !first.contains($0) }.sorted()
            rows.append(("sensor", (first + rest).map { "\($0) \(setting($0, sensor[$0]!))" }.joined(separator: " · ")))
        }
        let t = r.thresholds
        rows.append(("thresholds", "detection ≥ \(f(t.detectionPct, 1))% · continuity ≥ \(f(t.continuityPct, 1))% · each pair's continuity ≥ \(f(t.pairContinuityPct, 1))% · first detection ≤ \(seconds(t.timeToFirstDetection)) · first read ≤ \(seconds(t.timeToFirstRead))"))
        if let c = i.controllers, !c.isEmpty { rows.append(("controllers", "\(c.count) node(s) with a controller identity (in summary.json)")) }
        rows.append(("input", "\(i.kind) \(i.path)"))
        var s = "<table class=\"settings\">" + rows.map { "<tr><th class=\"l\">\(esc($0.0))</th><td class=\"l\">\(esc($0.1))</td></tr>" }.joined() + "</table>"
        if ctx.nodes.isEmpty && i.kind == "folder" { s += "<p class=\"small\">A plain folder of logs: no manifest, so no plan settings, positions or node states.</p>" }
        if let text = ctx.planText, !text.isEmpty {
            s += "<details><summary>the plan file as submitted</summary><pre>\(esc(String(text.prefix(20_000))))</pre></details>"
        }
        return s
    }

    static func linksLine() -> String {
        let files = ["summary.json", "pairs.csv", "junit.xml", "formal-summary.csv", "formal-continuity.csv", "summary-discovery-pairs.csv"]
        return "<p class=\"links\">Machine-readable, in this folder: " + files.map { "<a href=\"\($0)\">\($0)</a>" }.joined(separator: " · ") + "</p>"
    }

    /// h:mm:ss of run time.
    static func runTimeText(_ s: Double) -> String {
        guard s.isFinite else { return "–" }
        // Saturated (a time from outside can be 1e300), and its magnitude unsigned: abs(Int.min) traps.
        let t = Saturating.int(s.rounded()), sign = t < 0 ? "−" : "", a = t.magnitude
        return "\(sign)\(a / 3600):" + String(format: "%02d:%02d", Int(a % 3600 / 60), Int(a % 60))
    }

    /// Nodes that are not complete, with the coordinator's message and every gap's reason.
    static func nodeStatesSection(_ report: AnalysisReport, _ m: ReportModel) -> String {
        let ctx = report.charts.context
        guard !ctx.nodes.isEmpty else { return "" }
        let origin = LogTime.parse(text: report.result.parameters.filterStart) ?? 0
        var rows = ""
        var count = 0
        for name in m.names {
            guard let node = ctx.nodes[name], node.state != .complete || !node.gaps.isEmpty || node.message != nil else { continue }
            count += 1
            var gaps = node.gaps.prefix(50).map { g in
                let from = g.from.map { runTimeText($0 - origin) } ?? "?", to = g.to.map { runTimeText($0 - origin) } ?? "the end"
                let length = g.from.flatMap { a in g.to.map { seconds(($0 - a).rounded()) } }.map { " (\($0))" } ?? ""
                return "\(esc(from))–\(esc(to))\(esc(length)): \(esc(g.reason))"
            }.joined(separator: "<br>")
            if node.gaps.count > 50 { gaps += "<br>… \(node.gaps.count - 50) more (manifest.json)" }
            rows += "<tr><td class=\"l\">\(esc(name))</td><td class=\"l \(node.state == .complete ? "" : "fail")\">\(esc(node.state?.rawValue ?? "–"))</td><td class=\"l\">\(esc(node.message ?? ""))</td><td class=\"l\">\(gaps.isEmpty ? "none recorded" : gaps)</td></tr>"
        }
        guard count > 0 else { return "<p>Every node is complete: the coordinator recorded no gap.</p>" }
        return "<p>\(count) node\(count == 1 ? "" : "s") not complete or with gaps (from the manifest; times in run time, h:mm:ss):</p><div class=\"scroll\"><table><tr><th class=\"l\">node</th><th class=\"l\">state</th><th class=\"l\">why</th><th class=\"l\">gaps: when and why</th></tr>" + rows + "</table></div>"
    }
}
