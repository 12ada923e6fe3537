import Foundation
import XCTest
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// An enrolled agent that lies about its clock (issue 36): a probe answered with
/// `{"received": 5e10, "sent": 1}` once put a run's start 5e11 s ahead, held the other agents,
/// and made every later `GET /metrics` trap, after a restart too. In memory, through AgentLinks.
final class HostileClockTests: XCTestCase {
    var results: URL!
    override func setUp() { results = FileManager.default.temporaryDirectory.appendingPathComponent("hostile-clock-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: results) }

    /// An agent that arms and releases, with a clock of the test's choosing.
    struct ClockLink: AgentLink {
        let name: String
        let samples: @Sendable () -> [LabWire.ClockSample]
        let released: Counter
        func status() async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: name, state: .idle) }
        func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] { samples() }
        func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: name, state: .armed) }
        func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { throw LinkError(status: 409, message: "not started in this test") }
        func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { throw LinkError(status: 404, message: "no preflight") }
        func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { LabWire.AgentStatus(name: name, state: .idle) }
        func files(of run: String) async throws(LinkError) -> LabWire.FileList { throw LinkError(status: 404, message: "no files") }
        func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
            throw LinkError(status: 404, message: "no files")
        }
        func release(_ run: String) async throws(LinkError) { released.add() }
    }

    static func honest() -> [LabWire.ClockSample] { [LabWire.ClockSample(offset: 0, roundTrip: 0.0004)] }

    func coordinator(_ links: [String: ClockLink], maxStartMargin: Double? = nil) throws -> Coordinator {
        var config = Coordinator.Config(results: results)
        config.insecure = true
        config.missingAfter = 600
        if let maxStartMargin { config.maxStartMargin = maxStartMargin }
        let byURL = Dictionary(uniqueKeysWithValues: links.map { ("http://\($0.key).in-memory:1", $0.value) })
        config.agentLinks = { byURL[$0.url.absoluteString]! }
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        for name in links.keys.sorted() {
            let info = LabWire.AgentInfo(name: name, url: "http://\(name).in-memory:1", tags: [], radio: .sim, adapter: nil, controller: nil)
            c.registry.withRecords { s in s[name] = AgentRegistry.AgentRecord(info: info, lastSeen: c.now, persistedSeen: c.now, status: nil) }
        }
        // The run driver runs the runs submitted (RunDriver); no HTTP, no other background work.
        c.startUnserved(background: false)
        return c
    }

    func finished(_ c: Coordinator, _ id: String) async throws -> RunRecord {
        try await eventually("run \(id) to end") { c.run(id)?.state.isFinal == true }
        return try XCTUnwrap(c.run(id), "run \(id)")
    }

    /// Waits until `counter` reaches `n` (the run is final before its agents are released).
    func released(_ counter: Counter, _ n: Int) async throws -> Bool {
        try await eventually("\(n) releases") { counter.value >= n }
        return counter.value == n
    }

    func metricsText(_ c: Coordinator) -> String {
        c.collectMetrics()
        return String(decoding: c.metrics.metrics.exposition(), as: UTF8.self)
    }

    func testAClockAnswerFarOutOfRangeFailsTheRunAtArmingNamingTheAgentAndReleasesTheOthers() async throws {
        let released = Counter()
        let now = Date().timeIntervalSince1970
        let links = [
            "a1": ClockLink(name: "a1", samples: Self.honest, released: released),
            "a2": ClockLink(name: "a2", samples: { (0..<8).map { _ in LabWire.ClockSample(t0: now, t1: 5e10, t2: 1, t3: now + 0.001) } }, released: released),
        ]
        let c = try coordinator(links)
        let id = try c.submit(planText: "name: p\nduration: 1m\nnodes: [n1, n2]\n", source: "p").id
        let r = try await finished(c, id)
        XCTAssertEqual(r.state, .failed)
        XCTAssertNil(r.startAt, "no common start was set")
        let message = r.message ?? ""
        XCTAssertTrue(message.contains("agent a2") && message.contains("no usable clock"), message)
        XCTAssertFalse(message.contains("agent a1"), message)
        let all = try await self.released(released, 2)
        XCTAssertTrue(all, "both agents were released: \(released.value)")
        XCTAssertTrue(r.nodes.allSatisfy { ($0.clockBefore?.offset).map { abs($0) < 1 } ?? true }, "no absurd offset recorded: \(r.nodes.map(\.clockBefore))")
        XCTAssertTrue(metricsText(c).contains("heraldlab_runs{state=\"failed\"} 1"))
        await c.stop()
        // The same results folder after a restart: the record is read and scraped.
        let again = try coordinator(links)
        XCTAssertEqual(again.run(id)?.state, .failed)
        XCTAssertTrue(metricsText(again).contains("heraldlab_runs{state=\"failed\"} 1"))
        await again.stop()
    }

    func testAStartThatCannotBeBoundedWithinTheMarginCapIsRefusedAtArming() async throws {
        let released = Counter()
        let links = [
            "a1": ClockLink(name: "a1", samples: Self.honest, released: released),
            "a2": ClockLink(name: "a2", samples: { [LabWire.ClockSample(offset: 0.5, roundTrip: 4.5)] }, released: released),
        ]
        let c = try coordinator(links, maxStartMargin: 20)
        let id = try c.submit(planText: "name: p\nduration: 1m\nnodes: [n1, n2]\n", source: "p").id
        let r = try await finished(c, id)
        XCTAssertEqual(r.state, .failed)
        XCTAssertNil(r.startAt)
        let message = r.message ?? ""
        XCTAssertTrue(message.contains("the start cannot be bounded") && message.contains("agent a2") && message.contains("4.500"), message)
        let all = try await self.released(released, 2)
        XCTAssertTrue(all, "both armed agents were released: \(released.value)")
        await c.stop()
    }

    func testSamplesOutOfRangeAreUnusable() {
        for s in [LabWire.ClockSample(offset: 0, roundTrip: 5.01), LabWire.ClockSample(offset: 4e8, roundTrip: 0.001),
                  LabWire.ClockSample(offset: .nan, roundTrip: 0.001), LabWire.ClockSample(offset: 0, roundTrip: -0.001),
                  LabWire.ClockSample(offset: 0, roundTrip: .infinity), LabWire.ClockSample(t0: 1, t1: 5e10, t2: 1, t3: 1.001),
                  LabWire.ClockSample(t0: 1e300, t1: -1e300, t2: 1e300, t3: 1e300)] {
            XCTAssertFalse(s.isUsable, "\(s)")
        }
        XCTAssertNil(LabWire.ClockSample.combined([LabWire.ClockSample(t0: 1, t1: 5e10, t2: 1, t3: 1.001)]))
        XCTAssertTrue(LabWire.ClockSample(offset: -3600, roundTrip: 4.9).isUsable, "an hour off over a slow link is still a clock")
    }
}

/// What an enrolled agent may say of itself is bounded in length and characters (issue 36): each
/// refusal is a 400 naming the field.
final class RegistrationBoundsTests: XCTestCase {
    func problem(_ change: (inout LabWire.AgentInfo) -> Void) -> String? {
        var info = LabWire.AgentInfo(name: "a1", url: "http://10.0.0.7:8701", tags: ["bench-3"], radio: .bluez, adapter: "hci0", controller: ["make": "Intel"])
        change(&info)
        return AgentRegistry.registrationProblem(info)
    }

    func testLongOrStrangeFieldsAreRefusedNamingTheField() throws {
        XCTAssertNil(problem { _ in }, "an ordinary registration")
        XCTAssertNil(problem { $0.adapter = "F0:00:00:00:00:01" })
        XCTAssertEqual(problem { $0.version = String(repeating: "v", count: 600) }, "version: longer than 64 characters")
        XCTAssertTrue(problem { $0.version = "1.0 \u{202E}" }?.hasPrefix("version: ") == true)
        XCTAssertEqual(problem { $0.tags = (0..<100).map { "t\($0)" } }, "tags: 100 tags, at most 64")
        XCTAssertTrue(problem { $0.tags = ["ok", "<b>"] }?.hasPrefix("tags[1]: ") == true)
        for url in ["http://10.0.0.7:8701/\"><script>", "http://10.0.0.7:8701/a b", "http://10.0.0.7:8701/\u{202E}txt", "http://10.0.0.7:8701/" + String(repeating: "x", count: 300)] {
            let p = try XCTUnwrap(problem { $0.url = url }, url)
            XCTAssertTrue(p.hasPrefix("url: "), p)
            XCTAssertFalse(p.contains("\u{202E}"), "the refusal escapes what it quotes: \(p)")
        }
        XCTAssertTrue(problem { $0.adapter = "../../x" }?.hasPrefix("adapter: ") == true)
        XCTAssertTrue(problem { $0.controller = Dictionary(uniqueKeysWithValues: (0..<40).map { ("k\($0)", "v") }) }?.hasPrefix("controller: ") == true)
    }

    func testTheCoordinatorAnswers400() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("reg-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        var config = Coordinator.Config(results: dir)
        config.insecure = true
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        var info = LabWire.AgentInfo(name: "a1", url: "http://10.0.0.7:8701", tags: [], radio: .sim, adapter: nil, controller: nil, version: String(repeating: "9", count: 65))
        info.boot = "boot-0001"
        info.sequence = 1
        XCTAssertThrowsError(try c.register(info, principal: nil, peerHost: "10.0.0.7")) { e in
            XCTAssertEqual((e as? LabRefusal)?.kind.status, 400)
            XCTAssertTrue("\(e)".contains("version: longer than 64 characters"), "\(e)")
        }
        XCTAssertTrue(c.agentViews.isEmpty, "nothing stored")
    }
}
