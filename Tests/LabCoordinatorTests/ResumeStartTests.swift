import Foundation
import XCTest
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import LabTestSupport
import Logging
@testable import LabCoordinator

/// A coordinator that restarts during a run asks each agent whether it has its start (issue 39):
/// an agent whose status cannot be read was once taken as started, so its node stayed idle for
/// the whole run. Now the start is sent to it anyway, the unknown status is logged, and a start
/// the agent did not take is sent again while the run lasts. In memory, through AgentLinks.
final class ResumeStartTests: XCTestCase {
    var results: URL!
    override func setUp() { results = FileManager.default.temporaryDirectory.appendingPathComponent("resume-start-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: results) }

    /// An armed agent whose status cannot be read (when `statusFails`), and that fails its first
    /// `startsLost` starts as if they were lost on the way; it records every start it is sent.
    final class ArmedLink: AgentLink, @unchecked Sendable {
        let name: String
        let statusFails: Bool
        let startsLost: Int
        var refuses = false
        private let lock = NSLock()
        private var starts: [(at: Double, taken: Bool)] = []
        init(name: String, statusFails: Bool, startsLost: Int = 0) { self.name = name; self.statusFails = statusFails; self.startsLost = startsLost }
        var sent: [(at: Double, taken: Bool)] { lock.withLock { starts } }

        func status() async throws(LinkError) -> LabWire.AgentStatus {
            if statusFails { throw LinkError(status: nil, message: "connection refused") }
            var s = LabWire.AgentStatus(name: name, state: .armed)
            s.runId = "r1"
            return s
        }
        func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus {
            let taken = lock.withLock {
                let taken = starts.count >= startsLost
                starts.append((request.startAt, taken))
                return taken
            }
            if refuses { throw LinkError(status: 409, message: "agent \(name) is not armed for run \(request.runId)") }
            guard taken else { throw LinkError(status: nil, message: "timed out") }
            var s = LabWire.AgentStatus(name: name, state: .armed)
            s.runId = request.runId
            s.startAt = request.startAt
            return s
        }
        func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] { [LabWire.ClockSample(offset: 0, roundTrip: 0.0004)] }
        func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { throw LinkError(status: 409, message: "armed already") }
        func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: name, state: .idle) }
        func files(of run: String) async throws(LinkError) -> LabWire.FileList { throw LinkError(status: 404, message: "no files") }
        func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
            throw LinkError(status: 404, message: "no files")
        }
        func release(_ run: String) async throws(LinkError) {}
    }

    func coordinator(_ links: [String: ArmedLink], logger: Logger) throws -> Coordinator {
        var config = Coordinator.Config(results: results)
        config.insecure = true
        config.missingAfter = 600
        let byURL = Dictionary(uniqueKeysWithValues: links.map { ("http://\($0.key).in-memory:1", $0.value as any AgentLink) })
        config.agentLinks = { byURL[$0.url.absoluteString]! }
        let c = try Coordinator(config: config, logger: logger)
        for name in links.keys.sorted() {
            let info = LabWire.AgentInfo(name: name, url: "http://\(name).in-memory:1", tags: [], radio: .sim, adapter: nil, controller: nil)
            c.registry.withRecords { s in s[name] = AgentRegistry.AgentRecord(info: info, lastSeen: c.now, persistedSeen: c.now, status: nil) }
        }
        return c
    }

    /// A run the coordinator had started (its start instant set) when it stopped.
    func runningRecord(_ c: Coordinator, agents: [String], startIn: Double, duration: Double) -> RunRecord {
        let nodes = agents.enumerated().map { i, agent in
            RunRecord.Node(name: "n\(i + 1)", agent: agent, agentURL: "http://\(agent).in-memory:1",
                           clockBefore: LabWire.ClockSample(offset: 0, roundTrip: 0.0004), state: .armed, files: [])
        }
        let planText = "name: p\nduration: \(Int(duration))s\nnodes: [\(nodes.map(\.name).joined(separator: ", "))]\n"
        return RunRecord(id: "r1", plan: "p", planText: planText, state: .running, created: c.now, startAt: c.now + startIn,
                         duration: duration, warmup: 0, air: nil, nodes: nodes)
    }

    func testAnAgentWhoseStatusCannotBeReadIsSentItsStartAndTheUnknownStatusIsLogged() async throws {
        let log = LogCapture()
        let quiet = ArmedLink(name: "a1", statusFails: true), known = ArmedLink(name: "a2", statusFails: false)
        let c = try coordinator(["a1": quiet, "a2": known], logger: log.logger("herald-lab.coordinator"))
        var r = runningRecord(c, agents: ["a1", "a2"], startIn: 30, duration: 60)
        let owed = await c.runs.ensureStarted(&r)
        XCTAssertTrue(owed.isEmpty, "both took their start: \(owed)")
        XCTAssertEqual(quiet.sent.map(\.at), [r.startAt!], "the agent whose status is unknown got the start once")
        XCTAssertEqual(known.sent.map(\.at), [r.startAt!], "the agent armed without a start got it, as before")
        let warning = try XCTUnwrap(log.all.first { $0.level == .warning && $0.message.contains("status of node n1") }, log.lines.joined(separator: "\n"))
        XCTAssertTrue(warning.message.contains("unknown") && warning.message.contains("connection refused"), warning.message)
        XCTAssertEqual(warning.metadata["run"], "r1")
        XCTAssertEqual(warning.metadata["node"], "n1")
        XCTAssertEqual(warning.metadata["agent"], "a1")
        await c.stop()
    }

    func testAStartTheAgentRefusesIsNotSentAgain() async throws {
        let refusing = ArmedLink(name: "a1", statusFails: true), known = ArmedLink(name: "a2", statusFails: false)
        refusing.refuses = true
        let c = try coordinator(["a1": refusing, "a2": known], logger: LogCapture.quiet())
        var r = runningRecord(c, agents: ["a1", "a2"], startIn: 30, duration: 60)
        let owed = await c.runs.ensureStarted(&r)
        XCTAssertTrue(owed.isEmpty, "a refusal is an answer: nothing is owed \(owed)")
        XCTAssertEqual(refusing.sent.count, 1, "asked once, not three times")
        XCTAssertTrue(c.agentViews.first { $0.info.name == "a1" }?.lastError?.contains("409") == true, "the refusal is the agent's last error")
        await c.stop()
    }

    func testOnResumeAStartTheAgentDidNotTakeIsSentAgainUntilItIsTaken() async throws {
        let log = LogCapture()
        // Three tries on resume and one more in the watch are lost; the fifth is taken.
        let link = ArmedLink(name: "a1", statusFails: true, startsLost: 4), other = ArmedLink(name: "a2", statusFails: false)
        let first = try coordinator(["a1": link, "a2": other], logger: LogCapture.quiet())
        let record = runningRecord(first, agents: ["a1", "a2"], startIn: 2, duration: 5)
        try first.save(record)
        await first.stop()

        let c = try coordinator(["a1": link, "a2": other], logger: log.logger("herald-lab.coordinator"))
        c.startUnserved()
        do { try await eventually("the start taken", within: 20) { link.sent.contains { $0.taken } } } catch {
            XCTFail("\(error); starts \(link.sent); run \(String(describing: c.run("r1")?.state)) \(c.run("r1")?.message ?? ""); log:\n\(log.lines.joined(separator: "\n"))")
            throw error
        }
        XCTAssertEqual(link.sent.count, 5, "\(link.sent)")
        XCTAssertTrue(link.sent.allSatisfy { $0.at == record.startAt }, "the same instant every time: \(link.sent)")
        XCTAssertEqual(other.sent.map(\.taken), [true], "the other agent got its start once")
        XCTAssertTrue(log.all.contains { $0.level == .error && $0.message.contains("did not take the start of run r1") && $0.message.contains("sent again") },
                      log.lines.joined(separator: "\n"))
        try await eventually("the later try logged") { log.all.contains { $0.message.contains("node n1 took its start on a later try") } }
        await c.stop()
    }
}
