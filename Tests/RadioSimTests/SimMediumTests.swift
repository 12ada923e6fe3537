import XCTest
import HeraldCore
import HeraldRadio
@testable import RadioSim

/// Collects what a simulated radio delivers.
final class Listener: BLETransportDelegate {
    var reports: [ScanReport] = []
    var states: [RadioState] = []
    var disconnects: [RadioAddress] = []
    func transport(didUpdateState state: RadioState) { states.append(state) }
    func transport(didReceive report: ScanReport) { reports.append(report) }
    func transport(didDisconnect address: RadioAddress) { disconnects.append(address) }
}

/// A GATT server holding one value, recording the offsets it was read at.
final class ValueServer: GATTServerDelegate {
    var value: Data
    var offsets: [Int] = []
    var writes: [Data] = []
    var disconnected: [RadioAddress] = []
    init(_ value: Data) { self.value = value }
    func gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress) -> Result<Data, ATTError> {
        offsets.append(offset)
        guard offset <= value.count else { return .failure(.invalidOffset) }
        return .success(Data(value.dropFirst(offset)))
    }
    func gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress) -> Result<Void, ATTError> {
        writes.append(value)
        return .success(())
    }
    func gattCentralDisconnected(_ central: RadioAddress) { disconnected.append(central) }
}

final class SimMediumTests: XCTestCase {
    let start = Date(timeIntervalSince1970: 1_767_225_600)
    let service = GATTService(uuid: HeraldUUIDs.service, characteristics: [
        GATTCharacteristic(uuid: HeraldUUIDs.payloadCharacteristic, properties: [.read]),
        GATTCharacteristic(uuid: HeraldUUIDs.androidSignalCharacteristic, properties: [.write]),
    ])

    /// Two nodes `distance` apart; `a` advertises, `b` scans for `seconds`.
    func listen(distance: Double, seconds: TimeInterval, parameters: RadioParameters = RadioParameters(), seed: UInt64 = 1, interval: TimeInterval = 0.1) -> (SimMedium, Listener, SimTransport, SimTransport) {
        let scheduler = VirtualScheduler(start: start)
        let medium = SimMedium(scheduler: scheduler, parameters: parameters, seed: seed)
        let a = medium.addNode(name: "a", x: 0, y: 0), b = medium.addNode(name: "b", x: distance, y: 0)
        let listener = Listener()
        b.delegate = listener
        a.powerOn { _ in }; b.powerOn { _ in }
        scheduler.run(until: start)
        a.startAdvertising(Advertisement(serviceUUIDs: [HeraldUUIDs.service], manufacturerData: [0x05F1: Data([1, 2, 3, 4, 5, 6])], txPower: 0, interval: interval)) { _ in }
        b.startScanning(filter: ScanFilter()) { _ in }
        scheduler.run(until: start.addingTimeInterval(seconds))
        return (medium, listener, a, b)
    }

    func testModelFollowsLogDistance() {
        let m = PropagationModel(parameters: RadioParameters())
        XCTAssertEqual(m.meanRSSI(distance: 1), -59, accuracy: 1e-9)
        XCTAssertEqual(m.meanRSSI(distance: 10), -79, accuracy: 1e-9)
        XCTAssertEqual(m.meanRSSI(distance: 0), m.meanRSSI(distance: 0.1))
        XCTAssertEqual(m.range(txPower: 0), pow(10, 41.0 / 20), accuracy: 1e-6)
    }

    func testRSSIMatchesTheModelWithinNoiseAndFallsWithDistance() {
        let (_, near, _, _) = listen(distance: 1, seconds: 60)
        let (_, far, _, _) = listen(distance: 8, seconds: 60)
        let meanNear = Double(near.reports.map(\.rssi).reduce(0, +)) / Double(near.reports.count)
        let meanFar = Double(far.reports.map(\.rssi).reduce(0, +)) / Double(far.reports.count)
        XCTAssertEqual(meanNear, -59, accuracy: 1)
        XCTAssertEqual(meanFar, -59 - 20 * log10(8), accuracy: 1)
        let rssi = near.reports.map { Double($0.rssi) }
        let sd = (rssi.map { ($0 - meanNear) * ($0 - meanNear) }.reduce(0, +) / Double(rssi.count - 1)).squareRoot()
        XCTAssertEqual(sd, 4, accuracy: 0.6, "shadowing sigma")
        XCTAssertEqual(near.reports.first?.manufacturerData[0x05F1], Data([1, 2, 3, 4, 5, 6]))
        XCTAssertEqual(near.reports.first?.serviceUUIDs, [HeraldUUIDs.service])
        XCTAssertNil(near.reports.first?.txPower, "TX power only when the advert includes it")
    }

    func testReportRateIsIntervalTimesLoss() {
        var p = RadioParameters()
        p.reportLoss = 0.25
        let (_, l, _, _) = listen(distance: 1, seconds: 600, parameters: p, interval: 0.25)
        // 600 s / (0.25 s + 5 ms mean advertising delay) x 0.75 kept
        let expected = 600 / 0.255 * 0.75
        XCTAssertEqual(Double(l.reports.count), expected, accuracy: expected * 0.03)
    }

    func testNothingWhileNotScanningOutOfRangeOrOff() {
        let (medium, l, a, b) = listen(distance: 1, seconds: 10)
        let n = l.reports.count
        XCTAssertGreaterThan(n, 50)
        b.stopScanning { _ in }
        medium.scheduler.execute {}
        (medium.scheduler as! VirtualScheduler).advance(by: 10)
        XCTAssertEqual(l.reports.count, n, "no reports while not scanning")
        b.startScanning(filter: ScanFilter()) { _ in }
        medium.schedulePower(node: a.index, off: 0, on: nil)
        (medium.scheduler as! VirtualScheduler).advance(by: 10)
        XCTAssertEqual(l.reports.count, n, "no reports from a node that is off")
        let (_, far, _, _) = listen(distance: 2000, seconds: 10)
        XCTAssertTrue(far.reports.isEmpty, "beyond sensitivity")
    }

    func testConnectDiscoverLongReadAndWrite() {
        let scheduler = VirtualScheduler(start: start)
        var p = RadioParameters()
        p.connectSuccess = 1
        let medium = SimMedium(scheduler: scheduler, parameters: p, seed: 3)
        let a = medium.addNode(name: "a", x: 0, y: 0), b = medium.addNode(name: "b", x: 1, y: 0)
        let value = Data((0..<129).map { UInt8($0) })
        let server = ValueServer(value)
        a.powerOn { _ in }; b.powerOn { _ in }
        scheduler.run(until: start)
        a.register(service: service, server: server) { _ in }
        var read: Data?, services: [GATTService]?, wrote = false
        b.connect(a.address, timeout: 8) { r in
            XCTAssertNotNil(try? r.get())
            b.discoverServices(a.address) { services = try? $0.get() }
            b.read(a.address, service: HeraldUUIDs.service, characteristic: HeraldUUIDs.payloadCharacteristic) { read = try? $0.get() }
            b.write(a.address, service: HeraldUUIDs.service, characteristic: HeraldUUIDs.androidSignalCharacteristic, value: Data([2, 0xC4, 0xFF]), withResponse: true) { wrote = (try? $0.get()) != nil }
        }
        scheduler.advance(by: 2)
        XCTAssertEqual(read, value)
        XCTAssertEqual(server.offsets, [0, 22, 44, 66, 88, 110], "long read at growing offsets, ending on a short chunk")
        XCTAssertEqual(services?.first?.uuid, HeraldUUIDs.service)
        XCTAssertTrue(wrote)
        XCTAssertEqual(server.writes, [Data([2, 0xC4, 0xFF])])
        b.disconnect(a.address) { _ in }
        var afterDisconnect: Result<Data, TransportError>?
        b.read(a.address, service: HeraldUUIDs.service, characteristic: HeraldUUIDs.payloadCharacteristic) { afterDisconnect = $0 }
        scheduler.advance(by: 1)
        XCTAssertEqual(afterDisconnect.map { if case .failure(.notConnected) = $0 { return true } else { return false } }, true)
        XCTAssertEqual(server.disconnected, [b.address])
    }

    func testConnectFailuresAreTypedAndBounded() {
        let scheduler = VirtualScheduler(start: start)
        var p = RadioParameters()
        p.connectSuccess = 0.5
        let medium = SimMedium(scheduler: scheduler, parameters: p, seed: 5)
        let a = medium.addNode(name: "a", x: 0, y: 0), b = medium.addNode(name: "b", x: 1, y: 0)
        a.powerOn { _ in }; b.powerOn { _ in }
        scheduler.run(until: start)
        var outcomes = [Bool]()
        for i in 0..<200 {
            scheduler.schedule(after: Double(i)) {
                b.connect(a.address, timeout: 8) { r in
                    outcomes.append((try? r.get()) != nil)
                    b.disconnect(a.address) { _ in }
                }
            }
        }
        scheduler.advance(by: 300)
        XCTAssertEqual(outcomes.count, 200)
        XCTAssertEqual(Double(outcomes.filter { $0 }.count), 100, accuracy: 25)
        var unknown: Result<Void, TransportError>?
        b.connect("C0:FF:EE:00:00:01", timeout: 8) { unknown = $0 }
        medium.schedulePower(node: a.index, off: 0, on: nil)
        var toOff: Result<Void, TransportError>?
        let sent = scheduler.now
        var at: Date?
        scheduler.execute { b.connect(a.address, timeout: 3) { toOff = $0; at = scheduler.now } }
        scheduler.advance(by: 10)
        if case .failure(.deviceNotFound(let addr)) = unknown { XCTAssertEqual(addr, "C0:FF:EE:00:00:01") } else { XCTFail("unknown address: \(String(describing: unknown))") }
        if case .failure(.timeout) = toOff {} else { XCTFail("connect to a node that is off times out: \(String(describing: toOff))") }
        XCTAssertEqual(at!.timeIntervalSince(sent), 3, accuracy: 0.001, "ends at its timeout")
    }

    func testMACRotationChangesAddressAndDropsLinks() {
        let scheduler = VirtualScheduler(start: start)
        var p = RadioParameters()
        p.macRotation = 30
        p.connectSuccess = 1
        let medium = SimMedium(scheduler: scheduler, parameters: p, seed: 2)
        let a = medium.addNode(name: "a", x: 0, y: 0), b = medium.addNode(name: "b", x: 1, y: 0)
        let listener = Listener()
        b.delegate = listener
        a.powerOn { _ in }; b.powerOn { _ in }
        scheduler.run(until: start)
        a.startAdvertising(Advertisement(serviceUUIDs: [HeraldUUIDs.service], interval: 0.5)) { _ in }
        b.startScanning(filter: ScanFilter()) { _ in }
        scheduler.advance(by: 31)
        let first = a.address
        b.connect(first, timeout: 8) { _ in }
        scheduler.advance(by: 60)
        XCTAssertNotEqual(a.address, first)
        XCTAssertTrue(listener.disconnects.contains(first), "the link to the old MAC dropped")
        XCTAssertGreaterThanOrEqual(Set(listener.reports.map(\.address)).count, 3, "reports under each MAC")
    }

    func testSameSeedSameReports() {
        func run(_ seed: UInt64) -> [String] { listen(distance: 3, seconds: 30, seed: seed).1.reports.map { "\($0.address) \($0.rssi)" } }
        XCTAssertEqual(run(7), run(7))
        XCTAssertNotEqual(run(7), run(8))
    }

    func testPowerCycleReportsStates() {
        let (medium, _, a, _) = listen(distance: 1, seconds: 1)
        let l = Listener()
        a.delegate = l
        medium.schedulePower(node: a.index, off: 1, on: 5)
        (medium.scheduler as! VirtualScheduler).advance(by: 10)
        XCTAssertEqual(l.states, [.poweredOff, .poweredOn])
        var r: Result<Void, TransportError>?
        medium.schedulePower(node: a.index, off: 0, on: nil)
        (medium.scheduler as! VirtualScheduler).advance(by: 1)
        a.startScanning(filter: ScanFilter()) { r = $0 }
        (medium.scheduler as! VirtualScheduler).advance(by: 1)
        if case .failure(.adapterUnavailable) = r {} else { XCTFail("operations on a node that is off fail with adapterUnavailable") }
    }
}
