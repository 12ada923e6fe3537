import BlueZRadio
import Foundation
import XCTest

final class ControllerIdentityTests: XCTestCase {
    /// Whether this kernel has Bluetooth sockets (errno of socket(AF_BLUETOOTH, SOCK_RAW, BTPROTO_HCI)).
    private func bluetoothSocketErrno() -> Int32? {
        let fd = socket(31 /* AF_BLUETOOTH */, Int32(SOCK_RAW.rawValue), 1 /* BTPROTO_HCI */)
        if fd >= 0 { close(fd); return nil }
        return errno
    }

    func testReadReportsUnavailableWithoutBluetoothAndNeverCrashes() throws {
        guard bluetoothSocketErrno() == EAFNOSUPPORT else {
            throw XCTSkip("this kernel has Bluetooth sockets")
        }
        let identity = ControllerIdentity.read(adapter: "hci0")
        XCTAssertNil(identity.controller)
        let reason = try XCTUnwrap(identity.unavailableReason)
        XCTAssertTrue(reason.hasPrefix("hci_open_dev(hci0): "), reason)
        XCTAssertTrue(reason.contains("EAFNOSUPPORT"), reason)
        for adapter in ["", "hci3", "00:11:22:33:44:55"] {
            let other = ControllerIdentity.read(adapter: adapter)
            XCTAssertTrue(other.unavailableReason?.contains("EAFNOSUPPORT") ?? false, "\(adapter): \(other)")
        }
        XCTAssertEqual(ControllerIdentity.read(adapter: "wlan0").unavailableReason,
                       "not an adapter name or address: 'wlan0'")
    }

    func testReadOnARealNodeGivesAnIdentity() throws {
        guard bluetoothSocketErrno() == nil else { throw XCTSkip("no Bluetooth sockets in this kernel") }
        // With Bluetooth present either a controller answers or the reason says why not.
        let identity = ControllerIdentity.read(adapter: "hci0")
        if let c = identity.controller {
            XCTAssertEqual(c.address.count, 17)
        } else {
            XCTAssertFalse(identity.unavailableReason?.isEmpty ?? true)
        }
    }

    func testJSONForms() throws {
        let identity = ControllerIdentity.controller(.init(address: "00:1A:7D:DA:71:13", hciVersion: 9, hciRevision: 256,
                                                           lmpVersion: 9, lmpSubversion: 8870, manufacturer: 2))
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let json = String(decoding: try encoder.encode(identity), as: UTF8.self)
        XCTAssertEqual(json, #"{"address":"00:1A:7D:DA:71:13","hciRevision":256,"hciVersion":9,"lmpSubversion":8870,"lmpVersion":9,"manufacturer":2,"manufacturerName":"Intel"}"#)
        XCTAssertEqual(try JSONDecoder().decode(ControllerIdentity.self, from: Data(json.utf8)), identity)

        let unavailable = ControllerIdentity.unavailable("hci_open_dev(hci0): Address family not supported by protocol (EAFNOSUPPORT)")
        let u = String(decoding: try encoder.encode(unavailable), as: UTF8.self)
        XCTAssertEqual(u, #"{"unavailable":"hci_open_dev(hci0): Address family not supported by protocol (EAFNOSUPPORT)"}"#)
        XCTAssertEqual(try JSONDecoder().decode(ControllerIdentity.self, from: Data(u.utf8)), unavailable)

        // The five documented keys alone decode.
        let minimal = #"{"address":"AA:BB:CC:DD:EE:FF","hciVersion":8,"lmpVersion":8,"lmpSubversion":4,"manufacturer":93}"#
        let decoded = try JSONDecoder().decode(ControllerIdentity.self, from: Data(minimal.utf8))
        XCTAssertEqual(decoded.controller?.manufacturer, 93)
        XCTAssertNil(decoded.controller?.hciRevision)
        XCTAssertThrowsError(try JSONDecoder().decode(ControllerIdentity.self, from: Data(#"{"address":"x"}"#.utf8)))
    }

    func testManufacturerNames() {
        let expected: [Int: String] = [2: "Intel", 10: "Qualcomm (CSR)", 13: "Texas Instruments", 15: "Broadcom",
                                       29: "Qualcomm", 70: "MediaTek", 93: "Realtek", 305: "Cypress",
                                       1521: "The Linux Foundation"]
        for (id, name) in expected { XCTAssertEqual(ControllerIdentity.manufacturerName(id), name) }
        // Beyond the short table, libbluetooth's company table.
        XCTAssertEqual(ControllerIdentity.manufacturerName(117), "Samsung")
        XCTAssertEqual(ControllerIdentity.manufacturerName(1), "Nokia Mobile Phones")
        XCTAssertNil(ControllerIdentity.manufacturerName(-1))
        XCTAssertEqual(ControllerIdentity.coreSpecification(9), "Bluetooth 5.0")
        XCTAssertEqual(ControllerIdentity.coreSpecification(6), "Bluetooth 4.0")
        XCTAssertNil(ControllerIdentity.coreSpecification(99))
    }
}
