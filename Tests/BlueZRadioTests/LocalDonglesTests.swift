import XCTest
@testable import BlueZRadio

/// A host's controllers as LocalDongles sees them: clone dongles (one address on two
/// controllers) are named, and an address that two controllers share selects neither.
final class LocalDonglesTests: XCTestCase {
    func dongle(_ adapter: String, _ address: String?) -> LocalDongle {
        LocalDongle(adapter: adapter, address: address, powered: true, inBlueZ: true, identity: nil, sysfs: nil)
    }

    func testClonesAreNamedAndTheirAddressSelectsNeither() {
        let dongles = [dongle("hci0", "00:1A:7D:DA:71:13"), dongle("hci1", "F0:00:00:00:00:02"),
                       dongle("hci2", "00:1A:7D:DA:71:13"), dongle("hci3", nil), dongle("hci4", nil)]
        XCTAssertEqual(LocalDongles.sharedAddresses(dongles), [
            "hci0 and hci2 report one address, 00:1A:7D:DA:71:13: clone dongles, which the lab cannot tell apart "
                + "(select them here by hciN; the coordinator marks the address bad)"])
        XCTAssertNil(LocalDongles.find("00:1a:7d:da:71:13", in: dongles), "an address two controllers share selects neither")
        XCTAssertEqual(LocalDongles.find("hci2", in: dongles)?.adapter, "hci2")
        XCTAssertEqual(LocalDongles.find("f0:00:00:00:00:02", in: dongles)?.adapter, "hci1")
        XCTAssertEqual(LocalDongles.sharedAddresses(Array(dongles.prefix(2))), [])
    }
}
