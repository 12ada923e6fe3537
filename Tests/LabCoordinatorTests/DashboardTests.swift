import XCTest
import HeraldAnalysis
import HeraldCore
@testable import LabHistory
import GRDB
import LabHTTP
import LabNet
import LabNode
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// The dashboard as a browser and as a stranger meet it, over HTTP to an in-process coordinator:
/// sign-in with the operator's credential only, the session cookie's flags, CSRF on every
/// state-changing form, nothing of the lab for a request without a session, escaped outside text.
final class DashboardTests: XCTestCase {
    var dirs: [URL] = []
    var coordinators: [Coordinator] = []
    override func tearDown() async throws {
        for c in coordinators { await c.stop() }
        for d in dirs { try? FileManager.default.removeItem(at: d) }
        LabTrust.forget()
    }

    let operatorToken = "operator-token-0123456789abcdef"
    let scrapeToken = "scrape-token-0123456789abcdef"
    let runId = "secretplan-20260101-000000-abcd"

    /// A coordinator with a credentials folder (enrolled agents), a finished run with its report
    /// files and a dongle, listening on loopback; with `tls`, over TLS with a lab CA the client trusts.
    /// A coordinator with the dashboard; `throttle` its rules for wrong credentials (here 10 free
    /// failures by default: the tests below try six wrong credentials before the right one).
    func start(tls: Bool = false, throttle: AuthThrottle.Rules = AuthThrottle.Rules(free: 10), history: (any HistoryReading)? = nil) async throws -> (Coordinator, LabClient) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dash-\(UUID().uuidString)")
        let cred = dir.appendingPathComponent("cred")
        try FileManager.default.createDirectory(at: cred, withIntermediateDirectories: true)
        dirs.append(dir)
        var config = Coordinator.Config(results: dir.appendingPathComponent("results"))
        config.token = operatorToken
        config.scrapeToken = scrapeToken
        config.credentials = CredentialsFolder(url: cred)
        config.authThrottle = throttle
        config.historyReader = history
        if tls {
            let p = { (n: String) in cred.appendingPathComponent(n).path }
            try LabCA.create(commonName: "dash CA", days: 1, certificate: p("ca.pem"), key: p("ca-key.pem"))
            try LabCA.issue(caCertificate: p("ca.pem"), caKey: p("ca-key.pem"), commonName: "coordinator", names: ["127.0.0.1"], days: 1,
                            certificate: p("cert.pem"), key: p("key.pem"))
            config.tls = try TLSContext(certificate: p("cert.pem"), key: p("key.pem"))
            try LabTrust.trust(caFile: p("ca.pem"))
        }
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        coordinators.append(c)
        // A finished run whose files exist, and a dongle: what a stranger must not see.
        let report = config.results.appendingPathComponent("\(runId)/report")
        try FileManager.default.createDirectory(at: report, withIntermediateDirectories: true)
        for name in ["report.html", "junit.xml", "summary.json"] { try Data("secret \(name) of \(runId)".utf8).write(to: report.appendingPathComponent(name)) }
        try Data("secret bundle".utf8).write(to: config.results.appendingPathComponent("\(runId).tar.gz"))
        var done = RunRecord(id: runId, plan: "secretplan", planText: "name: secretplan", state: .complete, created: 1_700_000_000, duration: 60, warmup: 0,
                             air: nil, nodes: [RunRecord.Node(name: "n1", agent: "secretagent", agentURL: "http://127.0.0.1:1", state: .complete, files: [])])
        done.bundle = runId
        done.passed = true
        try c.save(done)
        var dongle = DongleRecord(id: "F0:00:00:00:00:01", info: LabWire.DongleInfo(id: "F0:00:00:00:00:01", name: "secretdongle", present: true), at: c.now)
        dongle.info.agent = "secretagent"
        c.dongles.withState { s in s.dongles[dongle.id] = dongle }
        let port = try await c.start()
        // A running run, recorded after the start (so no drive task takes it over).
        var running = done
        running.id = "liveplan-20260101-000000-abcd"
        running.state = .running
        running.startAt = c.now
        running.bundle = nil
        running.passed = nil
        try c.save(running)
        let client = LabClient(base: URL(string: "\(tls ? "https" : "http")://127.0.0.1:\(port)")!, token: nil)
        return (c, client)
    }

    func form(_ fields: [String: String]) -> Data {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return Data(fields.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&").utf8)
    }

    let formType = ["Content-Type": "application/x-www-form-urlencoded"]

    func signIn(_ client: LabClient, _ credential: String) async throws -> (status: Int, setCookie: String?) {
        let (status, _, headers) = try await client.request("POST", "/signin", body: form(["credential": credential]), headers: formType)
        return (status, headers["set-cookie"])
    }

    /// The cookie a browser would send back, and the CSRF token the Lab page's forms carry.
    func session(_ client: LabClient) async throws -> (cookie: String, csrf: String) {
        let (status, setCookie) = try await signIn(client, operatorToken)
        XCTAssertEqual(status, 303)
        let cookie = String(try XCTUnwrap(setCookie).split(separator: ";")[0])
        let (_, body, _) = try await client.request("GET", "/lab", headers: ["Cookie": cookie])
        let html = String(decoding: body, as: UTF8.self)
        let range = try XCTUnwrap(html.range(of: "name=\"csrf\" value=\""))
        return (cookie, String(html[range.upperBound...].prefix(64)))
    }

    /// Guessing at sign-in is slowed per address (issue 36): after the free failures the address
    /// waits (429, Retry-After, the page says so), the right credential included, and the same
    /// count holds its bearer tokens back.
    func testGuessingAtSignInIsSlowedWith429AndRetryAfter() async throws {
        let (_, client) = try await start(throttle: AuthThrottle.Rules(free: 2, base: 60))
        for k in 0..<3 {
            let (wrong, _) = try await signIn(client, "guess-\(k)-" + String(repeating: "x", count: 40))
            XCTAssertEqual(wrong, 401)
        }
        let (status, body, headers) = try await client.request("POST", "/signin", body: form(["credential": operatorToken]), headers: formType)
        XCTAssertEqual(status, 429, "the address waits, whatever it sends")
        XCTAssertEqual(headers["retry-after"], "60")
        XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("Too many wrong credentials from this address: try again in 60 s."))
        XCTAssertNil(headers["set-cookie"])
        let (bearer, _, bearerHeaders) = try await client.request("GET", "/v1/agents", headers: ["Authorization": "Bearer \(operatorToken)"])
        XCTAssertEqual(bearer, 429)
        XCTAssertEqual(bearerHeaders["retry-after"], "60")
    }

    func testOnlyTheOperatorsCredentialSignsIn() async throws {
        let (c, client) = try await start()
        let agentSecret = "agent-secretagent-credential-1"
        let rec = IdentityStore.Credential(name: "secretagent", tokenHash: CredentialHash.of(agentSecret), coordinatorToken: "calls-secretagent",
                                           issuedAt: c.now, revokedAt: nil, hosts: ["127.0.0.1"])
        try XCTUnwrap(c.identities.store).saveCredential(rec)
        c.identities.add(rec)
        // The sign-in page itself is open, and shows nothing of the lab.
        let (status, page, _) = try await client.request("GET", "/")
        XCTAssertEqual(status, 200)
        XCTAssertTrue(String(decoding: page, as: UTF8.self).contains("name=\"credential\""))
        for wrong in ["", "wrong-credential-0123456789", scrapeToken, agentSecret, operatorToken + "x", String(operatorToken.dropLast())] {
            let (status, setCookie) = try await signIn(client, wrong)
            XCTAssertEqual(status, 401, "credential \(wrong.prefix(12))… must not sign in")
            XCTAssertNil(setCookie, "no session for \(wrong.prefix(12))…")
        }
        let (ok, setCookie) = try await signIn(client, operatorToken)
        XCTAssertEqual(ok, 303)
        let cookie = try XCTUnwrap(setCookie)
        XCTAssertTrue(cookie.hasPrefix("heraldlab_session="), cookie)
        XCTAssertEqual(String(cookie.split(separator: ";")[0]).count, "heraldlab_session=".count + 64, "a 32-byte random id")
        for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] { XCTAssertTrue(cookie.contains(flag), "\(flag) in \(cookie)") }
        XCTAssertFalse(cookie.contains("Secure"), "plain HTTP: a Secure cookie would never come back")
        let (labStatus, lab, _) = try await client.request("GET", "/lab", headers: ["Cookie": String(cookie.split(separator: ";")[0])])
        XCTAssertEqual(labStatus, 200)
        XCTAssertTrue(String(decoding: lab, as: UTF8.self).contains("secretdongle"))
        // Two sign-ins are two sessions.
        let (_, second) = try await signIn(client, operatorToken)
        XCTAssertNotEqual(second?.split(separator: ";")[0], cookie.split(separator: ";")[0])
    }

    func testTheCookieIsSecureUnderTLS() async throws {
        let (_, client) = try await start(tls: true)
        let (status, setCookie) = try await signIn(client, operatorToken)
        XCTAssertEqual(status, 303)
        let cookie = try XCTUnwrap(setCookie)
        for flag in ["HttpOnly", "SameSite=Strict", "Secure"] { XCTAssertTrue(cookie.contains(flag), "\(flag) in \(cookie)") }
    }

    /// Under TLS every answer carries HSTS (pages, refusals, the API); a form posted from the
    /// plain-http origin of the same host and port is another origin (issue 36).
    func testHSTSUnderTLSAndTheOriginsSchemeCounts() async throws {
        let (_, client) = try await start(tls: true)
        for (path, headers) in [("/", [String: String]()), ("/v1/agents", [:]), ("/v1/agents", ["Authorization": "Bearer \(operatorToken)"])] {
            let (_, _, h) = try await client.request("GET", path, headers: headers)
            XCTAssertEqual(h["strict-transport-security"], "max-age=31536000", path)
        }
        let port = try XCTUnwrap(client.base.port)
        let plainOrigin = ["Origin": "http://127.0.0.1:\(port)"]
        let (refused, _, _) = try await client.request("POST", "/signin", body: form(["credential": operatorToken]), headers: formType.merging(plainOrigin) { a, _ in a })
        XCTAssertEqual(refused, 403, "http:// is not the https:// origin")
        let (taken, _, _) = try await client.request("POST", "/signin", body: form(["credential": operatorToken]), headers: formType.merging(["Origin": "https://127.0.0.1:\(port)"]) { a, _ in a })
        XCTAssertEqual(taken, 303)
        let (_, plain) = try await start()
        let (_, _, h) = try await plain.request("GET", "/")
        XCTAssertNil(h["strict-transport-security"], "no HSTS over plain HTTP")
    }

    func testAStrangerGetsNothingFromAnyDashboardRoute() async throws {
        let (c, client) = try await start()
        let secrets = [runId, "secretagent", "secretdongle", "secretplan", "secret report", "secret bundle", "liveplan", "secretstudy"]
        // A run of a study (its plan text names the study): the study's page shows a stranger nothing either.
        let study = try XCTUnwrap(try Plan.expandStudy(yaml: studyYAML(name: "secretstudy", repeats: 1)).runs.first)
        try c.save(RunRecord(id: "secretstudy-run", plan: "studyplan", planText: study.yaml, state: .complete, created: 1_700_000_000, duration: 60, warmup: 0, air: nil, nodes: []))
        // Every dashboard route, each without a session, with a made-up one, and with bearer
        // credentials (the dashboard takes its cookie only).
        let strangers: [[String: String]] = [[:], ["Cookie": "heraldlab_session=" + String(repeating: "ab", count: 32)],
                                             ["Authorization": "Bearer \(operatorToken)"], ["Authorization": "Bearer \(scrapeToken)"]]
        XCTAssertGreaterThanOrEqual(DashboardRoutes.dashboardRouteList.count, 12)
        for (method, pattern) in DashboardRoutes.dashboardRouteList {
            let path = pattern.replacingOccurrences(of: "/studies/:name", with: "/studies/secretstudy").replacingOccurrences(of: ":id", with: runId).replacingOccurrences(of: ":name", with: "report.html")
                .replacingOccurrences(of: ":dongle", with: "F0:00:00:00:00:01")
            for headers in strangers {
                var h = headers
                var body: Data?
                if method == "POST" { h.merge(formType) { a, _ in a }; body = form(["csrf": "guess", "health": "bad"]) }
                let (status, answer, answerHeaders) = try await client.request(method, path, body: body, headers: h)
                let text = String(decoding: answer, as: UTF8.self)
                for s in secrets { XCTAssertFalse(text.contains(s), "\(method) \(path) with \(h.keys.sorted()) leaks \(s): \(text.prefix(300))") }
                XCTAssertNil(answerHeaders["set-cookie"], "\(method) \(path) gives a stranger a session")
                switch (method, pattern) {
                case ("GET", "/"): XCTAssertEqual(status, 200, "the sign-in page")
                case ("GET", "/favicon.ico"): XCTAssertEqual(status, 204)
                // The style sheet and scripts are public, by name only: report.html is none of them.
                case ("GET", "/static/:name"): XCTAssertEqual(status, 404)
                case ("POST", "/signin"): XCTAssertEqual(status, 401)
                case ("GET", "/runs/:id/events"), ("GET", "/events/lab"), ("GET", "/runs/:id/files/:name"), ("POST", _): XCTAssertEqual(status, 401, "\(method) \(path)")
                default:
                    XCTAssertEqual(status, 303, "\(method) \(path)")
                    XCTAssertEqual(answerHeaders["location"], "/")
                }
            }
        }
        // Nothing changed.
        XCTAssertEqual(c.run("liveplan-20260101-000000-abcd")?.abortRequested, nil)
        XCTAssertEqual(c.dongleViews(history: 0).first?.health, .unknown)
    }

    func testStateChangesNeedTheSessionsCSRFToken() async throws {
        let (c, client) = try await start()
        let (cookie, csrf) = try await session(client)
        let live = "liveplan-20260101-000000-abcd"
        let (_, other) = try await session(client) // another session's token is wrong here
        for bad in [[:], ["csrf": ""], ["csrf": String(repeating: "0", count: 64)], ["csrf": other]] {
            var fields = bad
            fields["health"] = "bad"
            let (a, _, _) = try await client.request("POST", "/runs/\(live)/abort", body: form(fields), headers: formType.merging(["Cookie": cookie]) { a, _ in a })
            XCTAssertEqual(a, 403, "abort with \(bad)")
            let (d, _, _) = try await client.request("POST", "/dongles/F0%3A00%3A00%3A00%3A00%3A01/health", body: form(fields), headers: formType.merging(["Cookie": cookie]) { a, _ in a })
            XCTAssertEqual(d, 403, "quarantine with \(bad)")
        }
        XCTAssertNil(c.run(live)?.abortRequested, "no abort without the token")
        XCTAssertEqual(c.dongleViews(history: 0).first?.health, .unknown, "no quarantine without the token")
        // From another site, even with the token (a browser says where a form comes from).
        let (o, _, _) = try await client.request("POST", "/runs/\(live)/abort", body: form(["csrf": csrf]),
                                                 headers: formType.merging(["Cookie": cookie, "Origin": "http://evil.example"]) { a, _ in a })
        XCTAssertEqual(o, 403)
        XCTAssertNil(c.run(live)?.abortRequested)
        // With it: done.
        let (q, _, qh) = try await client.request("POST", "/dongles/F0%3A00%3A00%3A00%3A00%3A01/health", body: form(["csrf": csrf, "health": "bad", "reason": "flaky"]),
                                                  headers: formType.merging(["Cookie": cookie]) { a, _ in a })
        XCTAssertEqual(q, 303)
        XCTAssertEqual(qh["location"], "/lab")
        XCTAssertEqual(c.dongleViews(history: 0).first?.health, .bad)
        let (a, _, ah) = try await client.request("POST", "/runs/\(live)/abort", body: form(["csrf": csrf]), headers: formType.merging(["Cookie": cookie]) { a, _ in a })
        XCTAssertEqual(a, 303)
        XCTAssertEqual(ah["location"], "/runs/\(live)")
        XCTAssertEqual(c.run(live)?.abortRequested, true)
        // Signed out, the cookie opens nothing.
        let (s, _, _) = try await client.request("POST", "/signout", body: form(["csrf": csrf]), headers: formType.merging(["Cookie": cookie]) { a, _ in a })
        XCTAssertEqual(s, 303)
        let (after, _, afterHeaders) = try await client.request("GET", "/lab", headers: ["Cookie": cookie])
        XCTAssertEqual(after, 303)
        XCTAssertEqual(afterHeaders["location"], "/")
    }

    func testOutsideTextIsEscaped() async throws {
        let (c, client) = try await start()
        var info = LabWire.AgentInfo(name: "hostile", url: "http://127.0.0.1:9/<script>alert(3)</script>", tags: ["<img src=x onerror=alert(2)>"], radio: .sim,
                                     adapter: nil, controller: nil, version: "<script>alert(1)</script>")
        info.boot = "boot-hostile"
        info.sequence = 1
        // Such a registration is refused where it enters (issue 36)...
        XCTAssertThrowsError(try c.register(info, principal: HTTPService.Principal(role: .operator, name: "operator"), peerHost: "127.0.0.1")) {
            XCTAssertTrue("\($0)".hasPrefix("400 url: "), "\($0)")
        }
        // ...and the pages escape it anyway, as a store written before the bounds could hold it.
        c.registry.withRecords { s in s["hostile"] = AgentRegistry.AgentRecord(info: info, lastSeen: c.now, persistedSeen: c.now, status: nil) }
        c.agentError("hostile", "<b onmouseover=alert(4)>boom</b>\"'")
        let (cookie, _) = try await session(client)
        let (status, body, headers) = try await client.request("GET", "/lab", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        XCTAssertTrue(headers["content-security-policy"]?.contains("default-src 'none'") == true)
        let html = String(decoding: body, as: UTF8.self)
        for raw in ["<script>alert(1)", "<img src=x", "<script>alert(3)", "<b onmouseover"] { XCTAssertFalse(html.contains(raw), "\(raw) reached the page raw") }
        for escaped in ["&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", "&lt;b onmouseover=alert(4)&gt;boom&lt;/b&gt;&quot;&#39;"] {
            XCTAssertTrue(html.contains(escaped), "\(escaped) missing")
        }
    }

    /// One session holds at most 4 live streams (issue 36: one session could hold all 32 and
    /// every other browser got 503 for 5 minutes); a fifth ends at once saying why, and another
    /// session still gets its own.
    func testOneSessionHoldsAtMostFourLiveStreams() async throws {
        let (_, client) = try await start()
        let (cookie, _) = try await session(client)
        let live = "liveplan-20260101-000000-abcd"
        let port = UInt16(try XCTUnwrap(client.base.port))
        let request = "GET /runs/\(live)/events HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nCookie: \(cookie)\r\n\r\n"
        var open = [TestStream]()
        defer { open.forEach { $0.close() } }
        for _ in 0..<DashboardSessions.streamsPerSession {
            let s = try TestStream.connect(host: "127.0.0.1", port: port)
            try s.write(request)
            let got = String(decoding: try s.read { String(decoding: $0, as: UTF8.self).contains("event: snapshot") }, as: UTF8.self)
            XCTAssertTrue(got.contains("200 OK"), got)
            open.append(s)
        }
        let (status, body, _) = try await client.request("GET", "/runs/\(live)/events", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let text = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(text.contains("event: refused") && text.contains("this session has 4 live views open"), text)
        XCTAssertFalse(text.contains("event: snapshot"), text)
        // Another session is not held back by this one's four.
        let (other, _) = try await session(client)
        let s = try TestStream.connect(host: "127.0.0.1", port: port)
        defer { s.close() }
        try s.write(request.replacingOccurrences(of: cookie, with: other))
        XCTAssertTrue(String(decoding: try s.read { String(decoding: $0, as: UTF8.self).contains("event: snapshot") }, as: UTF8.self).contains("event: snapshot"))
    }

    func testSignInOverTheSessionCapEndsTheOldestAndSaysSo() {
        let sessions = DashboardSessions(capacity: 2)
        let a = sessions.signIn(now: 0), b = sessions.signIn(now: 1), c = sessions.signIn(now: 2)
        XCTAssertEqual([a.ended, b.ended, c.ended], [0, 0, 1])
        XCTAssertNil(sessions.find(cookieHeader: "heraldlab_session=\(a.session.id)", now: 3), "the oldest was ended")
        XCTAssertNotNil(sessions.find(cookieHeader: "heraldlab_session=\(c.session.id)", now: 3))
        for _ in 0..<4 { XCTAssertTrue(sessions.openStream(c.session.id)) }
        XCTAssertFalse(sessions.openStream(c.session.id))
        sessions.closeStream(c.session.id)
        XCTAssertTrue(sessions.openStream(c.session.id))
    }

    /// Over HTTP: the sign-in that ends the oldest session leads to a Lab page that says so.
    func testTheSignInOverTheCapIsToldOnThePage() async throws {
        let (coordinator, client) = try await start()
        let capacity = coordinator.dashboard.sessions.capacity
        for _ in 0..<capacity {
            let (_, _, headers) = try await client.request("POST", "/signin", body: form(["credential": operatorToken]), headers: formType)
            XCTAssertEqual(headers["location"], "/lab")
        }
        let (status, _, headers) = try await client.request("POST", "/signin", body: form(["credential": operatorToken]), headers: formType)
        XCTAssertEqual(status, 303)
        XCTAssertEqual(headers["location"], "/lab?notice=session-cap")
        let cookie = String(try XCTUnwrap(headers["set-cookie"]).split(separator: ";")[0])
        let (_, body, _) = try await client.request("GET", "/lab?notice=session-cap", headers: ["Cookie": cookie])
        XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("Signing in ended the oldest dashboard session: \(capacity) are kept at once."))
        let (_, plain, _) = try await client.request("GET", "/lab", headers: ["Cookie": cookie])
        XCTAssertFalse(String(decoding: plain, as: UTF8.self).contains("id=\"notice\""))
    }

    func testTheLiveEventsOfAFinishedRunEndTheStream() async throws {
        let (_, client) = try await start()
        let (cookie, _) = try await session(client)
        let (status, body, headers) = try await client.request("GET", "/runs/\(runId)/events", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        XCTAssertEqual(headers["content-type"], "text/event-stream")
        XCTAssertEqual(headers["transfer-encoding"], "chunked")
        let text = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("retry: 2000\n\nevent: snapshot\ndata: {"), text)
        XCTAssertTrue(text.hasSuffix("event: end\ndata: {}\n\n"), text)
        let json = try XCTUnwrap(text.split(separator: "\n").first { $0.hasPrefix("data: {\"final\"") || $0.hasPrefix("data: {") })
        let snapshot = try JSONDecoder().decode(LiveSnapshot.self, from: Data(json.dropFirst(6).utf8))
        XCTAssertEqual(snapshot.id, runId)
        XCTAssertTrue(snapshot.final)
        XCTAssertEqual(snapshot.nodes.map(\.name), ["n1"])
    }

    func testANodeIsMarkedStaleAfterMissedHeartbeats() async throws {
        let (c, _) = try await start()
        let live = "liveplan-20260101-000000-abcd"
        XCTAssertEqual(try XCTUnwrap(c.run(live)).state, .running)
        XCTAssertEqual(c.pages.liveSnapshot(try XCTUnwrap(c.run(live))).nodes.map(\.stale), [true], "no heartbeat at all")
        var info = LabWire.AgentInfo(name: "secretagent", url: "http://127.0.0.1:9", tags: [], radio: .sim, adapter: nil, controller: nil)
        info.boot = "boot-secret"
        info.sequence = 1
        try c.register(info, principal: HTTPService.Principal(role: .operator, name: "operator"), peerHost: "127.0.0.1")
        XCTAssertEqual(c.pages.liveSnapshot(try XCTUnwrap(c.run(live))).nodes.map(\.stale), [false], "a heartbeat just now")
        c.registry.withRecords { s in s["secretagent"]?.lastSeen = c.now - 3.5 }
        let node = try XCTUnwrap(c.pages.liveSnapshot(try XCTUnwrap(c.run(live))).nodes.first)
        XCTAssertTrue(node.stale, "three heartbeats missed")
        XCTAssertEqual(node.state, "complete", "the state it last had is kept, with the marker beside it")
    }

    func testTheStripKeepsTheWindowsEachPairWasHeardInForTheLast30Minutes() throws {
        func record(_ duration: String) throws -> (RunRecord, [String: String]) {
            let text = "name: strip\nduration: \(duration)\nwarmup: 2s\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n  - {name: n3, position: [2, 0]}\n"
            let plan = try Plan.parse(yaml: text, source: "strip.yaml")
            var r = RunRecord(id: "strip-\(duration)", plan: "strip", planText: text, state: .running, created: 0, duration: plan.duration, warmup: 2, air: nil,
                              nodes: plan.nodes.map { RunRecord.Node(name: $0.name, agent: "a-\($0.name)", agentURL: "http://127.0.0.1:1", state: .running, files: []) })
            r.startAt = 1000
            return (r, Dictionary(uniqueKeysWithValues: plan.nodes.map { ($0.name, $0.shortName) }))
        }
        let strips = LiveStrips()
        let (short, names) = try record("10m")
        strips.note(short, node: "n1", recent: [names["n2"]!, names["n1"]!, "ZZZZ"], at: 1005) // window 0; itself and a stranger ignored
        strips.note(short, node: "n1", recent: [names["n2"]!, names["n3"]!], at: 1025)         // window 2
        strips.note(short, node: "n2", recent: [], at: 1035)
        strips.note(short, node: "n2", recent: [names["n1"]!], at: 990)                       // before the start: nothing
        let t = try XCTUnwrap(strips.track(short.id))
        XCTAssertEqual(t.window, 10)
        XCTAssertEqual(t.hits, ["n1\u{1F}n2": [0, 2], "n1\u{1F}n3": [2]])
        // A long run: minutes, and only the last 30 of them kept.
        let (long, longNames) = try record("2h")
        strips.note(long, node: "n3", recent: [longNames["n1"]!], at: 1010)
        strips.note(long, node: "n3", recent: [longNames["n1"]!], at: 1000 + 45 * 60 + 5)
        let l = try XCTUnwrap(strips.track(long.id))
        XCTAssertEqual(l.window, 60)
        XCTAssertEqual(l.hits, ["n3\u{1F}n1": [45]], "minute 0 rolled out of the last 30 minutes")
    }

    func studyYAML(name: String, repeats: Int) -> String {
        """
        name: studyplan
        duration: 2m
        nodes: {count: 4, prefix: n}
        radio: {kind: sim}
        study: {name: \(name), factors: [{path: sensor.advertInterval, levels: [100ms, 2s]}], repeats: \(repeats)}
        """
    }

    /// Finished runs of a study as `herald-lab run STUDY` submits them (each plan text with its
    /// studyRun), their bundles simulated in-process where the coordinator keeps bundles.
    /// Each run created at `created` + its index and ended 130 s later (long ago by default: a
    /// study whose runs ended long ago is over, whether or not every run was submitted).
    func saveStudyRuns(_ c: Coordinator, _ runs: [StudyRun], prefix: String, created: Double = 1_700_000_100) throws {
        for r in runs {
            let id = "\(prefix)-2026010\(r.block)-00000\(r.index)-abcd"
            let bundle = c.config.results.appendingPathComponent(id)
            _ = try Simulation(plan: r.plan, planText: r.yaml, output: bundle, runId: id, threads: 1).run()
            var rec = RunRecord(id: id, plan: "studyplan", planText: r.yaml, state: .complete, created: created + Double(r.index), duration: 120, warmup: 0, air: nil,
                                nodes: r.plan.nodes.map { RunRecord.Node(name: $0.name, agent: "agent-\($0.name)", agentURL: "http://127.0.0.1:1", state: .complete, files: []) })
            rec.ended = rec.created + 130
            rec.bundle = bundle.path
            try c.save(rec)
        }
    }

    /// Issue 40: the Lab and Runs pages carry the lab's summary (agents, runs, dongles, each
    /// plan's last verdict, refusals of the day), the Runs list filters and pages with each
    /// run's duration, a refused submission is kept with its reason, and both pages are live
    /// (their event stream sends snapshots).
    func testTheRunsListFiltersAndPagesAndTheSummaryAndRefusalsAreShown() async throws {
        let (c, client) = try await start()
        let yaml = "name: listplan\nduration: 20s\nnodes: {count: 2}\n"
        for k in 0..<55 {
            var r = RunRecord(id: "listplan-2026010\(k % 9 + 1)-0000\(String(format: "%02d", k))-abcd", plan: k < 52 ? "listplan" : "otherplan", planText: yaml,
                              state: k == 54 ? .aborted : .complete, created: 1_700_000_000 + Double(k), duration: 20, warmup: 0, air: nil, nodes: [])
            r.startAt = r.created + 2
            r.ended = r.created + 24
            r.passed = k == 54 ? nil : k % 2 == 0
            r.bundle = k == 54 ? "x" : nil
            try c.save(r)
        }
        // A submission the coordinator refuses (no agents to run it) is kept with its reason.
        let (refused, _, _) = try await client.request("POST", CoordinatorAPI.submit.path(query: "name=toolarge"), body: Data("name: toolarge\nduration: 1m\nnodes: {count: 40}\n".utf8),
                                                       headers: ["Authorization": "Bearer \(operatorToken)"])
        XCTAssertGreaterThanOrEqual(refused, 400)
        let (cookie, _) = try await session(client)
        func get(_ path: String) async throws -> String {
            let (status, body, _) = try await client.request("GET", path, headers: ["Cookie": cookie])
            XCTAssertEqual(status, 200, path)
            return String(decoding: body, as: UTF8.self)
        }
        let first = try await get("/runs")
        XCTAssertTrue(first.contains("<div id=\"summary\""), "the summary strip")
        XCTAssertTrue(first.contains("refused today <b id=\"s-refused\">1</b>"), first)
        XCTAssertTrue(first.contains("otherplan <a class=\"aborted\""), "the last verdict of each plan: otherplan's newest is aborted")
        XCTAssertEqual(first.components(separatedBy: "<tr data-run=").count - 1, 50, "50 a page")
        XCTAssertTrue(first.contains("page 1 of 2 (57 runs)") && first.contains("id=\"older\""), first)
        XCTAssertTrue(first.contains("<td class=\"num\">22 s</td>"), "each run's duration, start to end")
        XCTAssertTrue(first.contains("<table id=\"refused\">") && first.contains("<td>toolarge</td>"), "the refusal with its reason")
        XCTAssertTrue(first.contains("<script src=\"/static/list.js\">"), "live")
        let second = try await get("/runs?page=2")
        XCTAssertEqual(second.components(separatedBy: "<tr data-run=").count - 1, 7, "the 55 and start()'s two runs")
        let other = try await get("/runs?plan=otherplan")
        XCTAssertEqual(other.components(separatedBy: "<tr data-run=").count - 1, 3)
        let aborted = try await get("/runs?verdict=aborted")
        XCTAssertEqual(aborted.components(separatedBy: "<tr data-run=").count - 1, 1)
        XCTAssertTrue(aborted.contains("data-verdict=\"aborted\""))
        let running = try await get("/runs?state=running")
        XCTAssertEqual(running.components(separatedBy: "<tr data-run=").count - 1, 1)
        let cancelled = try await get("/runs?state=cancelled")
        XCTAssertTrue(cancelled.contains("No run matches."))
        let lab = try await get("/lab")
        XCTAssertTrue(lab.contains("<div id=\"summary\"") && lab.contains("<script src=\"/static/list.js\">"), "the Lab page has the strip and is live")
        // The stream both pages listen to.
        let port = UInt16(try XCTUnwrap(client.base.port))
        let stream = try TestStream.connect(host: "127.0.0.1", port: port)
        defer { stream.close() }
        try stream.write("GET /events/lab HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nCookie: \(cookie)\r\n\r\n")
        let got = String(decoding: try stream.read { String(decoding: $0, as: UTF8.self).contains("\"refusedToday\"") }, as: UTF8.self)
        XCTAssertTrue(got.contains("200 OK") && got.contains("event: snapshot") && got.contains("\"refusedToday\":1"), got)
    }

    /// Issue 40: a plan charted with several settings names each series by what differs.
    func testSeriesOfOnePlanAreNamedByTheSettingsThatDiffer() {
        func run(_ key: String, plan: String = "p") -> HistoryStore.Run {
            HistoryStore.Run(id: nil, recordedAt: "2026-01-01 00:00:00", runId: "r", path: "/r", plan: plan, variant: "", devices: 3, detectionPct: 1, continuityPct: 1,
                             heraldContinuityPct: 1, longevity: 1, passed: true, reportPath: "", summaryJSON: "", settingsKey: key)
        }
        let fast = run("sensor.advertInterval=100ms\u{1F}sensor.scan=on"), slow = run("sensor.advertInterval=1s\u{1F}sensor.scan=on")
        XCTAssertEqual(Dashboard.differingSettings(fast, among: [fast, slow, run("x=1", plan: "other")]), ["sensor.advertInterval=100ms"])
        XCTAssertEqual(Dashboard.differingSettings(fast, among: [fast]), [], "one series: nothing to tell apart")
    }

    /// The infra rate per testbed (issue 38) is on the Trends page with its interval and in the
    /// metrics, from the history's rows.
    func testTheInfraRatePerTestbedIsOnTrendsAndInTheMetrics() async throws {
        let (c, client) = try await start()
        let yaml = "name: infraplan\nduration: 20s\nnodes: {count: 3}\nradio: {kind: sim}\n"
        let plan = try Plan.parse(yaml: yaml)
        try FileManager.default.createDirectory(at: c.config.results, withIntermediateDirectories: true)
        let store = try HistoryStore(url: c.config.results.appendingPathComponent("history.sqlite"))
        for seed in UInt64(1)...3 {
            let bundle = c.config.results.appendingPathComponent("infraplan-\(seed)")
            _ = try Simulation(plan: plan, planText: yaml, seed: seed, output: bundle, threads: 1).run()
            _ = try store.record(try Analyser.analyse(bundle).result, reportPath: "")
        }
        let faulty = try XCTUnwrap(try store.runs().last)
        let db = try DatabaseQueue(path: c.config.results.appendingPathComponent("history.sqlite").path)
        try await db.write { try $0.execute(sql: "UPDATE run SET infra = 'node n1: 1 gap (agent paused)' WHERE id = ?", arguments: [faulty.id]) }
        XCTAssertEqual(try store.infraRates(), [HistoryStore.InfraRate(testbed: "sim", runs: 3, infra: 1)])
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let page = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(page.contains("<p id=\"infrarate\">") && page.contains("<b>sim</b> 1 of 3 (33.33 %, 95 % CI 6.149–79.23 %)"), page)
        c.collectMetrics()
        let metrics = String(decoding: c.metrics.metrics.exposition(), as: UTF8.self)
        XCTAssertTrue(metrics.contains("heraldlab_testbed_recent_runs{testbed=\"sim\"} 3"), metrics)
        XCTAssertTrue(metrics.contains("heraldlab_testbed_recent_infra_runs{testbed=\"sim\"} 1"), metrics)
    }

    /// A history row whose stored summary no longer decodes is named on the Trends page, not
    /// dropped from the chart and the regression band without a word.
    func testTrendsNamesAStoredSummaryThatCannotBeRead() async throws {
        let (c, client) = try await start()
        let yaml = "name: trendplan\nduration: 20s\nnodes: {count: 3}\nradio: {kind: sim}\n"
        let plan = try Plan.parse(yaml: yaml)
        try FileManager.default.createDirectory(at: c.config.results, withIntermediateDirectories: true)
        let store = try HistoryStore(url: c.config.results.appendingPathComponent("history.sqlite"))
        for seed in UInt64(1)...3 {
            let bundle = c.config.results.appendingPathComponent("trendplan-\(seed)")
            _ = try Simulation(plan: plan, planText: yaml, seed: seed, output: bundle, threads: 1).run()
            _ = try store.record(try Analyser.analyse(bundle).result, reportPath: "")
        }
        let damaged = try XCTUnwrap(try store.runs().dropFirst().first)
        let db = try DatabaseQueue(path: c.config.results.appendingPathComponent("history.sqlite").path)
        try await db.write { try $0.execute(sql: "UPDATE run SET summaryJSON = '{\"cut off' WHERE id = ?", arguments: [damaged.id]) }
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let page = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(page.contains("class=\"fail unreadable\""), page)
        XCTAssertTrue(page.contains("run \(damaged.runId) (history row \(damaged.id!))"), "the damaged row is named")
        XCTAssertEqual(page.components(separatedBy: "(history row ").count - 1, 1, "only the damaged row")
        XCTAssertTrue(page.contains("(3 runs)"), "the plan's runs are still charted")
    }

    func testTrendsListsAFinishedStudyAndItsPageShowsTheEffects() async throws {
        let (c, client) = try await start()
        let (_, runs) = try Plan.expandStudy(yaml: studyYAML(name: "advstudy", repeats: 3))
        try saveStudyRuns(c, runs, prefix: "advstudy")
        // A valid plan without a study, finished: in no study.
        try c.save(RunRecord(id: "plainplan-20260101-000000-abcd", plan: "plainplan", planText: "name: plainplan\nduration: 1m\nnodes: {count: 2}\n", state: .complete,
                             created: 1_700_000_000, duration: 60, warmup: 0, air: nil, nodes: []))
        // A second study with only its baseline's runs finished.
        let half = try Plan.expandStudy(yaml: studyYAML(name: "halfstudy", repeats: 2)).runs.filter { $0.levelIndex == 0 }
        try saveStudyRuns(c, half, prefix: "halfstudy")
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let trends = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(trends.contains("<table id=\"studies\">"), trends)
        XCTAssertTrue(trends.contains("href=\"/studies/advstudy\">advstudy</a>"))
        XCTAssertTrue(trends.contains("100ms (3/3), 2s (3/3)"))
        XCTAssertTrue(trends.contains("6 of 6 finished (6 planned)"))
        XCTAssertTrue(trends.contains("href=\"/studies/halfstudy\">halfstudy</a>"))
        XCTAssertTrue(trends.contains("100ms (2/2), 2s (0/2)"))
        XCTAssertFalse(trends.contains("/studies/plainplan"), "a plan without a study is in no study")
        XCTAssertFalse(trends.contains("/studies/secretplan"))
        XCTAssertEqual(trends.components(separatedBy: "href=\"/studies/").count - 1, 3, "two studies linked by name, and the effects of the one that has them")
        XCTAssertTrue(trends.contains(">compute</a>"), "nothing is bootstrapped before the study's page is asked for")
        XCTAssertTrue(trends.contains("too few finished runs"))

        let (ok, page, _) = try await client.request("GET", "/studies/advstudy", headers: ["Cookie": cookie])
        XCTAssertEqual(ok, 200)
        let html = String(decoding: page, as: UTF8.self)
        XCTAssertTrue(html.contains("aria-label=\"forest plot\""), "the study report's forest plot")
        XCTAssertTrue(html.contains("Pairing: <b>paired per dongle</b>"), "a crossover on the same agents, paired per unit")
        for r in runs { XCTAssertTrue(html.contains(">\(r.plan.studyRun!.level)</td><td><a href=\"/runs/advstudy-"), "run \(r.index) listed with its level") }
        // The effects are the analysis's own: the same comparison as compare computes from these bundles.
        let done = try XCTUnwrap(c.pages.dashboardStudies().first { $0.study.name == "advstudy" })
        guard case .success(let outcome) = c.pages.studyOutcome(done) else { return XCTFail("no outcome") }
        XCTAssertEqual(outcome.effects.count, Metric.allCases.count)
        XCTAssertTrue(html.contains(StudyReport.estimatesTable(outcome)), "each metric's estimates, difference with its 95 % interval, verdict, repeats advised")
        XCTAssertTrue(html.contains(StudyReport.forestPlot(outcome, inlineStyle: false)))
        XCTAssertTrue(outcome.effects.contains { $0.ci95 != nil && $0.verdict != .noData }, "effects with intervals and verdicts")
        // Computed once for this set of runs; the Trends page then shows the verdicts.
        XCTAssertNotNil(c.dashboard.studies.cached(done.key, runs: done.finished.map(\.record.id).sorted()))
        let (_, again, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertFalse(String(decoding: again, as: UTF8.self).contains(">compute</a>"), "the Trends page shows the cached verdicts")

        let (_, halfPage, _) = try await client.request("GET", "/studies/halfstudy", headers: ["Cookie": cookie])
        let halfHTML = String(decoding: halfPage, as: UTF8.self)
        XCTAssertTrue(halfHTML.contains("id=\"toofew\""), halfHTML)
        XCTAssertTrue(halfHTML.contains("level 2s has none"))
        XCTAssertFalse(halfHTML.contains("forest plot"))
        let (missing, _, _) = try await client.request("GET", "/studies/nostudy", headers: ["Cookie": cookie])
        XCTAssertEqual(missing, 404)
        let (bad, _, _) = try await client.request("GET", "/studies/..%2Fx", headers: ["Cookie": cookie])
        XCTAssertTrue([400, 404].contains(bad))

        // A restarted coordinator still knows which of its runs belong to which study (the plan text is in its store).
        coordinators.removeAll { $0 === c }
        await c.stop()
        let restarted = try Coordinator(config: c.config, logger: LogCapture.quiet())
        let known = restarted.pages.dashboardStudies()
        XCTAssertEqual(Set(known.map(\.study.name)), ["advstudy", "halfstudy"])
        XCTAssertEqual(known.first { $0.study.name == "advstudy" }?.finished.count, 6)
    }

    /// Issue 40, item 5: while a study runs, its page says so ("in progress: 3 of 6 runs, about
    /// 100 s left"), lists the runs still planned, and shows no red arm check or short levels:
    /// nothing failed. A study that stopped short, or a run that failed, is said in red.
    func testAStudyInProgressSaysHowFarAndListsItsPlannedRuns() async throws {
        let (c, client) = try await start()
        let (_, runs) = try Plan.expandStudy(yaml: studyYAML(name: "livestudy", repeats: 3))
        let t = Date().timeIntervalSince1970
        // The first three runs (both levels among them) finished lately; the fourth is running.
        XCTAssertEqual(Set(runs.prefix(3).map(\.level)).count, 2)
        try saveStudyRuns(c, Array(runs.prefix(3)), prefix: "livestudy", created: t - 600)
        var running = RunRecord(id: "livestudy-running-0004", plan: "studyplan", planText: runs[3].yaml, state: .running, created: t - 30, duration: 40, warmup: 0,
                                air: nil, nodes: [])
        running.startAt = t - 20
        try c.save(running)
        let st = try XCTUnwrap(c.pages.dashboardStudies().first { $0.study.name == "livestudy" })
        XCTAssertTrue(st.inProgress(now: t))
        // The running run's 20 s, and the two runs still to come at its 40 s (the finished runs
        // say no arming or gathering time: they have no start).
        XCTAssertEqual(st.secondsLeft(now: t), 100, accuracy: 0.001)
        XCTAssertEqual(DashboardStudy.about(100), "about 100 s left")
        XCTAssertEqual(DashboardStudy.about(1500), "about 25 min left")
        XCTAssertEqual(st.plannedOnly.map(\.index), [4, 5])
        XCTAssertEqual(st.plannedOnly.map(\.block), [2, 2])
        XCTAssertEqual(st.plannedOnly.first?.levels, ["100ms", "2s"], "the last block's order is not known until it is submitted")

        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/studies/livestudy", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let html = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(html.range(of: "in progress: 3 of 6 runs, about [0-9]+ s left", options: .regularExpression) != nil, html)
        XCTAssertEqual(html.components(separatedBy: "<td>planned</td>").count - 1, 2, "runs 5 and 6 listed as planned")
        XCTAssertTrue(html.contains("<td class=\"num\">5</td><td class=\"num\">3</td><td>one of 100ms, 2s</td>"), html)
        XCTAssertTrue(html.contains(">livestudy-running-0004</a></td><td class=\"running\">running</td>"), html)
        XCTAssertFalse(html.contains("Arm check failed"), "nothing failed: the study is in progress")
        XCTAssertFalse(html.contains("Levels short of their planned runs"))
        XCTAssertFalse(html.contains("id=\"endedshort\""))
        XCTAssertTrue(html.contains("Interim effects"), html)
        let (_, trends, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertTrue(String(decoding: trends, as: UTF8.self).contains("in progress: 3 of 6 runs"))

        // The fourth run fails: said at once, in red, while the study goes on.
        running.state = .failed
        running.message = "agent lost"
        running.ended = t
        try c.save(running)
        let (_, failedPage, _) = try await client.request("GET", "/studies/livestudy", headers: ["Cookie": cookie])
        let failedHTML = String(decoding: failedPage, as: UTF8.self)
        XCTAssertTrue(failedHTML.contains("id=\"runsfailed\" class=\"fail\">Failed: run 4"), failedHTML)
        XCTAssertTrue(failedHTML.contains("in progress: 4 of 6 runs"), "the CLI may still submit the rest")
        // Nothing more for longer than a submission takes: the study stopped short.
        let stopped = try XCTUnwrap(c.pages.dashboardStudies().first { $0.study.name == "livestudy" })
        XCTAssertFalse(stopped.inProgress(now: t + DashboardStudy.submissionGap + 1))
    }

    /// Issue 40: an aborted run has no verdict (the Runs page says aborted, Trends does not plot
    /// it, it is in no verdict count), and a run with infrastructure faults is marked, outside the
    /// band and the scale, and not counted as a fail.
    func testAbortedRunsHaveNoVerdictAndInfraRunsAreMarked() async throws {
        let (c, client) = try await start()
        let yaml = "name: abortplan\nduration: 20s\nnodes: {count: 3}\nradio: {kind: sim}\n"
        let plan = try Plan.parse(yaml: yaml)
        try FileManager.default.createDirectory(at: c.config.results, withIntermediateDirectories: true)
        let store = try HistoryStore(url: c.config.results.appendingPathComponent("history.sqlite"))
        let bundle = c.config.results.appendingPathComponent("abortplan-base")
        _ = try Simulation(plan: plan, planText: yaml, seed: 1, output: bundle, threads: 1).run()
        let base = try Analyser.analyse(bundle).result
        func night(_ id: String, aborted: Bool = false, infra: Bool = false) throws {
            var r = base
            r.input.runId = id
            r.input.path = c.config.results.appendingPathComponent(id).path
            if aborted { r.input.aborted = true; r.input.infrastructure = ["the run was aborted"] }
            if infra { r.input.infrastructure = ["node node2: state partial (paused)"] }
            _ = try store.record(r, reportPath: "")
        }
        for k in 1...3 { try night("abortplan-n\(k)") }
        try night("abortplan-stopped", aborted: true)
        try night("abortplan-paused", infra: true)
        try night("abortplan-n4")
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let page = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(page.contains("Aborted, no verdict (not plotted): abortplan-stopped"), page)
        XCTAssertFalse(page.contains("<title>abortplan-stopped"), "an aborted run is in no chart")
        XCTAssertTrue(page.contains("<title>abortplan-paused (") && page.contains(" UTC): "), "an infra run is plotted, marked")
        XCTAssertTrue(page.contains("class=\"infra\"><title>abortplan-paused"), page)
        XCTAssertTrue(page.contains("Infrastructure faults (grey rings; not in the line, the band or the scale): abortplan-paused (node node2: state partial (paused))"))

        // The Runs page and the verdict counts.
        func record(_ id: String, _ state: RunRecord.State, passed: Bool?, infra: [String]? = nil, abort: Bool = false) -> RunRecord {
            var r = RunRecord(id: id, plan: "abortplan", planText: yaml, state: state, created: 1_700_000_500, duration: 20, warmup: 0, air: nil, nodes: [])
            r.bundle = id
            r.passed = passed
            r.infra = infra
            r.abortRequested = abort ? true : nil
            return r
        }
        let records = [record("abortplan-pass", .complete, passed: true), record("abortplan-fail", .complete, passed: false),
                       record("abortplan-infra", .complete, passed: false, infra: ["node n2: 1 gap (agent paused)"]),
                       record("abortplan-aborted", .aborted, passed: nil, abort: true),
                       // Recorded before issue 40: an aborted run with the analysis' FAIL.
                       record("abortplan-oldabort", .aborted, passed: false, abort: true)]
        XCTAssertEqual(CoordinatorMetrics.verdictCounts(records), ["pass": 1, "fail": 1, "infra": 1, "aborted": 2])
        XCTAssertEqual(c.pages.verdictCell(records[3]), "<span class=\"noverdict\">aborted</span>")
        XCTAssertEqual(c.pages.verdictCell(records[4]), "<span class=\"noverdict\">aborted</span>")
        XCTAssertTrue(c.pages.verdictCell(records[2]).contains(">infra</span>"))
        XCTAssertFalse(c.pages.verdictCell(records[2]).contains("FAIL"))
        XCTAssertTrue(c.pages.verdictCell(records[1]).contains("FAIL"))
        for r in records { try c.save(r) }
        let (_, runsBody, _) = try await client.request("GET", "/runs", headers: ["Cookie": cookie])
        let runs = String(decoding: runsBody, as: UTF8.self)
        XCTAssertTrue(runs.contains("<span class=\"noverdict\">aborted</span>"), runs)
        c.collectMetrics()
        let exposition = String(decoding: Data(c.metrics.metrics.exposition()), as: UTF8.self)
        XCTAssertTrue(exposition.contains("heraldlab_run_verdicts_total{verdict=\"fail\"} 1"), exposition)
        XCTAssertTrue(exposition.contains("heraldlab_runs_without_verdict_total{reason=\"aborted\"} 2"), exposition)
        XCTAssertTrue(exposition.contains("heraldlab_runs_without_verdict_total{reason=\"infra\"} 1"), exposition)
    }

    // MARK: The run page is the run's home (issue 40)

    /// A finished run with a real bundle's report folder (simulated, analysed) and its archive.
    func saveAnalysedRun(_ c: Coordinator, id: String) throws {
        let yaml = "name: homeplan\nduration: 20s\nnodes: {count: 3}\nradio: {kind: sim}\nthresholds: {detectionPct: 95, continuityPct: 85}\n"
        let plan = try Plan.parse(yaml: yaml)
        let bundle = c.config.results.appendingPathComponent(id)
        _ = try Simulation(plan: plan, planText: yaml, seed: 3, output: bundle, runId: id, threads: 1).run()
        try ReportWriter.write(try Analyser.analyse(bundle), to: bundle.appendingPathComponent("report"))
        try Data("the bundle of \(id)".utf8).write(to: c.config.results.appendingPathComponent("\(id).tar.gz"))
        var r = RunRecord(id: id, plan: "homeplan", planText: yaml, state: .complete, created: 1_700_000_000, duration: 20, warmup: 0, air: nil,
                          nodes: plan.nodes.map { RunRecord.Node(name: $0.name, agent: "agent-\($0.name)", agentURL: "http://127.0.0.1:1", state: .complete, files: []) })
        r.bundle = bundle.path
        r.passed = true
        r.headline = "detection 100 %"
        try c.save(r)
    }

    func hrefs(_ html: String) -> [String] {
        html.components(separatedBy: "href=\"").dropFirst().compactMap { $0.split(separator: "\"", maxSplits: 1).first.map(String.init) }
    }

    /// After a run ends its page links to every file of its report folder and its bundle; each
    /// answers with the session and 401 without; report.html is sandboxed without script but in the
    /// dashboard's origin, links back to the run, and every link in it resolves for the session.
    func testAFinishedRunsPageLinksItsFilesAndTheReportsLinksResolve() async throws {
        let (c, client) = try await start()
        let id = "homeplan-20260101-000000-abcd"
        try saveAnalysedRun(c, id: id)
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/runs/\(id)", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 200)
        let page = String(decoding: body, as: UTF8.self)
        let files = hrefs(page).filter { $0.hasPrefix("/runs/\(id)/files/") }
        XCTAssertEqual(files.map { String($0.dropFirst("/runs/\(id)/files/".count)) }, DashboardRoutes.runFileNames.map(\.name), page)
        XCTAssertTrue(page.contains("The plan&#39;s thresholds: detection ≥ 95 % · continuity ≥ 85 % · each pair&#39;s continuity ≥ 80 %"), page)
        XCTAssertTrue(page.contains("<span class=\"pass\">PASS</span>"), "the verdict")
        XCTAssertTrue(page.contains("id=\"state\" class=\"complete\">complete<"), page)
        for path in files {
            let (ok, data, headers) = try await client.request("GET", path, headers: ["Cookie": cookie])
            XCTAssertEqual(ok, 200, path)
            XCTAssertFalse(data.isEmpty, path)
            XCTAssertEqual(headers["x-content-type-options"], "nosniff")
            let (stranger, answer, _) = try await client.request("GET", path)
            XCTAssertEqual(stranger, 401, path)
            XCTAssertFalse(String(decoding: answer, as: UTF8.self).contains("homeplan"), path)
        }
        let (_, reportData, reportHeaders) = try await client.request("GET", "/runs/\(id)/files/report.html", headers: ["Cookie": cookie])
        let csp = try XCTUnwrap(reportHeaders["content-security-policy"])
        XCTAssertTrue(csp.hasPrefix("sandbox allow-same-origin allow-downloads"), csp)
        XCTAssertFalse(csp.contains("allow-scripts"), "nothing in the report runs in the dashboard's origin")
        XCTAssertTrue(csp.contains("script-src 'none'"), csp)
        XCTAssertNil(reportHeaders["content-disposition"], "the report is shown, its files downloaded")
        let report = String(decoding: reportData, as: UTF8.self)
        XCTAssertTrue(report.contains("<a style=\"color:#fff\" href=\"/runs/\(id)\">← run \(id)</a>"), "a link back to the run")
        XCTAssertFalse(report.contains("<script"), "no script is served where none would run")
        XCTAssertTrue(report.contains("<table id=\"pt\">"), "the report's first page of pairs is static")
        XCTAssertEqual(String(decoding: DashboardRoutes.withoutScripts(Data("a<script>x</script>b<script src=y></script>c".utf8)), as: UTF8.self), "abc")
        let links = hrefs(report).filter { !$0.hasPrefix("#") }
        for name in ["summary.json", "pairs.csv", "junit.xml", "formal-summary.csv", "formal-continuity.csv", "summary-discovery-pairs.csv", "/runs/\(id)", "/runs"] {
            XCTAssertTrue(links.contains(name), "report.html links \(name): \(links)")
        }
        let base = try XCTUnwrap(URL(string: "http://127.0.0.1/runs/\(id)/files/report.html"))
        for link in links {
            let path = try XCTUnwrap(URL(string: link, relativeTo: base)?.path)
            let (ok, _, _) = try await client.request("GET", path, headers: ["Cookie": cookie])
            XCTAssertEqual(ok, 200, "\(link) from report.html is \(path)")
        }
        // Only the allow-list's names: nothing else of the results folder, however it is spelled.
        for name in ["..%2Fcoordinator.sqlite", "..%2F..%2Fcoordinator.sqlite", "%2e%2e", "manifest.json", "report", "nodes%2Fnode1%2Fcontacts.csv",
                     "report.html%00", "REPORT.HTML", "summary.json.bak", "%2Fetc%2Fpasswd", "..%5Ccoordinator.sqlite"] {
            let (refused, answer, _) = try await client.request("GET", "/runs/\(id)/files/\(name)", headers: ["Cookie": cookie])
            XCTAssertTrue([400, 404].contains(refused), "\(name): \(refused)")
            XCTAssertFalse(String(decoding: answer, as: UTF8.self).contains("SQLite"), name)
        }
        // A running run has no files yet: its page links none.
        let (_, live, _) = try await client.request("GET", "/runs/liveplan-20260101-000000-abcd", headers: ["Cookie": cookie])
        XCTAssertFalse(String(decoding: live, as: UTF8.self).contains("href=\"/runs/liveplan-20260101-000000-abcd/files/"))
    }

    /// The progress follows the nodes (issue 40): armed nodes waiting for the start are "armed",
    /// never "running (… s left)"; then running, gathering and the final state.
    func testTheProgressSaysArmedWhileTheNodesAreArmed() async throws {
        let (c, client) = try await start()
        let t = c.now
        var r = try XCTUnwrap(c.run("liveplan-20260101-000000-abcd"))
        r.id = "armedplan-20260101-000000-abcd"
        r.duration = 120
        r.startAt = t + 30
        r.nodes[0].state = .armed
        try c.save(r)
        let armed = RunProgress(r, now: t)
        XCTAssertEqual(armed.phase, "armed")
        XCTAssertTrue(armed.text.hasPrefix("armed: 1 of 1 nodes armed, starting in 3"), armed.text)
        XCTAssertFalse(armed.text.contains("running"), armed.text)
        // Past the instant, a node that has not said it runs is still armed.
        XCTAssertEqual(RunProgress(r, now: t + 31).phase, "armed")
        let (cookie, _) = try await session(client)
        let (_, body, _) = try await client.request("GET", "/runs/\(r.id)", headers: ["Cookie": cookie])
        let page = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(page.contains("id=\"state\" class=\"armed\">armed</b>"), page)
        XCTAssertTrue(page.contains("<span id=\"left\">1 of 1 nodes armed, starting in"), page)
        XCTAssertFalse(page.contains("s left"))
        XCTAssertEqual(c.pages.liveSnapshot(r).progress?.phase, "armed")
        var arming = r
        arming.state = .arming
        arming.nodes[0].state = .selected
        XCTAssertEqual(RunProgress(arming, now: t).text, "arming: 0 of 1 nodes armed")
        r.nodes[0].state = .running
        let running = RunProgress(r, now: t + 60)
        XCTAssertEqual(running.phase, "running")
        XCTAssertEqual(running.text, "running: 30 s of 120 s, 90 s left; 1 of 1 nodes running")
        XCTAssertEqual(try XCTUnwrap(running.fraction), 0.25, accuracy: 1e-9)
        r.state = .gathering
        r.nodes[0].state = .complete
        XCTAssertEqual(RunProgress(r, now: t + 200).text, "gathering: 1 of 1 nodes gathered")
        r.state = .complete
        XCTAssertEqual(RunProgress(r, now: t + 200).phase, "complete")
    }

    /// The run's page shows the coordinator's log lines of that run (and no other's), escaped.
    func testTheRunsPageShowsItsLogLinesEscaped() async throws {
        let (c, client) = try await start()
        let live = "liveplan-20260101-000000-abcd"
        c.logger.notice("run \(live): node <b onmouseover=alert(1)>n1</b> took its start", metadata: ["run": .string(live), "node": .string("n1")])
        c.logger.notice("run other: elsewhere", metadata: ["run": .string("otherplan-20260101-000000-abcd")])
        c.logger.debug("run \(live): below info", metadata: ["run": .string(live)])
        XCTAssertEqual(c.dashboard.events.of(live).map(\.text), ["run \(live): node <b onmouseover=alert(1)>n1</b> took its start node=n1"])
        let (cookie, _) = try await session(client)
        let (_, body, _) = try await client.request("GET", "/runs/\(live)", headers: ["Cookie": cookie])
        let page = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(page.contains("node &lt;b onmouseover=alert(1)&gt;n1&lt;/b&gt; took its start node=n1</td>"), page)
        XCTAssertFalse(page.contains("<b onmouseover"))
        XCTAssertFalse(page.contains("elsewhere"))
        XCTAssertEqual(c.pages.liveSnapshot(try XCTUnwrap(c.run(live))).events?.count, 1)
        // A run this coordinator logged nothing of: what its record says.
        XCTAssertTrue(c.pages.runEvents(try XCTUnwrap(c.run(runId))).first?.text.hasPrefix("submitted: 1 nodes (from the run's record") == true)
    }

    /// The charts' counts over run time: buckets of a round width, a node keeping its last sample.
    func testTheLiveSeriesCountOverRunTime() throws {
        XCTAssertEqual(LiveSeries.step(duration: 60), 5)
        XCTAssertEqual(LiveSeries.step(duration: 3600), 10)
        XCTAssertEqual(LiveSeries.step(duration: 86_400), 300)
        let nodes = ["n1", "n2"].map { RunRecord.Node(name: $0, agent: "a-\($0)", agentURL: "http://127.0.0.1:1", state: .running, files: []) }
        var r = RunRecord(id: "series-1", plan: "series", planText: "", state: .running, created: 0, duration: 60, warmup: 0, air: nil, nodes: nodes)
        r.startAt = 1000
        let series = LiveSeries()
        series.note(r, node: "n1", .init(peers: 1, reads: 3, rssiPerMinute: 10), at: 1001)
        series.note(r, node: "n2", .init(peers: 1, reads: 2, rssiPerMinute: 20), at: 1002)
        series.note(r, node: "n1", .init(peers: 1, reads: 5, rssiPerMinute: 12), at: 1012)
        series.note(r, node: "n1", .init(peers: 0, reads: 0, rssiPerMinute: 0), at: 990) // before the start: nothing
        let s = Dashboard.series(try XCTUnwrap(series.track(r.id)), r)
        XCTAssertEqual(s.t, [0, 5, 10, 15], "from the start")
        XCTAssertEqual(s.detected, [0, 2, 2, 2])
        XCTAssertEqual(s.reads, [0, 5, 5, 7])
        XCTAssertEqual(s.rssi, [[0, 10, 10, 12], [0, 20, 20, 20]])
        XCTAssertEqual(s.pairs, 2)
    }
}
