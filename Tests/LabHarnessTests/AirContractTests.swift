import Foundation
import XCTest
import HeraldCore
import HeraldRadio
import RadioSim
@testable import RadioAir

/// The air's typed contract (issue 22, item 1): every kind goes out as the same JSON object as
/// the untyped messages did, comes back as the same case, and a line that is not a message of
/// the contract is refused when decoded rather than half-read.
final class AirContractTests: XCTestCase {
    let service = BluetoothUUID("428132af-4746-42d3-801e-4572d65bfd9b")!
    let characteristic = BluetoothUUID("f617b813-092e-437a-8324-e09a80821a11")!
    let address = RadioAddress("AA:BB:CC:DD:EE:01")

    private func object<T: Encodable>(_ value: T) throws -> [String: Any] {
        try XCTUnwrap(JSONSerialization.jsonObject(with: JSONEncoder().encode(value)) as? [String: Any])
    }

    private func roundTrip(_ r: AirRequest) throws -> AirRequest {
        try JSONDecoder().decode(AirRequest.self, from: JSONEncoder().encode(r))
    }

    private func roundTrip(_ a: AirAnswer) throws -> AirAnswer {
        try JSONDecoder().decode(AirAnswer.self, from: JSONEncoder().encode(a))
    }

    func testCallsKeepTheirWireNamesAndComeBackAsTheSameCase() throws {
        let value = Data([1, 2, 3, 250])
        let gatt = GATTService(uuid: service, characteristics: [GATTCharacteristic(uuid: characteristic, properties: [.read, .write])])
        let calls: [(AirCall, String, [String: String])] = [
            (.powerOn, "powerOn", [:]),
            (.stopScanning, "stopScanning", [:]),
            (.connect(address, timeout: 4.5), "connect", ["address": address.value]),
            (.discover(address), "discover", ["address": address.value]),
            (.read(address, service: service, characteristic: characteristic), "read", ["service": service.uuidString, "characteristic": characteristic.uuidString]),
            (.write(address, service: service, characteristic: characteristic, value: value, withResponse: false), "write", ["value": value.base64EncodedString()]),
            (.register(gatt, values: [characteristic: value]), "register", [:]),
            (.notice("signed-notice"), "notice", ["notice": "signed-notice"]),
        ]
        for (call, kind, fields) in calls {
            let o = try object(AirRequest(id: 7, call))
            XCTAssertEqual(o["t"] as? String, kind)
            XCTAssertEqual(o["id"] as? Int, 7)
            for (k, v) in fields { XCTAssertEqual(o[k] as? String, v, "\(kind).\(k)") }
            let back = try roundTrip(AirRequest(id: 7, call))
            XCTAssertEqual(back.call.kind, kind)
            XCTAssertEqual(back.id, 7)
        }
        guard case .write(let a, _, let c, let v, let withResponse) = try roundTrip(AirRequest(.write(address, service: service, characteristic: characteristic, value: value, withResponse: false))).call else {
            return XCTFail("a write came back as another kind")
        }
        XCTAssertEqual([a.value, c.uuidString], [address.value, characteristic.uuidString])
        XCTAssertEqual(v, value)
        XCTAssertFalse(withResponse)
        guard case .register(let s, let values) = try roundTrip(AirRequest(.register(gatt, values: [characteristic: value]))).call else {
            return XCTFail("a register came back as another kind")
        }
        XCTAssertEqual(s.characteristics.map { $0.uuid }, [characteristic])
        XCTAssertEqual(values[characteristic], value)
    }

    /// Lines as the untyped code wrote them (and as hostile peers write them) decode as before.
    func testLinesOfTheOldWireDecode() throws {
        let hello = try JSONDecoder().decode(AirRequest.self, from: Data(#"{"t":"hello","id":0,"node":"n1","x":1.5,"y":-2,"token":"tok"}"#.utf8))
        guard case .hello(let h) = hello.call else { return XCTFail("not a hello") }
        XCTAssertEqual(h.node, "n1")
        XCTAssertEqual(h.x, 1.5)
        XCTAssertEqual(h.y, -2)
        XCTAssertEqual(h.token, "tok")
        // A read without its UUIDs is answered with a failure (it was before), not dropped.
        let bad = try JSONDecoder().decode(AirRequest.self, from: Data(#"{"t":"read","id":3}"#.utf8))
        guard case .malformed(let kind, let problem) = bad.call else { return XCTFail("a read without UUIDs decoded as \(bad.call)") }
        XCTAssertEqual(kind, "read")
        XCTAssertEqual(problem, "bad read")
        let noService = try JSONDecoder().decode(AirRequest.self, from: Data(#"{"t":"register","id":4}"#.utf8))
        guard case .malformed(_, "no service") = noService.call else { return XCTFail("a register without a service decoded as \(noService.call)") }
        // Unknown kinds and junk do not decode: the reader drops the line.
        for line in [#"{"t":"format-disk"}"#, #"{"t":1}"#, #"{"id":1}"#, "junk"] {
            XCTAssertThrowsError(try JSONDecoder().decode(AirRequest.self, from: Data(line.utf8)), line)
        }
        // A node never takes an answer it cannot use: a report without its RSSI does not decode.
        XCTAssertThrowsError(try JSONDecoder().decode(AirAnswer.self, from: Data(#"{"t":"report","address":"AA"}"#.utf8)))
        XCTAssertThrowsError(try JSONDecoder().decode(AirAnswer.self, from: Data(#"{"t":"state","state":"exploded"}"#.utf8)))
    }

    func testAnswersKeepTheirWireNamesAndComeBackAsTheSameCase() throws {
        let failed = try roundTrip(AirAnswer(id: 9, .reply(.failed(.characteristicNotFound(characteristic))), at: 12.5))
        guard case .reply(.failed(.characteristicNotFound(let c))) = failed.news else { return XCTFail("\(failed.news)") }
        XCTAssertEqual(c, characteristic)
        XCTAssertEqual(failed.at, 12.5)
        let o = try object(AirAnswer(id: 9, .reply(.failed(.timeout("slow")))))
        XCTAssertEqual(o["t"] as? String, "reply")
        XCTAssertEqual(o["ok"] as? Bool, false)
        XCTAssertEqual(o["errorKind"] as? String, "timeout")
        XCTAssertEqual(o["error"] as? String, "slow")
        guard case .reply(.value(let v)) = try roundTrip(AirAnswer(id: 1, .reply(.value(Data([9, 8]))))).news else { return XCTFail("value lost") }
        XCTAssertEqual(v, Data([9, 8]))
        guard case .attached(let a) = try roundTrip(AirAnswer(id: 0, .attached(address))).news else { return XCTFail("attached lost") }
        XCTAssertEqual(a, address)
        guard case .refused("no ticket") = try roundTrip(AirAnswer(id: 0, .refused("no ticket"))).news else { return XCTFail("refusal lost") }
        XCTAssertEqual(try object(AirAnswer(id: 0, .refused("x")))["t"] as? String, "hello")
        let report = ScanReport(address: address, rssi: -61, txPower: 4, manufacturerData: [0x0660: Data([1])], serviceUUIDs: [service])
        guard case .report(let r) = try roundTrip(AirAnswer(.report(report))).news else { return XCTFail("report lost") }
        XCTAssertEqual(r.rssi, -61)
        XCTAssertEqual(r.txPower, 4)
        XCTAssertEqual(r.manufacturerData, [0x0660: Data([1])])
        XCTAssertEqual(r.serviceUUIDs, [service])
        guard case .gattWrite(let gc, let gv, 2, let central) = try roundTrip(AirAnswer(.gattWrite(characteristic: characteristic, value: Data([5]), offset: 2, central: address))).news else {
            return XCTFail("gattWrite lost")
        }
        XCTAssertEqual([gc.uuidString, central.value], [characteristic.uuidString, address.value])
        XCTAssertEqual(gv, Data([5]))
    }
}
