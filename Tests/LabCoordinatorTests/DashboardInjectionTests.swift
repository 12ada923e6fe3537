import XCTest
import GRDB
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabNode
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// Issue 40 item 8: markup, Mustache syntax, a direction override and an escape character put
/// through every field an agent or a plan controls (agent name, URL, tags, version, adapter,
/// dongle name, host, evidence, messages, errors, held runs; plan name, variant, settings,
/// testbed, node names, run messages and headlines, infra faults, study names, factors and
/// levels, the run's log lines, refusals) reach every page only escaped, and no page has an
/// inline script, style or event handler left for the Content-Security-Policy to allow.
final class DashboardInjectionTests: XCTestCase {
    var dirs: [URL] = []
    var coordinators: [Coordinator] = []
    override func tearDown() async throws {
        for c in coordinators { await c.stop() }
        for d in dirs { try? FileManager.default.removeItem(at: d) }
    }

    let operatorToken = "operator-token-0123456789abcdef"

    /// What an attacker writes into field `field`: a script, an attribute break-out, Mustache
    /// syntax, U+202E (right-to-left override) and ESC (a terminal colour).
    static func hostile(_ field: String) -> String {
        "\(field)<script>alert(1)</script>\"><img src=x onerror=alert(1)>{{x}}{{{x}}}\u{202E}\u{1B}[31m"
    }

    /// Raw pieces none of which may reach a page.
    static let raw = ["<script>alert", "<img src=x", "\u{202E}", "\u{1B}", "\"><img"]

    func testMarkupThroughEveryFieldAnAgentOrAPlanControlsIsEscapedOnEveryPage() async throws {
        let h = Self.hostile
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dash-inject-\(UUID().uuidString)")
        dirs.append(dir)
        var config = Coordinator.Config(results: dir.appendingPathComponent("results"))
        config.token = operatorToken
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        coordinators.append(c)
        let t = c.now

        // An agent as a store written before the entry checks could hold it.
        var info = LabWire.AgentInfo(name: h("agentname"), url: h("agenturl"), tags: [h("tag1"), h("tag2")], radio: .sim, adapter: h("adapter"),
                                     controller: ["k": h("controller")], version: h("version"))
        info.dongle = LabWire.DongleInfo(id: "F0:00:00:00:00:09", name: h("agentdongle"), present: true)
        var status = LabWire.AgentStatus(name: info.name, state: .idle)
        status.held = [h("heldrun")]
        status.message = h("statusmessage")
        c.registry.withRecords { s in s[info.name] = AgentRegistry.AgentRecord(info: info, lastSeen: t, persistedSeen: t, status: status) }
        c.agentError(info.name, h("agenterror"))

        // A dongle: its name, host, agent, health reason, and a history event's message, run and evidence.
        var dongleInfo = LabWire.DongleInfo(id: "F0:00:00:00:00:01", name: h("donglename"), present: true)
        dongleInfo.host = h("donglehost")
        dongleInfo.agent = h("dongleagent")
        var dongle = DongleRecord(id: "F0:00:00:00:00:01", info: dongleInfo, at: t)
        dongle.health = .bad
        dongle.healthReason = h("healthreason")
        try c.store.saveDongle(dongle, events: [LabWire.DongleEvent(kind: .check, at: t, ok: false, message: h("donglemessage"), run: h("donglerun"), evidence: h("evidence"))])
        c.dongles.withState { s in s.dongles[dongle.id] = dongle }

        // A finished run of a hostile plan and nodes, with its message, headline and infra faults.
        let runId = "hostileplan-20260101-000000-abcd"
        var run = RunRecord(id: runId, plan: h("planname"), planText: "name: hostileplan\nduration: 20s\nnodes: {count: 2}\n", state: .complete,
                            created: t - 100, duration: 20, warmup: 0, air: nil,
                            nodes: [RunRecord.Node(name: h("nodename"), agent: h("nodeagent"), agentURL: h("nodeurl"), state: .complete, files: [LabWire.FileInfo(name: h("filename"), bytes: 1, sha256: h("sha"))]),
                                    RunRecord.Node(name: h("peername"), agent: info.name, agentURL: "http://127.0.0.1:1", state: .complete, files: [])])
        run.message = h("runmessage")
        run.headline = h("headline")
        run.passed = false
        run.infra = [h("infra")]
        run.ended = t - 50
        run.startAt = t - 80
        try c.save(run)
        // A run whose id itself is hostile (the Runs list).
        var oddRun = run
        oddRun.id = h("runid")
        oddRun.headline = nil
        oddRun.message = h("oddmessage")
        try c.save(oddRun)
        // The coordinator's log line of the run (its page's events) and a refused submission.
        c.logger.notice("\(h("logline"))", metadata: ["run": .string(runId)])
        c.dashboard.refusals.note(source: h("refusedplan"), reason: h("refusedreason"), at: t)

        // Studies: one with a hostile name (Trends lists it), one whose factor, levels and plan are hostile (its page).
        func study(_ name: String) throws -> Study {
            let json = try JSONSerialization.data(withJSONObject: ["name": name, "factors": [["path": h("factor"), "levels": [h("level1"), h("level2")]]],
                                                                   "repeats": 2, "margins": [String: String]()])
            return try JSONDecoder().decode(Study.self, from: json)
        }
        for (k, name) in [h("studyname"), "safestudy"].enumerated() {
            var r = run
            r.id = "studyrun-20260101-00000\(k)-abcd"
            r.plan = h("studyplan")
            r.state = .failed
            r.message = h("studyrunmessage")
            try c.save(r)
            c.dashboard.studies.remember(r.id, StudyMembership(study: try study(name), level: h("level1"), index: 0, block: 0))
        }

        // The history Trends draws: a plan, variant, testbed and settings that are hostile, an
        // infra run and an aborted run.
        let yaml = "name: injectplan\nduration: 20s\nnodes: {count: 2}\nradio: {kind: sim}\n"
        try FileManager.default.createDirectory(at: c.config.results, withIntermediateDirectories: true)
        let historyURL = c.config.results.appendingPathComponent("history.sqlite")
        let store = try HistoryStore(url: historyURL)
        let bundle = c.config.results.appendingPathComponent("injectplan-1")
        _ = try Simulation(plan: try Plan.parse(yaml: yaml), planText: yaml, seed: 1, output: bundle, threads: 1).run()
        let result = try Analyser.analyse(bundle).result
        for i in 0..<3 {
            var r = result
            r.input.runId = "injectplan-\(i)"
            _ = try store.record(r, reportPath: "")
        }
        let rows = try store.runs()
        XCTAssertEqual(rows.count, 3)
        let db = try DatabaseQueue(path: historyURL.path)
        try await db.write { db in
            for (i, row) in rows.enumerated() {
                try db.execute(sql: "UPDATE run SET plan = ?, variant = ?, testbed = ?, settingsKey = ?, runId = ?, infra = ?, aborted = ? WHERE id = ?",
                               arguments: [h("historyplan"), h("variant"), h("testbed"), "advertInterval=" + h("setting\(i % 2)"), h("historyrun\(i)"),
                                           i == 1 ? h("historyinfra") : "", i == 2, row.id])
            }
        }

        let port = try await c.start()
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: nil)
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        let (signed, _, headers) = try await client.request("POST", "/signin", body: Data("credential=\(operatorToken)".utf8),
                                                            headers: ["Content-Type": "application/x-www-form-urlencoded"])
        XCTAssertEqual(signed, 303)
        let cookie = String(try XCTUnwrap(headers["set-cookie"]).split(separator: ";")[0])

        // Each page, and the fields it must show (escaped).
        let pages: [(String, [String])] = [
            ("/lab", ["agentname", "agenturl", "tag1", "tag2", "version", "agentdongle", "heldrun", "agenterror", "donglename", "donglehost", "dongleagent",
                      "healthreason", "donglemessage", "donglerun", "evidence", "planname"]),
            ("/runs", ["planname", "runid", "headline", "oddmessage", "studyname", "level1", "refusedplan", "refusedreason"]),
            ("/runs?plan=" + h("planname").addingPercentEncoding(withAllowedCharacters: allowed)!, ["planname"]),
            ("/runs/\(runId)", ["planname", "logline"]),
            ("/trends", ["historyplan", "variant", "testbed", "setting0", "setting1", "historyrun0", "historyinfra", "historyrun2", "studyname", "studyplan",
                         "factor", "level1", "level2"]),
            ("/studies/safestudy", ["studyplan", "factor", "level1", "level2", "studyrunmessage"]),
        ]
        for (path, fields) in pages {
            let (status, body, headers) = try await client.request("GET", path, headers: ["Cookie": cookie])
            XCTAssertEqual(status, 200, path)
            let html = String(decoding: body, as: UTF8.self)
            for piece in Self.raw { XCTAssertFalse(html.contains(piece), "\(path): \(piece.debugDescription) reached the page raw") }
            for field in fields {
                // The log keeps its lines with controls already made visible (LabLogHandler): its start is checked.
                let shown = field == "logline" ? "logline&lt;script&gt;alert(1)&lt;/script&gt;" : OutsideText.html(h(field))
                XCTAssertTrue(html.contains(shown), "\(path): \(field) is not shown escaped\n\(html)")
            }
            // Nothing inline for the policy to allow: no script without src, no style element or attribute, no handler.
            let csp = try XCTUnwrap(headers["content-security-policy"], path)
            XCTAssertTrue(csp.contains("script-src 'self'") && csp.contains("style-src 'self'") && !csp.contains("unsafe-inline"), csp)
            XCTAssertNil(html.range(of: "<script(?![^>]*\\ssrc=\"/static/)", options: .regularExpression), "\(path): an inline script")
            XCTAssertNil(html.range(of: "<style|\\sstyle=", options: .regularExpression), "\(path): inline style")
            // (Attribute values are skipped: escaped text in one holds no quote to end it early.)
            let handler = html.range(of: "<[a-zA-Z][a-zA-Z0-9]*(?:\\s+[a-zA-Z:-]+(?:=\"[^\"]*\")?)*\\s+on[a-z]+\\s*=", options: .regularExpression)
            XCTAssertNil(handler, "\(path): an inline event handler: \(handler.map { String(html[$0]) } ?? "")")
        }
        // The sign-in page, with no session: the same policy, nothing inline.
        let (_, signIn, signInHeaders) = try await client.request("GET", "/")
        XCTAssertNil(String(decoding: signIn, as: UTF8.self).range(of: "<script|<style|\\sstyle=", options: .regularExpression))
        XCTAssertTrue(signInHeaders["content-security-policy"]?.contains("style-src 'self'") == true)
    }

    /// The style sheet and the scripts are served by name only, with their types, cacheable,
    /// to anyone (they hold nothing of the lab); any other name is 404.
    func testTheStaticFilesAreServedByNameOnly() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dash-static-\(UUID().uuidString)")
        dirs.append(dir)
        var config = Coordinator.Config(results: dir.appendingPathComponent("results"))
        config.token = operatorToken
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        coordinators.append(c)
        let port = try await c.start()
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: nil)
        for (name, type) in [("dashboard.css", "text/css"), ("live.js", "text/javascript"), ("list.js", "text/javascript")] {
            let (status, body, headers) = try await client.request("GET", "/static/\(name)")
            XCTAssertEqual(status, 200, name)
            XCTAssertTrue(headers["content-type"]?.hasPrefix(type) == true, "\(name): \(headers["content-type"] ?? "none")")
            XCTAssertTrue(headers["cache-control"]?.contains("max-age=") == true, name)
            XCTAssertEqual(headers["x-content-type-options"], "nosniff")
            XCTAssertFalse(body.isEmpty)
        }
        for name in ["..%2FPackage.swift", "layout.mustache", "run.mustache", "other.js", "%2E%2E"] {
            let (status, _, _) = try await client.request("GET", "/static/\(name)")
            XCTAssertTrue(status == 404 || status == 400, "\(name): \(status)")
        }
    }

    /// Every template loads, opens with the dashboard's escaping pragma, and one without it is refused at the start.
    func testATemplateWithoutTheEscapingPragmaOrMissingIsRefusedAtTheStart() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dash-tpl-\(UUID().uuidString)")
        dirs.append(dir)
        let folder = try DashboardTemplates.resourceFolder()
        try FileManager.default.copyItem(at: folder, to: dir)
        XCTAssertNoThrow(try DashboardTemplates(folder: dir))
        try Data("<p>{{x}}</p>".utf8).write(to: dir.appendingPathComponent("lab.mustache"))
        XCTAssertThrowsError(try DashboardTemplates(folder: dir)) { XCTAssertTrue("\($0)".contains("lab.mustache does not open with"), "\($0)") }
        try FileManager.default.removeItem(at: dir.appendingPathComponent("lab.mustache"))
        XCTAssertThrowsError(try DashboardTemplates(folder: dir)) { XCTAssertTrue("\($0)".contains("lab.mustache cannot be read"), "\($0)") }
        try Data("\(DashboardTemplates.pragma)\n{{#open}}".utf8).write(to: dir.appendingPathComponent("lab.mustache"))
        XCTAssertThrowsError(try DashboardTemplates(folder: dir)) { XCTAssertTrue("\($0)".contains("lab.mustache does not parse"), "\($0)") }
        try FileManager.default.removeItem(at: dir.appendingPathComponent("live.js"))
        try Data("\(DashboardTemplates.pragma)\n".utf8).write(to: dir.appendingPathComponent("lab.mustache"))
        XCTAssertThrowsError(try DashboardTemplates(folder: dir)) { XCTAssertTrue("\($0)".contains("live.js cannot be read"), "\($0)") }
    }

    /// A deleted templates folder (an installed /usr/share/herald-lab/dashboard removed) is an
    /// error naming every folder looked in, not the end of the process.
    func testMissingTemplateFoldersAreAnErrorNamingWhereItLooked() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dash-none-\(UUID().uuidString)")
        dirs.append(dir)
        let missing = [dir.appendingPathComponent("a/Dashboard"), dir.appendingPathComponent("share/herald-lab/dashboard")]
        XCTAssertThrowsError(try DashboardTemplates.firstFolder(of: missing)) { error in
            XCTAssertTrue("\(error)".contains("templates are missing"), "\(error)")
            for url in missing { XCTAssertTrue("\(error)".contains(url.path), "\(error)") }
        }
        // A file where the folder should be is not a folder.
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("a"), withIntermediateDirectories: true)
        try Data().write(to: missing[0])
        XCTAssertThrowsError(try DashboardTemplates.firstFolder(of: missing))
        try FileManager.default.createDirectory(at: missing[1], withIntermediateDirectories: true)
        XCTAssertEqual(try DashboardTemplates.firstFolder(of: missing), missing[1])
        XCTAssertTrue(DashboardTemplates.resourceCandidates().count >= 1)
    }
}
