import Foundation

/// A fake sysfs tree in a folder, laid out as Linux 6.1 lays out a USB Bluetooth dongle.
struct FakeSysfs {
    let root: URL

    func write(_ path: String, _ text: String) throws {
        let url = root.appendingPathComponent(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(text.utf8).write(to: url)
    }

    func mkdir(_ path: String) throws {
        try FileManager.default.createDirectory(at: root.appendingPathComponent(path), withIntermediateDirectories: true)
    }

    func link(_ path: String, to target: String) throws {
        let url = root.appendingPathComponent(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: url.path, withDestinationPath: target)
    }

    static let usbDevice = "devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1.2"

    /// A CSR dongle on port 2 of a hub on port 1 of bus 1, driven by btusb, as Linux 6.1 lays it out.
    func makeUSBDongle(hci: String = "hci0", device: String = FakeSysfs.usbDevice, serial: String? = "5C:F3:70:8B:12:34") throws {
        try write("\(device)/idVendor", "0a12\n")
        try write("\(device)/idProduct", "0001\n")
        try write("\(device)/bcdDevice", "8891\n")
        if let serial { try write("\(device)/serial", serial + "\n") }
        try write("\(device)/manufacturer", "Cambridge Silicon Radio\n")
        try write("\(device)/product", "CSR8510 A10\n")
        try write("\(device)/busnum", "1\n")
        try write("\(device)/devnum", "5\n")
        try write("\(device)/speed", "12\n")
        try write("\(device)/authorized", "1\n")
        let interface = "\(device)/\((device as NSString).lastPathComponent):1.0"
        try write("\(interface)/bInterfaceClass", "e0\n")
        try mkdir("bus/usb/drivers/btusb")
        try link("\(interface)/driver", to: String(repeating: "../", count: interface.split(separator: "/").count) + "bus/usb/drivers/btusb")
        try write("\(interface)/bluetooth/\(hci)/rfkill3/soft", "0\n")
        try write("\(interface)/bluetooth/\(hci)/rfkill3/hard", "0\n")
        try link("\(interface)/bluetooth/\(hci)/device", to: "../../../\((interface as NSString).lastPathComponent)")
        try link("class/bluetooth/\(hci)", to: "../../\(interface)/bluetooth/\(hci)")
        try write("module/btusb/version", "0.8\n")
    }
}
