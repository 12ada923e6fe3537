// SysfsBluetooth: the Bluetooth controllers the kernel has, as sysfs shows them
// (/sys/class/bluetooth/hciN and the device behind each: its USB device, driver, bus), plus
// what drivers publish in debugfs (firmware_info, hardware_info) where it is readable. The root
// is a parameter, so tests read a fake tree; everything read is treated as hostile: paths must
// resolve inside the root, only regular files are opened (never through a symlink), values are
// bounded in size and checked for their form, and anything else is left out with a problem.
//
// Layout read (Linux 6.x):
//   class/bluetooth/hci0 -> ../../devices/.../1-1.2/1-1.2:1.0/bluetooth/hci0
//   hci0/device -> the USB interface (1-1.2:1.0) or another parent; none for hci_vhci
//   hci0/rfkillN/{soft,hard}; hci0/address (kernels before 3.x only)
//   <interface>/driver -> .../drivers/btusb; module/btusb/version
//   <usb device>/{idVendor,idProduct,serial,manufacturer,product,bcdDevice,busnum,devnum,speed,authorized}
//   kernel/debug/bluetooth/hci0/{firmware_info,hardware_info,identity} (root only)
import Foundation
#if canImport(Glibc)
import Glibc
#endif

public struct SysfsBluetooth: Sendable {
    /// The sysfs mount ("/sys"), or a folder laid out like it.
    public let root: String

    public init(root: String = "/sys") { self.root = root }

    public struct USB: Codable, Sendable, Equatable {
        /// idVendor, idProduct, bcdDevice: four hex digits each, lower case.
        public var vendor: String
        public var product: String
        public var release: String?
        public var serial: String?
        public var manufacturer: String?
        public var productName: String?
        /// The port path, the USB device's folder name: "1-1.2".
        public var port: String
        public var busNumber: Int?
        public var deviceNumber: Int?
        /// Mbit/s as the kernel says ("12", "480").
        public var speed: String?
        /// The USB device's folder, relative to the root (for a reset through `authorized`).
        public var path: String
    }

    public struct Adapter: Codable, Sendable, Equatable {
        /// hciN.
        public var name: String
        /// usb, virtual, pci, serial, sdio, platform, ...; nil when unknown.
        public var bus: String?
        /// Only old kernels publish it in sysfs; debugfs `identity` has it (root).
        public var address: String?
        public var driver: String?
        public var driverVersion: String?
        public var firmware: String?
        public var hardware: String?
        public var usb: USB?
        /// "soft" or "hard" when rfkill blocks it; nil when not blocked or unknown.
        public var rfkillBlocked: String?
        /// What could not be read, or was refused (not a regular file, outside the root, malformed).
        public var problems: [String] = []
    }

    /// Every hciN, in index order (empty when there is no Bluetooth, or no sysfs).
    public func adapters() -> [Adapter] {
        guard let rootReal = Self.realPath(root) else { return [] }
        let classDir = rootReal + "/class/bluetooth"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: classDir) else { return [] }
        return names.compactMap(Self.hciIndex).sorted().prefix(256).compactMap { adapter("hci\($0)", rootReal: rootReal) }
    }

    /// One adapter by name (hciN), nil when sysfs has no such adapter.
    public func adapter(_ name: String) -> Adapter? {
        guard Self.hciIndex(name) != nil, let rootReal = Self.realPath(root) else { return nil }
        return adapter(name, rootReal: rootReal)
    }

    /// "hci12" -> 12; nil for anything else (hci0:11 connection entries, other names).
    static func hciIndex(_ name: String) -> Int? {
        guard name.hasPrefix("hci"), name.count <= 6 else { return nil }
        let digits = name.dropFirst(3)
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(digits), n < 1000 else { return nil }
        return n
    }

    private func adapter(_ name: String, rootReal: String) -> Adapter? {
        let link = rootReal + "/class/bluetooth/" + name
        var out = Adapter(name: name)
        guard let hciDir = Self.inside(rootReal, link) else {
            if FileManager.default.fileExists(atPath: link) { out.problems.append("\(name) leads outside \(root)") ; return out }
            return nil
        }
        let attrs = Attributes(rootReal: rootReal, problems: [])
        var a = attrs
        if let address = a.read(hciDir, "address"), let normal = Self.address(address) { out.address = normal }
        // rfkill: the first rfkillN below the adapter.
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: hciDir) {
            for e in entries.sorted() where e.hasPrefix("rfkill") && e.dropFirst(6).allSatisfy(\.isNumber) {
                guard let dir = Self.inside(rootReal, hciDir + "/" + e) else { continue }
                if a.read(dir, "hard") == "1" { out.rfkillBlocked = "hard" } else if a.read(dir, "soft") == "1" { out.rfkillBlocked = "soft" }
                break
            }
        }
        let device = Self.inside(rootReal, hciDir + "/device")
        if let device {
            if let driverDir = Self.inside(rootReal, device + "/driver") {
                let driver = (driverDir as NSString).lastPathComponent
                if Self.isToken(driver) {
                    out.driver = driver
                    if let v = a.read(rootReal + "/module/" + driver, "version"), Self.isToken(v, extra: ".-+~") { out.driverVersion = v }
                }
            }
            // The USB device: the parent device itself or one of its two nearest ancestors.
            var dir = device
            for _ in 0..<3 {
                if FileManager.default.fileExists(atPath: dir + "/idVendor") {
                    out.usb = usb(dir, rootReal: rootReal, attributes: &a)
                    break
                }
                let parent = (dir as NSString).deletingLastPathComponent
                guard parent.hasPrefix(rootReal + "/"), parent != dir else { break }
                dir = parent
            }
            if out.usb != nil { out.bus = "usb" } else if let subsystem = Self.inside(rootReal, device + "/subsystem") {
                let s = (subsystem as NSString).lastPathComponent
                if Self.isToken(s) { out.bus = s }
            }
        } else if hciDir.contains("/devices/virtual/") {
            out.bus = "virtual"
        }
        // What the driver tells debugfs (readable by root only).
        let debug = rootReal + "/kernel/debug/bluetooth/" + name
        if let dir = Self.inside(rootReal, debug) {
            if let f = a.read(dir, "firmware_info") { out.firmware = f }
            if let h = a.read(dir, "hardware_info") { out.hardware = h }
            if out.address == nil, let id = a.read(dir, "identity"), let first = id.split(separator: " ").first, let normal = Self.address(String(first)) {
                out.address = normal
            }
        }
        out.problems = a.problems
        return out
    }

    private func usb(_ dir: String, rootReal: String, attributes a: inout Attributes) -> USB? {
        guard let vendor = a.read(dir, "idVendor"), let product = a.read(dir, "idProduct") else { return nil }
        guard Self.isHex4(vendor), Self.isHex4(product) else {
            a.problems.append("\(Self.relative(dir, rootReal)): idVendor/idProduct are not four hex digits")
            return nil
        }
        let port = (dir as NSString).lastPathComponent
        guard Self.isPortPath(port) else {
            a.problems.append("\(Self.relative(dir, rootReal)): \"\(port.prefix(40))\" is not a USB port path")
            return nil
        }
        var u = USB(vendor: vendor.lowercased(), product: product.lowercased(), port: port, path: Self.relative(dir, rootReal))
        if let r = a.read(dir, "bcdDevice") { if Self.isHex4(r) { u.release = r.lowercased() } else { a.problems.append("\(port): bcdDevice is not four hex digits") } }
        u.serial = a.text(dir, "serial", max: 126)
        u.manufacturer = a.text(dir, "manufacturer", max: 126)
        u.productName = a.text(dir, "product", max: 126)
        u.busNumber = a.read(dir, "busnum").flatMap(Int.init).flatMap { (1...1000).contains($0) ? $0 : nil }
        u.deviceNumber = a.read(dir, "devnum").flatMap(Int.init).flatMap { (1...100_000).contains($0) ? $0 : nil }
        if let s = a.read(dir, "speed"), s.count <= 8, s.allSatisfy({ $0.isNumber || $0 == "." }) { u.speed = s }
        return u
    }

    // MARK: Resetting a USB dongle

    public enum ResetError: Error, CustomStringConvertible, Equatable {
        case notUSB(String)
        case notPermitted(String)
        case failed(String)
        public var description: String {
            switch self { case .notUSB(let s), .notPermitted(let s), .failed(let s): return s }
        }
    }

    /// The `authorized` attribute of the USB device behind `adapter`, resolved now (the adapter
    /// vanishes from sysfs once the device is de-authorised, the USB device does not).
    public func authorizedPath(of adapter: String) throws(ResetError) -> String {
        guard let a = self.adapter(adapter) else { throw .notUSB("\(adapter) is not in \(root)/class/bluetooth") }
        guard let usb = a.usb else { throw .notUSB("\(adapter) is not a USB device (bus \(a.bus ?? "unknown")): no USB reset") }
        guard let rootReal = Self.realPath(root) else { throw .failed("\(root) is not readable") }
        return rootReal + "/" + usb.path + "/authorized"
    }

    /// Resets a USB device as unplugging and plugging it would: `authorized` 0, a pause, 1. The
    /// kernel unbinds the driver (the adapter disappears) and probes the device again (it comes
    /// back, often as another hciN, with the same address). Needs write access to the attribute
    /// (root, or install.sh's udev rule).
    public static func resetUSB(authorized path: String, pause: TimeInterval = 1) throws(ResetError) {
        try write(path, "0\n")
        usleep(useconds_t(max(0, min(pause, 10)) * 1e6))
        try write(path, "1\n")
    }

    private static func write(_ path: String, _ value: String) throws(ResetError) {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw .failed("\(path): \(String(cString: strerror(errno)))") }
        guard st.st_mode & S_IFMT == S_IFREG else { throw .failed("\(path) is not a regular file") }
        let fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else {
            let e = errno
            if e == EACCES || e == EPERM || e == EROFS {
                throw .notPermitted("\(path): \(String(cString: strerror(e))) (run the agent as root, or install agents/install.sh's udev rule)")
            }
            throw .failed("\(path): \(String(cString: strerror(e)))")
        }
        defer { close(fd) }
        let bytes = Array(value.utf8)
        let n = bytes.withUnsafeBufferPointer { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard n == bytes.count else {
            let e = errno
            if e == EACCES || e == EPERM { throw .notPermitted("\(path): \(String(cString: strerror(e)))") }
            throw .failed("writing \(path): \(String(cString: strerror(e)))")
        }
    }

    // MARK: Reading safely

    /// Reads attributes, collecting problems.
    struct Attributes {
        let rootReal: String
        var problems: [String]

        /// The first line of a regular file of at most `max` bytes, trimmed; nil when absent.
        mutating func read(_ dir: String, _ name: String, max: Int = 256) -> String? {
            let path = dir + "/" + name
            let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else {
                if errno == ELOOP { problems.append("\(SysfsBluetooth.relative(path, rootReal)) is a symbolic link; not read") }
                return nil
            }
            defer { close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
                problems.append("\(SysfsBluetooth.relative(path, rootReal)) is not a regular file; not read")
                return nil
            }
            var buffer = [UInt8](repeating: 0, count: max + 1)
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, max + 1) }
            guard n >= 0 else { return nil }
            guard n <= max else {
                problems.append("\(SysfsBluetooth.relative(path, rootReal)) is longer than \(max) bytes; not read")
                return nil
            }
            let text = String(decoding: buffer[0..<n], as: UTF8.self)
            let line = text.split(separator: "\n", omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard !trimmed.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F || $0 == "\u{FFFD}" }) else {
                problems.append("\(SysfsBluetooth.relative(path, rootReal)) holds control characters or is not UTF-8; not read")
                return nil
            }
            return trimmed.isEmpty ? nil : trimmed
        }

        /// Free text (USB strings) of at most `max` characters.
        mutating func text(_ dir: String, _ name: String, max: Int) -> String? {
            guard let s = read(dir, name) else { return nil }
            guard s.count <= max else { problems.append("\((dir as NSString).lastPathComponent)/\(name) is too long; not read"); return nil }
            return s
        }
    }

    /// `path` with its symbolic links resolved, when it exists and stays inside `rootReal`.
    static func inside(_ rootReal: String, _ path: String) -> String? {
        guard let real = realPath(path) else { return nil }
        return real == rootReal || real.hasPrefix(rootReal + "/") ? real : nil
    }

    static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    static func relative(_ path: String, _ rootReal: String) -> String {
        path.hasPrefix(rootReal + "/") ? String(path.dropFirst(rootReal.count + 1)) : path
    }

    static func isHex4(_ s: String) -> Bool { s.count == 4 && s.allSatisfy(\.isHexDigit) }

    /// Driver, module and subsystem names: 1 to 64 letters, digits, '_' and '-' (and `extra`).
    static func isToken(_ s: String, extra: String = "") -> Bool {
        !s.isEmpty && s.count <= 64 && s.allSatisfy { ($0.isASCII && ($0.isLetter || $0.isNumber)) || $0 == "_" || $0 == "-" || extra.contains($0) }
    }

    /// "1-1.2": bus, dash, ports separated by dots.
    static func isPortPath(_ s: String) -> Bool {
        guard s.count <= 32, let dash = s.firstIndex(of: "-") else { return false }
        let bus = s[..<dash], ports = s[s.index(after: dash)...].split(separator: ".", omittingEmptySubsequences: false)
        return !bus.isEmpty && bus.allSatisfy { $0.isASCII && $0.isNumber } && !ports.isEmpty
            && ports.allSatisfy { !$0.isEmpty && $0.count <= 3 && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }

    /// "aa:bb:cc:dd:ee:ff" -> "AA:BB:CC:DD:EE:FF"; nil for anything else.
    static func address(_ s: String) -> String? {
        ControllerIdentity.isAddress(s) ? s.uppercased() : nil
    }
}
