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

    func makeSensor(seed: UInt64 = 1, _ configure: (inout BLESensorSettings) -> Void = { _ in }) {
        scheduler = VirtualScheduler(start: start)
        transport = ScriptedTransport(scheduler: scheduler)
        recorder = EventRecorder()
        var settings = BLESensorSettings()
        configure(&settings)
        sensor = BLESensor(transport: transport, payloadDataSupplier: own, settings: settings, random: SeededGenerator(seed: seed))
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

    func testDeviceWithoutHeraldServiceIsIgnoredWithGrowingBackoff() {
        makeSensor()
        // An Apple device that is not a Herald phone (a Mac): Apple data, no Herald service on connect.
        transport.peers[A] = ScriptedTransport.Peer(services: [GATTService(uuid: BluetoothUUID(0x180F), characteristics: [])])
        at(1) { transport.advert(from: A, rssi: -40, herald: false, apple: true) }
        XCTAssertEqual(recorder.events.suffix(2), ["detect C0:00:00:00:00:0A", "measure C0:00:00:00:00:0A RSSI:-40.0"])
        at(6) // scan ends at 4.05: connect and discover (0.05 s each), then ignored for a minute
        XCTAssertEqual(sensor.devices[0].ignoreUntil!.timeIntervalSince(start), 64.15, accuracy: 0.01)
        at(8) { transport.advert(from: A, rssi: -40, herald: false, apple: true) }
        at(60)
        XCTAssertEqual(events(matching: "measure").count, 1, "not measured while ignored")
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("connect") }.count, 1)
        at(66) { transport.advert(from: A, rssi: -40, herald: false, apple: true) }
        XCTAssertEqual(events(matching: "measure").count, 2, "measured again once the minute is over")
        at(68) // tried again at 67.05, ignored for 1 minute x 1.2
        XCTAssertEqual(sensor.devices[0].ignoreUntil!.timeIntervalSince(start), 67.15 + 72, accuracy: 0.01)
    }

    /// A node that advertises the Herald service but does not serve it yet (its GATT application
    /// is still being registered) is a failed attempt, read in a later cycle, not ignored.
    func testAPeerAdvertisingHeraldButNotServingItYetIsTriedAgainNotIgnored() {
        makeSensor()
        transport.peers[A] = ScriptedTransport.Peer(services: [GATTService(uuid: BluetoothUUID(0x180F), characteristics: [])])
        at(1) { transport.advert(from: A, rssi: -40) }
        at(6)
        XCTAssertNil(sensor.devices[0].ignoreUntil, "not ignored")
        XCTAssertEqual(events(matching: "read").count, 0)
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(15) { transport.advert(from: A, rssi: -41) }  // in the scan of 14-18
        at(20)
        XCTAssertEqual(events(matching: "read").count, 1, "read once it serves the service")
        XCTAssertEqual(transport.calls.filter { $0.hasPrefix("connect") }.count, 2)
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

    func testAPeerWhoseWritesKeepFailingDoesNotKeepAnUnreadPeerWaiting() {
        makeSensor()
        // B, an iPhone, is read first; then it stops accepting connections, so the payload write
        // it is owed fails every cycle after the full connection timeout (longer than a cycle).
        transport.peers[B] = ScriptedTransport.iosPeer(payload: FixedPayloadSupplier(identifier: 42).payloadData)
        at(1) { transport.advert(from: B, rssi: -45, apple: true) }
        at(7)
        XCTAssertEqual(events(matching: "read").count, 1)
        transport.peers[B]!.connectable = false
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        for t in stride(from: 8.0, to: 40, by: 2) { at(t) { transport.advert(from: B, rssi: -45, apple: true); transport.advert(from: A, rssi: -50) } }
        at(40)
        XCTAssertEqual(events(matching: "read C0:00:00:00:00:0A").count, 1, "A, never read, goes before B's failing write")
    }

    func testAPeerThatCannotBeReadDoesNotKeepTheOthersWaiting() {
        makeSensor()
        // B is heard first and never accepts a connection; its read fails every cycle after the
        // full connection timeout (longer than a cycle). A, heard after it, is read all the same.
        var b = ScriptedTransport.heraldPeer(payload: FixedPayloadSupplier(identifier: 42).payloadData)
        b.connectable = false
        transport.peers[B] = b
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: B, rssi: -45) }
        for t in stride(from: 2.0, to: 40, by: 2) { at(t) { transport.advert(from: B, rssi: -45); transport.advert(from: A, rssi: -50) } }
        at(40)
        XCTAssertEqual(events(matching: "read C0:00:00:00:00:0A").count, 1, "A is read although B, ahead of it, keeps failing")
        XCTAssertGreaterThanOrEqual(transport.calls.filter { $0.hasPrefix("connect C0:00:00:00:00:0B") }.count, 2, "B is still tried")
    }

    func testConnectionsStartAtOnceByDefaultAndSpreadWhenAsked() {
        // Herald (spread 0): the read starts as the scan ends, 4 s after start (and the
        // transport's 50 ms).
        makeSensor()
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -50) }
        at(7)
        XCTAssertEqual(transport.connectTimes.count, 1)
        let atOnce = transport.connectTimes.first ?? 0
        XCTAssertTrue(atOnce >= 4 && atOnce < 4.1, "\(atOnce)")
        // Lab nodes (spread 2 s): later by a delay below 2 s drawn from the node's own generator,
        // so nodes started in step do not initiate to each other at the same instant.
        var delays: [TimeInterval] = []
        for seed: UInt64 in [1, 2, 3] {
            makeSensor(seed: seed) { $0.connectionSpread = 2 }
            transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
            at(1) { transport.advert(from: A, rssi: -50) }
            at(3.9)
            XCTAssertTrue(transport.connectTimes.isEmpty)
            at(7)
            XCTAssertEqual(transport.connectTimes.count, 1, "seed \(seed)")
            let delay = (transport.connectTimes.first ?? 0) - atOnce
            XCTAssertTrue(delay >= 0 && delay < 2, "seed \(seed): delay \(delay)")
            XCTAssertEqual(sensor.devices.first?.payload, peerPayload, "seed \(seed): read after the delay")
            delays.append(delay)
        }
        XCTAssertEqual(Set(delays).count, 3, "each node draws its own delay: \(delays)")
        // Stopped during the delay: no connection.
        makeSensor { $0.connectionSpread = 2 }
        transport.peers[A] = ScriptedTransport.heraldPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -50) }
        at(atOnce + 0.0001) { sensor.stop() }
        at(7)
        XCTAssertGreaterThan(delays[0], 0.0001)
        XCTAssertEqual(transport.connectTimes, [], "no connection after stop")
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

    // MARK: Scan filter (Herald's Android receiver)

    /// The bundles a peer received, reassembled from its 20-byte writes.
    func bundles(writtenTo address: RadioAddress) -> [SignalBundle] {
        var r = SignalReassembler<Int>()
        var out = [SignalBundle]()
        for w in transport.peers[address]?.writes ?? [] {
            if case .bundle(let b) = r.append(w, from: 0) { out.append(b) }
        }
        return out
    }

    func testScanFilterAdmitsOnlyHeraldServiceAppleDataOrPseudoAddress() {
        makeSensor()
        var g = SeededGenerator(seed: 3)
        let pseudo = PseudoDeviceAddress(using: &g)
        let headset: RadioAddress = "C0:00:00:00:00:01", eddystone: RadioAddress = "C0:00:00:00:00:02"
        let airpods: RadioAddress = "C0:00:00:00:00:03", emptyOverflow: RadioAddress = "C0:00:00:00:00:04"
        let legacyOnly: RadioAddress = "C0:00:00:00:00:05", handoff: RadioAddress = "C0:00:00:00:00:06"
        let iphoneBackground: RadioAddress = "C0:00:00:00:00:07", pseudoOnly: RadioAddress = "C0:00:00:00:00:08"
        var overflow = Data([0x01]) + Data(repeating: 0, count: 16)
        overflow[3] = 0x40 // one service bit set: an app's service moved to the overflow area
        transport.peers[pseudoOnly] = ScriptedTransport.heraldPeer(payload: peerPayload)
        transport.peers[iphoneBackground] = ScriptedTransport.iosPeer(payload: FixedPayloadSupplier(identifier: 77).payloadData)
        for t in [1.0, 2.0, 3.0] {
            at(t) {
                transport.report(from: headset, rssi: -40, manufacturer: [0x0075: Data([1, 2, 3, 4])])
                transport.report(from: eddystone, rssi: -41, services: [BluetoothUUID(0xFEAA)])
                transport.report(from: airpods, rssi: -42, manufacturer: [ManufacturerID.apple: Data([0x07, 0x19, 0x01, 0x0E, 0x20])])
                transport.report(from: emptyOverflow, rssi: -43, manufacturer: [ManufacturerID.apple: Data([0x01]) + Data(repeating: 0, count: 16)])
                transport.report(from: legacyOnly, rssi: -44, manufacturer: [ManufacturerID.heraldLegacy: Data([1, 2, 3, 4, 5, 6])])
                transport.report(from: handoff, rssi: -45, manufacturer: [ManufacturerID.apple: Data([0x0C, 0x0E, 0x00] + [UInt8](repeating: 7, count: 12))])
                transport.report(from: iphoneBackground, rssi: -46, manufacturer: [ManufacturerID.apple: overflow])
                transport.report(from: pseudoOnly, rssi: -47, manufacturer: [ManufacturerID.herald: pseudo.data])
            }
        }
        XCTAssertEqual(events(matching: "detect"), ["detect \(iphoneBackground)", "detect \(pseudoOnly)"],
                       "headsets, beacons, AirPods, Handoff and empty overflow adverts never enter the database")
        XCTAssertEqual(events(matching: "measure").count, 6)
        XCTAssertEqual(sensor.devices.map(\.address), [iphoneBackground, pseudoOnly])
        XCTAssertEqual(sensor.reportsFiltered, 18)
        at(12)
        XCTAssertEqual(Set(transport.calls.filter { $0.hasPrefix("connect") }), ["connect \(iphoneBackground)", "connect \(pseudoOnly)"])
        XCTAssertEqual(events(matching: "read").count, 2, "both Herald devices are read")
        XCTAssertEqual(sensor.devices[0].os, .ios)
        // The pseudo address follows the device to a new MAC, even under the legacy id.
        at(15) { transport.report(from: "C0:00:00:00:00:09", rssi: -50, manufacturer: [ManufacturerID.heraldLegacy: pseudo.data]) }
        XCTAssertEqual(events(matching: "detect").count, 2)
        XCTAssertEqual(sensor.devices[1].address, "C0:00:00:00:00:09")
    }

    func testAppleAdvertOfAnIgnoredKindIgnoresAnUnconfirmedDeviceButNotAConfirmedIPhone() {
        makeSensor()
        let handoff = [ManufacturerID.apple: Data([0x0C, 0x0E, 0x00] + [UInt8](repeating: 7, count: 12))]
        transport.peers[A] = ScriptedTransport.iosPeer(payload: peerPayload)
        at(1) { transport.advert(from: A, rssi: -45, apple: true) }
        at(6)
        XCTAssertEqual(sensor.devices[0].os, .ios, "confirmed by its signal characteristic")
        at(8) { transport.report(from: A, rssi: -46, manufacturer: handoff) }
        XCTAssertEqual(recorder.events.suffix(2), ["measure \(A) RSSI:-46.0", "measure+ \(A) ZqFdag"], "a confirmed iPhone keeps being measured")
        // An Apple device only guessed to be an iPhone is ignored when it shows a kind that is not.
        at(9) { transport.advert(from: B, rssi: -45, herald: false, apple: true) }
        XCTAssertEqual(sensor.devices[1].os, .iosProbable)
        at(10) { transport.report(from: B, rssi: -47, manufacturer: handoff) }
        XCTAssertNotNil(sensor.devices[1].ignoreUntil)
        XCTAssertFalse(recorder.events.contains("measure \(B) RSSI:-47.0"))
    }

    func testAppleMessagesSplitAsHeraldParsesThem() {
        XCTAssertEqual(AdvertFilter.appleMessages(Data([0x10, 0x02, 0xAA, 0xBB, 0x0C, 0x05, 0x01])), [Data([0x10, 0x02, 0xAA, 0xBB]), Data([0x0C, 0x05, 0x01])])
        XCTAssertEqual(AdvertFilter.appleMessages(Data([0x01, 0x00, 0x10])), [Data([0x01, 0x00, 0x10])], "the overflow area runs to the end")
        let f = AdvertFilter()
        XCTAssertEqual(f.ignoredApplePattern(Data([0x10, 0x05, 0x03, 0x14, 0x00])), "10....14")
        XCTAssertNil(f.ignoredApplePattern(Data([0x10, 0x05, 0x03, 0x18, 0x00])), "a nearby-info message with another action is not refused")
        XCTAssertNil(f.ignoredApplePattern(Data([0x02, 0x15] + [UInt8](repeating: 1, count: 21))), "Herald does not refuse iBeacons")
    }

    // MARK: Receive-only centrals and payload sharing (Herald's Android transmitter)

    func testReceiveOnlyCentralIsSharedWithIOSPeersAndSharedOnlyDevicesAreNot() throws {
        makeSensor()
        at(0.5)
        let signal = HeraldUUIDs.androidSignalCharacteristic
        let central: RadioAddress = "C0:00:00:00:00:0C", rssiOnly: RadioAddress = "C0:00:00:00:00:0D", sharer: RadioAddress = "C0:00:00:00:00:0E"
        let centralPayload = FixedPayloadSupplier(identifier: 4242).payloadData
        let viaSharing = FixedPayloadSupplier(identifier: 99).payloadData
        // A node that cannot advertise connects and writes its payload, then its RSSI.
        for f in SignalBundle.fragments(of: try SignalBundle.writePayload(centralPayload).encoded()) {
            _ = sensor.gattWrite(characteristic: signal, value: f, offset: 0, central: central)
        }
        XCTAssertEqual(recorder.events.suffix(3), ["detect \(central)", "confirm \(central)", "read \(central) \(centralPayload.shortName)"])
        _ = sensor.gattWrite(characteristic: signal, value: try SignalBundle.writeRSSI(-58).encoded(), offset: 0, central: rssiOnly)
        XCTAssertEqual(recorder.events.suffix(2), ["detect \(rssiOnly)", "measure \(rssiOnly) RSSI:-58.0"])
        let c = sensor.devices.first { $0.address == central }!
        XCTAssertTrue(c.receiveOnly)
        XCTAssertEqual(c.os, .android, "a central that writes its payload is taken for Android, as Herald does")
        XCTAssertTrue(sensor.devices.first { $0.address == rssiOnly }!.receiveOnly)
        // Another node shares a payload this node has never read: known only through sharing.
        let sharing = try SignalBundle.payloadSharing(rssi: -61, data: viaSharing.data).encoded()
        for f in SignalBundle.fragments(of: sharing) { _ = sensor.gattWrite(characteristic: signal, value: f, offset: 0, central: sharer) }
        XCTAssertEqual(recorder.events.suffix(2), ["share \(sharer) \(viaSharing.shortName)", "measure \(sharer) RSSI:-61.0"])
        XCTAssertEqual(sensor.devices.last?.os, .shared)
        XCTAssertNil(sensor.devices.last?.address)
        // An iPhone in range: read, own payload written, then the receive-only central's payload shared.
        transport.peers[A] = ScriptedTransport.iosPeer(payload: peerPayload)
        for t in stride(from: 1.0, to: 40, by: 3) {
            at(t) {
                transport.advert(from: A, rssi: -45, apple: true)
                // The centrals keep writing, as they do every 15 s.
                _ = sensor.gattWrite(characteristic: signal, value: try! SignalBundle.writeRSSI(-57).encoded(), offset: 0, central: central)
            }
        }
        at(40)
        XCTAssertFalse(transport.calls.contains("connect \(central)"), "a receive-only central is never connected to")
        XCTAssertFalse(transport.calls.contains("connect \(rssiOnly)"))
        let written = bundles(writtenTo: A)
        XCTAssertEqual(written.first, .writePayload(own.payloadData))
        let shared = written.compactMap { b -> [PayloadData]? in
            if case .payloadSharing(_, let data) = b { return own.payload(data) } else { return nil }
        }
        XCTAssertFalse(shared.isEmpty, "payload sharing to the iPhone")
        for list in shared {
            XCTAssertEqual(list, [centralPayload], "the receive-only central is shared; the payload known only through sharing is not")
        }
    }

    func testANodeThatWroteWhileItCouldNotAdvertiseIsReadableAgainOnceItAdvertises() throws {
        // A Linux node whose bluetoothd came back before its advertising manager writes its
        // payload and RSSI for a while, from the address it then advertises from again.
        makeSensor()
        at(1)
        let signal = HeraldUUIDs.androidSignalCharacteristic
        let node: RadioAddress = "C0:00:00:00:00:0F"
        let nodePayload = FixedPayloadSupplier(identifier: 4343).payloadData
        for f in SignalBundle.fragments(of: try SignalBundle.writePayload(nodePayload).encoded()) {
            _ = sensor.gattWrite(characteristic: signal, value: f, offset: 0, central: node)
        }
        _ = sensor.gattWrite(characteristic: signal, value: try SignalBundle.writeRSSI(-58).encoded(), offset: 0, central: node)
        let d = try XCTUnwrap(sensor.devices.first { $0.address == node })
        XCTAssertTrue(d.receiveOnly)
        let iPhone = BLEDevice(identifier: "iphone", address: "C0:00:00:00:00:10", now: scheduler.now)
        XCTAssertEqual(sensor.sharingContent(for: iPhone, now: scheduler.now), [nodePayload], "receive-only: shared with iPhones")
        at(2) { transport.advert(from: node, rssi: -54) }
        XCTAssertFalse(d.receiveOnly, "advertising Herald again, it can be read: not receive-only for the rest of the run")
        XCTAssertEqual(sensor.sharingContent(for: iPhone, now: scheduler.now), [], "iPhones read it themselves")
        XCTAssertEqual(recorder.events.last, "measure+ \(node) \(nodePayload.shortName)")
    }

    // MARK: Pseudo address renewal on Bluetooth restart

    func testPseudoAddressIsRenewedWhenTheRadioComesBackOn() {
        makeSensor()
        at(10)
        let first = sensor.pseudoDeviceAddress
        XCTAssertNotNil(first)
        transport.power(false)
        at(20)
        XCTAssertFalse(sensor.isAdvertising)
        transport.power(true)
        at(25)
        XCTAssertTrue(sensor.isAdvertising)
        XCTAssertNotNil(sensor.pseudoDeviceAddress)
        XCTAssertNotEqual(sensor.pseudoDeviceAddress, first, "a new pseudo address after the radio was off")
        XCTAssertEqual(transport.advertisements.last?.manufacturerData[ManufacturerID.herald], sensor.pseudoDeviceAddress?.data)
        // The idle timer starts again from the restart: no second renewal 20 minutes after the first address.
        let second = sensor.pseudoDeviceAddress
        at(20 * 60 + 15)
        XCTAssertEqual(sensor.pseudoDeviceAddress, second)
    }
}
