import XCTest
@testable import HeraldCore

final class PayloadTests: XCTestCase {
    func testShortNameCheckValuesFromProtocol() {
        XCTAssertEqual(FixedPayloadSupplier(identifier: 1_784_521_062).shortName, "ZqFdag")
        XCTAssertEqual(FixedPayloadSupplier(identifier: -502_964_310).shortName, "ql8F4g")
    }

    func testIdentifierDerivationCheckValues() {
        XCTAssertEqual(TestIdentifier.derive(from: "iPhone:iPhone:iOS:16.0"), 278_411_871)
        XCTAssertEqual(FixedPayloadSupplier(identifier: 278_411_871).shortName, "XzqYEA")
        XCTAssertEqual(TestIdentifier.derive(from: "node1:Linux:Linux:6.1"), 1_253_053_828)
        XCTAssertEqual(FixedPayloadSupplier(deviceText: TestIdentifier.deviceText(nodeName: "node1")).shortName, "hBWwSg")
    }

    func testFixedPayloadLayout() {
        let p = FixedPayloadSupplier(identifier: 0x0102_0304).payloadData
        XCTAssertEqual(p.count, 129)
        XCTAssertEqual(Array(p.data.prefix(7)), [0x00, 0x00, 0x00, 0x04, 0x03, 0x02, 0x01])
        XCTAssertTrue(p.data.dropFirst(7).allSatisfy { $0 == 0 })
    }

    func testShortNameOfShortAndEmptyPayloads() {
        XCTAssertEqual(PayloadData().shortName, "")
        XCTAssertEqual(PayloadData([0x01, 0x02, 0x03]).shortName, Data([1, 2, 3]).base64EncodedString())
        XCTAssertEqual(PayloadData([0, 0, 0, 0xFF]).shortName, "/w==")
    }

    func testShortNameIsTheStartOfBase64OfEveryLength() {
        var g = SeededGenerator(seed: 3, stream: "payloads")
        for length in 0...40 {
            for _ in 0..<20 {
                let bytes = (0..<length).map { _ in UInt8(truncatingIfNeeded: g.next()) }
                let data = Data(bytes)
                let expected = data.isEmpty ? "" : data.count <= 3 ? data.base64EncodedString() : String(data.dropFirst(3).base64EncodedString().prefix(6))
                XCTAssertEqual(PayloadData(data).shortName, expected, "\(bytes)")
                XCTAssertEqual(PayloadData(Data([9, 9] + bytes).dropFirst(2)).shortName, expected, "a slice")
            }
        }
    }

    func testDefaultSplitUsesOwnPayloadLength() {
        let supplier = FixedPayloadSupplier(identifier: 7)
        let a = FixedPayloadSupplier(identifier: 1).payloadData, b = FixedPayloadSupplier(identifier: 2).payloadData
        var data = a.data + b.data
        data.append(contentsOf: [1, 2, 3])
        XCTAssertEqual(supplier.payload(data), [a, b])
    }

    func testHexAndBase64() {
        XCTAssertEqual(PayloadData([0xAB, 0x01]).hexEncodedString, "AB01")
        XCTAssertEqual(Data(hexEncoded: "ab:01"), Data([0xAB, 0x01]))
        XCTAssertNil(Data(hexEncoded: "abc"))
        XCTAssertEqual(PayloadData([0xFF]).base64EncodedString, "/w==")
    }

    func testProximityText() {
        XCTAssertEqual(Proximity.rssi(-47).description, "RSSI:-47.0")
        XCTAssertEqual(Proximity.rssi(-42, txPower: 12).description, "RSSI:-42.0[BLETransmitPower:12.0]")
    }

    func testSeededGeneratorIsReproducibleAndStreamsDiffer() {
        var a = SeededGenerator(seed: 42, stream: "x"), b = SeededGenerator(seed: 42, stream: "x"), c = SeededGenerator(seed: 42, stream: "y")
        let sa = (0..<5).map { _ in a.next() }
        XCTAssertEqual(sa, (0..<5).map { _ in b.next() })
        XCTAssertNotEqual(sa, (0..<5).map { _ in c.next() })
    }

    func testTimestampsFormatAndParse() {
        let d = Date(timeIntervalSince1970: 1_669_760_516.552) // 2022-11-29 22:21:56.552 UTC
        XCTAssertEqual(HeraldTimestamp.utcMillis(d), "2022-11-29 22:21:56.552+0000")
        XCTAssertEqual(HeraldTimestamp.utcSeconds(d), "2022-11-29 22:21:56")
        XCTAssertEqual(HeraldTimestamp.iso8601(d), "2022-11-29T22:21:56.552Z")
        XCTAssertEqual(HeraldTimestamp.parse("2022-11-29 22:21:56.552+0000")!.timeIntervalSince1970, d.timeIntervalSince1970, accuracy: 0.0005)
        XCTAssertEqual(HeraldTimestamp.parse("2022-11-29T23:21:56+01:00")!.timeIntervalSince1970, 1_669_760_516, accuracy: 0.0005)
        XCTAssertNil(HeraldTimestamp.parse("2022-13-29 22:21:56"))
        XCTAssertEqual(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: -1)), "1969-12-31 23:59:59")
    }
}
