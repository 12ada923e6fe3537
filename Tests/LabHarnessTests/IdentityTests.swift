import Foundation
import XCTest
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
import LabTestSupport

/// A lab as install.sh deploys it: a CA made by `herald-lab ca init`, agents enrolled with
/// `herald-lab agents enrol` and `herald-lab enrol`, everything over TLS (coordinator, agents,
/// air). A run completes; then each agent tries to be someone else, and one is revoked.
final class IdentityTests: XCTestCase {
    var lab: LabProcesses?
    override func tearDown() { lab?.stopAll(); lab = nil }

    /// The lab: CA folder `cred`, air and coordinator on TLS, agents a1 and a2 enrolled.
    func enrolledLab() throws -> (LabProcesses, CredentialsFolder) {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        let cred = lab.dir.appendingPathComponent("cred")
        var (rc, out) = try lab.cli(["ca", "init", "--dir", cred.path, "--host", "127.0.0.1"])
        XCTAssertEqual(rc, 0, out)
        let folder = CredentialsFolder(url: cred)
        try lab.start("air", ["air", "--credentials", cred.path])
        try lab.start("coordinator", ["coordinator", "--credentials", cred.path, "--results", lab.results.path, "--air", lab.airAddress, "--gather-patience", "30s"])
        for a in ["a1", "a2"] {
            let file = lab.dir.appendingPathComponent("\(a).enrol").path
            (rc, out) = try lab.cli(["agents", "enrol", a, "--host", "127.0.0.1", "--out", file, "--coordinator", lab.secureCoordinatorURL, "--credentials", cred.path])
            XCTAssertEqual(rc, 0, out)
            var st = stat()
            XCTAssertEqual(stat(file, &st), 0)
            XCTAssertEqual(st.st_mode & 0o777, 0o600, "the enrolment holds secrets")
            (rc, out) = try lab.cli(["enrol", file, "--dir", lab.dir.appendingPathComponent("\(a)-cred").path])
            XCTAssertEqual(rc, 0, out)
            try lab.start(a, ["agent", "--name", a, "--credentials", lab.dir.appendingPathComponent("\(a)-cred").path,
                              "--data", lab.dir.appendingPathComponent("\(a)-data").path, "--coordinator", lab.secureCoordinatorURL])
        }
        try folder.trustLabCA()
        let op = try XCTUnwrap(folder.secret("operator.token"))
        try lab.waitUntil(timeout: 20, "enrolled agents registered over TLS") {
            let (s, d, _) = lab.call("GET", "/v1/agents", url: lab.secureCoordinatorURL, token: op)
            guard s == 200, let list = try? JSONSerialization.jsonObject(with: d) as? [[String: Any]] else { return false }
            let alive = list.filter { $0["state"] as? String == "alive" }.compactMap { ($0["info"] as? [String: Any])?["url"] as? String }
            return alive.count == 2 && alive.allSatisfy { $0.hasPrefix("https://") }
        }
        return (lab, folder)
    }

    func credential(_ lab: LabProcesses, _ a: String) throws -> AgentCredential {
        try XCTUnwrap(CredentialsFolder(url: lab.dir.appendingPathComponent("\(a)-cred")).agent())
    }

    func testAnEnrolledLabRunsOverTLSAndNobodyActsAsAnother() throws {
        let (lab, folder) = try enrolledLab()
        let op = try XCTUnwrap(folder.secret("operator.token"))
        let url = lab.secureCoordinatorURL

        // A run over TLS end to end: arm, air tickets, gather, bundle checked by herald-lab run.
        let plan = lab.dir.appendingPathComponent("id.yaml")
        try LabProcesses.plan("identity", nodes: 2, duration: "6s").write(to: plan, atomically: true, encoding: .utf8)
        let (rc, out) = try lab.cli(["run", plan.path, "--coordinator", url, "--credentials", folder.url.path, "--out", lab.dir.appendingPathComponent("bundles").path], timeout: 120)
        XCTAssertTrue(rc == 0 || rc == 1, "the run ends with a verdict, not an error: \(out)\n\(lab.log("coordinator").suffix(2000))")
        XCTAssertTrue(out.contains("verdict:"), "the bundle was fetched (checked against its SHA-256), unpacked and analysed: \(out)")
        XCTAssertTrue(lab.log("air").contains("n1 attached"), lab.log("air"))

        let a1 = try credential(lab, "a1"), a2 = try credential(lab, "a2")
        let status = try LabJSON.encoder.encode(LabWire.AgentStatus(name: "a2", state: .idle))
        // An agent is itself only: not another agent, not the operator.
        XCTAssertEqual(lab.call("POST", "/v1/agents/a2/heartbeat", body: status, url: url, token: a1.token).0, 403)
        XCTAssertEqual(lab.call("GET", "/v1/runs", url: url, token: a1.token).0, 403)
        let impostor = try LabJSON.encoder.encode(LabWire.AgentInfo(name: "a2", url: "https://127.0.0.1:1", tags: [], radio: .sim, adapter: nil, controller: nil, version: ""))
        XCTAssertEqual(lab.call("POST", "/v1/agents/register", body: impostor, url: url, token: a1.token).0, 403)
        // The operator's credential cannot take an enrolled agent's name either.
        XCTAssertEqual(lab.call("POST", "/v1/agents/register", body: impostor, url: url, token: op).0, 403)
        // What the coordinator calls a1 with does not open a2.
        let a2URL = "https://127.0.0.1:\(lab.ports["a2"]!)"
        XCTAssertEqual(lab.call("GET", "/v1/status", url: a2URL, token: a1.coordinatorToken).0, 401)
        XCTAssertEqual(lab.call("GET", "/v1/status", url: a2URL, token: a2.coordinatorToken).0, 200)
        // Plain HTTP to a TLS service gets no answer.
        XCTAssertNotNil(lab.call("GET", "/health", url: url.replacingOccurrences(of: "https://", with: "http://"), token: op).2)

        // The air: a ticket for n1 does not attach n2; a forged one attaches nothing.
        let key = Data(try XCTUnwrap(folder.secret("air.key")).utf8)
        let n1Ticket = NodeTicket.issue(run: "manual", node: "n1", agent: "a1", issued: Date().timeIntervalSince1970, expires: Date().timeIntervalSince1970 + 60, key: key)
        XCTAssertTrue(try airHello(lab, node: "n2", ticket: n1Ticket).contains("ticket is for node n1"))
        let forged = NodeTicket.issue(run: "manual", node: "n2", agent: "a2", issued: Date().timeIntervalSince1970, expires: Date().timeIntervalSince1970 + 60, key: Data("not the key".utf8))
        XCTAssertTrue(try airHello(lab, node: "n2", ticket: forged).contains("not signed"))
        XCTAssertTrue(try airHello(lab, node: "n1", ticket: n1Ticket).contains("\"ok\":true"))

        // Revoking a2: one command; its credential is refused and it leaves the list.
        let (rrc, rout) = try lab.cli(["agents", "revoke", "a2", "--coordinator", url, "--credentials", folder.url.path])
        XCTAssertEqual(rrc, 0, rout)
        XCTAssertEqual(lab.call("POST", "/v1/agents/a2/heartbeat", body: status, url: url, token: a2.token).0, 401)
        let (_, list, _) = lab.call("GET", "/v1/agents", url: url, token: op)
        XCTAssertFalse(String(decoding: list, as: UTF8.self).contains("\"a2\""))
        try lab.waitUntil(timeout: 10, "a2 told it is refused") { lab.log("a2").contains("refuses this agent's credential") }
    }

    /// Issue 19: revoking an agent in the middle of its run. The coordinator calls it with
    /// nothing from then on (the lab token least of all), its node ends lost as "revoked" while
    /// the other node's run goes on, the air drops what its ticket attached, a ticket of the ended
    /// run attaches nothing, and the agent enrolled again under the same name runs the next run.
    func testAnAgentRevokedMidRunIsNeverCalledAgainAndEnrolledAnewRunsTheNext() throws {
        let (lab, folder) = try enrolledLab()
        let op = try XCTUnwrap(folder.secret("operator.token"))
        let url = lab.secureCoordinatorURL
        let plan = LabProcesses.plan("revoked", nodes: 2, duration: "8s") + "agents: {names: [a1, a2]}\n"
        let (s, d, _) = lab.call("POST", "/v1/runs", body: Data(plan.utf8), url: url, token: op)
        XCTAssertEqual(s, 201, String(decoding: d, as: UTF8.self))
        let id = try XCTUnwrap((try JSONSerialization.jsonObject(with: d) as? [String: Any])?["id"] as? String)
        func record() -> [String: Any]? {
            let (s, d, _) = lab.call("GET", "/v1/runs/\(id)", url: url, token: op)
            return s == 200 ? try? JSONSerialization.jsonObject(with: d) as? [String: Any] : nil
        }
        func nodes(_ r: [String: Any]?) -> [[String: Any]] { (r?["nodes"] as? [[String: Any]]) ?? [] }
        try lab.waitUntil(timeout: 30, "both nodes running") { nodes(record()).allSatisfy { $0["state"] as? String == "running" } && nodes(record()).count == 2 }
        let a2LogBefore = lab.log("a2").count
        let (rrc, rout) = try lab.cli(["agents", "revoke", "a2", "--coordinator", url, "--credentials", folder.url.path])
        XCTAssertEqual(rrc, 0, rout)
        try lab.waitUntil(timeout: 90, "the run ended") { ["complete", "failed", "aborted"].contains(record()?["state"] as? String ?? "") }
        let final = try XCTUnwrap(record())
        let n2 = try XCTUnwrap(nodes(final).first { $0["agent"] as? String == "a2" })
        let n1 = try XCTUnwrap(nodes(final).first { $0["agent"] as? String == "a1" })
        XCTAssertEqual(n2["state"] as? String, "lost")
        XCTAssertTrue((n2["message"] as? String ?? "").hasPrefix("revoked: agent a2 was revoked"), "\(n2)")
        XCTAssertTrue((n2["message"] as? String ?? "").contains("herald-lab agents enrol a2"), "the way back is named: \(n2)")
        XCTAssertEqual(n1["state"] as? String, "complete", "the other node's run went on: \(n1)")
        // Nothing reached a2 after the revocation: no request, with any credential.
        let after = String(lab.log("a2").dropFirst(a2LogBefore))
        let calls = after.components(separatedBy: "\n").filter { $0.contains("refused") && !$0.contains("refuses this agent's credential") }
        print("revoked mid-run: requests that reached the revoked agent: \(calls.count); node \(n2["name"] ?? "?") \(n2["state"] ?? "?")")
        XCTAssertEqual(calls, [], "the coordinator called the revoked agent")
        XCTAssertTrue(lab.log("air").contains("agent a2 revoked"), lab.log("air"))
        // a1's ticket: kept 0600, and it attaches nothing once the run has ended.
        let state = lab.dir.appendingPathComponent("a1-data/runs/\(id)/state.json")
        if FileManager.default.fileExists(atPath: state.path) {
            var st = stat()
            XCTAssertEqual(stat(state.path, &st), 0)
            XCTAssertEqual(st.st_mode & 0o777, 0o600, "the ticket is a secret")
        }
        let key = Data(try XCTUnwrap(folder.secret("air.key")).utf8)
        let n1Name = try XCTUnwrap(n1["name"] as? String)
        let old = NodeTicket.issue(run: id, node: n1Name, agent: "a1", issued: Date().timeIntervalSince1970 - 60, expires: Date().timeIntervalSince1970 + 600, key: key)
        let answer = try airHello(lab, node: n1Name, ticket: old)
        XCTAssertTrue(answer.contains("has ended"), "a ticket of an ended run: \(answer)")

        // Enrolled again under the same name, on a new credentials folder: it registers, the old one does not.
        let file = lab.dir.appendingPathComponent("a2-again.enrol").path
        var (rc, out) = try lab.cli(["agents", "enrol", "a2", "--host", "127.0.0.1", "--out", file, "--coordinator", url, "--credentials", folder.url.path])
        XCTAssertEqual(rc, 0, out)
        (rc, out) = try lab.cli(["enrol", file, "--dir", lab.dir.appendingPathComponent("a2-again-cred").path])
        XCTAssertEqual(rc, 0, out)
        try lab.start("a2-again", ["agent", "--name", "a2", "--credentials", lab.dir.appendingPathComponent("a2-again-cred").path,
                                   "--data", lab.dir.appendingPathComponent("a2-again-data").path, "--coordinator", url])
        try lab.waitUntil(timeout: 20, "a2 enrolled again registers") {
            let (s, d, _) = lab.call("GET", "/v1/agents", url: url, token: op)
            return s == 200 && String(decoding: d, as: UTF8.self).contains("\"name\":\"a2\"") && String(decoding: d, as: UTF8.self).contains(":\(lab.ports["a2-again"]!)")
        }
        let plan2 = LabProcesses.plan("again", nodes: 2, duration: "4s") + "agents: {names: [a1, a2]}\n"
        let (rc2, out2) = try lab.cli(["run", lab.dir.appendingPathComponent("again.yaml").path, "--coordinator", url, "--credentials", folder.url.path,
                                       "--out", lab.dir.appendingPathComponent("bundles").path], timeout: 120, writing: plan2)
        XCTAssertTrue(rc2 == 0 || rc2 == 1, "the re-enrolled agent runs: \(out2)\n\(lab.log("coordinator").suffix(2000))")
        XCTAssertTrue(out2.contains("verdict:"), out2)
    }

    /// Sends a hello to the air over TLS; returns its answer line.
    func airHello(_ lab: LabProcesses, node: String, ticket: String) throws -> String {
        let c = try TestStream.connect(host: "127.0.0.1", port: lab.ports["air"]!, timeout: 5, tls: LabTrust.client)
        defer { c.close() }
        let hello = try JSONSerialization.data(withJSONObject: ["t": "hello", "id": 1, "node": node, "ticket": ticket, "x": 0, "y": 0])
        try c.write(hello + Data([10]))
        return String(decoding: try c.read(through: 10), as: UTF8.self)
    }

    /// (Services without any credential: HarnessTests.testServicesNeverRunWithoutAuthenticationByAccident.)
    func testAnAgentRefusesAnEnrolmentForAnotherName() throws {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        var env = ProcessInfo.processInfo.environment
        env["HERALDLAB_TOKEN"] = nil
        env["HERALDLAB_CREDENTIALS"] = nil
        // An enrolment for another name is refused.
        let cred = lab.dir.appendingPathComponent("c")
        try AgentCredential(name: "someone", token: LabToken.generate(), coordinatorToken: LabToken.generate()).write(to: cred)
        let (rc2, out2) = try lab.cli(["agent", "--name", "x", "--credentials", cred.path, "--data", lab.dir.appendingPathComponent("x").path], environment: env, timeout: 10)
        XCTAssertEqual(rc2, 2, out2)
        XCTAssertTrue(out2.contains("for agent someone"), out2)
    }
}

extension AgentCredential {
    /// A credentials folder holding only agent.json.
    func write(to folder: URL) throws {
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try LabJSON.encoder.encode(self).write(to: folder.appendingPathComponent("agent.json"))
    }
}

extension LabProcesses {
    /// `cli` after writing `text` to the file named by the second argument.
    func cli(_ args: [String], timeout: TimeInterval, writing text: String) throws -> (Int32, String) {
        try text.write(toFile: args[1], atomically: true, encoding: .utf8)
        return try cli(args, timeout: timeout)
    }

    var secureCoordinatorURL: String { "https://127.0.0.1:\(ports["coordinator"]!)" }

    /// One request with `token` to `url` (TLS checked against the process's lab CA); the status
    /// (0 when there was no answer), the body, and the error when there was none.
    func call(_ method: String, _ path: String, body: Data? = nil, url: String, token: String) -> (Int, Data, Error?) {
        let sem = DispatchSemaphore(value: 0)
        let box = ResultBox<(Int, Data, Error?)>()
        let c = LabClient(base: URL(string: url)!, token: token, timeout: 10)
        Task {
            do {
                let (s, d, _) = try await c.request(method, path, body: body)
                box.value = (s, d, nil)
            } catch { box.value = (0, Data(), error) }
            sem.signal()
        }
        sem.wait()
        return box.value ?? (0, Data(), nil)
    }
}
