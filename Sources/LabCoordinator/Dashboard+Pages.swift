import Foundation
import Hummingbird
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabPlan

/// The dashboard's pages: Mustache templates (Sources/LabCoordinator/Dashboard/, loaded once by
/// `DashboardTemplates`) whose `{{x}}` escapes every piece of outside text (agents' names, URLs,
/// tags, messages, plans, dongles' evidence) with `OutsideText.html`; the style sheet and the
/// scripts are files served from /static/, so the Content-Security-Policy allows no inline script
/// or style. The code here builds each page's context (plain values) and nothing of its markup.
extension Dashboard {
    static func h(_ s: String) -> String { OutsideText.html(s) }

    /// A path segment for a link (names are checked where used, and still encoded here).
    static func segment(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// The pages' policy: scripts and style sheets from the coordinator only (/static/), none inline.
    static let pagePolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    /// A whole page: `template` (which fills in layout.mustache: the navigation, sign-out, the
    /// style sheet) with `context`, and `script` (a /static/ name) when the page is live.
    func page(_ template: String, _ title: String, _ s: DashboardSession, active: String, _ context: [String: Any] = [:], script: String? = nil,
              status: HTTPResponse.Status = .ok) -> Response {
        var c = context
        c["title"] = title
        c["csrf"] = s.csrf
        c["nav"] = [("Lab", "/lab"), ("Runs", "/runs"), ("Trends", "/trends")].map { name, href -> [String: Any] in ["name": name, "href": href, "on": name == active] }
        if let script { c["script"] = script }
        return Self.html(dashboard.templates.render(template, c), status: status)
    }

    /// A page of one line (a run that does not exist, an error).
    func messagePage(_ title: String, _ s: DashboardSession, active: String, text: String, id: String? = nil, cls: String? = nil, status: HTTPResponse.Status) -> Response {
        page("message", title, s, active: active, mustacheContext(["text": text, "id": id, "cls": cls]), status: status)
    }

    static func html(_ text: String, status: HTTPResponse.Status = .ok) -> Response {
        Response(status, headers: [
            "Content-Type": "text/html; charset=utf-8", "Content-Security-Policy": pagePolicy,
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store", "X-Frame-Options": "DENY",
        ], body: Data(text.utf8))
    }

    func signInPage(message: String?, status: HTTPResponse.Status) -> Response {
        Self.html(dashboard.templates.render("signin", mustacheContext(["message": message])), status: status)
    }

    /// GET /static/NAME: the style sheet and the scripts (`DashboardTemplates.staticFiles`, by
    /// name only), public (the sign-in page needs the style sheet; they hold nothing of the lab).
    func staticFile(_ name: String) throws -> Response {
        guard let type = DashboardTemplates.staticFiles[name], let data = dashboard.templates.files[name] else {
            throw LabRefusal(.notFound, "no static file \(HTTPService.escaped(name)) (\(DashboardTemplates.staticFiles.keys.sorted().joined(separator: ", ")))")
        }
        return Response(.ok, headers: ["Content-Type": type, "Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"], body: data)
    }

    static func age(_ seconds: Double?) -> String {
        guard let s = seconds, s.isFinite else { return "–" }
        if s < 120 { return String(format: "%.0f s", max(0, s)) }
        if s < 7200 { return String(format: "%.0f min", s / 60) }
        if s < 172_800 { return String(format: "%.1f h", s / 3600) }
        return String(format: "%.0f d", s / 86400)
    }

    /// A time as the pages show it (plain text: the template escapes it).
    static func time(_ t: Double?) -> String {
        guard let t else { return "–" }
        return HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: t))
    }

    // MARK: Lab

    func labPage(_ s: DashboardSession, notice: String? = nil) -> Response {
        let t = now
        let agents = agentViews.map { a -> [String: Any] in
            let held = a.status?.held ?? []
            return mustacheContext([
                "name": a.info.name, "state": a.state.rawValue, "url": a.info.url, "radio": a.info.radio.rawValue, "dongle": a.info.dongle?.name,
                "age": Self.age(a.lastSeen.map { t - $0 }),
                "run": a.status?.runId.map { ["href": "/runs/\(Self.segment($0))", "id": $0] },
                "heldCount": held.count, "heldAny": !held.isEmpty, "held": Array(held.prefix(5)), "heldMore": held.count > 5,
                "error": a.lastError.map { ["text": $0, "age": Self.age(a.lastErrorAt.map { t - $0 })] },
                "version": a.info.version, "tags": a.info.tags,
            ])
        }
        let dongles = dongleViews(history: 10)
        let order: [LabWire.DongleHealth] = [.bad, .maintenance, .unknown, .good, .retired]
        let groups = order.compactMap { health -> [String: Any]? in
            let group = dongles.filter { $0.health == health }
            guard !group.isEmpty else { return nil }
            return ["health": health.rawValue, "count": group.count, "dongles": group.map { d -> [String: Any] in
                mustacheContext([
                    "name": d.info.name, "id": d.id, "host": d.info.host ?? "–", "agent": d.info.agent ?? "–", "agentState": d.agentState ?? "", "busyWith": d.busyWith,
                    "since": Self.time(d.healthSince), "reason": d.healthReason ?? "–", "failures": d.failures, "outliers": d.outliers,
                    "historyCount": d.history.count,
                    "history": d.history.map { e in mustacheContext(["at": Self.time(e.at), "kind": e.kind.rawValue, "ok": e.ok, "message": e.message, "run": e.run, "evidence": e.evidence]) },
                    "actions": dongleActions(d),
                ])
            }]
        }
        let context = mustacheContext(["notice": notice, "summary": summaryContext(labSummary()), "agents": agents, "groups": groups])
        return page("lab", "Lab", s, active: "Lab", context, script: "list.js")
    }

    /// The operator's buttons on a dongle: each health it is not in (the form posts the session's CSRF token).
    func dongleActions(_ d: LabWire.DongleView) -> [[String: Any]] {
        let actions: [(LabWire.DongleHealth, String)] = [(.bad, "Quarantine"), (.unknown, "Release"), (.maintenance, "Maintenance")]
        return actions.filter { $0.0 != d.health }.map { health, label in
            ["action": "/dongles/\(Self.segment(d.id))/health", "health": health.rawValue, "label": label]
        }
    }

    // MARK: Runs

    /// Runs, newest first, 50 a page (`?page=N`), filtered by `?plan=`, `?state=` and
    /// `?verdict=` (pass, fail, infra, aborted, none); live (the strip, each run's state, a new
    /// run or verdict redraws the first page); with each run's duration and study.
    func runsPage(_ s: DashboardSession, query: [String: String] = [:]) -> Response {
        let plan = query["plan"].flatMap { $0.isEmpty ? nil : $0 }, state = query["state"].flatMap { $0.isEmpty ? nil : $0 }
        let verdict = query["verdict"].flatMap { $0.isEmpty ? nil : $0 }
        let pageNumber = max(1, min(Int(query["page"] ?? "") ?? 1, 100_000))
        let all = withLock { s in s.runs.values.sorted { $0.created > $1.created } }
        let plans = Set(all.map(\.plan)).sorted()
        let chosen = all.filter { r in
            (plan == nil || r.plan == plan) && (state == nil || r.state.rawValue == state) && (verdict == nil || Self.verdictWord(r) == verdict)
        }
        let pages = max(1, (chosen.count + Self.runsPerPage - 1) / Self.runsPerPage)
        let shown = chosen.dropFirst((min(pageNumber, pages) - 1) * Self.runsPerPage).prefix(Self.runsPerPage)
        func filter(_ name: String, _ values: [String], _ chosen: String?) -> [String: Any] {
            ["name": name, "options": values.map { ["value": $0, "selected": $0 == chosen] as [String: Any] }]
        }
        let first = pageNumber == 1 && plan == nil && state == nil && verdict == nil
        let t = now
        let rows = shown.map { r -> [String: Any] in
            let files = runFiles(r).filter { $0 != "formal-summary.csv" && $0 != "formal-continuity.csv" && $0 != "summary-discovery-pairs.csv" }
            let study = dashboard.studies.membership(r).map { m in ["href": Self.studyPath(m.study.name), "name": m.study.name, "level": m.level] }
            return mustacheContext([
                "id": r.id, "href": Self.dashboardPath(run: Self.segment(r.id)), "verdictWord": Self.verdictWord(r), "plan": r.plan, "study": study,
                "created": Self.time(r.created), "state": r.state.rawValue, "duration": Self.durationText(r, now: t), "verdict": Self.verdictContext(r),
                "headline": r.headline ?? r.message ?? "", "files": Self.fileLinks(r.id, files),
            ])
        }
        var paging: [String: Any]?
        if pages > 1 {
            func href(_ n: Int) -> String {
                var q = ["page=\(n)"]
                for (k, v) in [("plan", plan), ("state", state), ("verdict", verdict)] { if let v { q.append("\(k)=\(v.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")") } }
                return "/runs?" + q.joined(separator: "&")
            }
            let p = min(pageNumber, pages)
            paging = mustacheContext(["page": p, "pages": pages, "count": chosen.count, "newer": p > 1 ? href(p - 1) : nil, "older": p < pages ? href(p + 1) : nil])
        }
        let refusals = dashboard.refusals.recent(now: now).prefix(50).map { ["at": Self.time($0.at), "source": $0.source, "reason": $0.reason] }
        let context = mustacheContext([
            "summary": summaryContext(labSummary()),
            "filters": [filter("plan", plans, plan), filter("state", Self.runStates.map(\.rawValue), state), filter("verdict", ["pass", "fail", "infra", "aborted", "none"], verdict)],
            "first": first ? 1 : 0, "runs": rows, "empty": all.isEmpty ? "No runs yet." : "No run matches.", "paging": paging,
            "hasRefusals": !refusals.isEmpty, "refusals": Array(refusals),
        ])
        return page("runs", "Runs", s, active: "Runs", context, script: "list.js")
    }

    /// How long a run took (start to end), or how far it is while it runs; "–" before its start.
    static func durationText(_ r: RunRecord, now t: Double) -> String {
        guard let start = r.startAt else { return "–" }
        if let end = r.ended { return Self.age(max(0, end - start)) }
        if r.state.isFinal { return Self.age(r.duration) + " planned" }
        return t < start ? "starts in " + Self.age(start - t) : Self.age(min(t - start, r.duration)) + " of " + Self.age(r.duration)
    }

    /// A run's verdict as the Runs page shows it (issue 40): an aborted run has none, and a
    /// failed run with infrastructure faults is marked infra, not FAIL (verdict.mustache).
    static func verdictContext(_ r: RunRecord) -> [String: Any] {
        if r.state == .aborted || (r.abortRequested == true && r.bundle != nil) { return ["aborted": true] }
        guard let passed = r.passed else { return ["none": true] }
        return mustacheContext([passed ? "pass" : "fail": true, "infra": r.infra.map { $0.joined(separator: "; ") }])
    }

    /// The verdict as its page shows it.
    func verdictCell(_ r: RunRecord) -> String {
        dashboard.templates.render("verdict", ["verdict": Self.verdictContext(r)]).trimmingCharacters(in: .newlines)
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
        if let problem = LabName.queryProblem(lab) { throw LabRefusal(.invalid, "lab: \(problem)") }
        guard config.historyReader?.namesLabs == true else {
            throw LabRefusal(.invalid, "lab: this coordinator's history is its own history.sqlite (one lab); start it with --history postgres://… to read every lab's")
        }
        return lab
    }

    /// The cross-lab page's `plan` query parameter (required), validated as a lab name is.
    static func planParameter(_ query: [String: String]) throws -> String {
        guard let plan = query["plan"], !plan.isEmpty else { throw LabRefusal(.invalid, "plan: required (/trends/labs?plan=NAME)") }
        if let problem = LabName.queryProblem(plan) { throw LabRefusal(.invalid, "plan: \(problem.replacingOccurrences(of: "a lab name", with: "a plan name"))") }
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

    func trendsPage(_ s: DashboardSession, lab: String? = nil) async -> Response {
        let store: (any HistoryReading)?
        do { store = try historyReader() } catch {
            return messagePage("Trends", s, active: "Trends", text: "The history cannot be read: \(error)", cls: "fail", status: .internalServerError)
        }
        guard let store else {
            return page("trends", "Trends", s, active: "Trends", ["noFile": true, "studiesSection": studiesContext()])
        }
        let labs = lab.map { [$0] } ?? []
        let history: [LabRun]
        let known: [String]
        do {
            history = try await store.historyRuns(labs: labs, plan: nil, last: Self.trendsWindow)
            known = try await store.historyLabs()
        } catch {
            return messagePage("Trends", s, active: "Trends", text: "The history cannot be read: \(error)", cls: "fail", status: .internalServerError)
        }
        var context: [String: Any] = ["hasFile": true, "infraWindow": Self.infraWindow, "perLab": store.namesLabs]
        if store.namesLabs {
            // The lab filter (every lab, or one) and the cross-lab page of each plan; a name that
            // could not come back as a query parameter is shown, not linked.
            context["everyLab"] = lab == nil
            context["labs"] = known.prefix(100).map { l in
                mustacheContext(["name": l, "on": l == lab, "href": LabName.queryProblem(l) == nil ? "/trends?lab=\(Self.queryValue(l))" : nil])
            }
            let plans = Set(history.map(\.run.plan)).sorted()
            context["hasPlans"] = !plans.isEmpty
            context["plans"] = plans.prefix(50).map { p in
                mustacheContext(["name": p, "href": LabName.queryProblem(p) == nil ? "/trends/labs?plan=\(Self.queryValue(p))" : nil])
            }
        }
        do {
            let rates = try await store.historyInfraRates(labs: labs, last: Self.infraWindow)
            context["hasInfraRates"] = !rates.isEmpty
            context["infraRates"] = rates.map { r -> [String: Any] in
                ["testbed": r.testbed.isEmpty ? "(none)" : r.testbed, "infra": r.infra, "runs": r.runs, "rate": Format.number(100 * r.rate),
                 "lo": Format.number(100 * r.interval.lo), "hi": Format.number(100 * r.interval.hi)]
            }
        } catch {
            context["infraError"] = "\(error)"
        }
        let groups = Dictionary(grouping: history) { "\($0.lab)\u{1F}\($0.run.plan)\u{1F}\($0.run.variant)\u{1F}\($0.run.testbed)\u{1F}\($0.run.settingsKey)" }
        let newestFirst = groups.values.sorted { ($0.last?.run.id ?? 0) > ($1.last?.run.id ?? 0) }
        context["groups"] = newestFirst.prefix(12).compactMap { trendGroup($0, among: history, namesLab: store.namesLabs) }
        context["noRuns"] = groups.isEmpty
        if let lab { context["filteredLab"] = lab }
        context["studiesSection"] = studiesContext()
        return page("trends", "Trends", s, active: "Trends", context)
    }

    /// The cross-lab page (issue 41): one plan's runs, a table of each lab's latest level, then
    /// one section per lab (and per variant, testbed and settings within it).
    func crossLabPage(_ s: DashboardSession, plan: String) async throws -> Response {
        guard let store = config.historyReader, store.namesLabs else {
            throw LabRefusal(.invalid, "plan: labs side by side need the shared results store; start the coordinator with --history postgres://…")
        }
        let history: [LabRun]
        do { history = try await store.historyRuns(labs: [], plan: plan, last: Self.trendsWindow) } catch {
            return messagePage("Labs · \(plan)", s, active: "Trends", text: "The history cannot be read: \(error)", cls: "fail", status: .internalServerError)
        }
        let byLab = Dictionary(grouping: history, by: \.lab)
        var rows = [[String: Any]]()
        var sections = [[String: Any]]()
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
            rows.append(mustacheContext([
                "name": lab, "href": LabName.queryProblem(lab) == nil ? "/trends?lab=\(Self.queryValue(lab))" : nil,
                "runs": runs.count, "clean": clean.count, "makes": makes.isEmpty ? "–" : makes.joined(separator: "; "),
                "lastRun": last.runId, "lastAt": last.recordedAt, "detection": mean(\.detectionPct), "continuity": mean(\.continuityPct),
                "verdict": last.verdict,
            ]))
            let groups = Dictionary(grouping: runs) { "\($0.run.variant)\u{1F}\($0.run.testbed)\u{1F}\($0.run.settingsKey)" }
            let shown = groups.values.sorted(by: { ($0.last?.run.id ?? 0) > ($1.last?.run.id ?? 0) }).prefix(4)
            sections.append(["name": lab, "groups": shown.compactMap { trendGroup($0, among: history, namesLab: true) }])
        }
        let context: [String: Any] = ["plan": plan, "hasLabs": !rows.isEmpty, "noRuns": rows.isEmpty, "labRows": rows, "sections": sections]
        return page("crosslab", "Labs · \(plan)", s, active: "Trends", context)
    }

    /// A query parameter's value, percent-encoded.
    static func queryValue(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// One series (a lab's plan, variant, testbed and settings) as the trendgroup partial's
    /// context: a chart per headline metric with the band `regress` allows, its regressions,
    /// infra and aborted runs named.
    func trendGroup(_ runs: [LabRun], among history: [LabRun], namesLab: Bool) -> [String: Any]? {
        // Aborted runs have no verdict and are not plotted (issue 40): named below the charts.
        let aborted = runs.filter(\.run.aborted).map(\.run)
        let recent = Array(runs.filter { !$0.run.aborted }.suffix(30)).map(\.run)
        guard let first = recent.first ?? runs.first?.run, let lab = runs.first?.lab else { return nil }
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
        let differing = Self.differingSettings(first, among: history.filter { $0.lab == lab }.map(\.run))
        var charts = [String]()
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
            // SVG drawn from numbers, every label escaped by TrendChart (OutsideText.html); the
            // page's style sheet styles its text (no <style> in it: style-src 'self').
            charts.append(TrendChart.svg(title: m.label, points: points, domain: 0...(m.ceiling ?? .infinity), inlineStyle: false))
        }
        let regressed = recent.indices.filter { judgements[$0]?.verdict == .regression }.map { recent[$0].runId }
        let infra = recent.filter { !$0.infra.isEmpty }
        return mustacheContext([
            "lab": namesLab ? lab : nil,
            "plan": first.plan, "variant": first.variant.isEmpty ? nil : first.variant, "testbed": first.testbed.isEmpty ? nil : first.testbed,
            "hasDiffering": !differing.isEmpty, "differing": differing, "count": runs.count,
            "hasUnreadable": !unreadable.isEmpty, "unreadable": unreadable, "source": namesLab ? "the shared store" : "history.sqlite", "charts": charts,
            "hasRegressed": !regressed.isEmpty, "regressed": regressed,
            "hasInfra": !infra.isEmpty, "infra": infra.map { ["run": $0.runId, "why": String($0.infra.prefix(200))] },
            "hasAborted": !aborted.isEmpty, "aborted": aborted.suffix(30).map(\.runId),
        ])
    }
}
