import Foundation
import Hummingbird
import HeraldCore
import LabHTTP
import LabPlan
import Logging

/// What the dashboard keeps: the signed-in browsers, the live runs' pairs x time strips and
/// counts over time, and each run's lines of the coordinator's log.
final class DashboardState: Sendable {
    let sessions = DashboardSessions()
    let strips = LiveStrips()
    let series = LiveSeries()
    let events = RunEvents()
    let studies = StudyCache()
    let refusals = Refusals()
    /// The pages' templates, style sheet and scripts (`DashboardTemplates`): a coordinator does
    /// not start without them.
    let templates: DashboardTemplates

    init() throws {
        templates = try DashboardTemplates.shared()
    }
}

/// The dashboard (docs/API.md, "Dashboard"): pages for the operator's browser on the
/// coordinator's own port. Its routes are public to `HTTPService` (a browser sends no bearer
/// token) and every handler checks the session cookie itself: a stranger gets a redirect to the
/// sign-in page from a page and 401 from a data, event or download route, never lab data. Forms
/// that change state carry the session's CSRF token (403 without it) and are refused from
/// another origin.
///
/// The dashboard's HTTP edge, given the coordinator (unowned: the coordinator owns its HTTP
/// service, whose router holds these handlers); its pages are the `Dashboard` read-model's.
struct DashboardRoutes: Sendable {
    unowned let coordinator: Coordinator

    var config: Coordinator.Config { coordinator.config }
    var http: HTTPService { coordinator.http }
    var dashboard: DashboardState { coordinator.dashboard }
    var pages: Dashboard { coordinator.pages }
    var logger: Logger { coordinator.logger }
    var identities: IdentityService { coordinator.identities }
    var now: Double { coordinator.now }
    func run(_ id: String) -> RunRecord? { coordinator.run(id) }

    /// The dashboard's routes as (method, pattern), for tests that try each one as a stranger.
    static let dashboardRouteList: [(String, String)] = [
        ("GET", "/"), ("POST", "/signin"), ("POST", "/signout"), ("GET", "/lab"), ("GET", "/runs"), ("GET", "/trends"),
        ("GET", "/trends/labs"), ("GET", "/studies/:name"),
        ("GET", "/runs/:id"), ("GET", "/runs/:id/events"), ("GET", "/runs/:id/files/:name"),
        ("POST", "/runs/:id/abort"), ("POST", "/dongles/:dongle/health"), ("GET", "/favicon.ico"), ("GET", "/events/lab"),
        ("GET", "/static/:name"),
    ]

    var sessionSecure: Bool { config.tls != nil }

    /// On the router itself, not behind its bearer authentication (a browser sends none): each
    /// page checks the session cookie.
    func register(_ routes: HTTPService.Routes) {
        let formLimit = 16 * 1024
        let pages = routes.router
        pages.get("/") { request, _ in
            if self.session(request) != nil { return Self.redirect("/lab") }
            return self.signInPage(message: nil, status: .ok)
        }
        pages.post("/signin") { request, context in
            let body = try await request.collectData(upTo: formLimit)
            try self.sameOrigin(request)
            let peer = context.peerHost ?? context.remote
            // Guessing is slowed per address, with the bearer tokens' count (AuthThrottle).
            let given = DashboardSessions.form(body)["credential"] ?? ""
            if let wait = self.http.throttle.retryAfter(peer), !(self.isOperator(given) && self.http.throttle.isKnown(peer, "dashboard operator")) {
                let seconds = AuthThrottle.retryAfterHeader(wait)
                var r = self.signInPage(message: "Too many wrong credentials from this address: try again in \(seconds) s.", status: .tooManyRequests)
                r["Retry-After"] = seconds
                return r
            }
            guard self.isOperator(given) else {
                self.http.throttle.failed(peer, "dashboard sign-in")
                return self.signInPage(message: "That is not the operator's credential.", status: .unauthorized)
            }
            self.http.throttle.succeeded(peer, "dashboard operator")
            let (s, ended) = self.dashboard.sessions.signIn(now: self.now)
            if ended > 0 {
                self.logger.notice("dashboard sign-in from \(context.remote) ended the oldest session: \(self.dashboard.sessions.capacity) are kept at once", metadata: ["peer": .string(context.remote)])
            }
            // Over the session cap the operator is told, on the page the sign-in leads to.
            var r = Self.redirect(ended > 0 ? "/lab?notice=session-cap" : "/lab")
            r["Set-Cookie"] = DashboardSessions.setCookie(s, secure: self.sessionSecure, now: self.now)
            self.logger.notice("dashboard sign-in from \(context.remote)", metadata: ["peer": .string(context.remote)])
            return r
        }
        pages.post("/signout") { request, context in
            let s = try self.changing(request, context, form: DashboardSessions.form(try await request.collectData(upTo: formLimit)))
            self.dashboard.sessions.end(s.id)
            var r = Self.redirect("/")
            r["Set-Cookie"] = DashboardSessions.setCookie(nil, secure: self.sessionSecure, now: self.now)
            return r
        }
        // Browsers ask for it on every page (the pages name an empty icon; error pages do not).
        pages.get("/favicon.ico") { _, _ in Response(.noContent, headers: ["Cache-Control": "max-age=86400"]) }
        // The style sheet and the scripts: fixed names, nothing of the lab (the sign-in page uses the style sheet).
        pages.get("/static/:name") { _, context in try self.staticFile(context.parameter("name")) }
        pages.get("/lab") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            return self.labPage(s, notice: context.query["notice"] == "session-cap"
                ? "Signing in ended the oldest dashboard session: \(self.dashboard.sessions.capacity) are kept at once." : nil)
        }
        pages.get("/runs") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            return self.runsPage(s, query: context.query)
        }
        pages.get("/events/lab") { request, _ in
            guard let s = self.session(request) else { throw Self.signInRequired }
            return try self.labEvents(s)
        }
        pages.get("/trends") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            return try await self.trendsPage(s, lab: try self.labParameter(context.query))
        }
        pages.get("/trends/labs") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            return try await self.crossLabPage(s, plan: try Dashboard.planParameter(context.query))
        }
        pages.get("/studies/:name") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            let name = context.parameter("name")
            guard SafeName.isValid(name) else { throw LabRefusal(.invalid, "study name \(SafeName.problem(with: name) ?? "is invalid")") }
            return try self.studyPage(s, name: name)
        }
        pages.get("/runs/:id") { request, context in
            guard let s = self.session(request) else { return Self.redirect("/") }
            return try self.livePage(s, id: try CoordinatorRoutes.runId(context))
        }
        pages.get("/runs/:id/events") { request, context in
            guard let s = self.session(request) else { throw Self.signInRequired }
            return try self.events(s, id: try CoordinatorRoutes.runId(context))
        }
        pages.get("/runs/:id/files/:name") { request, context in
            guard self.session(request) != nil else { throw Self.signInRequired }
            return try self.runFile(try CoordinatorRoutes.runId(context), context.parameter("name"), range: request.headers[.range])
        }
        pages.post("/runs/:id/abort") { request, context in
            _ = try self.changing(request, context, form: DashboardSessions.form(try await request.collectData(upTo: formLimit)))
            let id = try CoordinatorRoutes.runId(context)
            _ = try await coordinator.abort(id)
            return Self.redirect(Coordinator.dashboardPath(run: id))
        }
        pages.post("/dongles/:dongle/health") { request, context in
            let fields = DashboardSessions.form(try await request.collectData(upTo: formLimit))
            _ = try self.changing(request, context, form: fields)
            guard let h = fields["health"], let health = LabWire.DongleHealth(rawValue: h), [.bad, .unknown, .maintenance].contains(health) else {
                throw LabRefusal(.invalid, "health: expected bad (quarantine), unknown (release) or maintenance")
            }
            let reason = fields["reason"].flatMap { $0.trimmingCharacters(in: .whitespaces).isEmpty ? nil : $0 }
            _ = try coordinator.setHealth(context.parameter("dongle"), LabWire.HealthRequest(health: health, reason: reason ?? "from the dashboard"))
            return Self.redirect("/lab")
        }
    }

    static let signInRequired = LabRefusal(.unauthenticated, "sign in to the dashboard first")

    /// The session a request's cookie names, if it is live.
    func session(_ request: Request) -> DashboardSession? {
        dashboard.sessions.find(cookieHeader: request.headers[.cookie], now: now)
    }

    /// Only the operator's credential signs in: an agent's or the scrape credential does not
    /// (the same check as a bearer token, `authenticator`, and then the role).
    func isOperator(_ given: String) -> Bool {
        guard !given.isEmpty, let token = config.token else { return false }
        let authenticate = HTTPService.withScraper(config.scrapeToken, Coordinator.authenticator(operatorToken: token, identities: identities))
        return authenticate!(given)?.role == .operator
    }

    /// A state-changing form: a live session, the same origin, and the session's CSRF token.
    func changing(_ request: Request, _ context: LabRequestContext, form: [String: String]) throws -> DashboardSession {
        guard let s = session(request) else { throw Self.signInRequired }
        try sameOrigin(request)
        guard DashboardSessions.csrfMatches(s, form["csrf"]) else {
            logger.warning("dashboard: \(request.method) \(HTTPService.escaped(context.path)) from \(context.remote) refused: CSRF token missing or wrong", metadata: ["peer": .string(context.remote)])
            throw LabRefusal(.forbidden, "the form's CSRF token is missing or wrong; reload the page")
        }
        return s
    }

    /// A form posted from another site is refused when the browser says so (Origin; the pages'
    /// Referrer-Policy same-origin makes browsers send it, "null" from a sandboxed page is refused).
    func sameOrigin(_ request: Request) throws {
        guard let origin = request.headers[.origin] else { return }
        let parts = URLComponents(string: origin)
        let host = parts.map { c in c.port.map { "\(c.host ?? ""):\($0)" } ?? (c.host ?? "") }
        // The scheme too: http://host:port is another origin than https://host:port.
        let scheme = sessionSecure ? "https" : "http"
        guard let host, let own = request.head.authority, host.lowercased() == own.lowercased(), parts?.scheme?.lowercased() == scheme else {
            throw LabRefusal(.forbidden, "a form from another origin is refused")
        }
    }

    static func redirect(_ to: String) -> Response {
        Response(.seeOther, headers: ["Location": to, "Cache-Control": "no-store", "Content-Type": "text/plain"], body: Data())
    }

    /// The files of a run the dashboard serves, by name: the analysis' report folder (docs/BUNDLE.md,
    /// `ReportWriter.write`) and the bundle's archive. Nothing else is served: a name is looked up
    /// here, never joined to a path, so no name reaches another file.
    static let runFileNames: [(name: String, type: String, label: String)] = [
        ("report.html", "text/html; charset=utf-8", "report.html"), ("junit.xml", "application/xml", "junit.xml"),
        ("summary.json", "application/json", "summary.json"), ("pairs.csv", "text/csv; charset=utf-8", "pairs.csv"),
        ("formal-summary.csv", "text/csv; charset=utf-8", "formal-summary.csv"), ("formal-continuity.csv", "text/csv; charset=utf-8", "formal-continuity.csv"),
        ("summary-discovery-pairs.csv", "text/csv; charset=utf-8", "summary-discovery-pairs.csv"), ("bundle.tar.gz", "application/gzip", "bundle"),
    ]

    /// The files of `runFileNames` this run has now, in that order.
    func runFiles(_ r: RunRecord) -> [String] { pages.runFiles(r) }

    /// report.html's policy on the dashboard: sandboxed without scripts (nothing in the report runs
    /// here), but in the coordinator's origin, so that its links (the files beside it, the run's
    /// page) are same-site navigations that carry the session cookie (SameSite=Strict: a sandbox
    /// without allow-same-origin is an opaque origin, whose links arrive without it). Its files
    /// are attachments, which a sandbox blocks without allow-downloads.
    static let reportPolicy = "sandbox allow-same-origin allow-downloads allow-popups allow-top-navigation-by-user-activation; default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"

    /// A finished run's report files or bundle (`runFileNames`); report.html with a line back to
    /// the run's page.
    func runFile(_ id: String, _ name: String, range: String?) throws -> Response {
        guard let r = run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
        guard let known = Self.runFileNames.first(where: { $0.name == name }) else {
            throw LabRefusal(.notFound, "no file \(HTTPService.escaped(name)) of a run (\(Self.runFileNames.map(\.name).joined(separator: ", ")))")
        }
        let report = config.results.appendingPathComponent(id).appendingPathComponent("report")
        var response: Response
        switch name {
        case "report.html":
            response = try reportPage(r, report.appendingPathComponent("report.html"), range: range)
            response["Content-Security-Policy"] = Self.reportPolicy
            response["Referrer-Policy"] = "same-origin"
            response["X-Frame-Options"] = "DENY"
        case "bundle.tar.gz":
            guard r.bundle != nil, [.complete, .aborted].contains(r.state) else { throw LabRefusal(.conflict, "run \(id) has no bundle") }
            response = try .file(config.results.appendingPathComponent("\(id).tar.gz"), contentType: known.type, range: range, missing: "bundle archive missing")
        default:
            response = try .file(report.appendingPathComponent(name), contentType: known.type, range: range, missing: "run \(id) has no \(name)")
        }
        if name != "report.html" { response["Content-Disposition"] = "attachment; filename=\"\(id)-\(name)\"" }
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "no-store"
        return response
    }

    /// The largest report.html given a line back to the run (larger ones are served as they are).
    static let reportBannerLimit = 64 << 20

    /// report.html with a line at the top of its body: back to the run's page, and why its
    /// filters and paging do not work here (no script runs in the dashboard's origin).
    func reportPage(_ r: RunRecord, _ url: URL, range: String?) throws -> Response {
        let size = (try? FileManager.default.attributesOfItem(atPath: url.path))?[.size] as? Int
        guard let size, size <= Self.reportBannerLimit, let data = try? Data(contentsOf: url),
              let body = data.range(of: Data("<body".utf8)), let close = data[body.upperBound...].firstIndex(of: UInt8(ascii: ">")) else {
            return try .file(url, contentType: "text/html; charset=utf-8", range: range, missing: "run \(r.id) has no report")
        }
        let run = Coordinator.dashboardPath(run: Dashboard.segment(r.id))
        let banner = "<nav id=\"dashboard\" style=\"font:13px system-ui,sans-serif;background:#23395d;color:#fff;padding:6px 12px\">"
            + "<a style=\"color:#fff\" href=\"\(run)\">← run \(Dashboard.h(r.id))</a> · <a style=\"color:#fff\" href=\"/runs\">all runs</a>"
            + " <span style=\"opacity:.8\">· served by the dashboard without its script: the pairs table's filters and paging and the heatmap's hover are off here (pairs.csv has every pair; the bundle's own report.html has them)</span></nav>"
        var out = Data(data[..<data.index(after: close)])
        out.append(Data(banner.utf8))
        out.append(Self.withoutScripts(data[data.index(after: close)...]))
        return Response(.ok, headers: ["Content-Type": "text/html; charset=utf-8"], body: out)
    }

    /// The report's body without its script elements: none would run (the sandbox), and a browser
    /// says so for each one on its console. The report's script puts `<` in its data as `\u003c`
    /// and its outside text is escaped, so a script ends at the first `</script>` after it.
    static func withoutScripts(_ html: Data) -> Data {
        let open = Data("<script".utf8), end = Data("</script>".utf8)
        var out = Data()
        var rest = html[...]
        while let start = rest.range(of: open) {
            out.append(rest[..<start.lowerBound])
            guard let stop = rest[start.upperBound...].range(of: end) else { return out }
            rest = rest[stop.upperBound...]
        }
        out.append(rest)
        return out
    }

    // The Dashboard read-model's pages, for the routes above.
    func signInPage(message: String?, status: HTTPResponse.Status) -> Response { pages.signInPage(message: message, status: status) }
    func staticFile(_ name: String) throws -> Response { try pages.staticFile(name) }
    func labPage(_ s: DashboardSession, notice: String? = nil) -> Response { pages.labPage(s, notice: notice) }
    func runsPage(_ s: DashboardSession, query: [String: String] = [:]) -> Response { pages.runsPage(s, query: query) }
    func labEvents(_ s: DashboardSession) throws -> Response { try pages.labEvents(s) }
    func labParameter(_ query: [String: String]) throws -> String? { try pages.labParameter(query) }
    func trendsPage(_ s: DashboardSession, lab: String? = nil) async -> Response { await pages.trendsPage(s, lab: lab) }
    func crossLabPage(_ s: DashboardSession, plan: String) async throws -> Response { try await pages.crossLabPage(s, plan: plan) }
    func studyPage(_ s: DashboardSession, name: String) throws -> Response { try pages.studyPage(s, name: name) }
    func livePage(_ s: DashboardSession, id: String) throws -> Response { try pages.livePage(s, id: id) }
    func events(_ s: DashboardSession, id: String) throws -> Response { try pages.events(s, id: id) }
}
