import Foundation
import XCTest
import LabPlan

/// `herald-lab run STUDY` on a lab of real processes (air, coordinator, agents on loopback):
/// every run submitted in simulate's order, each bundle fetched, the first run's agents pinned
/// to every later run (a crossover), and compare pairing the levels per dongle.
final class StudyRunTests: XCTestCase {
    var lab: LabProcesses?
    override func tearDown() { lab?.stopAll(); lab = nil }

    static let study = """
    name: lab-study
    duration: 10s
    warmup: 2s
    seed: 7
    nodes:
      - {name: n1, position: [0, 0]}
      - {name: n2, position: [1, 0]}
      - {name: n3, position: [2, 0]}
      - {name: n4, position: [3, 0]}
    study:
      factors:
        - {path: sensor.advertInterval, levels: [100ms, 1s]}
      repeats: 3

    """

    func testAStudyRunsEveryLevelOnTheSameAgentsInSimulatesOrderAndComparesPaired() throws {
        // Three runs a level (a paired comparison needs them); five agents for four nodes: the coordinator could pick another set for a later run
        // if the first run's agents were not pinned.
        let lab = try LabProcesses.make(agents: 5)
        self.lab = lab
        let planFile = lab.dir.appendingPathComponent("lab-study.yaml")
        try Self.study.write(to: planFile, atomically: true, encoding: .utf8)
        let out = lab.dir.appendingPathComponent("studies")
        let (code, output) = try lab.cli(["run", planFile.path, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path, "--out", out.path])
        XCTAssertEqual(code, 0, output)
        XCTAssertTrue(output.contains("crossover: every level runs on the same dongles"), output)
        let folder = out.appendingPathComponent("lab-study")
        let expected = try Plan.expandStudy(yaml: Self.study).runs
        let index = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("study.json"))) as? [String: Any])
        XCTAssertEqual(index["mode"] as? String, "lab")
        XCTAssertEqual(index["crossover"] as? Bool, true)
        XCTAssertEqual(index["order"] as? [String], expected.map(\.folder), "the order simulate gives")
        let runs = try XCTUnwrap(index["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.map { $0["level"] as? String }, expected.map(\.level))
        XCTAssertEqual(runs.map { $0["seed"] as? UInt64 }, expected.map(\.seed))
        XCTAssertEqual(Set(expected.prefix(2).map(\.level)).count, 2, "interleaved: the first block runs both levels")
        var assignment: [String: String]?
        var runIds = Set<String>()
        for (r, e) in zip(runs, expected) {
            XCTAssertEqual(r["state"] as? String, "complete")
            runIds.insert(try XCTUnwrap(r["runId"] as? String))
            let manifest = try Manifest.read(from: folder.appendingPathComponent("\(e.folder)/manifest.json"))
            XCTAssertEqual(manifest.nodes.map(\.state), [.complete, .complete, .complete, .complete], e.folder)
            XCTAssertTrue(FileManager.default.fileExists(atPath: folder.appendingPathComponent("\(e.folder)/report/summary.json").path), e.folder)
            let nodes = try XCTUnwrap(r["nodes"] as? [[String: Any]])
            let here = Dictionary(uniqueKeysWithValues: nodes.map { ($0["node"] as! String, $0["agent"] as! String) })
            XCTAssertEqual(here.count, 4)
            XCTAssertEqual(Set(manifest.nodes.compactMap { $0.agent?.name }), Set(here.values), "study.json names the agents that ran it")
            // The coordinator picks agents in name order, so a check of who ran what alone could
            // pass unpinned: the plans it was given must name the first run's agents.
            let id = try XCTUnwrap(r["runId"] as? String)
            let submitted = try Plan.parse(yaml: try XCTUnwrap(lab.runRecord(id)?["planText"] as? String))
            XCTAssertNil(submitted.study, "each run is sent as its own plan")
            XCTAssertEqual(submitted.seed, e.seed)
            XCTAssertEqual(submitted.sensor.advertInterval, e.level == "100ms" ? 0.1 : 1)
            XCTAssertEqual(submitted.studyRun, e.plan.studyRun, "the coordinator keeps which study the run belongs to, its level and place")
            XCTAssertEqual(submitted.studyRun?.study.name, "lab-study")
            if let assignment {
                XCTAssertEqual(here, assignment, "\(e.folder): every node on the first run's agent")
                XCTAssertEqual(submitted.agents.names, submitted.nodes.map { assignment[$0.name]! }, "\(e.folder): pinned to the first run's agents")
            } else {
                assignment = here
                XCTAssertNil(submitted.agents.names, "the first run's agents are the coordinator's choice")
            }
        }
        XCTAssertEqual(runIds.count, 6)
        let compare = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("compare.json"))) as? [String: Any])
        XCTAssertEqual(compare["pairing"] as? String, "paired per dongle")
        let effects = try XCTUnwrap(compare["effects"] as? [[String: Any]])
        XCTAssertTrue(effects.contains { $0["pairing"] as? String == "paired per dongle" && $0["pairedUnits"] as? Int == 4 })
        XCTAssertTrue(FileManager.default.fileExists(atPath: folder.appendingPathComponent("study.html").path))
        // compare on the folder gives the same.
        let (cc, text) = try lab.cli(["compare", folder.path])
        XCTAssertEqual(cc, 0, text)
        XCTAssertTrue(text.contains("pairing: paired per dongle (4 dongles ran every level)"), text)
        // The coordinator's dashboard finds the study among its runs and shows the same effects,
        // computed from the bundles it holds: study.html's forest plot and estimates, verbatim.
        let (status, page) = lab.dashboard("/studies/lab-study")
        XCTAssertEqual(status, 200, page)
        let report = try String(contentsOf: folder.appendingPathComponent("study.html"), encoding: .utf8)
        let forest = try XCTUnwrap(report.range(of: "<svg").map { report[$0.lowerBound...] }.flatMap { r in r.range(of: "</svg>").map { String(r[..<$0.upperBound]) } })
        // The dashboard's copy leaves out the SVG's own <style> (its policy allows no inline
        // style; the page's style sheet styles the text): everything else verbatim.
        let forestWithoutStyle = forest.replacingOccurrences(of: "<style>[^<]*</style>", with: "", options: .regularExpression)
        XCTAssertNotEqual(forestWithoutStyle, forest, "study.html's forest plot carries its own style")
        XCTAssertTrue(page.contains(forestWithoutStyle), "the forest plot of study.html")
        XCTAssertFalse(page.contains("<style"), "no inline style on the dashboard's study page")
        let table = try XCTUnwrap(report.components(separatedBy: "<h2>Estimates</h2>\n").last?.components(separatedBy: "</table>\n").first)
        XCTAssertTrue(page.contains(table + "</table>"), "the estimates of study.html")
        XCTAssertTrue(page.contains("Pairing: <b>paired per dongle</b>"), page)
        let (_, trends) = lab.dashboard("/trends")
        XCTAssertTrue(trends.contains("100ms (3/3), 1s (3/3)"), trends)
    }

    /// A pinned agent lost in the first run: that run fails, and the next is refused with the
    /// reason rather than run on the free agent the coordinator has (agent5, which an unpinned
    /// plan would get); the study stops there (issue 40: the rest would be refused alike),
    /// records both and exits 2.
    func testALostPinnedAgentFailsItsRunsInsteadOfUsingAnother() throws {
        let lab = try LabProcesses.make(agents: 5)
        self.lab = lab
        let planFile = lab.dir.appendingPathComponent("lab-study.yaml")
        try Self.study.replacingOccurrences(of: "repeats: 3", with: "repeats: 2").write(to: planFile, atomically: true, encoding: .utf8)
        let out = lab.dir.appendingPathComponent("studies")
        let index = out.appendingPathComponent("lab-study/study.json")
        let study = Process()
        study.executableURL = LabProcesses.binary
        study.arguments = ["run", planFile.path, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path, "--out", out.path]
        let log = lab.dir.appendingPathComponent("study.log")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        study.standardOutput = handle
        study.standardError = handle
        try study.run()
        // Once the first run is running, its first node's agent goes away.
        var firstAgent: String?
        try lab.waitUntil(timeout: 60, "the first run running") {
            let (status, data) = lab.call("GET", "/v1/runs")
            guard status == 200, let list = try? JSONSerialization.jsonObject(with: data) as? [[String: Any]],
                  let run = list.first(where: { $0["state"] as? String == "running" }), let nodes = run["nodes"] as? [[String: Any]] else { return false }
            firstAgent = nodes.first?["agent"] as? String
            return firstAgent != nil
        }
        lab.kill9(try XCTUnwrap(firstAgent))
        study.waitUntilExit()
        let output = try String(contentsOf: log, encoding: .utf8)
        XCTAssertEqual(study.terminationStatus, 2, output)
        XCTAssertTrue(output.contains("4 of 4 runs did not complete"), output)
        XCTAssertTrue(output.contains("names agent \(firstAgent!), which is not alive"), output)
        XCTAssertEqual(output.components(separatedBy: "which is not alive").count - 1, 1, "refused once, not once a run: \(output)")
        XCTAssertTrue(output.contains("so the study stopped there (2 runs not submitted)"), output)
        let (status, list) = lab.call("GET", "/v1/runs")
        XCTAssertEqual(status, 200)
        XCTAssertEqual((try JSONSerialization.jsonObject(with: list) as? [Any])?.count, 1, "only the first run was taken")
        let obj = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: index)) as? [String: Any])
        let runs = try XCTUnwrap(obj["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.map { $0["state"] as? String }, ["failed", "failed"])
        XCTAssertTrue((runs[1]["message"] as? String ?? "").contains("not alive"), "the reason is recorded: \(runs[1])")
        XCTAssertNil(runs[1]["runId"], "the second run was never run")
    }

    /// Issue 40, item 5: a lab too small for the study is refused before the first submission,
    /// with how many agents the study needs and how many fit: exit 2, no run submitted, nothing
    /// in --out (a 3-agent lab once had all 10 runs of a 25-node study refused, the same 409 ten
    /// times, and a study.json and study.html written for a study that never ran).
    func testALabTooSmallForTheStudyIsRefusedBeforeTheFirstRun() throws {
        let lab = try LabProcesses.make(agents: 3)
        self.lab = lab
        let planFile = lab.dir.appendingPathComponent("lab-study.yaml")
        try Self.study.write(to: planFile, atomically: true, encoding: .utf8)
        let out = lab.dir.appendingPathComponent("studies")
        let (code, output) = try lab.cli(["run", planFile.path, "--coordinator", lab.coordinatorURL, "--token-file", lab.tokenFile.path, "--out", out.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertTrue(output.contains("needs 4 agents with radio sim, but 3 fit (agent1, agent2, agent3)"), output)
        XCTAssertTrue(output.contains("nothing submitted, nothing written"), output)
        XCTAssertEqual(output.components(separatedBy: "needs 4 agents").count - 1, 1, "said once")
        XCTAssertFalse(FileManager.default.fileExists(atPath: out.path), "nothing written in --out")
        let (status, data) = lab.call("GET", "/v1/runs")
        XCTAssertEqual(status, 200)
        XCTAssertEqual((try JSONSerialization.jsonObject(with: data) as? [Any])?.count, 0, "no run submitted")
    }

    func testAStudyWithoutACoordinatorOrFileIsAClearError() throws {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        let planFile = lab.dir.appendingPathComponent("lab-study.yaml")
        try Self.study.write(to: planFile, atomically: true, encoding: .utf8)
        let out = lab.dir.appendingPathComponent("studies")
        // A port nothing listens on.
        let (code, output) = try lab.cli(["run", planFile.path, "--coordinator", "http://127.0.0.1:9", "--token-file", lab.tokenFile.path, "--out", out.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertTrue(output.contains("cannot reach the coordinator at http://127.0.0.1:9"), output)
        XCTAssertFalse(FileManager.default.fileExists(atPath: out.appendingPathComponent("lab-study").path), "nothing written")
        let (missing, text) = try lab.cli(["run", lab.dir.appendingPathComponent("nope.yaml").path, "--coordinator", "http://127.0.0.1:9", "--token-file", lab.tokenFile.path])
        XCTAssertEqual(missing, 2, text)
        XCTAssertTrue(text.contains("nope.yaml"), text)
    }
}
