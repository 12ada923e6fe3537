// An agent with radio bluez against the simulated bluetoothd: what it says of its dongle, and a
// node whose dongle is not there, which must never be `complete`.
import BlueZRadio
import DBus
import DBusTestSupport
import Foundation
import HeraldCore
import LabTestSupport
@testable import LabAgent
import LabPlan
import XCTest

final class AgentDongleTests: XCTestCase, @unchecked Sendable {
    var bus: PrivateBus!
    var fake: Process?
    var data: URL!

    override func setUp() async throws {
        guard pythonHasModule("dbus_fast") else { throw XCTSkip("python3 -m pip install dbus-fast (the simulated bluetoothd) is not installed") }
        bus = try await PrivateBus.start()
        let control = try await DBusConnection.connect(address: bus.address)
        let owner = try await control.signals(matching: DBusMatchRule(interface: "org.freedesktop.DBus", member: "NameOwnerChanged", args: [0: "org.heraldlab.Fake"]))
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("fake_bluetoothd.py")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["python3", script.path, bus.address, FixedPayloadSupplier(identifier: 4242).payloadData.data.map { String(format: "%02x", $0) }.joined(), "-60"]
        try p.run()
        fake = p
        try await withTimeout(30, "simulated bluetoothd start") {
            for await s in owner where s.arguments.count == 3 && s.arguments[2] != .string("") { return }
        }
        await control.close()
        // The agent talks to "the system bus": this test's.
        setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address, 1)
        data = bus.directory.appendingPathComponent("agent")
    }

    override func tearDown() async throws {
        unsetenv("DBUS_SYSTEM_BUS_ADDRESS")
        if let fake, fake.isRunning { fake.terminate() }
        bus?.stop()
    }

    func agent(adapter: String) async throws -> Agent {
        var config = Agent.Config(name: "a1", dataDirectory: data)
        config.radio = .bluez
        config.adapter = adapter
        config.insecure = true
        config.dongleName = "hub1-p3"
        config.hostName = "pi4a"
        config.sysfsRoot = bus.directory.path // no sysfs: no USB identity
        let a = Agent(config: config, logger: LogCapture.quiet())
        _ = try await a.start()
        return a
    }

    func testTheAgentDescribesItsDongleByAddress() async throws {
        let a = try await agent(adapter: "aa:bb:cc:dd:ee:00")
        defer { Task { await a.stop() } }
        let d = try XCTUnwrap(a.info.dongle)
        XCTAssertEqual(d.id, "AA:BB:CC:DD:EE:00")
        XCTAssertEqual(d.name, "hub1-p3")
        XCTAssertEqual(d.host, "pi4a")
        XCTAssertEqual(d.agent, "a1")
        XCTAssertEqual(d.adapter, "hci0")
        XCTAssertTrue(d.present)
        XCTAssertEqual(a.status.dongle, d, "heartbeats carry it too")
    }

    /// The dongle is missing for the whole run: the node logs nothing as if it worked; its logs
    /// have a gap from its start to its end and it says why, so it is never `complete`.
    func testANodeWithoutAWorkingDongleHasAGapToTheEnd() async throws {
        let a = try await agent(adapter: "F0:00:00:00:00:09")
        defer { Task { await a.stop() } }
        let d = try XCTUnwrap(a.info.dongle)
        XCTAssertFalse(d.present)
        XCTAssertEqual(d.id, "F0:00:00:00:00:09", "known by the address it was given")
        XCTAssertTrue(d.problem?.hasPrefix("adapter F0:00:00:00:00:09 is not on this host") == true, d.problem ?? "")
        let plan = try Plan.parse(yaml: "name: p\nduration: 3s\nnodes: [n1, n2]\nradio: {kind: bluez}\n")
        let assignment = NodeAssignment(runId: "r1", plan: plan, node: plan.nodes[0])
        try a.scheduler.sync { try a.lifecycle.arm(LabWire.ArmRequest(assignment: assignment, air: nil)) }
        try a.scheduler.sync { try a.lifecycle.schedule(LabWire.StartRequest(runId: "r1", startAt: Date().timeIntervalSince1970 + 1.6)) }
        try await withTimeout(30, "the run's end") {
            while a.status.state != .finished { try await Task.sleep(for: .milliseconds(100)) }
        }
        let list = try a.scheduler.sync { try a.lifecycle.fileList("r1") }
        let gap = try XCTUnwrap(list.gaps?.first, "a gap")
        XCTAssertTrue(gap.reason.hasPrefix("no working dongle: "), gap.reason)
        XCTAssertTrue(gap.reason.contains("no adapter F0:00:00:00:00:09"), gap.reason)
        let started = try XCTUnwrap(list.startedAt)
        XCTAssertEqual(gap.from, started, accuracy: 0.001, "from the node's start")
        XCTAssertGreaterThanOrEqual(gap.to, started + 2.9, "to its end")
        XCTAssertTrue(a.status.message?.hasPrefix("the node's dongle never worked during the run") == true, a.status.message ?? "")
        let log = try String(contentsOf: data.appendingPathComponent("runs/r1/node/log.txt"), encoding: .utf8)
        XCTAssertTrue(log.contains("node had no working dongle for the whole run"), log)
    }
}
