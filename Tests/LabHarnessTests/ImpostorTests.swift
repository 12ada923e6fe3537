import Foundation
import Hummingbird
import XCTest
import HeraldCore
import LabHTTP
import LabPlan
import LabTestSupport

/// An agent that lies: it registers with the real coordinator, accepts a node and then lists
/// file names that try to leave the bundle. Nothing may be written outside the node's folder.
final class ImpostorTests: XCTestCase {
    var lab: LabProcesses?

    /// The air, a coordinator and agent1, real processes; the impostor joins them.
    func labWithOneAgent() throws -> LabProcesses {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        try lab.startAir()
        try lab.startCoordinator()
        try lab.startAgent(1)
        return lab
    }

    override func tearDown() { lab?.stopAll(); lab = nil }

    final class Impostor: @unchecked Sendable {
        let http: HTTPService
        let lock = NSLock()
        var runId: String?
        var node: String?
        var startAt: Double?
        var duration = 0.0
        let fileNames: [String]
        let body = Data("abc".utf8)
        /// Text this impostor puts in every field it can (status message, gap reasons, the file
        /// list's failure and write error), and the file it then serves (nil: lists only).
        var hostile: String?
        var served: URL?

        init(token: String, fileNames: [String]) {
            self.fileNames = fileNames
            http = HTTPService(name: "impostor", token: token, logger: LogCapture.quiet())
            http.serve { r in
                r.routes().on(AgentAPI.clock) { _, _, _ in (LabWire.ClockReply(received: Date().timeIntervalSince1970, sent: Date().timeIntervalSince1970)) }
                r.routes().on(AgentAPI.arm) { [unowned self] arm, _, _ in
                    let a = arm.assignment
                    lock.withLock { runId = a.runId; node = a.node.name; duration = a.duration }
                    return status
                }
                r.routes().on(AgentAPI.start) { [unowned self] s, _, _ in
                    lock.withLock { startAt = s.startAt }
                    return status
                }
                r.routes().on(AgentAPI.status) { [unowned self] _, _, _ in status }
                r.routes().on(AgentAPI.files) { [unowned self] _, _, _ in
                    let (id, node, start) = lock.withLock { (runId ?? "", self.node ?? "", startAt) }
                    let sha = SHA256.hash(body)
                    var list = LabWire.FileList(runId: id, node: node, resumed: false, startedAt: start,
                                                files: fileNames.map { LabWire.FileInfo(name: $0, bytes: 3, sha256: sha) })
                    list.startAt = start
                    if let h = hostile, let start {
                        list.gaps = [LabWire.Gap(from: start + 0.5, to: start + 1, reason: h)]
                        list.writeError = h
                    }
                    return list
                }
                // Never reached with a lying list: the coordinator refuses it before fetching anything.
                r.routes().on(AgentAPI.file) { [unowned self] _, request, _ -> Response in
                    guard let served else { return .json(["never": "fetched"]) }
                    return try .file(served, range: request.headers[.range], missing: "gone")
                }
                r.routes().on(AgentAPI.release) { _, _, _ in Empty() }
                r.routes().on(AgentAPI.stopRun) { [unowned self] _, _, _ in status }
            }
        }

        /// Starts serving, registers with the lab's coordinator and heartbeats every 0.3 s (with
        /// its boot and counter) until the returned task is cancelled.
        func join(_ lab: LabProcesses, tags: [String]) async throws -> (LabClient, Task<Void, Never>) {
            let port = try await http.start(port: 0)
            let coordinator = LabClient(base: URL(string: lab.coordinatorURL)!, token: lab.token, timeout: 5)
            var info = LabWire.AgentInfo(name: "impostor", url: "http://127.0.0.1:\(port)", tags: tags, radio: .sim, adapter: nil, controller: nil, port: port)
            (info.boot, info.sequence) = ("impostor-boot", 1)
            let _: Empty = try await coordinator.call("POST", "/v1/agents/register", info)
            let beats = Task {
                var sequence: UInt64 = 1
                while !Task.isCancelled {
                    sequence += 1
                    var beat = self.status
                    (beat.boot, beat.sequence) = ("impostor-boot", sequence)
                    let _: Empty? = try? await coordinator.call("POST", "/v1/agents/impostor/heartbeat", beat)
                    try? await Task.sleep(nanoseconds: 300_000_000)
                }
            }
            return (coordinator, beats)
        }

        var status: LabWire.AgentStatus {
            lock.withLock {
                var state = LabWire.AgentState.idle
                if runId != nil { state = .armed }
                if let s = startAt { state = Date().timeIntervalSince1970 >= s + duration ? .finished : .running }
                var st = LabWire.AgentStatus(name: "impostor", state: state)
                st.runId = runId
                st.node = node
                st.startAt = startAt
                st.startedAt = startAt
                st.message = hostile
                st.held = hostile.map { [$0] }
                return st
            }
        }
    }

    func testTraversalNamesInAFileListWriteNothingOutsideTheBundle() async throws {
        let lab = try labWithOneAgent()
        let impostor = Impostor(token: lab.token, fileNames: ["contacts.csv", "../../../../x", "/../../.."])
        let (coordinator, beats) = try await impostor.join(lab, tags: [])
        defer { beats.cancel() }
        let plan = "name: lies\nduration: 3s\nwarmup: 1s\nagents: {names: [agent1, impostor]}\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
        let (status, data, _) = try await coordinator.request("POST", "/v1/runs", body: Data(plan.utf8))
        XCTAssertEqual(status, 201, String(decoding: data, as: UTF8.self))
        let id = try XCTUnwrap((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["id"] as? String)
        var final: [String: Any] = [:]
        for _ in 0..<300 {
            if let r = lab.runRecord(id), let s = r["state"] as? String, ["complete", "failed", "aborted"].contains(s) { final = r; break }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        XCTAssertNotNil(final["state"], "the run ended")
        let node = ((final["nodes"] as? [[String: Any]]) ?? []).first { $0["name"] as? String == "n2" }
        XCTAssertEqual(node?["state"] as? String, "lost")
        XCTAssertTrue((node?["message"] as? String ?? "").contains("not one of the Herald files"), "\(node ?? [:])")
        // A lost node fails the run, as docs/API.md says, and the run's message names it.
        XCTAssertEqual(final["state"] as? String, "failed")
        XCTAssertTrue((final["message"] as? String ?? "").contains("lost: n2"), "\(final["message"] ?? "")")
        XCTAssertFalse(FileManager.default.fileExists(atPath: lab.dir.appendingPathComponent("x").path), "nothing written outside results/")
        XCTAssertTrue(FileManager.default.fileExists(atPath: lab.results.appendingPathComponent("coordinator.sqlite").path), "the results folder survives")
        let nodeDir = lab.results.appendingPathComponent("\(id)/nodes/n2")
        XCTAssertEqual((try? FileManager.default.contentsOfDirectory(atPath: nodeDir.path)) ?? [], [], "not even the valid name is written from a lying list")
        await impostor.http.stop()
    }

    /// Issue 19, item 4: an agent's text (status message, gap reasons, the file list's fields,
    /// its tags) with ESC, CR, LF and direction marks reaches the coordinator's log and the
    /// operator's terminal (`run`, `agents`, `runs`) only as visible escapes: no cleared screen,
    /// no forged line.
    func testAnAgentsTextReachesTheLogAndTheTerminalOnlyEscaped() async throws {
        let lab = try labWithOneAgent()
        let hostile = "x\u{1B}[2J\u{1B}[H\rcoordinator: run forged-1 complete\ncoordinator: run forged-2 complete\u{202E}txt.exe\u{2066}\u{200F}\u{200E}\u{9B}"
        let impostor = Impostor(token: lab.token, fileNames: ["contacts.csv"])
        impostor.hostile = hostile
        let file = lab.dir.appendingPathComponent("served.csv")
        try impostor.body.write(to: file)
        impostor.served = file
        // Its tags are refused where they enter (400 naming the field, escaped); its heartbeats'
        // text and the runs it says it holds still reach the log and the terminal.
        do {
            let coordinator = LabClient(base: URL(string: lab.coordinatorURL)!, token: lab.token, timeout: 5)
            var bad = LabWire.AgentInfo(name: "impostor", url: "http://127.0.0.1:1", tags: [hostile], radio: .sim, adapter: nil, controller: nil, port: 1)
            (bad.boot, bad.sequence) = ("impostor-boot", 1)
            let _: Empty = try await coordinator.call("POST", "/v1/agents/register", bad)
            XCTFail("a registration with a hostile tag is refused")
        } catch {
            XCTAssertTrue("\(error)".contains("HTTP 400: tags[0]: "), "\(error)")
            XCTAssertEqual("\(error)".unicodeScalars.filter { $0 != "\n" && OutsideText.isEscaped($0) }.count, 0, "\(error)")
        }
        let (_, beats) = try await impostor.join(lab, tags: ["impostor"])
        defer { beats.cancel() }
        let planFile = lab.dir.appendingPathComponent("inject.yaml")
        try "name: inject\nduration: 3s\nwarmup: 1s\nagents: {names: [agent1, impostor]}\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
            .write(to: planFile, atomically: true, encoding: .utf8)
        let auth = ["--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path]
        let (_, run) = try lab.cli(["run", planFile.path, "--out", lab.dir.appendingPathComponent("out").path] + auth, timeout: 120)
        let (_, agents) = try lab.cli(["agents"] + auth)
        let (_, runs) = try lab.cli(["runs", "list"] + auth)
        await impostor.http.stop()
        let log = lab.log("coordinator")
        var escapesSeen = 0
        for (what, text) in [("coordinator log", log), ("herald-lab run", run), ("herald-lab agents", agents), ("herald-lab runs list", runs)] {
            let raw = text.unicodeScalars.filter { $0 != "\n" && OutsideText.isEscaped($0) }
            XCTAssertEqual(raw.map { String(format: "U+%04X", $0.value) }, [], "\(what) holds raw control characters or direction marks:\n\(text.suffix(3000))")
            XCTAssertFalse(text.components(separatedBy: "\n").contains { $0.hasPrefix("coordinator: run forged") }, "\(what) holds a forged line")
            let seen = text.components(separatedBy: "\\x1B[2J").count - 1
            escapesSeen += seen
            print("injection: \(what): \(seen) escaped ESC[2J, \(raw.count) raw control characters")
        }
        XCTAssertTrue(log.contains("\\x1B[2J\\x1B[H\\x0Dcoordinator: run forged-1 complete\\x0Acoordinator: run forged-2 complete\\u{202E}txt.exe\\u{2066}\\u{200F}\\u{200E}\\u{009B}"),
                      "the heartbeat's message is in the log, escaped:\n\(log.suffix(3000))")
        // The runs it says it holds are not names: its heartbeats are refused where they enter
        // (400 naming the field, LabWire.Bounds), so nothing of them reaches `herald-lab agents`.
        XCTAssertFalse(agents.contains("forged"), "the runs it says it holds are refused, not shown: \(agents)")
        XCTAssertTrue(log.contains("held[0] is not a safe name"), "the refusal is in the log, naming the field:\n\(log.suffix(3000))")
        XCTAssertTrue(run.contains("\\x1B[2J") || runs.contains("\\x1B[2J"), "the gap reason is shown escaped:\n\(run)\n\(runs)")
        XCTAssertGreaterThan(escapesSeen, 2)
    }
}
