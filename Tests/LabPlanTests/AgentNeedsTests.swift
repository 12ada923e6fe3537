import XCTest
@testable import LabPlan

/// Issue 40, item 5: what a plan needs of a lab (`Plan.needs`, `Plan.needs(of:)`) and whether a
/// lab fits it (`AgentNeeds.fit`), pure: what `plan check` says, `run STUDY` checks before its
/// first submission and the coordinator selects by.
final class AgentNeedsTests: XCTestCase {
    func plan(_ body: String) throws -> Plan { try Plan.parse(yaml: "name: p\nduration: 1m\n" + body, source: "t.yaml") }

    func agent(_ name: String, radio: RadioKind = .sim, tags: [String] = [], url: String? = nil,
               make: Int? = nil, makeName: String? = nil, lmp: Int? = nil, dongle: String? = nil) -> LabWire.AgentInfo {
        var i = LabWire.AgentInfo(name: name, url: url ?? "http://127.0.0.1/\(name)", tags: tags, radio: radio, adapter: nil, controller: nil)
        if radio == .bluez {
            var d = LabWire.DongleInfo(id: nil, name: dongle ?? name, present: true)
            d.manufacturer = make; d.manufacturerName = makeName; d.lmpVersion = lmp.map { _ in 9 }; d.lmpSubversion = lmp
            i.dongle = d
        }
        return i
    }

    func testAPlanNeedsOneAgentANodeWithItsRadioAndTags() throws {
        let p = try plan("nodes: {count: 4}\nagents: {tags: [east, hub1]}\n")
        XCTAssertEqual(p.needs, AgentNeeds(agents: 4, radio: .sim, tags: ["east", "hub1"]))
        XCTAssertEqual(p.needs.description, "4 agents with radio sim with tags east,hub1")
        let b = try plan("nodes: {count: 3}\nradio: {kind: bluez}\nagents: {manufacturer: [Intel, 2], firmware: 8870, spares: 1}\n")
        XCTAssertEqual(b.needs, AgentNeeds(agents: 3, radio: .bluez, manufacturer: ["Intel", "2"], firmware: ["8870"], spares: 1))
        XCTAssertEqual(b.needs.description, "3 agents with radio bluez and dongles of make Intel/2, firmware 8870")
        XCTAssertEqual(try plan("nodes: [a, b]\nagents: {names: [x, y]}\n").needs.description, "2 agents named x, y with radio sim")
        XCTAssertEqual(try plan("nodes: [a, b]\nradio: {kind: bluez}\nagents: {dongles: [d1, d2]}\n").needs.description, "2 agents driving dongles d1, d2 with radio bluez")
    }

    func testAStudyNeedsOneEntryUnlessItsLevelsSelectDifferentDongles() throws {
        let same = try Plan.expandStudy(yaml: """
        name: s
        duration: 1m
        nodes: {count: 25}
        study: {factors: [{path: sensor.advertInterval, levels: [100ms, 1s]}], repeats: 5}
        """).runs
        XCTAssertEqual(Plan.needs(of: same), [AgentNeeds(agents: 25, radio: .sim)], "every run needs the same: one entry, no levels")
        let byFirmware = try Plan.expandStudy(yaml: """
        name: s
        duration: 1m
        nodes: {count: 2}
        radio: {kind: bluez}
        study: {factors: [{path: agents.firmware, levels: ["8870", "0x1234"]}], repeats: 2}
        """).runs
        let needs = Plan.needs(of: byFirmware)
        XCTAssertEqual(needs.count, 2)
        XCTAssertEqual(Set(needs.compactMap(\.levels)), [["8870"], ["0x1234"]])
        XCTAssertEqual(Set(needs.compactMap(\.firmware)), [["8870"], ["0x1234"]])
    }

    func testTheFitCountsAliveFreeMatchingAgentsOneAURL() {
        let needs = AgentNeeds(agents: 4, radio: .sim, tags: ["east"])
        let lab = [
            AgentOffer(info: agent("a1", tags: ["east", "x"]), alive: true),
            AgentOffer(info: agent("a2", tags: ["east"]), alive: true),
            AgentOffer(info: agent("a3", tags: ["east"], url: "http://127.0.0.1/a2"), alive: true), // a2's slot
            AgentOffer(info: agent("a4", tags: ["west"]), alive: true),                         // no tag
            AgentOffer(info: agent("a5", radio: .bluez, tags: ["east"]), alive: true),            // another radio
            AgentOffer(info: agent("a6", tags: ["east"]), alive: false),
            AgentOffer(info: agent("a7", tags: ["east"]), alive: true, busy: true),
        ]
        let fit = needs.fit(lab)
        XCTAssertEqual(fit.fitting, ["a1", "a2"])
        XCTAssertEqual(fit.notAlive, ["a6"])
        XCTAssertEqual(fit.busy, ["a7"])
        XCTAssertFalse(fit.fits)
        XCTAssertEqual(fit.reason, "needs 4 agents with radio sim with tags east, but 2 fit (a1, a2); not alive: a6; busy with another run: a7")
        XCTAssertTrue(AgentNeeds(agents: 2, radio: .sim, tags: ["east"]).fit(lab).fits)
        XCTAssertNil(AgentNeeds(agents: 2, radio: .sim).fit(lab).reason)
        // The lab: three agents for a study of 25 nodes.
        let three = (1...3).map { AgentOffer(info: agent("agent\($0)"), alive: true) }
        XCTAssertEqual(AgentNeeds(agents: 25, radio: .sim).fit(three).reason, "needs 25 agents with radio sim, but 3 fit (agent1, agent2, agent3)")
        XCTAssertEqual(AgentNeeds(agents: 2, radio: .sim).fit([]).reason, "needs 2 agents with radio sim, but 0 fit")
    }

    func testDonglesFitByMakeAndFirmwareAndHealth() {
        let lab = [
            AgentOffer(info: agent("i1", radio: .bluez, make: 2, makeName: "Intel Corp.", lmp: 8870), alive: true),
            AgentOffer(info: agent("i2", radio: .bluez, make: 2, makeName: "Intel Corp.", lmp: 0x1234), alive: true),
            AgentOffer(info: agent("r1", radio: .bluez, make: 93, makeName: "Realtek", lmp: 8870), alive: true),
            AgentOffer(info: agent("i3", radio: .bluez, make: 2, makeName: "Intel Corp.", lmp: 8870), alive: true, unusable: "dongle i3 (-) is bad: failed 2 checks"),
        ]
        XCTAssertEqual(AgentNeeds(agents: 2, radio: .bluez, manufacturer: ["Intel"]).fit(lab).fitting, ["i1", "i2"])
        XCTAssertEqual(AgentNeeds(agents: 2, radio: .bluez, firmware: ["8870"]).fit(lab).fitting, ["i1", "r1"])
        let intel8870 = AgentNeeds(agents: 2, radio: .bluez, manufacturer: ["0x0002"], firmware: ["0x22a6"]).fit(lab)
        XCTAssertEqual(intel8870.fitting, ["i1"])
        XCTAssertEqual(intel8870.reason, "needs 2 agents with radio bluez and dongles of make 0x0002, firmware 0x22a6, but 1 fits (i1); not selectable: i3: dongle i3 (-) is bad: failed 2 checks")
        XCTAssertFalse(AgentNeeds(agents: 1, radio: .sim).admits(lab[0].info), "a bluez agent never runs a simulated plan")
    }

    func testNamedAgentsAndDonglesMustAllFit() {
        let lab = [AgentOffer(info: agent("x"), alive: true), AgentOffer(info: agent("y"), alive: false),
                   AgentOffer(info: agent("d", radio: .bluez, dongle: "hub1-p1"), alive: true)]
        XCTAssertTrue(AgentNeeds(agents: 1, radio: .sim, names: ["x"]).fit(lab).fits)
        XCTAssertEqual(AgentNeeds(agents: 3, radio: .sim, names: ["x", "y", "z"]).fit(lab).reason,
                       "needs 3 agents named x, y, z with radio sim, but 1 fits (x); not in the lab: agent z; not alive: y")
        XCTAssertEqual(AgentNeeds(agents: 1, radio: .sim, names: ["d"]).fit(lab).unknown, ["agent d"], "named, but with another radio")
        XCTAssertTrue(AgentNeeds(agents: 1, radio: .bluez, dongles: ["hub1-p1"]).fit(lab).fits)
        XCTAssertEqual(AgentNeeds(agents: 2, radio: .bluez, dongles: ["hub1-p1", "hub9"]).fit(lab).unknown, ["dongle hub9"])
    }
}
