import ArgumentParser
import Foundation
import XCTest
@testable import LabHistory
@testable import HeraldLabCLI

/// Issue 40, item 7: one command-line convention, tested on the parser and the pure functions
/// (no process started, so in `make test`): `--json [FILE]` on every command that emits results,
/// did-you-mean for subcommands and keyword values, environment defaults for the coordinator and
/// the credential, hints that carry the options (never a secret), run ids printed whole.
final class CLIConventionsTests: XCTestCase {
    var tmp: URL!
    override func setUp() {
        tmp = FileManager.default.temporaryDirectory.appendingPathComponent("cliconv-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
    }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func parse(_ args: [String]) throws -> ParsableCommand {
        try HeraldLab.parseAsRoot(CLIConventions.normalizeJSON(args))
    }

    func testJSONTakesAnOptionalFile() throws {
        let existing: Set<String> = ["bundles/run-1", "plans/smoke.yaml", "old.json"]
        func n(_ a: [String]) -> [String] { CLIConventions.normalizeJSON(a, exists: { existing.contains($0) }) }
        XCTAssertEqual(n(["history", "--json"]), ["history", "--json=-"], "alone: standard output")
        XCTAssertEqual(n(["history", "--json", "--plan", "p"]), ["history", "--json=-", "--plan", "p"], "followed by an option")
        XCTAssertEqual(n(["history", "--json", "-"]), ["history", "--json", "-"])
        XCTAssertEqual(n(["history", "--json", "out.json"]), ["history", "--json", "out.json"], "a .json file to write")
        XCTAssertEqual(n(["history", "--json", "old.json"]), ["history", "--json", "old.json"], "an existing .json file is overwritten")
        XCTAssertEqual(n(["regress", "b", "--json", "judgement"]), ["regress", "b", "--json", "judgement"], "a new file of any name")
        XCTAssertEqual(n(["analyse", "--json", "bundles/run-1"]), ["analyse", "--json=-", "bundles/run-1"], "the bundle read is not the file written")
        XCTAssertEqual(n(["plan", "check", "--json", "plans/smoke.yaml"]), ["plan", "check", "--json=-", "plans/smoke.yaml"], "nor the plan")
        XCTAssertEqual(n(["history", "--json=x"]), ["history", "--json=x"])
        XCTAssertEqual(n(["compare", "--", "--json"]), ["compare", "--", "--json"], "nothing after --")

        // Every command that emits results takes it the same way.
        let plan = tmp.appendingPathComponent("p.yaml")
        try Data("name: p\n".utf8).write(to: plan)
        let check = try XCTUnwrap(try parse(["plan", "check", "--json", plan.path]) as? PlanCommand.Check)
        XCTAssertEqual(check.json, "-")
        XCTAssertEqual(check.plan, plan.path)
        XCTAssertEqual((try parse(["plan", "check", plan.path, "--json", "plan.json"]) as? PlanCommand.Check)?.json, "plan.json")
        XCTAssertEqual((try parse(["history", "--json"]) as? HistoryCommand)?.json, "-")
        XCTAssertEqual((try parse(["simulate", plan.path, "--json"]) as? SimulateCommand)?.json, "-")
        XCTAssertNil((try parse(["history"]) as? HistoryCommand)?.json)
        XCTAssertEqual((try parse(["analyse", "--json", tmp.path]) as? AnalyseCommand)?.json, "-")
        XCTAssertEqual((try parse(["analyse", tmp.path, "--json", "s.json"]) as? AnalyseCommand)?.json, "s.json")
        XCTAssertEqual((try parse(["compare", "a", "b", "--json"]) as? CompareCommand)?.json, "-")
        XCTAssertEqual((try parse(["regress", "b", "--baseline", "history", "--json"]) as? RegressJudgeCommand)?.json, "-")
        XCTAssertEqual((try parse(["runs", "list", "--coordinator", "http://c:1", "--json"]) as? RunsCommand.List)?.json, "-")
        XCTAssertEqual((try parse(["agents", "--coordinator", "http://c:1", "--json", "a.json"]) as? AgentsList)?.json, "a.json")
        XCTAssertEqual((try parse(["dongles", "list", "--json"]) as? DonglesList)?.json, "-")
        XCTAssertEqual((try parse(["dongles", "check", "--coordinator", "http://c:1", "--json"]) as? DonglesCheck)?.json, "-")
        XCTAssertEqual((try parse(["results-store", "runs", "--history", "postgres://u@h/db", "--json"]) as? ResultsStoreCommand.Runs)?.json, "-")
    }

    func testDidYouMean() {
        XCTAssertEqual(CLIConventions.suggestion(for: "histroy", among: ["history", "latest"]), "history")
        XCTAssertEqual(CLIConventions.suggestion(for: "lates", among: ["history", "latest"]), "latest")
        XCTAssertEqual(CLIConventions.suggestion(for: "offce-10", among: ["office-10", "smoke"]), "office-10")
        XCTAssertEqual(CLIConventions.suggestion(for: "simulat", among: ["simulate", "analyse"]), "simulate")
        XCTAssertEqual(CLIConventions.suggestion(for: "stric", among: ["herald", "strict"]), "strict")
        XCTAssertNil(CLIConventions.suggestion(for: "bundles/run-7", among: ["history", "latest"]))
        XCTAssertNil(CLIConventions.suggestion(for: "xyz", among: ["history", "latest"]))
        XCTAssertNil(CLIConventions.suggestion(for: "history", among: ["history", "latest"]), "a keyword itself is no slip")
        XCTAssertEqual(CLIConventions.didYouMean("histroy", among: ["history", "latest"]), "; did you mean 'history'?")
        XCTAssertEqual(CLIConventions.distance("abc", "acb"), 1, "a swap is one edit")
    }

    func testAMistypedSubcommandIsToldTheCloseOne() {
        let none: (String) -> Bool = { _ in false }
        XCTAssertEqual(CLIConventions.unknownSubcommand(["simulat", "plans/smoke.yaml"], root: HeraldLab.self, exists: none),
                       "herald-lab: unknown command 'simulat'; did you mean 'simulate'?")
        XCTAssertEqual(CLIConventions.unknownSubcommand(["runs", "abrt", "r1"], root: HeraldLab.self, exists: none),
                       "herald-lab runs: unknown command 'abrt'; did you mean 'abort'?")
        XCTAssertEqual(CLIConventions.unknownSubcommand(["plan", "chek", "p.yaml"], root: HeraldLab.self, exists: none),
                       "herald-lab plan: unknown command 'chek'; did you mean 'check'?")
        XCTAssertTrue(CLIConventions.unknownSubcommand(["frobnicate"], root: HeraldLab.self, exists: none)?.hasPrefix("herald-lab: unknown command 'frobnicate' (commands: plan, simulate") == true)
        XCTAssertNil(CLIConventions.unknownSubcommand(["simulate", "plans/smoke.yaml"], root: HeraldLab.self, exists: none))
        XCTAssertNil(CLIConventions.unknownSubcommand(["--version"], root: HeraldLab.self, exists: none))
        XCTAssertNil(CLIConventions.unknownSubcommand(["help", "run"], root: HeraldLab.self, exists: none))
        // A command with a default subcommand takes arguments: a bundle is no slip, even one named like a subcommand.
        XCTAssertNil(CLIConventions.unknownSubcommand(["regress", "bundles/x", "--baseline", "history"], root: HeraldLab.self, exists: none))
        XCTAssertNil(CLIConventions.unknownSubcommand(["regress", "judg"], root: HeraldLab.self, exists: { $0 == "judg" }))
        XCTAssertEqual(CLIConventions.unknownSubcommand(["regress", "acept", "smoke"], root: HeraldLab.self, exists: none),
                       "herald-lab regress: unknown command 'acept'; did you mean 'accept'?")
    }

    func testTheCoordinatorAndTheCredentialFileComeFromTheEnvironment() throws {
        setenv("HERALDLAB_COORDINATOR", "http://coord.lab:8700", 1)
        setenv("HERALDLAB_TOKEN_FILE", "/etc/herald-lab/operator.token", 1)
        defer { unsetenv("HERALDLAB_COORDINATOR"); unsetenv("HERALDLAB_TOKEN_FILE") }
        let list = try XCTUnwrap(try parse(["runs", "list"]) as? RunsCommand.List)
        XCTAssertEqual(list.options.coordinator, "http://coord.lab:8700")
        XCTAssertEqual(list.options.tokenFile, "/etc/herald-lab/operator.token")
        let given = try XCTUnwrap(try parse(["runs", "list", "--coordinator", "http://other:1", "--token-file", "t"]) as? RunsCommand.List)
        XCTAssertEqual(given.options.coordinator, "http://other:1", "a flag wins over the environment")
        XCTAssertEqual(given.options.tokenFile, "t")
        unsetenv("HERALDLAB_COORDINATOR")
        XCTAssertThrowsError(try parse(["runs", "list"])) { error in
            XCTAssertEqual(HeraldLab.exitCode(for: error), .validationFailure, "exit 2 (HeraldLab.main)")
            XCTAssertTrue(HeraldLab.message(for: error).contains("--coordinator: give the coordinator's URL"), HeraldLab.message(for: error))
            XCTAssertTrue(HeraldLab.message(for: error).contains("HERALDLAB_COORDINATOR"))
        }
    }

    func testTheDetachHintCarriesTheOptionsButNoSecret() throws {
        var options = try XCTUnwrap(try parse(["run", "p.yaml", "--coordinator", "https://coord.lab:8700", "--token-file", "/home/ci/my token", "--credentials", "/etc/hl"]) as? RunCommand).options
        options.environment = ["HERALDLAB_TOKEN": "s3cret-token-value-0123456789"]
        let hint = RunCommand.detachHint("smoke-20260101-000000-abcd", options: options.pasteable)
        XCTAssertTrue(hint.contains("herald-lab run --attach smoke-20260101-000000-abcd --coordinator https://coord.lab:8700 --token-file '/home/ci/my token' --credentials /etc/hl"), hint)
        XCTAssertTrue(hint.contains("herald-lab runs abort smoke-20260101-000000-abcd --coordinator https://coord.lab:8700 --token-file"), hint)
        XCTAssertFalse(hint.contains("s3cret"))
        // A token from the environment is named, never printed.
        var bare = try XCTUnwrap(try parse(["runs", "list", "--coordinator", "http://c:1"]) as? RunsCommand.List).options
        bare.environment = ["HERALDLAB_TOKEN": "s3cret-token-value-0123456789"]
        XCTAssertEqual(bare.pasteable, "--coordinator http://c:1   (with $HERALDLAB_TOKEN set)")
        XCTAssertEqual(CLIConventions.shellQuoted("it's"), "'it'\\''s'")
    }

    func testHistoryPrintsRunIdsWholeAndAbortedRunsWithoutVerdictOrArrows() {
        func run(_ id: String, _ detection: Double, aborted: Bool = false, infra: String = "", passed: Bool = true) -> HistoryStore.Run {
            HistoryStore.Run(id: nil, recordedAt: "2026-01-01 00:00:00", runId: id, path: "/r/\(id)", plan: "office-10", variant: "", devices: 10,
                             detectionPct: detection, continuityPct: 99, heraldContinuityPct: 99, longevity: 0.9, passed: passed, reportPath: "", summaryJSON: "",
                             infra: infra, aborted: aborted)
        }
        let long = "office-10-20260101-020000-abcdef0123456789"
        let lines = HistoryCommand.table([run("office-10-20251231-020000-aaaa", 98), run(long, 0, aborted: true, infra: "the run was aborted", passed: false),
                                          run("office-10-20260102-020000-bbbb", 40, infra: "node n2: state partial", passed: false),
                                          run("office-10-20260103-020000-cccc", 97)])
        XCTAssertEqual(lines.count, 5)
        XCTAssertTrue(lines[2].contains(long), "the whole run id: \(lines[2])")
        XCTAssertTrue(lines[2].hasSuffix("aborted (no verdict)"), lines[2])
        XCTAssertFalse(lines[2].contains("↓") || lines[2].contains("↑"), "no arrows on an aborted run")
        XCTAssertTrue(lines[3].contains("FAIL (infra: node n2: state partial)"), lines[3])
        XCTAssertFalse(lines[3].contains("↓"), "no arrows on an infra run")
        XCTAssertTrue(lines[4].contains("97.00 ↓"), "compared with the last clean run (98), not the aborted 0: \(lines[4])")
        XCTAssertTrue(lines[4].hasSuffix("pass"))
    }

    func testHistoryEndsWithTheInfraRatePerTestbed() {
        let lines = HistoryCommand.infraLines([HistoryStore.InfraRate(testbed: "sim", runs: 30, infra: 3), HistoryStore.InfraRate(testbed: "", runs: 2, infra: 0)])
        XCTAssertEqual(lines, ["infra rate, testbed sim: 3 of its last 30 runs (10.00 %, 95 % CI 3.460-25.62 %)",
                               "infra rate, testbed (none): 0 of its last 2 runs (0.000 %, 95 % CI 0.000-65.76 %)"])
    }
}
