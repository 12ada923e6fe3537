import Foundation
import Hummingbird
import HeraldCore
import HeraldAnalysis
import LabHistory
import LabNode
import LabPlan
import Logging
import PostgresNIO
import XCTest
import LabHTTP
@testable import LabCoordinator
@testable import LabResults

/// Reading across labs from a real PostgreSQL the test starts (issue 41 item 4; the tier
/// `make test-results-server`): two labs' rows read apart and together, each lab's regression
/// judged against its own nights only (lab B's bad nights do not move lab A's verdict), and two
/// labs' nightly series of one plan compared with intervals. Skipped only when PostgreSQL's
/// server binaries are absent (HERALDLAB_REQUIRE_POSTGRES=1: failed instead).
final class SharedHistoryReadingTests: XCTestCase {
    nonisolated(unsafe) static var server: PostgresServer?
    nonisolated(unsafe) static var databases = 0
    nonisolated(unsafe) static var base: AnalysisResult?
    static let ownerPassword = "owner-\(UUID().uuidString)"
    let logger = Logger(label: "test.results.reading")
    var tmp: URL!

    override func setUpWithError() throws {
        tmp = FileManager.default.temporaryDirectory.appendingPathComponent("reading-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
    }

    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    override class func tearDown() {
        server?.destroy()
        server = nil
        super.tearDown()
    }

    func admin(_ sql: String) async throws {
        let c = try await PostgresConnection.connect(configuration: .init(unixSocketPath: Self.server!.socketPath, username: PostgresServer.superuser, password: nil, database: "postgres"),
                                                     id: 1, logger: logger)
        do { try await c.query(PostgresQuery(unsafeSQL: sql), logger: logger) } catch {
            try? await c.close()
            throw error
        }
        try await c.close()
    }

    /// A new database owned by the owner role, and a store on it over TCP (password from a 0600 file).
    func newStore() async throws -> SharedResultsStore {
        if Self.server == nil {
            Self.server = try PostgresServer()
            try await admin("CREATE ROLE reading_owner LOGIN PASSWORD '\(Self.ownerPassword)'")
        }
        Self.databases += 1
        let name = "reading_\(Self.databases)"
        try await admin("CREATE DATABASE \(name) OWNER reading_owner")
        let file = tmp.appendingPathComponent("owner.pw")
        _ = FileManager.default.createFile(atPath: file.path, contents: Data("\(Self.ownerPassword)\n".utf8), attributes: [.posixPermissions: 0o600])
        return try await SharedResultsStore.connect(url: "postgres://reading_owner@127.0.0.1:\(Self.server!.port)/\(name)", passwordFile: file.path, logger: logger)
    }

    /// One simulated smoke run (2 nodes, 2 pairs), analysed once per test process.
    func baseResult() throws -> AnalysisResult {
        if let b = Self.base { return b }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let out = tmp.appendingPathComponent("base")
        _ = try Simulation(plan: try Plan.load(path: root.appendingPathComponent("plans/smoke.yaml").path), planText: "", seed: 1, output: out).run()
        let r = try Analyser.analyse(out).result
        Self.base = r
        return r
    }

    /// `base` as run `id`; `bad`: its pairs undetected but the first (detection falls by half or more).
    func night(_ id: String, bad: Bool = false) throws -> AnalysisResult {
        var r = try baseResult()
        r.input.runId = id
        r.input.path = "/srv/results/\(id)"
        if bad { for k in r.pairs.indices.dropFirst() { r.pairs[k].detected = false } }
        return r
    }

    func testTwoLabsRowsAreReadApartAndTogetherEachNamingItsLab() async throws {
        let store = try await newStore()
        let hostile = "lab'; DROP TABLE lab_run; --"
        for k in 0..<3 {
            try await store.record(try SharedRun(try night("a-\(k)"), lab: "lab-a"))
            try await store.record(try SharedRun(try night("b-\(k)"), lab: hostile))
        }
        try await store.record(try SharedRun(try night("c-0"), lab: "lab-c"))
        let a = try await store.historyRuns(labs: ["lab-a"], plan: nil)
        XCTAssertEqual(a.map(\.run.runId), ["a-0", "a-1", "a-2"])
        XCTAssertTrue(a.allSatisfy { $0.lab == "lab-a" })
        let b = try await store.historyRuns(labs: [hostile], plan: nil)
        XCTAssertEqual(b.map(\.run.runId), ["b-0", "b-1", "b-2"], "a hostile lab name is a value like any")
        let both = try await store.historyRuns(labs: ["lab-a", hostile], plan: nil)
        XCTAssertEqual(both.count, 6)
        XCTAssertEqual(Set(both.map(\.lab)), ["lab-a", hostile])
        XCTAssertEqual(both.map(\.run.runId), ["a-0", "b-0", "a-1", "b-1", "a-2", "b-2"], "in the order stored")
        let every = try await store.historyRuns(labs: [], plan: nil)
        XCTAssertEqual(every.count, 7)
        let newest = try await store.historyRuns(labs: ["lab-a", hostile], plan: nil, last: 3)
        XCTAssertEqual(newest.map(\.run.runId), ["b-1", "a-2", "b-2"], "the newest 3, oldest first")
        let labs = try await store.historyLabs()
        XCTAssertEqual(labs, [hostile, "lab-a", "lab-c"].sorted())
        let plans = try await store.historyPlans(labs: ["lab-a"])
        XCTAssertEqual(plans, ["smoke"])
        let none = try await store.historyRuns(labs: ["lab-a"], plan: "no-such-plan")
        XCTAssertTrue(none.isEmpty)
        // Infra rates: by testbed for one lab, lab/testbed for several.
        let one = try await store.historyInfraRates(labs: ["lab-a"], last: 30)
        XCTAssertEqual(one.map(\.testbed), [try baseResult().input.testbed ?? ""])
        let two = try await store.historyInfraRates(labs: ["lab-a", "lab-c"], last: 30)
        XCTAssertEqual(two.map(\.testbed), ["lab-a/\(try baseResult().input.testbed ?? "")", "lab-c/\(try baseResult().input.testbed ?? "")"])
        XCTAssertEqual(two.map(\.runs), [3, 1])
        // The rows decode back to the summaries stored.
        let summary = try XCTUnwrap(a.first).run.decodedSummary()
        XCTAssertEqual(summary.input.runId, "a-0")
        let stored = try await store.count()
        XCTAssertEqual(stored, 7, "nothing dropped")
        await store.close()
    }

    func testEachLabsRegressionIsJudgedAgainstItsOwnNightsOnly() async throws {
        let store = try await newStore()
        // Interleaved nights: lab A healthy, lab B bad every night.
        for k in 0..<5 {
            try await store.record(try SharedRun(try night("a-\(k)"), lab: "lab-a"))
            try await store.record(try SharedRun(try night("b-\(k)", bad: true), lab: "lab-b"))
        }
        // Lab A's baseline is lab A's nights alone.
        let baseline = try await store.baseline(like: try night("a-next"), lab: "lab-a", last: 10)
        XCTAssertEqual(baseline.map(\.runId), ["a-0", "a-1", "a-2", "a-3", "a-4"])
        // A healthy night of lab A: no regression (lab B's bad nights are not its baseline).
        let fine = try await SharedRegressionMemory.judge(current: try night("a-5"), lab: "lab-a", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(fine.verdict, .none, Regression.text(fine))
        // A bad night of lab B against lab B's bad nights: no regression either (not against lab A's healthy ones).
        let same = try await SharedRegressionMemory.judge(current: try night("b-5", bad: true), lab: "lab-b", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(same.verdict, .none, Regression.text(same))
        // A bad night of lab A: a regression, and lab A's alert only.
        let drop = try await SharedRegressionMemory.judge(current: try night("a-6", bad: true), lab: "lab-a", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(drop.verdict, .regression, Regression.text(drop))
        XCTAssertTrue(drop.alert?.contains("opened by this night of lab lab-a") == true, drop.alert ?? "no alert")
        let alertsA = try await store.alerts(lab: "lab-a", plan: "smoke")
        let alertsB = try await store.alerts(lab: "lab-b", plan: "smoke")
        XCTAssertEqual(alertsA.map(\.state), [.regressed])
        XCTAssertEqual(alertsA.first?.openedRun, "a-6")
        XCTAssertTrue(alertsB.isEmpty, "lab A's drop opened no alert of lab B")
        // The next bad night of lab A stays flagged; lab B's bad nights still judge none.
        let still = try await SharedRegressionMemory.judge(current: try night("a-7", bad: true), lab: "lab-a", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(still.verdict, .regression)
        let other = try await SharedRegressionMemory.judge(current: try night("b-6", bad: true), lab: "lab-b", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(other.verdict, .none, Regression.text(other))
        // Lab A back to its level: the alert returns, and the flagged nights stay out of its baseline.
        let back = try await SharedRegressionMemory.judge(current: try night("a-8"), lab: "lab-a", store: store, last: 10, tolerancePct: 2)
        XCTAssertEqual(back.verdict, .none, Regression.text(back))
        let closed = try await store.alerts(lab: "lab-a", plan: "smoke")
        XCTAssertEqual(closed.map(\.state), [.returned])
        let after = try await store.baseline(like: try night("a-9"), lab: "lab-a", last: 20)
        XCTAssertFalse(after.contains { ["a-6", "a-7"].contains($0.runId) }, "\(after.map(\.runId))")
        XCTAssertTrue(after.allSatisfy { $0.lab == "lab-a" })
        await store.close()
    }

    func testTwoLabsNightlySeriesOfOnePlanAreComparedWithIntervals() async throws {
        let store = try await newStore()
        for k in 0..<4 {
            try await store.record(try SharedRun(try night("north-\(k)"), lab: "north"))
            try await store.record(try SharedRun(try night("south-\(k)", bad: true), lab: "south"))
        }
        var faulty = try SharedRun(try night("south-infra", bad: true), lab: "south")
        faulty.infra = "node n1: 1 gap"
        try await store.record(faulty)
        var design = try await CrossLabComparison.design(plan: "smoke", labs: ["north", "south"], variant: nil, last: 30, reader: store)
        XCTAssertEqual(design.factor, "lab")
        XCTAssertEqual(design.levels.map(\.name), ["north", "south"])
        XCTAssertEqual(design.levels.map { $0.runs.count }, [4, 4], "clean nights only")
        XCTAssertEqual(design.levels[1].runs.map(\.label), ["south/south-0", "south/south-1", "south/south-2", "south/south-3"])
        design.resamples = 500
        let outcome = Comparison.compare(design)
        XCTAssertEqual(outcome.baseline, "north")
        let detection = try XCTUnwrap(outcome.effects.first { $0.metric == Metric.detectionPct.rawValue && $0.level == "south" })
        let delta = try XCTUnwrap(detection.delta)
        XCTAssertLessThan(delta, -10, "south detects less: \(detection)")
        XCTAssertNotNil(detection.ci95, "an interval")
        // Same seed, same figures.
        let again = Comparison.compare(design)
        XCTAssertEqual(again.effects.first { $0.metric == Metric.detectionPct.rawValue }?.ci95, detection.ci95)
        // A lab without clean runs of the plan is said.
        do {
            _ = try await CrossLabComparison.design(plan: "smoke", labs: ["north", "east"], variant: nil, last: 30, reader: store)
            XCTFail("a lab without runs compared")
        } catch let e as CrossLabComparison.Problem { XCTAssertEqual(e, .noRuns(lab: "east")) }
        await store.close()
    }

    /// The coordinator's Trends over the shared store (what `coordinator --history` serves): every
    /// lab's series, one lab's with `?lab=`, and the cross-lab page of a plan.
    func testTheCoordinatorsTrendsReadTheSharedStoreWithALabFilter() async throws {
        let store = try await newStore()
        for k in 0..<3 {
            try await store.record(try SharedRun(try night("n-\(k)"), lab: "north"))
            try await store.record(try SharedRun(try night("s-\(k)", bad: true), lab: "south"))
        }
        var config = Coordinator.Config(results: tmp.appendingPathComponent("results"))
        config.historyReader = store
        let c = try Coordinator(config: config, logger: Logger(label: "test.trends", factory: { _ in SwiftLogNoOpLogHandler() }))
        let session = DashboardSession(id: "s", csrf: "c", expires: .infinity)
        func html(_ r: Response) async -> String {
            String(decoding: await r.data ?? Data(), as: UTF8.self)
        }
        let every = await html(await c.pages.trendsPage(session))
        XCTAssertTrue(every.contains("<span class=\"lab\">lab north</span>") && every.contains("<span class=\"lab\">lab south</span>"), every)
        XCTAssertTrue(every.contains("north/"), "infra rates per lab/testbed: \(every)")
        let lab = try c.pages.labParameter(["lab": "north"])
        let north = await html(await c.pages.trendsPage(session, lab: lab))
        XCTAssertTrue(north.contains("<span class=\"lab\">lab north</span>"))
        XCTAssertFalse(north.contains("s-0") || north.contains("<span class=\"lab\">lab south</span>"), "south on north's page")
        XCTAssertThrowsError(try c.pages.labParameter(["lab": "north'; DROP TABLE lab_run; --"])) { e in
            XCTAssertEqual((e as? LabRefusal)?.kind, .invalid)
            XCTAssertTrue("\(e)".contains("lab:"), "\(e)")
        }
        let cross = await html(try await c.pages.crossLabPage(session, plan: "smoke"))
        XCTAssertEqual(cross.components(separatedBy: "<tr class=\"lab\">").count - 1, 2, cross)
        XCTAssertEqual(cross.components(separatedBy: "<h2 class=\"labsection\">").count - 1, 2)
        let rows = try await store.count()
        XCTAssertEqual(rows, 6, "reading wrote nothing")
        await store.close()
    }
}
