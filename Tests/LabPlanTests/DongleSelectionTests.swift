import XCTest
@testable import LabPlan

/// Plans select dongles (radio bluez): by name, maker, firmware, with spares and a pre-flight
/// bound; every bad value is refused with its field path.
final class DongleSelectionTests: XCTestCase {
    func plan(_ agents: String, radio: String = "bluez", nodes: String = "[a, b, c]") throws -> Plan {
        try Plan.parse(yaml: """
        name: p
        duration: 1m
        nodes: \(nodes)
        radio: {kind: \(radio)}
        agents: \(agents)
        """, source: "t.yaml")
    }

    func problems(_ agents: String, radio: String = "bluez", nodes: String = "[a, b, c]") -> [String] {
        do { _ = try plan(agents, radio: radio, nodes: nodes); return [] } catch let e as PlanError {
            return e.problems.map { "\($0.path): \($0.message)" }
        } catch { return ["\(error)"] }
    }

    func testDongleCriteriaAreRead() throws {
        let p = try plan("{count: 3, spares: 2, manufacturer: [Intel, 0x005D, 10], firmware: 8870, preflight: 45s, tags: [hub1]}")
        XCTAssertEqual(p.agents.count, 3)
        XCTAssertEqual(p.agents.spares, 2)
        XCTAssertEqual(p.agents.manufacturer, ["Intel", "0x005D", "10"])
        XCTAssertEqual(p.agents.firmware, ["8870"])
        XCTAssertEqual(p.agents.preflight, 45)
        XCTAssertEqual(p.agents.tags, ["hub1"])
        XCTAssertTrue(p.agents.selectsDongles)
        XCTAssertEqual(try plan("{dongles: [hub1-p1, hub1-p2, hub2-p1]}").agents.dongles, ["hub1-p1", "hub1-p2", "hub2-p1"])
        XCTAssertEqual(try plan("{preflight: off}").agents.preflight, 0)
        XCTAssertNil(try plan("{count: 3}").agents.preflight, "the coordinator's default bound applies")
        XCTAssertFalse(try plan("{count: 3}").agents.selectsDongles)
    }

    func testBadValuesHaveFieldPaths() {
        XCTAssertEqual(problems("{manufacturer: 0x1FFFF}"), ["agents.manufacturer: \"0x1FFFF\" is not a Bluetooth SIG company id (0 to 65535, or 0x0000 to 0xFFFF)"])
        XCTAssertEqual(problems("{manufacturer: [Intel, 70000]}"), ["agents.manufacturer[1]: \"70000\" is not a Bluetooth SIG company id (0 to 65535, or 0x0000 to 0xFFFF)"])
        XCTAssertEqual(problems("{firmware: [0xZZ]}"), ["agents.firmware[0]: \"0xZZ\" is not an LMP subversion (0 to 65535, or 0x0000 to 0xFFFF)"])
        XCTAssertEqual(problems("{firmware: \"\"}").first, "agents.firmware: \"\" is empty; write an LMP subversion (8870, 0x22a6) or the driver's firmware text")
        XCTAssertEqual(problems("{dongles: [a, b]}"), ["agents.dongles: names 2 dongles but the plan has 3 nodes"])
        XCTAssertEqual(problems("{dongles: [a, a, b]}"), ["agents.dongles: names a dongle twice; one dongle runs one node"])
        XCTAssertTrue(problems("{dongles: [a, ../b, c]}").first?.hasPrefix("agents.dongles[1]: \"../b\"") == true, "\(problems("{dongles: [a, ../b, c]}"))")
        XCTAssertEqual(problems("{names: [x, y, z], dongles: [a, b, c]}"), ["agents.dongles: give names (agents) or dongles, not both"])
        XCTAssertEqual(problems("{names: [x, y, z], spares: 1}"), ["agents.spares: spares stand in for dongles that fail their check; names and dongles choose every node's agent themselves"])
        XCTAssertEqual(problems("{spares: -1}"), ["agents.spares: -1 is out of range; expected 0 to 1000"])
        XCTAssertEqual(problems("{preflight: 30}"), ["agents.preflight: \"30\" has no unit; write a duration with one, such as 30s (units ms, s, m, h, d)"])
        XCTAssertEqual(problems("{preflight: 2h}"), ["agents.preflight: \"2h\" is too long; at most 10m"])
        XCTAssertEqual(problems("{count: 5}"), ["agents.count: is 5 but the plan has 3 nodes; one agent runs one node (spares: N checks N more)"])
        XCTAssertEqual(problems("{manufacturer: Intel, spares: 1}", radio: "sim"), [
            "agents.manufacturer: selects or checks dongles, which only agents with radio kind bluez have (radio.kind is sim)",
            "agents.spares: selects or checks dongles, which only agents with radio kind bluez have (radio.kind is sim)",
        ])
        XCTAssertEqual(problems("{colour: red}").first, "agents.colour: unknown field (known: count, names, tags, dongles, manufacturer, firmware, spares, preflight)")
    }

    func dongle(_ maker: Int?, _ makerName: String?, lmp: Int?, firmware: String? = nil) -> LabWire.DongleInfo {
        var d = LabWire.DongleInfo(id: "F0:00:00:00:00:01", name: "d1", present: true)
        d.manufacturer = maker
        d.manufacturerName = makerName
        d.lmpVersion = lmp == nil ? nil : 9
        d.lmpSubversion = lmp
        d.firmware = firmware
        return d
    }

    func testMatchingByMakerAndFirmware() throws {
        let intel = dongle(2, "Intel", lmp: 8870)
        let realtek = dongle(93, "Realtek Semiconductor Corporation", lmp: 0x0B12, firmware: "rtl8761bu_fw v0x0999")
        let unknown = dongle(nil, nil, lmp: nil)
        func sel(_ yaml: String) throws -> AgentSelection { try plan(yaml).agents }

        XCTAssertTrue(try sel("{manufacturer: Intel}").matches(intel))
        XCTAssertTrue(try sel("{manufacturer: intel}").matches(intel), "names match without case")
        XCTAssertTrue(try sel("{manufacturer: 2}").matches(intel))
        XCTAssertTrue(try sel("{manufacturer: 0x0002}").matches(intel))
        XCTAssertFalse(try sel("{manufacturer: Intel}").matches(realtek))
        XCTAssertTrue(try sel("{manufacturer: Realtek}").matches(realtek), "the first word of the full name")
        XCTAssertFalse(try sel("{manufacturer: Real}").matches(realtek), "not any prefix")
        XCTAssertTrue(try sel("{manufacturer: [Intel, 93]}").matches(realtek))
        XCTAssertFalse(try sel("{manufacturer: Intel}").matches(unknown), "a dongle of unknown make matches no maker")

        XCTAssertTrue(try sel("{firmware: 8870}").matches(intel))
        XCTAssertTrue(try sel("{firmware: 0x22A6}").matches(intel))
        XCTAssertFalse(try sel("{firmware: 8871}").matches(intel))
        XCTAssertTrue(try sel("{firmware: \"RTL8761BU_FW v0x0999\"}").matches(realtek), "the driver's text, without case")
        XCTAssertTrue(try sel("{firmware: 0x0b12}").matches(realtek))
        XCTAssertFalse(try sel("{firmware: 8870}").matches(unknown))
        XCTAssertTrue(try sel("{manufacturer: Intel, firmware: 8870}").matches(intel))
        XCTAssertFalse(try sel("{manufacturer: Intel, firmware: 1}").matches(intel), "every criterion must hold")
        XCTAssertTrue(try sel("{count: 3}").matches(unknown), "no criteria: every dongle")
        XCTAssertEqual(intel.firmwareText, "LMP 9.8870 (0x22a6)")
        XCTAssertEqual(realtek.firmwareText, "LMP 9.2834 (0xb12), rtl8761bu_fw v0x0999")
    }

    func testPreflightBeaconsRoundTrip() {
        let data = LabWire.preflightData(0xDEADBEEF)
        XCTAssertEqual([UInt8](data), Array("HLpf".utf8) + [0xDE, 0xAD, 0xBE, 0xEF])
        XCTAssertEqual(LabWire.preflightBeacon(data), 0xDEADBEEF)
        XCTAssertNil(LabWire.preflightBeacon(Data([1, 2, 3])))
        XCTAssertNil(LabWire.preflightBeacon(Data(Array("HLpx".utf8) + [0, 0, 0, 1])))
        XCTAssertEqual(LabWire.normalisedAddress("f0:00:00:00:00:0a"), "F0:00:00:00:00:0A")
        XCTAssertNil(LabWire.normalisedAddress("f0:00:00:00:00"))
        XCTAssertNil(LabWire.normalisedAddress("hci0"))
    }

    func testTheShippedDonglePlanParses() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let p = try Plan.load(path: root.appendingPathComponent("plans/dongles-5.yaml").path)
        XCTAssertEqual(p.nodes.count, 5)
        XCTAssertEqual(p.radio.kind, .bluez)
        XCTAssertEqual(p.agents.count, 5)
        XCTAssertEqual(p.agents.spares, 1)
        XCTAssertEqual(p.agents.preflight, 45)
    }

    func testWhatAgentsSayOfTheirDonglesIsSanitised() {
        var d = LabWire.DongleInfo(id: "f0:00:00:00:00:01", name: "../../etc", present: true)
        d.host = "host\nforged: line"
        d.agent = "someone-else"
        d.adapter = "hci0; rm -rf /"
        d.problem = "bad\u{1B}[31m thing" + String(repeating: "x", count: 2000)
        d.manufacturer = 70_000
        d.manufacturerName = "Intel\u{202E}"
        d.hciVersion = -1
        d.lmpSubversion = 8870
        d.usb = LabWire.USBInfo(vendor: "0A12", product: "zzzz", port: "1-1.2")
        d.tags = ["ok", "not ok"]
        let s = d.sanitised(agent: "a1")
        XCTAssertEqual(s.id, "F0:00:00:00:00:01")
        XCTAssertEqual(s.name, "a1", "a name that is not a name becomes the agent's")
        XCTAssertNil(s.host)
        XCTAssertEqual(s.agent, "a1", "the agent is who called, not who it says")
        XCTAssertNil(s.adapter)
        XCTAssertEqual(s.problem?.count, 500)
        XCTAssertTrue(s.problem?.hasPrefix("bad[31m thing") == true, s.problem ?? "")
        XCTAssertNil(s.manufacturer)
        XCTAssertEqual(s.manufacturerName, "Intel")
        XCTAssertNil(s.hciVersion)
        XCTAssertEqual(s.lmpSubversion, 8870)
        XCTAssertNil(s.usb, "an impossible product id: no USB identity")
        XCTAssertEqual(s.tags, ["ok"])
        var r = LabWire.PreflightReport(id: "c", agent: "liar")
        r.seen = (0..<5000).map { LabWire.PreflightReport.Sighting(beacon: UInt32($0), after: $0 == 0 ? .nan : 1, rssi: nil) }
        r.elapsed = .infinity
        let clean = r.sanitised(agent: "a1")
        XCTAssertEqual(clean.agent, "a1")
        XCTAssertEqual(clean.seen.count, 1000)
        XCTAssertEqual(clean.elapsed, 0)
    }

    func testDecodedPlansAreRangeChecked() throws {
        var p = try plan("{count: 3}")
        p.agents.spares = -3
        p.agents.preflight = .infinity
        XCTAssertTrue(p.rangeProblems.contains { $0.hasPrefix("agents.spares") }, "\(p.rangeProblems)")
        XCTAssertTrue(p.rangeProblems.contains { $0.hasPrefix("agents.preflight") }, "\(p.rangeProblems)")
    }
}
