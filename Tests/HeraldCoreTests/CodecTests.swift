import XCTest
@testable import HeraldCore

final class CodecTests: XCTestCase {
    func testRSSIBundleBytesFromProtocol() throws {
        XCTAssertEqual(try SignalBundle.writeRSSI(-60).encoded(), Data([0x02, 0xC4, 0xFF]))
    }

    func testPayloadBundleHeaderFromProtocol() throws {
        let payload = FixedPayloadSupplier(identifier: 1).payloadData
        let encoded = try SignalBundle.writePayload(payload).encoded()
        XCTAssertEqual(Array(encoded.prefix(3)), [0x01, 0x81, 0x00])
        XCTAssertEqual(encoded.count, 3 + 129)
    }

    func testEveryBundleRoundTrips() throws {
        let bundles: [SignalBundle] = [
            .writePayload(FixedPayloadSupplier(identifier: 5).payloadData),
            .writeRSSI(-127), .writeRSSI(20),
            .payloadSharing(rssi: 127, data: Data()),
            .payloadSharing(rssi: -55, data: FixedPayloadSupplier(identifier: 9).payloadData.data + FixedPayloadSupplier(identifier: 10).payloadData.data),
            .immediateSend(Data([1, 2, 3])), .immediateSend(Data()),
        ]
        for b in bundles {
            XCTAssertEqual(SignalBundle.decode(try b.encoded()), .success(b), "\(b)")
        }
    }

    func testSharingLayout() throws {
        let e = try SignalBundle.payloadSharing(rssi: -2, data: Data([0xAA, 0xBB])).encoded()
        XCTAssertEqual(e, Data([0x03, 0xFE, 0xFF, 0x02, 0x00, 0xAA, 0xBB]))
    }

    func testRejectionsCarryReasons() {
        XCTAssertEqual(SignalBundle.decode(Data([0x09])), .failure(.unknownAction(0x09)))
        if case .failure(.truncated) = SignalBundle.decode(Data([0x02, 0xC4])) {} else { XCTFail("short RSSI") }
        if case .failure(.invalidLength) = SignalBundle.decode(Data([0x02, 0xC4, 0xFF, 0x00])) {} else { XCTFail("long RSSI") }
        if case .failure(.truncated) = SignalBundle.decode(Data([0x01, 0x05, 0x00, 1, 2])) {} else { XCTFail("truncated payload") }
        if case .failure(.invalidLength) = SignalBundle.decode(Data([0x01, 0x01, 0x00, 1, 2])) {} else { XCTFail("trailing bytes") }
        if case .failure(.tooLarge) = SignalBundle.decode(Data([0x01, 0xFF, 0x01])) {} else { XCTFail("511 bytes") }
        if case .failure(.invalidLength) = SignalBundle.decode(Data([0x04, 0xFF, 0xFF])) {} else { XCTFail("negative length") }
        XCTAssertThrowsError(try SignalBundle.writePayload(PayloadData(Data(count: 511))).encoded())
        XCTAssertNoThrow(try SignalBundle.writePayload(PayloadData(Data(count: 510))).encoded())
    }

    func testFragmentsReassemblePerCentral() throws {
        let payload = FixedPayloadSupplier(identifier: 77).payloadData
        let encoded = try SignalBundle.writePayload(payload).encoded()
        let fragments = SignalBundle.fragments(of: encoded, size: 20)
        XCTAssertEqual(fragments.count, 7)
        var r = SignalReassembler<String>()
        // Interleave another central's RSSI write between fragments.
        for (i, f) in fragments.enumerated() {
            let outcome = r.append(f, from: "A")
            if i < fragments.count - 1 { XCTAssertEqual(outcome, .waiting) } else { XCTAssertEqual(outcome, .bundle(.writePayload(payload))) }
            if i == 2 { XCTAssertEqual(r.append(Data([0x02, 0xC4, 0xFF]), from: "B"), .bundle(.writeRSSI(-60))) }
        }
        XCTAssertEqual(r.pendingCount, 0)
    }

    func testReassemblerDropsGarbageAndClearsOnDisconnect() {
        var r = SignalReassembler<String>()
        if case .rejected(.unknownAction(0x7F)) = r.append(Data([0x7F, 0, 0]), from: "A") {} else { XCTFail() }
        XCTAssertEqual(r.append(Data([0x01, 0x81]), from: "A"), .waiting)
        r.clear("A")
        XCTAssertEqual(r.append(Data([0x02, 0xC4, 0xFF]), from: "A"), .bundle(.writeRSSI(-60)))
    }

    func testManufacturerDataParsing() {
        let six: [UInt8] = [1, 2, 3, 4, 5, 6]
        XCTAssertEqual(HeraldManufacturerData.parse([0x05F1: Data(six)]).pseudoDeviceAddress?.bytes, six)
        XCTAssertEqual(HeraldManufacturerData.parse([0xFFFA: Data(six)]).pseudoDeviceAddress?.bytes, six)
        XCTAssertNil(HeraldManufacturerData.parse([0x05F1: Data([1, 2, 3])]).pseudoDeviceAddress, "Android needs exactly 6 bytes")
        XCTAssertNil(HeraldManufacturerData.parse([0x05F1: Data(six + [7])]).pseudoDeviceAddress)
        let apple = HeraldManufacturerData.parse([0x004C: Data([0x01, 0x00])])
        XCTAssertTrue(apple.hasAppleData)
        XCTAssertNil(apple.pseudoDeviceAddress)
        let legacy: [UInt8] = [9, 8, 7, 6, 5, 4]
        XCTAssertEqual(HeraldManufacturerData.parse([0x05F1: Data(six), 0xFFFA: Data(legacy)]).pseudoDeviceAddress?.bytes, six, "0x05F1 wins")
        XCTAssertEqual(HeraldManufacturerData.parse([0x05F1: Data([1]), 0xFFFA: Data(legacy), 0x004C: Data()]),
                       HeraldManufacturerData(pseudoDeviceAddress: PseudoDeviceAddress(bytes: legacy), hasAppleData: true), "a 0x05F1 that is no address falls back to 0xFFFA")
        XCTAssertEqual(PseudoDeviceAddress(data: Data(six)), PseudoDeviceAddress(bytes: six))
        XCTAssertEqual(PseudoDeviceAddress(data: Data([0, 0] + six).dropFirst(2)), PseudoDeviceAddress(bytes: six), "a slice")
        XCTAssertNotEqual(PseudoDeviceAddress(bytes: six), PseudoDeviceAddress(bytes: legacy))
        XCTAssertEqual(PseudoDeviceAddress(bytes: six)?.description, "010203040506")
    }

    func testPseudoAddressFromGeneratorIsSixBytesAndAdvertisedUnder05F1() {
        var g = SeededGenerator(seed: 1)
        let a = PseudoDeviceAddress(using: &g)
        XCTAssertEqual(a.bytes.count, 6)
        XCTAssertEqual(HeraldManufacturerData.advertised(a), [0x05F1: a.data])
    }

    func testRawAdvertisingDataParsing() throws {
        // Flags, 16-bit UUID FCF6, manufacturer data F1 05 + 6 bytes (company id little-endian on air).
        let raw = Data([0x02, 0x01, 0x06, 0x03, 0x03, 0xF6, 0xFC, 0x09, 0xFF, 0xF1, 0x05, 1, 2, 3, 4, 5, 6])
        let parsed = try AdvertisingData.parse(raw).get()
        XCTAssertEqual(parsed.serviceUUIDs, [HeraldUUIDs.service])
        XCTAssertEqual(parsed.manufacturerData[0x05F1], Data([1, 2, 3, 4, 5, 6]))
        if case .failure(.truncated) = AdvertisingData.parse(Data([0x09, 0xFF, 0xF1])) {} else { XCTFail("truncated AD") }
        if case .failure(.invalidLength) = AdvertisingData.parse(Data([0x02, 0xFF, 0xF1])) {} else { XCTFail("no company id") }
    }

    func testUUIDForms() {
        XCTAssertEqual(BluetoothUUID("fcf6"), HeraldUUIDs.service)
        XCTAssertEqual(BluetoothUUID("0000FCF6-0000-1000-8000-00805f9b34fb"), HeraldUUIDs.service)
        XCTAssertEqual(HeraldUUIDs.service.shortValue, 0xFCF6)
        XCTAssertNil(HeraldUUIDs.payloadCharacteristic.shortValue)
        XCTAssertNil(BluetoothUUID("not-a-uuid"))
    }
}

final class SHA256Tests: XCTestCase {
    func testFIPSVectors() {
        XCTAssertEqual(SHA256.hash(Data()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        XCTAssertEqual(SHA256.hash(Data("abc".utf8)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        XCTAssertEqual(SHA256.hash(Data("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)),
                       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        XCTAssertEqual(SHA256.hash(Data(repeating: UInt8(ascii: "a"), count: 1_000_000)),
                       "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    func testStreamingInOddChunksMatchesOneShot() {
        let data = Data((0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        var s = SHA256()
        var i = 0
        for size in [1, 63, 64, 65, 7, 1000, 3] + Array(repeating: 997, count: 20) where i < data.count {
            let end = min(i + size, data.count)
            s.update(data[i..<end])
            i = end
        }
        s.update(data[i...])
        XCTAssertEqual(s.finalizeHex(), SHA256.hash(data))
    }

    func testFileHashMatchesSha256sum() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("sha-\(UUID().uuidString)")
        let data = Data((0..<3_000_001).map { UInt8(truncatingIfNeeded: $0 ^ ($0 >> 8)) })
        try data.write(to: url)
        defer { try? FileManager.default.removeItem(at: url) }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        p.arguments = [url.path]
        let pipe = Pipe()
        p.standardOutput = pipe
        try p.run()
        p.waitUntilExit()
        let expected = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).prefix(64)
        let (hex, bytes) = try SHA256.hash(fileAt: url)
        XCTAssertEqual(hex, String(expected))
        XCTAssertEqual(bytes, 3_000_001)
    }
}
