// The sysfs reader against fake sysfs trees: a USB dongle behind a hub, a virtual controller,
// and hostile trees (links leading outside the root, FIFOs, symbolic links as attributes,
// oversized and malformed values). Nothing here needs Bluetooth or privileges.
import BlueZRadio
import Foundation
import XCTest

final class SysfsBluetoothTests: XCTestCase {
    var root: URL!

    override func setUpWithError() throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("fake-sysfs-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: root)
    }

    var fake: FakeSysfs { FakeSysfs(root: root) }
    func write(_ path: String, _ text: String) throws { try fake.write(path, text) }
    func mkdir(_ path: String) throws { try fake.mkdir(path) }
    func link(_ path: String, to target: String) throws { try fake.link(path, to: target) }
    static let usbDevice = FakeSysfs.usbDevice
    func makeUSBDongle(hci: String = "hci0", device: String = usbDevice, serial: String? = "5C:F3:70:8B:12:34") throws {
        try fake.makeUSBDongle(hci: hci, device: device, serial: serial)
    }

    func testAUSBDongleBehindAHub() throws {
        try makeUSBDongle()
        try write("kernel/debug/bluetooth/hci0/firmware_info", "CSR 8891 build 3164\n")
        try write("kernel/debug/bluetooth/hci0/identity", "00:1a:7d:da:71:13 (type 0) 00000000000000000000000000000000 00:00:00:00:00:00\n")
        // A connection entry and a virtual controller beside it.
        try mkdir("devices/virtual/bluetooth/hci1")
        try link("class/bluetooth/hci1", to: "../../devices/virtual/bluetooth/hci1")
        try mkdir("devices/virtual/bluetooth/hci0:11")
        try link("class/bluetooth/hci0:11", to: "../../devices/virtual/bluetooth/hci0:11")

        let adapters = SysfsBluetooth(root: root.path).adapters()
        XCTAssertEqual(adapters.map(\.name), ["hci0", "hci1"], "connections (hci0:11) are not adapters")
        let a = adapters[0]
        XCTAssertEqual(a.bus, "usb")
        XCTAssertEqual(a.driver, "btusb")
        XCTAssertEqual(a.driverVersion, "0.8")
        XCTAssertEqual(a.firmware, "CSR 8891 build 3164")
        XCTAssertEqual(a.address, "00:1A:7D:DA:71:13", "debugfs identity, upper case")
        XCTAssertNil(a.rfkillBlocked)
        let usb = try XCTUnwrap(a.usb)
        XCTAssertEqual(usb.vendor, "0a12")
        XCTAssertEqual(usb.product, "0001")
        XCTAssertEqual(usb.release, "8891")
        XCTAssertEqual(usb.serial, "5C:F3:70:8B:12:34")
        XCTAssertEqual(usb.manufacturer, "Cambridge Silicon Radio")
        XCTAssertEqual(usb.productName, "CSR8510 A10")
        XCTAssertEqual(usb.port, "1-1.2")
        XCTAssertEqual(usb.busNumber, 1)
        XCTAssertEqual(usb.deviceNumber, 5)
        XCTAssertEqual(usb.speed, "12")
        XCTAssertEqual(usb.path, Self.usbDevice)
        XCTAssertEqual(a.problems, [])
        XCTAssertEqual(adapters[1].bus, "virtual")
        XCTAssertNil(adapters[1].usb)
        XCTAssertEqual(SysfsBluetooth(root: root.path).adapter("hci1")?.bus, "virtual")
        XCTAssertNil(SysfsBluetooth(root: root.path).adapter("hci7"))
        XCTAssertNil(SysfsBluetooth(root: root.path).adapter("../hci0"))
    }

    func testNoBluetoothNoSysfs() {
        XCTAssertEqual(SysfsBluetooth(root: root.path).adapters(), [], "no class/bluetooth: no adapters")
        XCTAssertEqual(SysfsBluetooth(root: root.appendingPathComponent("missing").path).adapters(), [])
    }

    func testRfkillAndOldKernelAddress() throws {
        try makeUSBDongle()
        let hci = "\(Self.usbDevice)/1-1.2:1.0/bluetooth/hci0"
        try write("\(hci)/rfkill3/soft", "1\n")
        try write("\(hci)/address", "f0:00:00:00:00:01\n")
        let a = try XCTUnwrap(SysfsBluetooth(root: root.path).adapter("hci0"))
        XCTAssertEqual(a.rfkillBlocked, "soft")
        XCTAssertEqual(a.address, "F0:00:00:00:00:01")
    }

    func testHostileTreesAreReadOnlyWhereTheyAreSafe() throws {
        try makeUSBDongle(serial: nil)
        let dev = Self.usbDevice
        // The serial is a FIFO (reading it would block), the product a link to a file outside,
        // the manufacturer holds control characters, bcdDevice is not hex, the speed is huge.
        XCTAssertEqual(mkfifo(root.appendingPathComponent("\(dev)/serial").path, 0o644), 0)
        try FileManager.default.removeItem(at: root.appendingPathComponent("\(dev)/product"))
        let outside = FileManager.default.temporaryDirectory.appendingPathComponent("sysfs-outside-\(UUID().uuidString)")
        try Data("secret\n".utf8).write(to: outside)
        defer { try? FileManager.default.removeItem(at: outside) }
        try link("\(dev)/product", to: outside.path)
        try write("\(dev)/manufacturer", "ACME\u{1B}[31m\n")
        try write("\(dev)/bcdDevice", "88zz\n")
        try write("\(dev)/speed", String(repeating: "9", count: 5000))
        // A second adapter whose class entry leads outside the root, and a third whose USB
        // device claims an impossible vendor id.
        try link("class/bluetooth/hci2", to: FileManager.default.temporaryDirectory.path)
        let other = "devices/pci0000:00/0000:00:14.0/usb1/1-3"
        try makeUSBDongle(hci: "hci3", device: other)
        try write("\(other)/idVendor", "../../\n")

        let adapters = SysfsBluetooth(root: root.path).adapters()
        XCTAssertEqual(adapters.map(\.name), ["hci0", "hci2", "hci3"])
        let a = adapters[0]
        let usb = try XCTUnwrap(a.usb, "the safe parts are still read")
        XCTAssertEqual(usb.vendor, "0a12")
        XCTAssertNil(usb.serial, "a FIFO is never opened for reading")
        XCTAssertNil(usb.productName, "a link is not followed")
        XCTAssertNil(usb.manufacturer, "control characters")
        XCTAssertNil(usb.release)
        XCTAssertNil(usb.speed)
        let problems = a.problems.joined(separator: "\n")
        XCTAssertTrue(problems.contains("serial is not a regular file"), problems)
        XCTAssertTrue(problems.contains("product is a symbolic link"), problems)
        XCTAssertTrue(problems.contains("manufacturer holds control characters"), problems)
        XCTAssertTrue(problems.contains("bcdDevice is not four hex digits"), problems)
        XCTAssertTrue(problems.contains("speed is longer than 256 bytes"), problems)
        XCTAssertFalse(problems.contains("secret"))
        XCTAssertEqual(adapters[1].problems, ["hci2 leads outside \(root.path)"])
        XCTAssertNil(adapters[1].usb)
        XCTAssertNil(adapters[2].usb, "an impossible vendor id: no USB identity")
        XCTAssertTrue(adapters[2].problems.contains { $0.contains("idVendor/idProduct are not four hex digits") }, "\(adapters[2].problems)")
    }

    func testUSBResetWritesAuthorizedZeroThenOne() throws {
        try makeUSBDongle()
        try mkdir("devices/virtual/bluetooth/hci1")
        try link("class/bluetooth/hci1", to: "../../devices/virtual/bluetooth/hci1")
        let sysfs = SysfsBluetooth(root: root.path)
        let path = try sysfs.authorizedPath(of: "hci0")
        XCTAssertTrue(path.hasSuffix("\(Self.usbDevice)/authorized"), path)
        try SysfsBluetooth.resetUSB(authorized: path, pause: 0)
        XCTAssertEqual(try String(contentsOfFile: path, encoding: .utf8), "1\n", "authorised again after the reset")
        XCTAssertThrowsError(try sysfs.authorizedPath(of: "hci1")) { e in
            XCTAssertEqual("\(e)", "hci1 is not a USB device (bus virtual): no USB reset")
        }
        XCTAssertThrowsError(try sysfs.authorizedPath(of: "hci9")) { e in
            XCTAssertTrue("\(e)".contains("hci9 is not in"), "\(e)")
        }
        // An `authorized` that is a link is never written through.
        let target = root.appendingPathComponent("elsewhere")
        try Data("1\n".utf8).write(to: target)
        try FileManager.default.removeItem(atPath: path)
        try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: target.path)
        XCTAssertThrowsError(try SysfsBluetooth.resetUSB(authorized: path, pause: 0)) { e in
            XCTAssertTrue("\(e)".contains("is not a regular file"), "\(e)")
        }
        XCTAssertEqual(try String(contentsOf: target, encoding: .utf8), "1\n")
    }
}
