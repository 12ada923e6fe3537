import XCTest
import HeraldCore
import HeraldRadio
@testable import HeraldSensor

final class BLESensorTests: XCTestCase {
    let start = Date(timeIntervalSince1970: 1_767_225_600)
    var scheduler: VirtualScheduler!
    var transport: ScriptedTransport!
    var recorder: EventRecorder!
    var sensor: BLESensor!
    let own = FixedPayloadSupplier(identifier: 1_253_053_828)
    let peerPayload = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData // ZqFdag
    let A: RadioAddress = "C0:00:00:00:00:0A"
    let B: RadioAddress = "C0:00:00:00:00:0B"

    func makeSensor(_ configure: (inout BLESensorSettings) -> Void = { _ in }) {
        scheduler = VirtualScheduler(start: start)
        transport = ScriptedTransport(scheduler: scheduler)
        recorder = EventRecorder()
        var settings = BLESensorSettings()
        configure(&settings)
        sensor = BLESensor(transport: transport, payloadDataSupplier: own, settings: settings, random: SeededGenerator(seed: 1))
        sensor.add(delegate: recorder)
        sensor.start()
    }

    func at(_ seconds: TimeInterval, _ body: () -> Void = {}) {
        scheduler.run(until: start.addingTimeInterval(seconds))
        body()
    }

    func events(matching prefix: String) -> [String] { recorder.events.filter { $0.hasPrefix(prefix) } }

    func testDetectMeasureReadThenMeasureWithPayload() {
        makeSensor()
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -50) }
        XCTAssertEqual(recorder.events.suffix(2), ["detect C0:00:00:00:00:0A", "measure C0:00:00:00:00:0A RSSI:-50.0"])
        at(6) // scan ends at 4.05; connect, discover, read follow
        XCTAssertEqual(recorder.events.suffix(2), ["confirm C0:00:00:00:00:0A", "read C0:00:00:00:00:0A ZqFdag"])
        at(8) { transport.advert(from: A, rssi: -61, txPower: 7) }
        XCTAssertEqual(recorder.events.suffix(2), ["measure C0:00:00:00:00:0A RSSI:-61.0[BLETransmitPower:7.0]", "measure+ C0:00:00:00:00:0A ZqFdag"])
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("read") }.count, 1, "the payload is read once")
        at(30) { transport.advert(from: A, rssi: -50) }
        at(40)
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("read") }.count, 1, "no second read of a known payload")
    }

    func testAdvertisesHeraldServiceWithPseudoAddressAndServesGATT() {
        makeSensor()
        at(1)
        XCTAssertEqual(transport.calls.prefix(3), ["powerOn", "register", "startAdvertising"])
        let ad = transport.advertisements.last!
        XCTAssertEqual(ad.serviceUUIDs, [HeraldUUIDs.service])
        XCTAssertEqual(ad.manufacturerData[ManufacturerID.herald]?.count, 6)
        XCTAssertEqual(sensor.pseudoDeviceAddress?.data, ad.manufacturerData[ManufacturerID.herald])
        XCTAssertEqual(ad.interval, 0.25)
        XCTAssertTrue(sensor.isAdvertising)
        XCTAssertTrue(events(matching: "state BLE on").count == 1)
    }

    func testMACRotatingPeerStaysOneDeviceThroughItsPseudoAddress() {
        makeSensor()
        var g = SeededGenerator(seed: 9)
        let pseudo = PseudoDeviceAddress(using: &g)
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -50, pseudo: pseudo) }
        at(6)
        XCTAssertEqual(events(matching: "read").count, 1)
        // The peer's MAC changes; its pseudo address does not.
        transport.peers[B] = transport.peers.removeValue(forKey: A)
        at(8) { transport.advert(from: B, rssi: -55, pseudo: pseudo) }
        XCTAssertEqual(events(matching: "detect"), ["detect C0:00:00:00:00:0A"], "no new device for the new MAC")
        XCTAssertEqual(recorder.events.suffix(2), ["measure C0:00:00:00:00:0A RSSI:-55.0", "measure+ C0:00:00:00:00:0A ZqFdag"])
        XCTAssertEqual(sensor.devices.count, 1)
        XCTAssertEqual(sensor.devices[0].address, B)
        at(20)
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("read") }.count, 1, "payload not read again after the MAC change")
    }

    func testSilentPeerIsPurgedAsEvent7() {
        makeSensor { $0.purgeAfter = 60 }
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -50) }
        at(60)
        XCTAssertTrue(events(matching: "delete").isEmpty)
        at(70)
        XCTAssertEqual(events(matching: "delete"), ["delete C0:00:00:00:00:0A"])
        XCTAssertTrue(sensor.devices.isEmpty)
        // It comes back: a new detection.
        at(71) { transport.advert(from: A, rssi: -50) }
        XCTAssertEqual(events(matching: "detect").count, 2)
    }

    func testNonHeraldDeviceIsIgnoredWithGrowingBackoff() {
        makeSensor()
        at(1) { transport.advert(from: A, rssi: -40, herald: false) }
        XCTAssertEqual(recorder.events.suffix(1), ["detect C0:00:00:00:00:0A"])
        at(2) { transport.advert(from: A, rssi: -40, herald: false) }
        at(30)
        XCTAssertTrue(events(matching: "measure").isEmpty)
        XCTAssertFalse(transport.calls.contains { $0.hasPrefix("connect") })
        let first = sensor.devices[0].ignoreUntil!
        XCTAssertEqual(first.timeIntervalSince(start), 61, accuracy: 0.01)
        at(64) { transport.advert(from: A, rssi: -40, herald: false) }
        XCTAssertEqual(sensor.devices[0].ignoreUntil!.timeIntervalSince(start), 64 + 72, accuracy: 0.01, "1 minute x 1.2")
    }

    func testAppleOnlyDeviceIsConnectedToConfirmAndRead() {
        makeSensor()
        transport.peers[A] = ScriptedTransport.iosPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -45, herald: false, apple: true) }
        XCTAssertEqual(sensor.devices[0].os, .iosProbable)
        at(6)
        XCTAssertEqual(events(matching: "read"), ["read C0:00:00:00:00:0A ZqFdag"])
        XCTAssertEqual(sensor.devices[0].os, .ios)
    }

    func testIOSPeerGetsOwnPayloadWrittenOnce() {
        makeSensor()
        transport.peers[A] = ScriptedTransport.iosPeer(payload: peerPayload)
        for t in stride(from: 1.0, to: 60, by: 7) { at(t) { transport.advert(from: A, rssi: -45, apple: true) } }
        at(60)
        let writes = transport.peers[A]!.writes
        let joined = writes.reduce(Data(), +)
        XCTAssertEqual(SignalBundle.decode(joined), .success(.writePayload(own.payloadData)), "one payload write, in 20-byte fragments")
        XCTAssertTrue(writes.allSatisfy { $0.count <= 20 })
    }

    func testNodeThatCannotAdvertiseWritesItsPayloadToPeers() {
        scheduler = VirtualScheduler(start: start)
        transport = ScriptedTransport(scheduler: scheduler)
        transport.advertisingFails = true
        recorder = EventRecorder()
        sensor = BLESensor(transport: transport, payloadDataSupplier: own, random: SeededGenerator(seed: 1))
        sensor.add(delegate: recorder)
        sensor.start()
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        for t in stride(from: 1.0, to: 30, by: 7) { at(t) { transport.advert(from: A, rssi: -45) } }
        at(30)
        XCTAssertFalse(sensor.isAdvertising)
        let bundles = transport.peers[A]!.writes.reduce(Data(), +)
        XCTAssertTrue(bundles.starts(with: Data([0x01, 0x81, 0x00])), "payload write first")
        XCTAssertTrue(bundles.dropFirst(132).starts(with: Data([0x02])), "then an RSSI write")
    }

    func testAdvertisingThatFailsForAWhileIsTriedAgain() {
        scheduler = VirtualScheduler(start: start)
        transport = ScriptedTransport(scheduler: scheduler)
        transport.advertisingFailuresLeft = 2
        recorder = EventRecorder()
        sensor = BLESensor(transport: transport, payloadDataSupplier: own, random: SeededGenerator(seed: 1))
        sensor.add(delegate: recorder)
        sensor.start()
        at(5)
        XCTAssertFalse(sensor.isAdvertising)
        at(25)
        XCTAssertTrue(sensor.isAdvertising, "advertising again once the radio lets it")
        XCTAssertEqual(transport.calls.filter { $0 == "startAdvertising" }.count, 3)
    }

    func testConnectTimeoutIsBoundedAndRetriedNextCycle() {
        makeSensor { $0.connectionTimeout = 2 }
        var peer = ScriptedTransport.heraldPeer(payload: peerPayload)
        peer.connectable = false
        transport.peers[A] = peer
        at(1) { transport.advert(from: A, rssi: -50) }
        at(7)
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("connect") }.count, 1)
        XCTAssertEqual(sensor.devices[0].failedConnections, 1)
        transport.peers[A]!.connectable = true
        at(8) { transport.advert(from: A, rssi: -50) }
        at(14)
        XCTAssertEqual(events(matching: "read").count, 1)
    }

    func testGATTServerHonoursReadOffsets() {
        makeSensor()
        at(1)
        let full = own.payloadData.data
        XCTAssertEqual(try sensor.gattRead(characteristic: HeraldUUIDs.payloadCharacteristic, offset: 0, central: B).get(), full)
        XCTAssertEqual(try sensor.gattRead(characteristic: HeraldUUIDs.payloadCharacteristic, offset: 100, central: B).get(), full.dropFirst(100))
        XCTAssertEqual(try sensor.gattRead(characteristic: HeraldUUIDs.payloadCharacteristic, offset: 129, central: B).get(), Data())
        XCTAssertEqual(sensor.gattRead(characteristic: HeraldUUIDs.payloadCharacteristic, offset: 130, central: B), .failure(.invalidOffset))
        XCTAssertEqual(sensor.gattRead(characteristic: HeraldUUIDs.androidSignalCharacteristic, offset: 0, central: B), .failure(.notSupported))
    }

    func testSignalWritesAreReassembledAndActedOn() throws {
        makeSensor()
        at(1)
        let signal = HeraldUUIDs.androidSignalCharacteristic
        for f in SignalBundle.fragments(of: try SignalBundle.writePayload(peerPayload).encoded()) {
            XCTAssertNoThrow(try sensor.gattWrite(characteristic: signal, value: f, offset: 0, central: B).get())
        }
        XCTAssertEqual(recorder.events.suffix(3), ["detect C0:00:00:00:00:0B", "confirm C0:00:00:00:00:0B", "read C0:00:00:00:00:0B ZqFdag"])
        _ = sensor.gattWrite(characteristic: signal, value: try SignalBundle.writeRSSI(-66).encoded(), offset: 0, central: B)
        XCTAssertEqual(recorder.events.suffix(2), ["measure C0:00:00:00:00:0B RSSI:-66.0", "measure+ C0:00:00:00:00:0B ZqFdag"])
        let other = FixedPayloadSupplier(identifier: 5).payloadData
        let sharing = try SignalBundle.payloadSharing(rssi: 127, data: other.data + own.payloadData.data).encoded()
        for f in SignalBundle.fragments(of: sharing) { _ = sensor.gattWrite(characteristic: signal, value: f, offset: 0, central: B) }
        XCTAssertEqual(recorder.events.last, "share C0:00:00:00:00:0B \(other.shortName)", "own payload is not reported as shared")
        // Garbage is answered with success and changes nothing.
        XCTAssertNoThrow(try sensor.gattWrite(characteristic: signal, value: Data([0x09, 0x00]), offset: 0, central: B).get())
        _ = sensor.gattWrite(characteristic: signal, value: try SignalBundle.immediateSend(Data([1, 2])).encoded(), offset: 0, central: B)
        XCTAssertEqual(recorder.events.last, "receive C0:00:00:00:00:0B 2")
    }

    func testPseudoAddressIsRenewedAfterTwentyIdleMinutes() {
        makeSensor()
        at(60)
        let first = sensor.pseudoDeviceAddress
        at(19 * 60)
        XCTAssertEqual(sensor.pseudoDeviceAddress, first)
        at(21 * 60)
        XCTAssertNotEqual(sensor.pseudoDeviceAddress, first)
        XCTAssertEqual(transport.advertisements.count, 2)
        XCTAssertEqual(transport.advertisements.last?.manufacturerData[ManufacturerID.herald], sensor.pseudoDeviceAddress?.data)
    }

    func testStopEndsScanningAndReportsOff() {
        makeSensor()
        at(1)
        sensor.stop()
        XCTAssertEqual(recorder.events.last, "state BLE off")
        let pending = scheduler.pendingCount
        at(100)
        XCTAssertLessThanOrEqual(scheduler.pendingCount, pending)
        transport.scanning = true
        transport.advert(from: A, rssi: -50)
        XCTAssertFalse(recorder.events.contains { $0.hasPrefix("detect") }, "a stopped sensor records nothing")
    }
}
