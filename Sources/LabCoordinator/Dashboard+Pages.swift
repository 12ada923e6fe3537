import Foundation
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabPlan

/// The dashboard's pages: server-rendered HTML with inline CSS and (on the live page) one inline
/// script; no external asset, so it works offline. Every piece of outside text (agents' names,
/// URLs, tags, messages, plans, dongles' evidence) goes through `OutsideText.html`.
extension Coordinator {
    static func h(_ s: String) -> String { OutsideText.html(s) }

    /// A path segment for a link (names are checked where used, and still encoded here).
    static func segment(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    static let css = """
    body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
    header{background:#23395d;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
    header a{color:#fff;text-decoration:none;padding:4px 8px;border-radius:4px}header a.on{background:#3d5a80}
    header form{margin-left:auto}main{padding:12px 16px}
    table{border-collapse:collapse;margin:8px 0;background:#fff}td,th{border:1px solid #ddd;padding:3px 7px;font-size:13px;text-align:left;vertical-align:top}
    th{background:#f0f0f0}.num{text-align:right;font-variant-numeric:tabular-nums}
    .alive,.good,.pass,.complete{color:#1a7f37}.missing,.unknown,.maintenance,.gathering,.arming,.running{color:#9a6700}
    .lost,.bad,.fail,.failed,.aborted,.retired,.stale{color:#cf222e;font-weight:bold}
    .small{font-size:12px;color:#555}button{cursor:pointer}pre{white-space:pre-wrap;max-width:60em}
    .m td{width:16px;height:16px;padding:0;text-align:center}.m td.y{background:#2ca02c}.m td.n{background:#eee}.m td.s{background:#555}
    .strip td{width:6px;height:12px;padding:0}.strip td:first-child{width:auto;white-space:nowrap;padding:0 6px;font-size:12px}.strip td.y{background:#2ca02c}.strip td.n{background:#f3d0d0}.strip td.f{background:#fff}
    .better{color:#1a7f37;font-weight:600}.worse{color:#cf222e;font-weight:600}.same{color:#555}.inconclusive{color:#9a6700}.note{color:#666;font-size:12px}
    .legend .sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
    .noverdict,.infra{color:#6e7781;font-style:italic}.armed{color:#9a6700}
    .m th{font-weight:normal;font-size:11px;padding:2px 4px}.m th.v{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;padding:4px 1px}
    .strip tr.axis th{font-size:10px;font-weight:normal;text-align:left;padding:0 2px;background:none;border:0;border-left:1px solid #999;white-space:nowrap}
    .steps{display:inline-flex;gap:4px;list-style:none;padding:0;margin:4px 0;vertical-align:middle}.steps li{padding:2px 8px;border-radius:10px;background:#eee;color:#777;font-size:12px}
    .steps li.done{background:#d8eedd;color:#1a7f37}.steps li.ended{background:#f6d5d5;color:#cf222e}.steps li.current{background:#9a6700;color:#fff;font-weight:600}progress#bar{width:240px;vertical-align:middle}
    .charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.chart{background:#fff;border:1px solid #ddd}.chart .axis{stroke:#888}.chart text{font-size:10px;fill:#444}.chart text.ctitle{font-size:12px;fill:#222}
    .events td{font-size:12px}.warning{color:#9a6700}.error,.critical{color:#cf222e}
    """

    /// A whole page: the header with the navigation and sign-out, then `body`. `script` runs with
    /// the page's nonce (the Content-Security-Policy allows no other script).
    func page(_ title: String, _ s: DashboardSession, active: String, body: String, script: String? = nil, status: HTTPStatusCode = .ok) -> HTTPResponse {
        let nonce = DashboardSessions.randomToken().prefix(32)
        let nav = [("Lab", "/lab"), ("Runs", "/runs"), ("Trends", "/trends")].map { name, href in
            "<a href=\"\(href)\"\(name == active ? " class=\"on\"" : "")>\(name)</a>"
        }.joined()
        let html = """
        <!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>\(Self.h(title)) · HeraldLab</title>
        <meta name="viewport" content="width=device-width, initial-scale=1"><style>\(Self.css)</style></head>
        <body><header><strong>HeraldLab</strong>\(nav)<form method="post" action="/signout"><input type="hidden" name="csrf" value="\(s.csrf)"><button id="signout">Sign out</button></form></header>
        <main><h1>\(Self.h(title))</h1>\(body)</main>\(script.map { "<script nonce=\"\(nonce)\">\($0)</script>" } ?? "")</body></html>
        """
        return Self.html(html, status: status, nonce: String(nonce))
    }

    static func html(_ text: String, status: HTTPStatusCode = .ok, nonce: String? = nil) -> HTTPResponse {
        HTTPResponse(status, headers: [
            "Content-Type": "text/html; charset=utf-8",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'" + (nonce.map { "; script-src 'nonce-\($0)'" } ?? ""),
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store", "X-Frame-Options": "DENY",
        ], body: Data(text.utf8))
    }

    func signInPage(message: String?, status: HTTPStatusCode) -> HTTPResponse {
        Self.html("""
        <!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>Sign in · HeraldLab</title><style>\(Self.css)</style></head>
        <body><header><strong>HeraldLab</strong></header><main><h1>Sign in</h1>
        \(message.map { "<p class=\"fail\" id=\"error\">\(Self.h($0))</p>" } ?? "")
        <form method="post" action="/signin"><label>Operator credential <input type="password" name="credential" id="credential" autocomplete="current-password" autofocus></label>
        <button type="submit" id="signin">Sign in</button></form>
        <p class="small">The operator's token (the coordinator's --token-file). Agents' and scrape credentials do not sign in.</p></main></body></html>
        """, status: status)
    }

    static func age(_ seconds: Double?) -> String {
        guard let s = seconds, s.isFinite else { return "–" }
        if s < 120 { return String(format: "%.0f s", max(0, s)) }
        if s < 7200 { return String(format: "%.0f min", s / 60) }
        if s < 172_800 { return String(format: "%.1f h", s / 3600) }
        return String(format: "%.0f d", s / 86400)
    }

    static func time(_ t: Double?) -> String {
        guard let t else { return "–" }
        return h(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: t)))
    }

    // MARK: Lab

    func labPage(_ s: DashboardSession, notice: String? = nil) -> HTTPResponse {
        let t = now
        var body = notice.map { "<p class=\"notice\" id=\"notice\">\(Self.h($0))</p>" } ?? ""
        body += summaryStrip(labSummary())
        body += "<h2>Agents</h2><table id=\"agents\"><tr><th>agent</th><th>liveness</th><th>URL</th><th>radio</th><th>last heartbeat</th><th>run</th><th>runs held</th><th>last error</th><th>version, tags</th></tr>"
        let views = agentViews
        for a in views {
            let held = a.status?.held ?? []
            body += "<tr data-agent=\"\(Self.h(a.info.name))\"><td>\(Self.h(a.info.name))</td><td class=\"liveness \(a.state.rawValue)\">\(a.state.rawValue)</td><td>\(Self.h(a.info.url))</td><td>\(a.info.radio.rawValue)\(a.info.dongle.map { " · " + Self.h($0.name) } ?? "")</td>"
            body += "<td class=\"num age\">\(Self.age(a.lastSeen.map { t - $0 }))</td><td>\(a.status?.runId.map { "<a href=\"/runs/\(Self.segment($0))\">\(Self.h($0))</a>" } ?? "–")</td>"
            body += "<td>\(held.count)\(held.isEmpty ? "" : ": " + held.prefix(5).map(Self.h).joined(separator: ", ") + (held.count > 5 ? ", …" : ""))</td>"
            body += "<td>\(a.lastError.map { "\(Self.h($0)) <span class=\"small\">(\(Self.age(a.lastErrorAt.map { t - $0 })) ago)</span>" } ?? "–")</td>"
            body += "<td class=\"small\">\(Self.h(a.info.version)) \(a.info.tags.map(Self.h).joined(separator: ", "))</td></tr>"
        }
        if views.isEmpty { body += "<tr><td colspan=\"9\">No agent has registered.</td></tr>" }
        body += "</table>"
        let dongles = dongleViews(history: 10)
        body += "<h2>Dongles</h2>"
        if dongles.isEmpty { body += "<p id=\"nodongles\">No dongles (agents with a simulated radio have none).</p>" }
        let order: [LabWire.DongleHealth] = [.bad, .maintenance, .unknown, .good, .retired]
        for health in order {
            let group = dongles.filter { $0.health == health }
            guard !group.isEmpty else { continue }
            body += "<h3 class=\"\(health.rawValue)\">\(health.rawValue) (\(group.count))</h3><table class=\"dongles\"><tr><th>dongle</th><th>host · agent</th><th>since</th><th>why</th><th>failures, outliers</th><th>history (newest first)</th><th>operator</th></tr>"
            for d in group {
                body += "<tr><td>\(Self.h(d.info.name))<br><span class=\"small\">\(Self.h(d.id))</span></td><td>\(Self.h(d.info.host ?? "–")) · \(Self.h(d.info.agent ?? "–")) <span class=\"small\">\(Self.h(d.agentState ?? ""))\(d.busyWith.map { ", busy with " + Self.h($0) } ?? "")</span></td>"
                body += "<td class=\"small\">\(Self.time(d.healthSince))</td><td>\(Self.h(d.healthReason ?? "–"))</td><td class=\"num\">\(d.failures), \(d.outliers)</td><td><details><summary>\(d.history.count) events</summary><table>"
                for e in d.history {
                    body += "<tr><td class=\"small\">\(Self.time(e.at))</td><td>\(e.kind.rawValue)</td><td class=\"\(e.ok ? "pass" : "fail")\">\(e.ok ? "ok" : "failed")</td><td>\(Self.h(e.message))\(e.run.map { " (run \(Self.h($0)))" } ?? "")\(e.evidence.map { "<details><summary>evidence</summary><pre>\(Self.h($0))</pre></details>" } ?? "")</td></tr>"
                }
                body += "</table></details></td><td>\(dongleButtons(d, s))</td></tr>"
            }
            body += "</table>"
        }
        return page("Lab", s, active: "Lab", body: body, script: Self.listScript)
    }

    func dongleButtons(_ d: LabWire.DongleView, _ s: DashboardSession) -> String {
        let actions: [(LabWire.DongleHealth, String)] = [(.bad, "Quarantine"), (.unknown, "Release"), (.maintenance, "Maintenance")]
        return actions.filter { $0.0 != d.health }.map { health, label in
            "<form method=\"post\" action=\"/dongles/\(Self.h(Self.segment(d.id)))/health\"><input type=\"hidden\" name=\"csrf\" value=\"\(s.csrf)\"><input type=\"hidden\" name=\"health\" value=\"\(health.rawValue)\"><input name=\"reason\" placeholder=\"reason\" size=\"12\"> <button>\(label)</button></form>"
        }.joined()
    }

    // MARK: Runs

    /// Runs, newest first, 50 a page (`?page=N`), filtered by `?plan=`, `?state=` and
    /// `?verdict=` (pass, fail, infra, aborted, none); live (the strip, each run's state, a new
    /// run or verdict redraws the first page); with each run's duration and study.
    func runsPage(_ s: DashboardSession, query: [String: String] = [:]) -> HTTPResponse {
        let plan = query["plan"].flatMap { $0.isEmpty ? nil : $0 }, state = query["state"].flatMap { $0.isEmpty ? nil : $0 }
        let verdict = query["verdict"].flatMap { $0.isEmpty ? nil : $0 }
        let pageNumber = max(1, min(Int(query["page"] ?? "") ?? 1, 100_000))
        let all = withLock { runs.values.sorted { $0.created > $1.created } }
        let plans = Set(all.map(\.plan)).sorted()
        let chosen = all.filter { r in
            (plan == nil || r.plan == plan) && (state == nil || r.state.rawValue == state) && (verdict == nil || Self.verdictWord(r) == verdict)
        }
        let pages = max(1, (chosen.count + Self.runsPerPage - 1) / Self.runsPerPage)
        let shown = chosen.dropFirst((min(pageNumber, pages) - 1) * Self.runsPerPage).prefix(Self.runsPerPage)
        var body = summaryStrip(labSummary())
        // Filters: a plain GET form (no state changes, no CSRF token needed).
        func options(_ name: String, _ values: [String], _ chosen: String?) -> String {
            "<select name=\"\(name)\" id=\"f-\(name)\"><option value=\"\">any \(name)</option>" + values.map {
                "<option value=\"\(Self.h($0))\"\($0 == chosen ? " selected" : "")>\(Self.h($0))</option>"
            }.joined() + "</select>"
        }
        body += "<form method=\"get\" action=\"/runs\" id=\"filters\">" + options("plan", plans, plan) + " " + options("state", Self.runStates.map(\.rawValue), state)
            + " " + options("verdict", ["pass", "fail", "infra", "aborted", "none"], verdict) + " <button>Show</button></form>"
        let first = pageNumber == 1 && plan == nil && state == nil && verdict == nil
        body += "<table id=\"runs\" data-first=\"\(first ? 1 : 0)\"><tr><th>run</th><th>plan</th><th>study</th><th>created</th><th>state</th><th>duration</th><th>verdict</th><th>headline</th><th>files</th></tr>"
        let t = now
        for r in shown {
            let link = "<a href=\"\(Self.dashboardPath(run: Self.segment(r.id)))\">\(Self.h(r.id))</a>"
            var files = [String]()
            let report = config.results.appendingPathComponent(r.id).appendingPathComponent("report")
            for name in ["report.html", "junit.xml", "summary.json", "pairs.csv"] where FileManager.default.fileExists(atPath: report.appendingPathComponent(name).path) {
                files.append("<a href=\"/runs/\(Self.segment(r.id))/files/\(name)\">\(name)</a>")
            }
            if r.bundle != nil, [.complete, .aborted].contains(r.state) { files.append("<a href=\"/runs/\(Self.segment(r.id))/files/bundle.tar.gz\">bundle</a>") }
            let study = dashboard.studies.membership(r).map { m in
                "<a href=\"/studies/\(Self.segment(m.study.name))\">\(Self.h(m.study.name))</a> <span class=\"small\">\(Self.h(m.level))</span>"
            } ?? "–"
            body += "<tr data-run=\"\(Self.h(r.id))\" data-verdict=\"\(Self.verdictWord(r))\"><td>\(link)</td><td>\(Self.h(r.plan))</td><td>\(study)</td><td class=\"small\">\(Self.time(r.created))</td>"
            body += "<td class=\"state \(r.state.rawValue)\">\(r.state.rawValue)</td><td class=\"num\">\(Self.durationText(r, now: t))</td><td>\(Self.verdictCell(r))</td>"
            body += "<td class=\"small\">\(Self.h(r.headline ?? r.message ?? ""))</td><td>\(files.joined(separator: " · "))</td></tr>"
        }
        if shown.isEmpty { body += "<tr><td colspan=\"9\">\(all.isEmpty ? "No runs yet." : "No run matches.")</td></tr>" }
        body += "</table>"
        if pages > 1 {
            func href(_ n: Int) -> String {
                var q = ["page=\(n)"]
                for (k, v) in [("plan", plan), ("state", state), ("verdict", verdict)] { if let v { q.append("\(k)=\(v.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")") } }
                return "/runs?" + q.joined(separator: "&amp;")
            }
            let p = min(pageNumber, pages)
            body += "<p id=\"paging\">page \(p) of \(pages) (\(chosen.count) runs)" + (p > 1 ? " · <a href=\"\(href(p - 1))\" id=\"newer\">newer</a>" : "")
                + (p < pages ? " · <a href=\"\(href(p + 1))\" id=\"older\">older</a>" : "") + "</p>"
        }
        body += refusalsTable()
        return page("Runs", s, active: "Runs", body: body, script: Self.listScript)
    }

    /// How long a run took (start to end), or how far it is while it runs; "–" before its start.
    static func durationText(_ r: RunRecord, now t: Double) -> String {
        guard let start = r.startAt else { return "–" }
        if let end = r.ended { return Self.age(max(0, end - start)) }
        if r.state.isFinal { return Self.age(r.duration) + " planned" }
        return t < start ? "starts in " + Self.age(start - t) : Self.age(min(t - start, r.duration)) + " of " + Self.age(r.duration)
    }

    /// A run's verdict as the Runs page shows it (issue 40): an aborted run has none, and a
    /// failed run with infrastructure faults is marked infra, not FAIL.
    static func verdictCell(_ r: RunRecord) -> String {
        if r.state == .aborted || (r.abortRequested == true && r.bundle != nil) { return "<span class=\"noverdict\">aborted</span>" }
        guard let passed = r.passed else { return "–" }
        let infra = r.infra.map { "<span class=\"infra\" title=\"\(h($0.joined(separator: "; ")))\">infra</span>" }
        if passed { return "<span class=\"pass\">PASS</span>" + (infra.map { " " + $0 } ?? "") }
        return infra ?? "<span class=\"fail\">FAIL</span>"
    }

    // MARK: Trends

    /// The settings of `run`'s series that differ from those of its plan's other series
    /// (same plan and variant, other settings), as `key=value`.
    static func differingSettings(_ run: HistoryStore.Run, among history: [HistoryStore.Run]) -> [String] {
        func parse(_ key: String) -> [String: String] {
            Dictionary(key.split(separator: "\u{1F}").compactMap { part -> (String, String)? in
                let kv = part.split(separator: "=", maxSplits: 1)
                return kv.count == 2 ? (String(kv[0]), String(kv[1])) : nil
            }, uniquingKeysWith: { a, _ in a })
        }
        let others = Set(history.filter { $0.plan == run.plan && $0.variant == run.variant && $0.settingsKey != run.settingsKey }.map(\.settingsKey))
        guard !others.isEmpty else { return [] }
        let mine = parse(run.settingsKey)
        let theirs = others.map(parse)
        let keys = Set(mine.keys).union(theirs.flatMap(\.keys))
        return keys.sorted().filter { k in theirs.contains { $0[k] != mine[k] } }.map { "\($0)=\(mine[$0] ?? "(unset)")" }
    }

    /// The Trends page's `lab` query parameter: nil when absent or empty; a name no lab can
    /// have here, or any lab on a coordinator without the shared store: 400 naming the field.
    func labParameter(_ query: [String: String]) throws -> String? {
        guard let lab = query["lab"], !lab.isEmpty else { return nil }
        if let problem = LabName.queryProblem(lab) { throw HTTPError(.badRequest, "lab: \(problem)") }
        guard config.historyReader?.namesLabs == true else {
            throw HTTPError(.badRequest, "lab: this coordinator's history is its own history.sqlite (one lab); start it with --history postgres://… to read every lab's")
        }
        return lab
    }

    /// The cross-lab page's `plan` query parameter (required), validated as a lab name is.
    static func planParameter(_ query: [String: String]) throws -> String {
        guard let plan = query["plan"], !plan.isEmpty else { throw HTTPError(.badRequest, "plan: required (/trends/labs?plan=NAME)") }
        if let problem = LabName.queryProblem(plan) { throw HTTPError(.badRequest, "plan: \(problem.replacingOccurrences(of: "a lab name", with: "a plan name"))") }
        return plan
    }

    /// The history the Trends pages read: the shared store, else results/history.sqlite (nil
    /// when it does not exist yet).
    func historyReader() throws -> (any HistoryReading)? {
        if let shared = config.historyReader { return shared }
        let url = config.results.appendingPathComponent("history.sqlite")
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        return try HistoryStore(url: url)
    }

    /// The newest runs the Trends pages read (each series shows its last 30): bounded however
    /// long the history, or the shared store's many labs, grow.
    static let trendsWindow = 5000

    func trendsPage(_ s: DashboardSession, lab: String? = nil) async -> HTTPResponse {
        let store: (any HistoryReading)?
        do { store = try historyReader() } catch {
            return page("Trends", s, active: "Trends", body: "<p class=\"fail\">The history cannot be read: \(Self.h("\(error)"))</p>", status: .internalServerError)
        }
        guard let store else {
            return page("Trends", s, active: "Trends", body: "<p id=\"nohistory\">No history yet: each analysed run adds to results/history.sqlite.</p>" + studiesSection())
        }
        let labs = lab.map { [$0] } ?? []
        let history: [LabRun]
        let known: [String]
        do {
            history = try await store.historyRuns(labs: labs, plan: nil, last: Self.trendsWindow)
            known = try await store.historyLabs()
        } catch {
            return page("Trends", s, active: "Trends", body: "<p class=\"fail\">The history cannot be read: \(Self.h("\(error)"))</p>", status: .internalServerError)
        }
        var body = ""
        if store.namesLabs {
            // The lab filter: every lab, or one; and the cross-lab page of each plan.
            body += "<p id=\"labs\">Lab: " + (lab == nil ? "<b>every lab</b>" : "<a href=\"/trends\">every lab</a>")
                + known.prefix(100).map { l in l == lab ? " · <b>\(Self.h(l))</b>" : (LabName.queryProblem(l) == nil ? " · <a href=\"/trends?lab=\(Self.queryValue(l))\">\(Self.h(l))</a>" : " · \(Self.h(l))") }.joined()
                + "</p>"
            let plans = Set(history.map(\.run.plan)).sorted()
            if !plans.isEmpty {
                body += "<p id=\"crosslab\">Labs side by side: " + plans.prefix(50).map { p in
                    LabName.queryProblem(p) == nil ? "<a href=\"/trends/labs?plan=\(Self.queryValue(p))\">\(Self.h(p))</a>" : Self.h(p)
                }.joined(separator: " · ") + "</p>"
            }
        }
        do {
            let rates = try await store.historyInfraRates(labs: labs, last: Self.infraWindow)
            if !rates.isEmpty {
                body += "<p id=\"infrarate\">Infrastructure faults per testbed (its last \(Self.infraWindow) runs; a node not complete, gaps, dongle recoveries): "
                    + rates.map { r in
                        let ci = r.interval
                        return "<b>\(Self.h(r.testbed.isEmpty ? "(none)" : r.testbed))</b> \(r.infra) of \(r.runs) (\(Format.number(100 * r.rate)) %, 95 % CI \(Format.number(100 * ci.lo))–\(Format.number(100 * ci.hi)) %)"
                    }.joined(separator: "; ") + "</p>"
            }
        } catch {
            body += "<p class=\"fail\">The infra rate cannot be read from the history: \(Self.h("\(error)"))</p>"
        }
        body += "<p class=\"small\">Each headline metric per \(store.namesLabs ? "lab, " : "")plan, variant and testbed, oldest run first. The band is the noise the regression check allows (the prediction bound from the runs before, as <code>herald-lab regress</code> judges); red points are regressions.</p>"
        let groups = Dictionary(grouping: history) { "\($0.lab)\u{1F}\($0.run.plan)\u{1F}\($0.run.variant)\u{1F}\($0.run.testbed)\u{1F}\($0.run.settingsKey)" }
        let newestFirst = groups.values.sorted { ($0.last?.run.id ?? 0) > ($1.last?.run.id ?? 0) }
        for runs in newestFirst.prefix(12) {
            body += trendSection(runs, among: history, namesLab: store.namesLabs, source: store.historyName)
        }
        if groups.isEmpty { body += "<p id=\"nohistory\">No runs in the history\(lab.map { " of lab " + Self.h($0) } ?? "") yet.</p>" }
        return page("Trends", s, active: "Trends", body: body + studiesSection())
    }

    /// The cross-lab page (issue 41): one plan's runs, one section per lab (and per variant,
    /// testbed and settings within it), after a table of each lab's latest level.
    func crossLabPage(_ s: DashboardSession, plan: String) async throws -> HTTPResponse {
        guard let store = config.historyReader, store.namesLabs else {
            throw HTTPError(.badRequest, "plan: labs side by side need the shared results store; start the coordinator with --history postgres://…")
        }
        let history: [LabRun]
        do { history = try await store.historyRuns(labs: [], plan: plan, last: Self.trendsWindow) } catch {
            return page("Labs · \(plan)", s, active: "Trends", body: "<p class=\"fail\">The history cannot be read: \(Self.h("\(error)"))</p>", status: .internalServerError)
        }
        var body = "<h2>Plan \(Self.h(plan)): every lab's nights</h2>"
        let byLab = Dictionary(grouping: history, by: \.lab)
        guard !byLab.isEmpty else {
            return page("Labs · \(plan)", s, active: "Trends", body: body + "<p id=\"nohistory\">No lab has runs of this plan.</p>")
        }
        body += "<table id=\"labtable\"><tr><th>lab</th><th>runs</th><th>clean</th><th>dongle makes</th><th>last run</th><th>mean detection % (last 10 clean)</th><th>mean continuity % (last 10 clean)</th><th>last verdict</th></tr>"
        for lab in byLab.keys.sorted() {
            let runs = byLab[lab]!
            let clean = runs.filter(\.run.isClean)
            let recent = clean.suffix(10)
            func mean(_ f: (HistoryStore.Run) -> Double) -> String {
                let v = recent.map { f($0.run) }.filter(\.isFinite)
                return v.isEmpty ? "–" : Format.number(v.reduce(0, +) / Double(v.count))
            }
            let makes = Set(runs.map(\.dongleMake).filter { !$0.isEmpty }).sorted()
            let last = runs.last!.run
            body += "<tr class=\"lab\"><td><a href=\"/trends?lab=\(Self.queryValue(lab))\">\(Self.h(lab))</a></td><td class=\"num\">\(runs.count)</td><td class=\"num\">\(clean.count)</td>"
                + "<td>\(makes.isEmpty ? "–" : Self.h(makes.joined(separator: "; ")))</td><td>\(Self.h(last.runId)) (\(Self.h(last.recordedAt)))</td>"
                + "<td class=\"num\">\(mean(\.detectionPct))</td><td class=\"num\">\(mean(\.continuityPct))</td><td>\(Self.h(last.verdict))</td></tr>"
        }
        body += "</table><p class=\"small\">Each lab is judged against its own nights only (<code>herald-lab regress --history</code>); <code>herald-lab compare --history … --lab A --lab B --plan \(Self.h(plan))</code> compares two labs with intervals.</p>"
        for lab in byLab.keys.sorted() {
            body += "<h2 class=\"labsection\">Lab \(Self.h(lab))</h2>"
            let groups = Dictionary(grouping: byLab[lab]!) { "\($0.run.variant)\u{1F}\($0.run.testbed)\u{1F}\($0.run.settingsKey)" }
            for runs in groups.values.sorted(by: { ($0.last?.run.id ?? 0) > ($1.last?.run.id ?? 0) }).prefix(4) {
                body += trendSection(runs, among: history, namesLab: true, source: store.historyName)
            }
        }
        return page("Labs · \(plan)", s, active: "Trends", body: body)
    }

    /// A query parameter's value, percent-encoded.
    static func queryValue(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// One series (a lab's plan, variant, testbed and settings): a chart per headline metric
    /// with the band `regress` allows, its regressions, infra and aborted runs named.
    func trendSection(_ runs: [LabRun], among history: [LabRun], namesLab: Bool, source: String) -> String {
        var body = ""
        // Aborted runs have no verdict and are not plotted (issue 40): named below the charts.
        let aborted = runs.filter(\.run.aborted).map(\.run)
        let recent = Array(runs.filter { !$0.run.aborted }.suffix(30)).map(\.run)
        guard let first = recent.first ?? runs.first?.run, let lab = runs.first?.lab else { return "" }
        var results = [AnalysisResult?]()
        var unreadable = [String]()
        for r in recent {
            do { results.append(try r.decodedSummary()) } catch {
                // A stored row that does not decode is named on the page, never left out unsaid.
                results.append(nil)
                unreadable.append("run \(r.runId) (history row \(r.id.map(String.init) ?? "?")): \(error)")
            }
        }
        // Each run judged against up to 10 runs before it, as `regress --baseline history` would.
        var judgements = [Regression.Judgement?]()
        for i in recent.indices {
            guard let current = results[i] else { judgements.append(nil); continue }
            let before = results[max(0, i - 10)..<i].compactMap { $0 }
            judgements.append(before.isEmpty ? nil : Regression.judge(current: current, history: before, tolerancePct: current.thresholds.regressionTolerancePct))
        }
        // Each point links to its run's page when the coordinator has the run.
        let links = recent.map { r -> String? in run(r.runId) != nil ? "/runs/\(Self.segment(r.runId))" : nil }
        // A plan charted with several settings: each series is named by the settings that
        // differ between them (advertInterval=100ms vs 1s), not only by the plan.
        let differing = Self.differingSettings(first, among: history.filter { $0.lab == lab }.map(\.run)).map { Self.h($0) }.joined(separator: ", ")
        body += "<h2>\(namesLab ? "<span class=\"lab\">lab " + Self.h(lab) + "</span> · " : "")\(Self.h(first.plan))\(first.variant.isEmpty ? "" : " · " + Self.h(first.variant))\(first.testbed.isEmpty ? "" : " · testbed " + Self.h(first.testbed))\(differing.isEmpty ? "" : " · <span class=\"settings\">" + differing + "</span>") <span class=\"small\">(\(runs.count) runs)</span></h2>"
        if !unreadable.isEmpty {
            body += "<p class=\"fail unreadable\">Left out of the chart and the band, their stored summaries cannot be read (\(Self.h(namesLab ? "the shared store" : "history.sqlite"))): " + unreadable.map { Self.h($0) }.joined(separator: "; ") + "</p>"
        }
        body += "<div class=\"trend\">"
        for m in Metric.allCases {
            let points = recent.indices.map { i -> TrendChart.Point in
                let finding = judgements[i]?.findings.first { $0.metric == m.rawValue }
                let value = results[i].flatMap { Regression.value($0, m) }
                var lo: Double?, hi: Double?
                if let b = finding?.baseline, let bound = finding?.bound, b.isFinite, bound.isFinite { lo = min(bound, 2 * b - bound); hi = max(bound, 2 * b - bound) }
                let infra = recent[i].infra.isEmpty ? nil : recent[i].infra
                return TrendChart.Point(label: recent[i].runId, value: value, bandLow: infra == nil ? lo : nil, bandHigh: infra == nil ? hi : nil,
                                        regressed: infra == nil && (finding?.regressed ?? false), infra: infra,
                                        at: AnalysisTime.parse(recent[i].recordedAt), link: links[i])
            }
            guard points.contains(where: { $0.value != nil }) else { continue }
            body += TrendChart.svg(title: m.label, points: points, domain: 0...(m.ceiling ?? .infinity))
        }
        let regressed = recent.indices.filter { judgements[$0]?.verdict == .regression }.map { Self.h(recent[$0].runId) }
        body += "</div><p>Regressions: \(regressed.isEmpty ? "none" : "<span class=\"fail\">" + regressed.joined(separator: ", ") + "</span>")</p>"
        let infra = recent.filter { !$0.infra.isEmpty }
        if !infra.isEmpty {
            body += "<p class=\"infra\">Infrastructure faults (grey rings; not in the line, the band or the scale): " + infra.map { "\(Self.h($0.runId)) (\(Self.h(String($0.infra.prefix(200)))))" }.joined(separator: "; ") + "</p>"
        }
        if !aborted.isEmpty {
            body += "<p class=\"noverdict aborted-runs\">Aborted, no verdict (not plotted): " + aborted.suffix(30).map { Self.h($0.runId) }.joined(separator: ", ") + "</p>"
        }
        return body
    }
}
