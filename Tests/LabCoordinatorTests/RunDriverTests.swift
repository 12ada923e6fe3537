import Foundation
import XCTest
import Synchronization
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// The coordinator's run work as child tasks of one driver (issue 39 item 3, RunDriver): a run
/// stopped by id ends its work alone, `stop` waits for the rest, and what is queued before the
/// driver runs is not lost.
final class RunDriverTests: XCTestCase {
    var results: URL!
    override func setUp() { results = FileManager.default.temporaryDirectory.appendingPathComponent("run-driver-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: results) }

    /// What a held agent saw of its arm calls.
    struct Arms: Sendable {
        var entered = 0
        var cancelled = 0
        var inFlight = 0
    }

    /// An agent whose arm call never answers: it returns only when the calling task is cancelled.
    final class HeldLink: AgentLink {
        let name: String
        let arms = Mutex(Arms())
        init(name: String) { self.name = name }

        func status() async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: name, state: .idle) }
        func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] { [LabWire.ClockSample(offset: 0, roundTrip: 0.0004)] }
        func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus {
            arms.withLock { a in a.entered += 1; a.inFlight += 1 }
            defer { arms.withLock { $0.inFlight -= 1 } }
            let (held, release) = AsyncStream.makeStream(of: Never.self)
            await withTaskCancellationHandler {
                for await _ in held {}
            } onCancel: { release.finish() }
            arms.withLock { $0.cancelled += 1 }
            throw LinkError(status: nil, message: "cancelled")
        }
        func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { throw LinkError(status: 409, message: "not started in this test") }
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

    func coordinator(_ links: [String: HeldLink]) throws -> Coordinator {
        var config = Coordinator.Config(results: results)
        config.insecure = true
        config.missingAfter = 600
        let byURL = Dictionary(uniqueKeysWithValues: links.map { ("http://\($0.key).in-memory:1", $0.value as any AgentLink) })
        config.agentLinks = { byURL[$0.url.absoluteString]! }
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        for name in links.keys.sorted() {
            let info = LabWire.AgentInfo(name: name, url: "http://\(name).in-memory:1", tags: [], radio: .sim, adapter: nil, controller: nil)
            c.registry.withRecords { s in s[name] = AgentRegistry.AgentRecord(info: info, lastSeen: c.now, persistedSeen: c.now, status: nil) }
        }
        return c
    }

    func plan(_ name: String, agents: [String]) -> String {
        "name: \(name)\nduration: 1m\nagents: {names: [\(agents.joined(separator: ", "))]}\nnodes: [n1, n2]\n"
    }

    func testAbortingOneRunByIdEndsItsWorkAloneAndStopWaitsForTheOthers() async throws {
        let first = [HeldLink(name: "a1"), HeldLink(name: "a2")], second = [HeldLink(name: "b1"), HeldLink(name: "b2")]
        func arms(_ links: [HeldLink], _ key: KeyPath<Arms, Int>) -> Int { links.reduce(0) { $0 + $1.arms.withLock { $0[keyPath: key] } } }
        let c = try coordinator(Dictionary(uniqueKeysWithValues: (first + second).map { ($0.name, $0) }))
        // Submitted before the driver runs: queued, not lost.
        let one = try c.submit(planText: plan("first", agents: ["a1", "a2"]), source: "first").id
        c.startUnserved(background: false)
        let two = try c.submit(planText: plan("second", agents: ["b1", "b2"]), source: "second").id
        try await eventually("both runs arming on their agents") { arms(first, \.inFlight) == 2 && arms(second, \.inFlight) == 2 }
        XCTAssertEqual(c.runs.driver.live, [one, two].sorted())

        let aborted = try await c.abort(one)
        XCTAssertEqual(aborted.state, .cancelled)
        try await eventually("the first run's work to end") { c.runs.driver.live == [two] }
        XCTAssertEqual(arms(first, \.inFlight), 0, "the first run's arm calls were cancelled and returned")
        XCTAssertGreaterThanOrEqual(arms(first, \.cancelled), 2)
        XCTAssertEqual(arms(second, \.cancelled), 0, "the second run's work goes on")
        XCTAssertEqual(arms(second, \.inFlight), 2)
        XCTAssertEqual(c.run(two)?.state, .arming)

        await c.stop()
        // Checked at once, not waited for: stop returns only once every run's work has ended.
        XCTAssertEqual(arms(second, \.inFlight), 0, "stop waited for the second run's work")
        XCTAssertGreaterThanOrEqual(arms(second, \.cancelled), 2)
        XCTAssertEqual(c.runs.driver.live, [], "no run's work is left")
        XCTAssertEqual(c.run(two)?.state, .arming, "stopped, not ended: it resumes at the next start")
    }

    func testWhatIsQueuedBeforeTheDriverRunsIsDrivenAndAStopBeforeTheWorkBeginsEndsItAtOnce() async throws {
        let driver = RunDriver(logger: LogCapture.quiet())
        let events = Mutex([String]())
        driver.launch("kept")
        driver.launch("stopped")
        driver.stop("stopped")
        driver.notify(.revoked(agent: "a1", at: 1))
        XCTAssertEqual(driver.live, ["kept", "stopped"])
        let running = Task {
            await driver.run(drive: { id in
                events.withLock { $0.append("drive \(id)") }
                // Until cancelled: only a stop ends it.
                let (held, release) = AsyncStream.makeStream(of: Never.self)
                await withTaskCancellationHandler { for await _ in held {} } onCancel: { release.finish() }
                events.withLock { $0.append("ended \(id)") }
            }, tell: { notice in events.withLock { $0.append("notice \(notice)") } })
        }
        try await eventually("the queued work to be taken") { events.withLock { e in e.contains("drive kept") && e.contains { $0.hasPrefix("notice") } } }
        try await eventually("the run stopped before its work began to end") { driver.live == ["kept"] }
        XCTAssertFalse(events.withLock { $0.contains("ended kept") }, "a run not stopped goes on")
        XCTAssertTrue(events.withLock { $0.contains("notice revoked(agent: \"a1\", at: 1.0)") }, events.withLock { $0.joined(separator: "; ") })
        driver.stop("kept")
        try await eventually("the kept run to end once stopped") { events.withLock { $0.contains("ended kept") } && driver.live.isEmpty }
        running.cancel()
        await running.value
        XCTAssertEqual(driver.live, [])
    }
}
