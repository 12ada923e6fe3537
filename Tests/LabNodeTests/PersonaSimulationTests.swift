import XCTest
import HeraldCore
import HeraldLogs
import HeraldRadio
import LabPlan
import RadioSim
@testable import LabNode

/// Forwards every call to a transport and records what the node did and heard, in order.
final class RecordingTransport: BLETransport, BLETransportDelegate {
    let inner: any BLETransport
    weak var delegate: (any BLETransportDelegate)?
    var state: RadioState { inner.state }
    var scheduler: any Scheduler { inner.scheduler }
    private(set) var calls: [String] = []
    /// Every report's service UUIDs and manufacturer ids, per address.
    private(set) var heard: [RadioAddress: [(services: [BluetoothUUID], manufacturers: [UInt16])]] = [:]

    init(_ inner: any BLETransport) {
        self.inner = inner
        inner.delegate = self
    }

    func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) { inner.powerOn(completion: completion) }
    func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void) {
        inner.register(service: service, server: server, completion: completion)
    }
    func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) { inner.startAdvertising(advertisement, completion: completion) }
    func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) { inner.stopAdvertising(completion: completion) }
    func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) { inner.startScanning(filter: filter, completion: completion) }
    func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) { inner.stopScanning(completion: completion) }
    func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        calls.append("connect \(address)")
        inner.connect(address, timeout: timeout, completion: completion)
    }
    func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        inner.discoverServices(address) { [weak self] result in
            if case .success(let services) = result { self?.calls.append("discovered \(address) \(services.map(\.uuid.description).joined(separator: "+"))") }
            completion(result)
        }
    }
    func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void) {
        calls.append("read \(address)")
        inner.read(address, service: service, characteristic: characteristic, completion: completion)
    }
    func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        calls.append("write \(address) \(characteristic)")
        inner.write(address, service: service, characteristic: characteristic, value: value, withResponse: withResponse, completion: completion)
    }
    func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) { inner.disconnect(address, completion: completion) }

    func transport(didUpdateState state: RadioState) { delegate?.transport(didUpdateState: state) }
    func transport(didReceive report: ScanReport) {
        heard[report.address, default: []].append((report.serviceUUIDs, report.manufacturerData.keys.sorted()))
        delegate?.transport(didReceive: report)
    }
    func transport(didDisconnect address: RadioAddress) { delegate?.transport(didDisconnect: address) }
}

final class PersonaSimulationTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = FileManager.default.temporaryDirectory.appendingPathComponent("persona-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    static let planText = """
    name: personas
    duration: 3m
    nodes:
      - {name: linux, position: [0, 0]}
      - {name: android, persona: android, position: [1m, 0]}
      - {name: iphone-fg, persona: ios-foreground, position: [0, 1m]}
      - {name: iphone-bg, persona: ios-background, position: [1m, 1m]}
    """

    /// contacts.csv rows, split into fields.
    func rows(_ folder: URL) throws -> [[String]] {
        try String(contentsOf: folder.appendingPathComponent("contacts.csv"), encoding: .utf8)
            .split(separator: "\n").dropFirst().map { $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init) }
    }

    struct PairCounts: Equatable { var detect = 0, read = 0, rssi = 0, share = 0 }

    /// Rows an observer logged about the device with `shortName`: through the ids it read that
    /// payload under, as Herald's analysis joins them.
    func counts(_ rows: [[String]], of shortName: String) -> PairCounts {
        let ids = Set(rows.filter { $0[4] == "2" && $0[10] == shortName }.map { $0[2] })
        var c = PairCounts()
        for r in rows where ids.contains(r[2]) {
            if r[3] == "1" { c.detect += 1 }
            if r[4] == "2" { c.read += 1 }
            if r[5] == "3" { c.rssi += 1 }
        }
        c.share = rows.filter { $0[6] == "4" && $0[10] == shortName }.count
        return c
    }

    /// Runs `plan` on a simulated medium in virtual time: its node without a persona as a
    /// NodeRunner over a RecordingTransport (started at 0.1 s), every persona after it (0.1 s
    /// apart), all stopped at the plan's end. Returns the recorder, the runner and each node's address.
    func runWithOneLinuxNode(_ plan: Plan, runId: String, seed: UInt64) -> (RecordingTransport, NodeRunner, [String: RadioAddress]) {
        let scheduler = VirtualScheduler(start: plan.start)
        let medium = SimMedium(scheduler: scheduler, parameters: Simulation.parameters(plan.radio), seed: seed)
        var recorder: RecordingTransport!
        var linux: NodeRunner!
        var others = [SimulatedNode]()
        var addresses = [String: RadioAddress]()
        for spec in plan.nodes {
            let transport = medium.addNode(name: spec.name, x: spec.position.x, y: spec.position.y)
            addresses[spec.name] = transport.address
            let assignment = NodeAssignment(runId: runId, plan: plan, node: spec, seed: seed)
            let dir = tmp.appendingPathComponent(spec.name)
            if spec.persona == nil {
                recorder = RecordingTransport(transport)
                linux = NodeRunner(assignment: assignment, transport: recorder, directory: dir, power: MainsPower(), osVersion: "6.1")
                scheduler.schedule(after: 0.1) { linux.start() }
            } else {
                let node = SimulatedNode(assignment: assignment, transport: transport, directory: dir)
                others.append(node)
                scheduler.schedule(after: 0.2 + 0.1 * Double(others.count)) { node.start() }
            }
        }
        scheduler.run(until: plan.start.addingTimeInterval(plan.duration))
        linux.stop()
        for o in others { o.stop() }
        return (recorder, linux, addresses)
    }

    func testLinuxNodeDetectsReadsAndMeasuresEveryPersonaAndSharesWithTheIPhones() throws {
        let plan = try Plan.parse(yaml: Self.planText)
        let (recorder, linux, addresses) = runWithOneLinuxNode(plan, runId: "personas", seed: 7)

        let name = Dictionary(uniqueKeysWithValues: plan.nodes.map { ($0.name, $0.shortName) })
        let linuxRows = try rows(tmp.appendingPathComponent("linux"))
        for persona in ["android", "iphone-fg", "iphone-bg"] {
            let c = counts(linuxRows, of: name[persona]!)
            XCTAssertEqual(c.detect, 1, "linux detects \(persona) once")
            XCTAssertEqual(c.read, 1, "linux reads \(persona)'s payload once")
            XCTAssertGreaterThan(c.rssi, 40, "linux measures \(persona) (RSSI rows)")
        }
        XCTAssertEqual(linux.status.peers, [name["android"]!, name["iphone-bg"]!, name["iphone-fg"]!].sorted())

        // The background iPhone advertises Apple data and no service: it is read only after its
        // services were discovered on a connection.
        let bg = addresses["iphone-bg"]!
        let bgAdverts = recorder.heard[bg] ?? []
        XCTAssertFalse(bgAdverts.isEmpty)
        XCTAssertTrue(bgAdverts.allSatisfy { $0.services.isEmpty && $0.manufacturers == [ManufacturerID.apple] }, "no Herald service in a background advert")
        let firstDiscovery = recorder.calls.firstIndex { $0.hasPrefix("discovered \(bg)") && $0.contains(HeraldUUIDs.service.description) }
        let firstRead = recorder.calls.firstIndex(of: "read \(bg)")
        XCTAssertNotNil(firstDiscovery)
        XCTAssertNotNil(firstRead)
        XCTAssertLessThan(firstDiscovery!, firstRead!, "discovered, then read")
        XCTAssertEqual(recorder.calls[recorder.calls.index(before: firstDiscovery!)], "connect \(bg)")
        // The foreground iPhone and the Android phone advertise the Herald service.
        XCTAssertTrue((recorder.heard[addresses["iphone-fg"]!] ?? []).allSatisfy { $0.services == [HeraldUUIDs.service] })
        XCTAssertTrue((recorder.heard[addresses["android"]!] ?? []).allSatisfy { $0.services == [HeraldUUIDs.service] && $0.manufacturers == [ManufacturerID.herald] })

        // Payload sharing: the Linux node writes each iPhone the other's payload, never the Android
        // phone's (Android peers find each other), logged by the iPhones as share rows (event 4).
        for (iphone, other) in [("iphone-fg", "iphone-bg"), ("iphone-bg", "iphone-fg")] {
            let r = try rows(tmp.appendingPathComponent(iphone))
            let linuxIds = Set(r.filter { $0[4] == "2" && $0[10] == name["linux"]! }.map { $0[2] })
            let shares = r.filter { $0[6] == "4" }
            XCTAssertTrue(shares.contains { linuxIds.contains($0[2]) && $0[10] == name[other]! }, "linux shares \(other) with \(iphone)")
            XCTAssertFalse(shares.contains { $0[10] == name["android"]! || $0[10] == name["linux"]! }, "only iPhones' payloads are shared")
            XCTAssertTrue(shares.allSatisfy { $0.count == 11 && $0[1] == "BLE" && $0[3].isEmpty && $0[5].isEmpty }, "share rows as Herald logs them")
            let learned = counts(r, of: name[other]!)
            XCTAssertGreaterThanOrEqual(learned.read, 1, "\(iphone) learns \(other)'s payload through sharing")
            XCTAssertGreaterThan(learned.rssi, 0)
            // The iPhone reads the Linux node and the Android phone itself, and hears the Linux node's writes.
            XCTAssertGreaterThanOrEqual(counts(r, of: name["linux"]!).read, 2, "\(iphone): a GATT read and the Linux node's payload write")
            XCTAssertGreaterThanOrEqual(counts(r, of: name["android"]!).read, 1)
            let detection = try String(contentsOf: tmp.appendingPathComponent("\(iphone)/detection.csv"), encoding: .utf8)
            XCTAssertTrue(detection.hasPrefix("\(iphone),iOS,16.0,\(name[iphone]!),"))
        }
        let androidDetection = try String(contentsOf: tmp.appendingPathComponent("android/detection.csv"), encoding: .utf8)
        XCTAssertEqual(androidDetection, "android,Android,33,\(name["android"]!),\([name["iphone-bg"]!, name["iphone-fg"]!, name["linux"]!].sorted().joined(separator: ","))\n")
    }

    /// A receive-only phone (Herald's J6) never advertises; a Linux node still learns its payload
    /// and measures it, from what the phone writes (payload every 5 min, RSSI every 15 s), and
    /// shares its payload with an iPhone; the phone itself measures and reads its peers.
    func testAReceiveOnlyPhoneIsKnownOnlyByWhatItWrites() throws {
        let plan = try Plan.parse(yaml: """
        name: receive-only
        duration: 4m
        nodes:
          - {name: linux, position: [0, 0]}
          - {name: j6, persona: android-receive-only, position: [1m, 0]}
          - {name: iphone-bg, persona: ios-background, position: [0, 1m]}
        """)
        let (recorder, _, addresses) = runWithOneLinuxNode(plan, runId: "receive-only", seed: 11)

        let name = Dictionary(uniqueKeysWithValues: plan.nodes.map { ($0.name, $0.shortName) })
        XCTAssertNil(recorder.heard[addresses["j6"]!], "the receive-only phone is never heard advertising")
        XCTAssertFalse(recorder.calls.contains("connect \(addresses["j6"]!)"), "nobody can connect to what it never heard")
        let linuxRows = try rows(tmp.appendingPathComponent("linux"))
        let j6 = counts(linuxRows, of: name["j6"]!)
        XCTAssertGreaterThanOrEqual(j6.read, 1, "linux learns the phone's payload from its write")
        // 4 minutes of RSSI writes every 15 s: about 15, fewer while the first connection is made.
        XCTAssertGreaterThanOrEqual(j6.rssi, 8, "linux measures the phone through its RSSI writes")
        XCTAssertLessThan(j6.rssi, 40, "no more than its writes: nothing was heard over the air")
        // The phone scans, connects and reads like an Android phone.
        let j6Rows = try rows(tmp.appendingPathComponent("j6"))
        XCTAssertEqual(counts(j6Rows, of: name["linux"]!).read, 1)
        XCTAssertGreaterThan(counts(j6Rows, of: name["linux"]!).rssi, 40)
        let detection = try String(contentsOf: tmp.appendingPathComponent("j6/detection.csv"), encoding: .utf8)
        XCTAssertTrue(detection.hasPrefix("j6,Android,26,\(name["j6"]!),"), detection)
        // The Linux node shares the receive-only phone's payload with the iPhone.
        let iphoneRows = try rows(tmp.appendingPathComponent("iphone-bg"))
        XCTAssertTrue(iphoneRows.contains { $0[6] == "4" && $0[10] == name["j6"]! }, "the iPhone hears of j6 through sharing")
    }

    func testBackgroundIPhonesLearnOfEachOtherOnlyThroughTheLinuxNodesSharing() throws {
        let text = """
        name: two-backgrounds
        duration: 2m
        nodes:
          - {name: linux, position: [0, 0]}
          - {name: bg1, persona: ios-background, position: [1m, 0]}
          - {name: bg2, persona: ios-background, position: [0, 1m]}
        """
        let plan = try Plan.parse(yaml: text)
        let result = try Simulation(plan: plan, planText: text, output: tmp.appendingPathComponent("bg")).run()
        let name = Dictionary(uniqueKeysWithValues: plan.nodes.map { ($0.name, $0.shortName) })
        for (me, other) in [("bg1", "bg2"), ("bg2", "bg1")] {
            let r = try rows(result.bundle.appendingPathComponent("nodes/\(me)"))
            let firstShare = r.first { $0[6] == "4" && $0[10] == name[other]! }
            let firstRead = r.first { $0[4] == "2" && $0[10] == name[other]! }
            XCTAssertNotNil(firstShare, "\(me) is told of \(other)")
            XCTAssertEqual(firstRead?[0], firstShare?[0], "\(me) knows \(other) from the moment it is shared, not before")
            XCTAssertEqual(counts(r, of: name[other]!).read, 1, "one device for the shared payload, read once")
        }
        // Both iPhones are read by the Linux node.
        let linuxRows = try rows(result.bundle.appendingPathComponent("nodes/linux"))
        XCTAssertEqual(counts(linuxRows, of: name["bg1"]!).read, 1)
        XCTAssertEqual(counts(linuxRows, of: name["bg2"]!).read, 1)
    }

    func testForegroundScanFindsBackgroundIPhonesThroughTheOverflowAreaAndBackgroundScanDoesNot() throws {
        let plan = try Plan.parse(yaml: Self.planText)
        let medium = SimMedium(scheduler: VirtualScheduler(start: plan.start), seed: 1)
        func persona(_ mode: IOSPersona.Mode) -> IOSPersona {
            IOSPersona(mode: mode, assignment: NodeAssignment(runId: "r", plan: plan, node: plan.nodes[2]),
                       transport: medium.addNode(name: "\(mode)", x: 0, y: 0), directory: tmp.appendingPathComponent("\(mode)"))
        }
        let fg = persona(.foreground), bg = persona(.background)
        let overflow = ScanReport(address: "C0:00:00:00:00:01", rssi: -50, manufacturerData: bg.advertisement.manufacturerData)
        let service = ScanReport(address: "C0:00:00:00:00:02", rssi: -50, serviceUUIDs: [HeraldUUIDs.service])
        let airpods = ScanReport(address: "C0:00:00:00:00:03", rssi: -50, manufacturerData: [ManufacturerID.apple: Data([0x07, 0x19, 0x01])])
        XCTAssertTrue(fg.scanFinds(overflow))
        XCTAssertFalse(bg.scanFinds(overflow))
        XCTAssertTrue(fg.scanFinds(service) && bg.scanFinds(service))
        XCTAssertFalse(fg.scanFinds(airpods))
        XCTAssertEqual(bg.advertisement.serviceUUIDs, [])
        XCTAssertEqual(fg.advertisement.serviceUUIDs, [HeraldUUIDs.service])
        fg.logs.close()
        bg.logs.close()
    }

    func testPersonaSimulationIsByteIdenticalForASeedAndTheManifestNamesThePhones() throws {
        var plan = try Plan.parse(yaml: Self.planText)
        plan.duration = 60
        let a = try Simulation(plan: plan, planText: Self.planText, seed: 3, output: tmp.appendingPathComponent("a/run")).run()
        let b = try Simulation(plan: plan, planText: Self.planText, seed: 3, output: tmp.appendingPathComponent("b/run")).run()
        XCTAssertEqual(try Data(contentsOf: a.bundle.appendingPathComponent("manifest.json")), try Data(contentsOf: b.bundle.appendingPathComponent("manifest.json")))
        for node in plan.nodes {
            for file in NodeRunner.heraldFiles {
                let x = try Data(contentsOf: a.bundle.appendingPathComponent("nodes/\(node.name)/\(file)"))
                let y = try Data(contentsOf: b.bundle.appendingPathComponent("nodes/\(node.name)/\(file)"))
                XCTAssertEqual(x, y, "\(node.name)/\(file)")
            }
        }
        let m = a.manifest
        XCTAssertEqual(m.nodes.map(\.os), ["Linux", "Android", "iOS", "iOS"])
        XCTAssertEqual(m.nodes.map(\.osVersion), ["6.1", "33", "16.0", "16.0"])
        XCTAssertEqual(m.nodes.map(\.persona), [nil, "android", "ios-foreground", "ios-background"])
    }
}
