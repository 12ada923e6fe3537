import Foundation
import XCTest
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import LabTestSupport
@testable import LabAgent
@testable import LabCoordinator

/// An enrolled agent turned hostile in each state of a run (issue 36): while it runs (its
/// heartbeats and status answers carry impossible numbers, another run's id, markup and terminal
/// escapes, and huge lists), while it is gathered (its file list lies about every field but the
/// names), and after the run has ended (it goes on claiming the run). Arming is
/// HostileClockTests'. In each, the other nodes complete, the run ends, nothing impossible is
/// recorded, the coordinator's metrics and pages render, and a coordinator restarted on the same
/// results folder reads the record and renders them too. In memory (MemoryLab), no sockets.
final class HostileAgentTests: XCTestCase {
    var lab: MemoryLab?
    override func tearDown() async throws { await lab?.stop(); lab = nil }

    func plan(_ name: String, nodes: Int, duration: String = "4s") -> String { MemoryLab.plan(name, nodes: nodes, duration: duration) }

    static let markup = "<script>alert(1)</script>\u{1B}[31mred\u{1B}]0;title\u{07}\u{202E}"

    /// Every number out of range, every text hostile, every list long.
    static let lie: @Sendable (inout LabWire.AgentStatus) -> Void = { s in
        s.state = .finished
        s.startAt = 1e300
        s.startedAt = -.infinity
        s.endsAt = .nan
        s.lateBy = .infinity
        s.peersDetected = .max
        s.payloadsRead = .max
        s.rssiLastMinute = .min
        s.rssiTotal = .max
        s.message = markup
        s.writeError = markup
        s.radio = markup
        s.gaps = [LabWire.Gap(from: .nan, to: 1e300, reason: markup), LabWire.Gap(from: 5e10, to: -5e10, reason: markup)]
        s.peers = (0..<20_000).map { "p\($0)\(markup)" }
        s.recentPeers = s.peers
        s.held = ["../../etc", "-rf", markup]
    }

    /// What every reader of the record must survive: the run is final, nothing impossible is in
    /// it, the metrics and the pages render with nothing raw from the agent; then the same after
    /// a restart on the same results folder.
    func checkReaders(_ c: Coordinator, _ id: String, _ where_: String, final: Bool = true) async throws {
        let r = try XCTUnwrap(c.run(id), "\(where_): the run's record")
        if final { XCTAssertTrue(r.state.isFinal, "\(where_): \(r.state)") }
        for n in r.nodes {
            for v in [n.startedAt, n.clockBefore?.offset, n.clockAfter?.offset].compactMap({ $0 }) {
                XCTAssertTrue(v.isFinite && abs(v) < 1e11, "\(where_): \(n.name) holds \(v)")
            }
            for g in n.gaps ?? [] { XCTAssertTrue(g.from.isFinite && g.to.isFinite && g.from <= g.to && g.to < 1e11, "\(where_): gap \(g)") }
            XCTAssertFalse((n.message ?? "").contains("\u{1B}"), "\(where_): \(n.name)'s message carries a terminal escape")
        }
        XCTAssertFalse((r.message ?? "").contains("\u{1B}"), "\(where_): the run's message carries a terminal escape")
        c.collectMetrics()
        let metrics = String(decoding: c.metrics.metrics.exposition(), as: UTF8.self)
        XCTAssertTrue(metrics.contains("heraldlab_runs{"), "\(where_): metrics render")
        XCTAssertFalse(metrics.contains("<script>") || metrics.contains("\u{1B}"), "\(where_): nothing raw in the metrics")
        let session = DashboardSession(id: "s", csrf: "c", expires: .infinity)
        let trends = await c.pages.trendsPage(session)
        let pages = [c.pages.labPage(session), c.pages.runsPage(session), trends, try c.pages.livePage(session, id: id)]
        for page in pages {
            guard let body = await page.data else { XCTFail("\(where_): a page without a body"); continue }
            let html = String(decoding: body, as: UTF8.self)
            XCTAssertFalse(html.contains("<script>alert") || html.contains("\u{1B}") || html.contains("\u{202E}"), "\(where_): raw agent text on a page")
        }
        let snapshot = try LabJSON.encoder.encode(c.pages.liveSnapshot(r))
        XCTAssertFalse(snapshot.isEmpty)
    }

    func restartAndCheck(_ lab: MemoryLab, _ id: String) async throws {
        let config = lab.coordinator.config
        await lab.coordinator.stop()
        let again = try Coordinator(config: config, logger: LogCapture.quiet())
        try await checkReaders(again, id, "after a restart")
        await again.stop()
    }

    func testAnAgentLyingWhileItRunsCannotCrashTheCoordinatorNorPutImpossibleNumbersInTheRecord() async throws {
        let lab = try await MemoryLab.make(agents: 3)
        self.lab = lab
        let id = try lab.coordinator.submit(planText: plan("lies-running", nodes: 3), source: "lies").id
        let running = try await lab.waitFor("the run running on every agent", timeout: 30) {
            lab.coordinator.run(id).flatMap { r in r.state == .running && r.nodes.allSatisfy { lab.agents[$0.agent]?.status.state == .running } ? r : nil }
        }
        let hostile = try XCTUnwrap(running.nodes.first?.agent)
        let link = try XCTUnwrap(lab.links[hostile])
        let before = link.heartbeats
        link.twistStatus = { s in Self.lie(&s); s.runId = id }
        // Its lies reach the coordinator: heartbeats after the twist, and a page viewed meanwhile.
        _ = try await lab.waitFor("3 hostile heartbeats", timeout: 20) { link.heartbeats >= before + 3 ? true : nil }
        try await checkReaders(lab.coordinator, id, "mid-run", final: false)
        let r = try await lab.waitFor("the run's end", timeout: 60) { lab.coordinator.run(id).flatMap { $0.state.isFinal ? $0 : nil } }
        for n in r.nodes where n.agent != hostile { XCTAssertEqual(n.state, .complete, "\(n.name): \(n.message ?? "")") }
        try await checkReaders(lab.coordinator, id, "after the end")
        try await restartAndCheck(lab, id)
    }

    func testAgentsLyingInTheirFileListsLoseOnlyTheirNodesAndWriteNothing() async throws {
        let lab = try await MemoryLab.make(agents: 3, gatherPatience: 1)
        self.lab = lab
        // agent2 lists the right files with impossible instants and gaps; agent3 impossible sizes.
        lab.links["agent2"]!.twistFiles = { list in
            list.startedAt = .nan
            list.startAt = 1e300
            list.gaps = [LabWire.Gap(from: -.infinity, to: .nan, reason: Self.markup)]
            list.failure = Self.markup
        }
        lab.links["agent3"]!.twistFiles = { list in
            list.files = list.files.map { var f = $0; f.bytes = .max; return f }
        }
        let r = try await lab.runToEnd(plan("lies-gathering", nodes: 3))
        let byAgent = Dictionary(uniqueKeysWithValues: r.nodes.map { ($0.agent, $0) })
        XCTAssertEqual(byAgent["agent1"]?.state, .complete, byAgent["agent1"]?.message ?? "")
        XCTAssertEqual(byAgent["agent2"]?.state, .lost)
        XCTAssertTrue(byAgent["agent2"]?.message?.contains("startedAt is not an instant") == true, byAgent["agent2"]?.message ?? "")
        XCTAssertEqual(byAgent["agent3"]?.state, .lost)
        XCTAssertTrue(byAgent["agent3"]?.message?.contains("impossible size") == true, byAgent["agent3"]?.message ?? "")
        for n in r.nodes where n.state == .lost {
            XCTAssertFalse(FileManager.default.fileExists(atPath: lab.results.appendingPathComponent("\(r.id)/nodes/\(n.name)/contacts.csv").path), "nothing written for \(n.name)")
        }
        XCTAssertEqual(r.state, .failed, "a lost node fails the run")
        let m = try Manifest.read(from: lab.results.appendingPathComponent("\(r.id)/manifest.json"))
        XCTAssertTrue(m.nodes.allSatisfy { $0.clockOffset.isFinite && abs($0.clockOffset) < 1e6 }, "\(m.nodes.map(\.clockOffset))")
        try await checkReaders(lab.coordinator, r.id, "after the end")
        try await restartAndCheck(lab, r.id)
    }

    func testAnAgentStillClaimingAnEndedRunChangesNothingAndTheLabRunsOn() async throws {
        let lab = try await MemoryLab.make(agents: 3)
        self.lab = lab
        let first = try await lab.runToEnd(plan("ended", nodes: 2))
        XCTAssertEqual(first.state, .complete, first.message ?? "")
        let hostile = try XCTUnwrap(first.nodes.first?.agent)
        let link = try XCTUnwrap(lab.links[hostile])
        let before = link.heartbeats
        link.twistStatus = { s in Self.lie(&s); s.state = .running; s.runId = first.id; s.node = "n1" }
        _ = try await lab.waitFor("3 hostile heartbeats", timeout: 20) { link.heartbeats >= before + 3 ? true : nil }
        let after = try XCTUnwrap(lab.coordinator.run(first.id))
        XCTAssertEqual(after.state, first.state)
        XCTAssertEqual(after.nodes.map(\.state), first.nodes.map(\.state))
        XCTAssertEqual(after.nodes.map(\.startedAt), first.nodes.map(\.startedAt))
        try await checkReaders(lab.coordinator, first.id, "after the end")
        // The lab runs on with the agents that tell the truth.
        let others = lab.agents.keys.filter { $0 != hostile }.count
        let second = try await lab.runToEnd(plan("next", nodes: others))
        XCTAssertTrue(second.state.isFinal)
        for n in second.nodes where n.agent != hostile { XCTAssertEqual(n.state, .complete, "\(n.name): \(n.message ?? "")") }
        try await restartAndCheck(lab, first.id)
    }
}
