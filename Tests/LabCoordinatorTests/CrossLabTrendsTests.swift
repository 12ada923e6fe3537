import XCTest
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabNode
import LabPlan
@testable import LabCoordinator

/// Several labs' history as the shared results store serves it (issue 41), held in memory: what
/// the coordinator's Trends pages make of it over HTTP (a lab filter, the cross-lab page), and
/// hostile `lab` and `plan` query parameters refused with 400 naming the field.
/// A HistoryReading over rows in memory, naming their labs as the shared store does.
struct MemoryHistory: HistoryReading {
        var rows: [LabRun]
        var historyName: String { "memory" }
        var namesLabs: Bool { true }
        func historyLabs() async throws -> [String] { Set(rows.map(\.lab)).sorted() }
        func historyPlans(labs: [String]) async throws -> [String] { Set(pick(labs).map(\.run.plan)).sorted() }
        func historyRuns(labs: [String], plan: String?, last: Int?) async throws -> [LabRun] {
            let rows = pick(labs).filter { plan == nil || $0.run.plan == plan }
            return last.map { Array(rows.suffix($0)) } ?? rows
        }
        func historyInfraRates(labs: [String], last: Int) async throws -> [HistoryStore.InfraRate] { [] }
        func pick(_ labs: [String]) -> [LabRun] { labs.isEmpty ? rows : rows.filter { labs.contains($0.lab) } }
}

nonisolated(unsafe) private var crossLabSummary: String?

extension DashboardTests {
    /// One simulated run's summary, analysed once.
    func crossLabSummaryJSON() throws -> String {
        if let s = crossLabSummary { return s }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("crosslab-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let yaml = "name: crossplan\nduration: 20s\nnodes: {count: 3}\nradio: {kind: sim}\n"
        _ = try Simulation(plan: try Plan.parse(yaml: yaml), planText: yaml, seed: 1, output: dir, threads: 1).run()
        let s = String(decoding: try ReportWriter.summaryJSON(try Analyser.analyse(dir).result), as: UTF8.self)
        crossLabSummary = s
        return s
    }

    func crossLabRows() throws -> [LabRun] {
        let json = try crossLabSummaryJSON()
        var out = [LabRun]()
        var id: Int64 = 0
        for night in 1...3 {
            for (lab, make) in [("lab-north", "Cambridge Silicon Radio"), ("lab-south", "Intel Corp.")] {
                id += 1
                let run = HistoryStore.Run.make(id: id, recordedAt: "2026-11-0\(night) 02:00:00", runId: "\(lab)-night-\(night)", path: "/srv/\(lab)/\(night)", plan: "crossplan",
                                           variant: "", devices: 3, detectionPct: 100, continuityPct: 90, heraldContinuityPct: 90, longevity: 1, passed: true,
                                           reportPath: "https://\(lab).example/\(night)", summaryJSON: json, settingsKey: "k", testbed: "sim")
                out.append(LabRun(lab: lab, run: run, dongleMake: make))
            }
        }
        return out
    }

    func testTrendsFiltersByLabAndTheCrossLabPageShowsEachLab() async throws {
        let (_, client) = try await start(history: MemoryHistory(rows: try crossLabRows()))
        let (cookie, _) = try await session(client)
        func get(_ path: String) async throws -> (Int, String) {
            let (status, body, _) = try await client.request("GET", path, headers: ["Cookie": cookie])
            return (status, String(decoding: body, as: UTF8.self))
        }
        let (all, every) = try await get("/trends")
        XCTAssertEqual(all, 200, every)
        XCTAssertTrue(every.contains("<span class=\"lab\">lab lab-north</span>") && every.contains("<span class=\"lab\">lab lab-south</span>"), every)
        XCTAssertTrue(every.contains("href=\"/trends?lab=lab-north\""), every)
        XCTAssertTrue(every.contains("href=\"/trends/labs?plan=crossplan\""), every)
        let (one, north) = try await get("/trends?lab=lab-north")
        XCTAssertEqual(one, 200, north)
        XCTAssertTrue(north.contains("<span class=\"lab\">lab lab-north</span>"), north)
        XCTAssertFalse(north.contains("<span class=\"lab\">lab lab-south</span>"), "lab-south's series on lab-north's page")
        XCTAssertFalse(north.contains("lab-south-night-"), "a run of lab-south on lab-north's page")
        let (none, empty) = try await get("/trends?lab=lab-east")
        XCTAssertEqual(none, 200)
        XCTAssertTrue(empty.contains("No runs in the history of lab lab-east yet."), empty)
        let (cross, labs) = try await get("/trends/labs?plan=crossplan")
        XCTAssertEqual(cross, 200, labs)
        XCTAssertTrue(labs.contains("<table id=\"labtable\">"), labs)
        XCTAssertEqual(labs.components(separatedBy: "<tr class=\"lab\">").count - 1, 2, "one row per lab")
        XCTAssertTrue(labs.contains("Cambridge Silicon Radio") && labs.contains("Intel Corp."), labs)
        XCTAssertEqual(labs.components(separatedBy: "<h2 class=\"labsection\">").count - 1, 2, "one section per lab")
    }

    func testHostileLabAndPlanParametersAreRefusedWith400NamingTheField() async throws {
        let (_, client) = try await start(history: MemoryHistory(rows: try crossLabRows()))
        let (cookie, _) = try await session(client)
        let hostile = ["%3Cscript%3Ealert(1)%3C%2Fscript%3E", "a%01b", "a%0Ab", "x%27%3B%20DROP%20TABLE%20lab_run%3B--", "%1B%5B31mred", "%E2%80%AEevil",
                       String(repeating: "a", count: 129), "%20padded", "..%2F..%2Fetc"]
        for value in hostile {
            for (path, field) in [("/trends?lab=", "lab"), ("/trends/labs?plan=", "plan")] {
                let (status, body, _) = try await client.request("GET", path + value, headers: ["Cookie": cookie])
                let text = String(decoding: body, as: UTF8.self)
                if value == "..%2F..%2Fetc" { XCTAssertNotEqual(status, 500, text); continue } // letters, dots and slashes: a name like any
                XCTAssertEqual(status, 400, "\(path)\(value): \(text)")
                XCTAssertTrue(text.contains("\(field):"), "\(path)\(value): the field is named: \(text)")
                XCTAssertFalse(text.contains("<script>") || text.contains("\u{1B}") || text.contains("\u{202E}"), text)
            }
        }
        // A NUL is refused before the page, by the HTTP layer (400 too).
        let (nul, nulBody, _) = try await client.request("GET", "/trends?lab=a%00b", headers: ["Cookie": cookie])
        XCTAssertEqual(nul, 400, String(decoding: nulBody, as: UTF8.self))
        let (missing, body, _) = try await client.request("GET", "/trends/labs", headers: ["Cookie": cookie])
        XCTAssertEqual(missing, 400)
        XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("plan: required"))
    }

    func testALabFilterOnACoordinatorWithItsOwnHistoryIs400() async throws {
        let (_, client) = try await start()
        let (cookie, _) = try await session(client)
        let (status, body, _) = try await client.request("GET", "/trends?lab=lab-north", headers: ["Cookie": cookie])
        XCTAssertEqual(status, 400)
        XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("lab: this coordinator's history is its own history.sqlite"))
        let (cross, _, _) = try await client.request("GET", "/trends/labs?plan=crossplan", headers: ["Cookie": cookie])
        XCTAssertEqual(cross, 400)
        let (plain, _, _) = try await client.request("GET", "/trends", headers: ["Cookie": cookie])
        XCTAssertEqual(plain, 200)
    }
}
