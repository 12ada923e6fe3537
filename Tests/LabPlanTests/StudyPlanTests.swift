import XCTest
@testable import LabPlan

final class StudyPlanTests: XCTestCase {
    let base = """
    name: adv
    duration: 1m
    nodes: {count: 6, prefix: n}
    sensor: {advertInterval: 250ms}
    radio: {kind: sim, crowding: on}

    """

    func testAStudyExpandsIntoSeededInterleavedBlocks() throws {
        let yaml = base + """
        study:
          factors:
            - {path: sensor.advertInterval, levels: [100ms, 1s]}
          repeats: 4
          margins: {detectionPct: 2, timeToFirstDetection: 15%}
        """
        let plan = try Plan.parse(yaml: yaml)
        XCTAssertEqual(plan.study?.factors.first?.levels, ["100ms", "1s"])
        XCTAssertEqual(plan.study?.margins["timeToFirstDetection"], "15%")
        let (_, runs) = try Plan.expandStudy(yaml: yaml)
        XCTAssertEqual(runs.count, 8)
        for block in 0..<4 {
            XCTAssertEqual(Set(runs.filter { $0.block == block }.map(\.level)), ["100ms", "1s"], "every block runs every level once")
        }
        XCTAssertEqual(Set(runs.map(\.seed)).count, 8, "each run its own seed")
        for r in runs {
            XCTAssertEqual(r.plan.sensor.advertInterval, r.level == "100ms" ? 0.1 : 1)
            XCTAssertNil(r.plan.study)
            XCTAssertEqual(r.plan.radio.crowding, CrowdingSettings(), "the rest of the plan is kept")
        }
        XCTAssertEqual(try Plan.expandStudy(yaml: yaml).runs, runs, "the same seed gives the same order")
        let reseeded = try Plan.expandStudy(yaml: yaml, seed: 99).runs
        XCTAssertNotEqual(reseeded.map(\.seed), runs.map(\.seed))
        // Over many seeds both orders of a block occur (randomised, not alternating by rule).
        let firsts = Set((0..<20).map { try! Plan.expandStudy(yaml: yaml, seed: UInt64($0)).runs[0].level })
        XCTAssertEqual(firsts, ["100ms", "1s"])
    }

    func testBadStudiesAreRefusedWithTheirPath() {
        func problems(_ study: String) -> [String] {
            do { _ = try Plan.expandStudy(yaml: base + study); return [] } catch { return error.problems.map(\.description) }
        }
        XCTAssertTrue(problems("study: {factors: [{path: name, levels: [a, b]}]}").contains { $0.hasPrefix("study.factors[0].path") })
        XCTAssertTrue(problems("study: {factors: [{path: sensor.advertInterval, levels: [100ms]}]}").contains { $0.hasPrefix("study.factors[0].levels") })
        XCTAssertTrue(problems("study: {factors: [{path: sensor.advertInterval, levels: [100ms, 100]}]}").contains { $0.contains("advertInterval") && $0.contains("no unit") })
        XCTAssertTrue(problems("study: {factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], repeats: 0}").contains { $0.hasPrefix("study.repeats") })
        XCTAssertTrue(problems("study: {factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], margins: {speed: 1}}").contains { $0.hasPrefix("study.margins.speed") })
        XCTAssertTrue(problems("study: {factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], margins: {longestGap: lots}}").contains { $0.hasPrefix("study.margins.longestGap") })
        XCTAssertTrue(problems("study: {factors: [{path: \"sensor.advertInterval\", levels: [\"1s\\u001b[2J\", 2s]}]}").contains { $0.contains("control characters") })
    }

    func testNodeGroupsCarryTheirOwnSensorSettings() throws {
        let plan = try Plan.parse(yaml: base + """
        groups:
          - {name: fast, set: {sensor.advertInterval: 100ms}}
          - {name: slow, set: {sensor.advertInterval: 1s, sensor.scan.on: 2s}}
        """)
        XCTAssertEqual(plan.groups?.map(\.name), ["fast", "slow"])
        XCTAssertEqual(plan.nodes.map(\.group), ["fast", "slow", "fast", "slow", "fast", "slow"], "dealt in turn")
        XCTAssertEqual(plan.nodes[0].sensor?.advertInterval, 0.1)
        XCTAssertEqual(plan.nodes[1].sensor?.advertInterval, 1)
        XCTAssertEqual(plan.nodes[1].sensor?.scanOn, 2)
        XCTAssertEqual(plan.nodes[0].sensor?.scanOn, 4, "unset paths keep the plan's settings")
        let assignment = NodeAssignment(runId: "r", plan: plan, node: plan.nodes[1])
        XCTAssertEqual(assignment.sensor.advertInterval, 1, "a node runs its group's settings")
        func problems(_ groups: String) -> [String] {
            do { _ = try Plan.parse(yaml: base + groups); return [] } catch { return error.problems.map(\.description) }
        }
        XCTAssertTrue(problems("groups: [{name: a, set: {radio.shadowing: 2}}, {name: b}]").contains { $0.hasPrefix("groups[0].set") && $0.contains("sensor settings only") })
        XCTAssertTrue(problems("groups: [{name: a, set: {sensor.advertInterval: 5ms}}, {name: b}]").contains { $0.hasPrefix("groups[0].set") })
        XCTAssertTrue(problems("groups: [{name: a, nodes: [n1, n2, n3]}, {name: b, nodes: [n4, n5]}]").contains { $0.contains("n6 is in no group") })
        XCTAssertTrue(problems("groups: [{name: a}]").contains { $0.hasPrefix("groups") })
    }

    func testEachRunSaysWhichStudyItBelongsTo() throws {
        let yaml = base + "study: {name: advstudy, factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], repeats: 3, margins: {detectionPct: 2}}\n"
        let runs = try Plan.expandStudy(yaml: yaml).runs
        for r in runs {
            let tag = try XCTUnwrap(try Plan.parse(yaml: r.yaml).studyRun, "studyRun is in the text the coordinator keeps")
            XCTAssertEqual(tag, r.plan.studyRun)
            XCTAssertEqual(tag.study.name, "advstudy")
            XCTAssertEqual(tag.study.levelNames, ["100ms", "1s"])
            XCTAssertEqual(tag.study.margins, ["detectionPct": "2"])
            XCTAssertEqual(tag.level, r.level)
            XCTAssertEqual(tag.index, r.index)
            XCTAssertEqual(tag.block, r.block)
        }
        // Two factors: the level is named as compare names it.
        let two = base + "study: {factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}, {path: radio.reportLoss, levels: [0.1, 0.3]}], repeats: 1}\n"
        let tags = try Plan.expandStudy(yaml: two).runs.map { try Plan.parse(yaml: $0.yaml).studyRun }
        XCTAssertEqual(Set(tags.compactMap { $0?.level }), ["sensor.advertInterval=100ms, radio.reportLoss=0.1", "sensor.advertInterval=100ms, radio.reportLoss=0.3",
                                                           "sensor.advertInterval=1s, radio.reportLoss=0.1", "sensor.advertInterval=1s, radio.reportLoss=0.3"])
        XCTAssertEqual(tags.first??.study.name, "adv", "the plan's name when the study has none")
        // A plan without it is as before.
        XCTAssertNil(try Plan.parse(yaml: base).studyRun)
        let encoded = String(decoding: try JSONEncoder().encode(try Plan.parse(yaml: base)), as: UTF8.self)
        XCTAssertFalse(encoded.contains("studyRun"), "a plan without studyRun encodes as before")
    }

    func testABadStudyRunIsRefusedNamingTheField() {
        let study = "{name: s, factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], repeats: 2}"
        func problems(_ tag: String) -> [String] {
            do { _ = try Plan.parse(yaml: base + "studyRun: " + tag + "\n"); return [] } catch { return error.problems.map(\.description) }
        }
        XCTAssertEqual(problems("{study: \(study), level: 1s, index: 3, block: 1}"), [])
        XCTAssertTrue(problems("{study: \(study), level: 2s, index: 0, block: 0}").contains { $0.hasPrefix("studyRun.level") && $0.contains("not one of the study's 2 levels") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: 4, block: 0}").contains { $0.hasPrefix("studyRun.index") && $0.contains("out of range") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: 0, block: 2}").contains { $0.hasPrefix("studyRun.block") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: -1, block: 0}").contains { $0.hasPrefix("studyRun.index") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: 0}").contains { $0.hasPrefix("studyRun.block") && $0.contains("required") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: 0, block: 0, extra: 1}").contains { $0.hasPrefix("studyRun.extra") })
        XCTAssertTrue(problems("{study: {name: \"../x\", factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}]}, level: 1s, index: 0, block: 0}").contains { $0.hasPrefix("studyRun.study.name") })
        XCTAssertTrue(problems("{study: {name: s}, level: 1s, index: 0, block: 0}").contains { $0.hasPrefix("studyRun.study.factors") })
        XCTAssertTrue(problems("{study: {name: s, factors: [{path: name, levels: [a, b]}]}, level: a, index: 0, block: 0}").contains { $0.hasPrefix("studyRun.study.factors[0].path") })
        XCTAssertTrue(problems("{study: \(study), level: \"\(String(repeating: "x", count: 2000))\", index: 0, block: 0}").contains { $0.hasPrefix("studyRun.level") && $0.contains("at most") })
        XCTAssertTrue(problems("[1, 2]").contains { $0.hasPrefix("studyRun") })
        XCTAssertTrue(problems("{study: \(study), level: 1s, index: 0, block: 0}\nstudy: \(study)").contains { $0.hasPrefix("studyRun") && $0.contains("not both") })
    }
}

/// A study on a lab: each run's own plan text, the crossover and its pinned agents.
final class StudyLabPlanTests: XCTestCase {
    let yaml = """
    name: adv
    duration: 1m
    nodes: {count: 3, prefix: n}
    sensor: {advertInterval: 250ms}
    agents: {tags: [bench], count: 3}
    study:
      factors:
        - {path: sensor.advertInterval, levels: [100ms, 1s]}
      repeats: 2

    """

    func testEachRunsPlanTextIsThePlanOfThatRun() throws {
        for r in try Plan.expandStudy(yaml: yaml).runs {
            let p = try Plan.parse(yaml: r.yaml)
            XCTAssertNil(p.study, "the study block is not sent to the coordinator")
            XCTAssertEqual(p.seed, r.seed)
            XCTAssertEqual(p, r.plan)
        }
    }

    func testASettingIsACrossoverAndADongleSelectorIsNot() throws {
        XCTAssertEqual(try Plan.parse(yaml: yaml).study?.labDesign, .crossover)
        let firmware = """
        name: fw
        duration: 1m
        nodes: {count: 2, prefix: n}
        radio: {kind: bluez}
        study:
          factors:
            - {path: agents.firmware, levels: ["8870", "0x22a6"]}
        """
        let design = try XCTUnwrap(Plan.parse(yaml: firmware).study?.labDesign)
        XCTAssertFalse(design.isCrossover)
        XCTAssertTrue(design.description.contains("agents.firmware selects different dongles"), design.description)
    }

    func testPinningNamesTheFirstRunsAgentsAndDropsTheSelectors() throws {
        let run = try Plan.expandStudy(yaml: yaml).runs[1]
        let pinned = try Plan.parseAndPin(run.yaml, ["a3", "a1", "a2"])
        XCTAssertEqual(pinned.agents.names, ["a3", "a1", "a2"])
        XCTAssertNil(pinned.agents.tags)
        XCTAssertNil(pinned.agents.count)
        XCTAssertEqual(pinned.sensor, run.plan.sensor)
        XCTAssertEqual(pinned.seed, run.seed)
        XCTAssertThrowsError(try Plan.pinning(yaml: run.yaml, agents: ["a1"]), "one agent for three nodes is not a plan")
    }
}

extension Plan {
    static func parseAndPin(_ yaml: String, _ agents: [String]) throws -> Plan { try parse(yaml: pinning(yaml: yaml, agents: agents)) }
}
