// ControllerIdentity: who made the Bluetooth controller of a node and what firmware it runs,
// read with libbluetooth (HCI Read Local Version Information and Read BD_ADDR), so results can
// be grouped by dongle. On machines without Bluetooth in the kernel, opening an HCI socket fails
// with EAFNOSUPPORT: that is reported as `.unavailable(reason)`, never a crash.
//
// JSON (docs/BUNDLE.md, node `controller`):
//   {"address": "AA:BB:CC:DD:EE:FF", "hciVersion": 9, "lmpVersion": 9, "lmpSubversion": 8870,
//    "manufacturer": 2, "manufacturerName": "Intel", "hciRevision": 256}
// or {"unavailable": "hci_open_dev(hci0): Address family not supported by protocol (EAFNOSUPPORT)"}.
// `manufacturerName` and `hciRevision` are additions to the documented five keys; decoding
// accepts their absence.
import CBluetooth
import Foundation

public enum ControllerIdentity: Sendable, Equatable, Codable {
    case controller(Controller)
    case unavailable(String)

    public struct Controller: Sendable, Equatable, Codable {
        /// Public address, "AA:BB:CC:DD:EE:FF".
        public var address: String
        /// HCI version (Bluetooth Core spec numbering: 6 = 4.0, 7 = 4.1, 8 = 4.2, 9 = 5.0, ... 13 = 5.4).
        public var hciVersion: Int
        public var hciRevision: Int?
        /// LMP/LL version (same numbering) and the vendor's firmware subversion.
        public var lmpVersion: Int
        public var lmpSubversion: Int
        /// Bluetooth SIG company identifier of the controller's manufacturer.
        public var manufacturer: Int
        public var manufacturerName: String?

        public init(address: String, hciVersion: Int, hciRevision: Int? = nil, lmpVersion: Int, lmpSubversion: Int,
                    manufacturer: Int, manufacturerName: String? = nil) {
            self.address = address
            self.hciVersion = hciVersion
            self.hciRevision = hciRevision
            self.lmpVersion = lmpVersion
            self.lmpSubversion = lmpSubversion
            self.manufacturer = manufacturer
            self.manufacturerName = manufacturerName ?? ControllerIdentity.manufacturerName(manufacturer)
        }

        /// "Bluetooth 5.0" style name of a version number, nil if unknown.
        public var coreSpecification: String? { ControllerIdentity.coreSpecification(lmpVersion) }
    }

    public var controller: Controller? {
        if case .controller(let c) = self { return c }
        return nil
    }

    public var unavailableReason: String? {
        if case .unavailable(let r) = self { return r }
        return nil
    }

    // MARK: Codable: the controller's fields, or {"unavailable": reason}

    private enum Keys: String, CodingKey { case unavailable }

    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        if let reason = try c.decodeIfPresent(String.self, forKey: .unavailable) {
            self = .unavailable(reason)
        } else {
            self = .controller(try Controller(from: decoder))
        }
    }

    public func encode(to encoder: Encoder) throws {
        switch self {
        case .controller(let info):
            try info.encode(to: encoder)
        case .unavailable(let reason):
            var c = encoder.container(keyedBy: Keys.self)
            try c.encode(reason, forKey: .unavailable)
        }
    }

    // MARK: Reading

    /// Reads the identity of a controller: `adapter` is "hciN", a controller address
    /// ("AA:BB:CC:DD:EE:FF"), or "" for the first available controller.
    public static func read(adapter: String = "hci0", timeoutMilliseconds: Int32 = 1000) -> ControllerIdentity {
        let devID: Int32
        if adapter.hasPrefix("hci"), let n = Int32(adapter.dropFirst(3)), n >= 0 {
            devID = n
        } else if adapter.isEmpty {
            let id = hci_get_route(nil)
            guard id >= 0 else { return .unavailable("hci_get_route(any): \(errnoDescription(errno))") }
            devID = id
        } else {
            guard isAddress(adapter) else {
                return .unavailable("not an adapter name or address: '\(adapter)'")
            }
            // hci_devid finds the controller with this address (hci_get_route would pick
            // another one: it looks for a route *to* that address).
            let id = hci_devid(adapter)
            guard id >= 0 else { return .unavailable("hci_devid(\(adapter)): \(errnoDescription(errno))") }
            devID = id
        }
        let dd = hci_open_dev(devID)
        guard dd >= 0 else { return .unavailable("hci_open_dev(hci\(devID)): \(errnoDescription(errno))") }
        defer { hci_close_dev(dd) }
        var version = hci_version()
        guard hci_read_local_version(dd, &version, timeoutMilliseconds) >= 0 else {
            return .unavailable("hci_read_local_version(hci\(devID)): \(errnoDescription(errno))")
        }
        var address = bdaddr_t()
        guard hci_read_bd_addr(dd, &address, timeoutMilliseconds) >= 0 else {
            return .unavailable("hci_read_bd_addr(hci\(devID)): \(errnoDescription(errno))")
        }
        return .controller(Controller(address: addressString(address), hciVersion: Int(version.hci_ver),
                                      hciRevision: Int(version.hci_rev), lmpVersion: Int(version.lmp_ver),
                                      lmpSubversion: Int(version.lmp_subver), manufacturer: Int(version.manufacturer)))
    }

    /// A controller the kernel has, with its address and whether it is up (HCIGETDEVINFO: no
    /// privilege needed, unlike `read`).
    public struct Device: Sendable, Equatable, Codable {
        public var index: Int
        public var name: String
        public var address: String
        public var up: Bool
    }

    /// Every controller the kernel has (hci0 to hci31), or why they cannot be listed.
    public static func devices() -> Result<[Device], ControllerListError> {
        var out = [Device]()
        for id in Int32(0)..<32 {
            var di = hci_dev_info()
            if hci_devinfo(id, &di) < 0 {
                let e = errno
                if e == ENODEV { continue }
                if e == EAFNOSUPPORT || e == EPERM || e == EACCES { return .failure(ControllerListError(description: "hci_devinfo: \(errnoDescription(e))")) }
                continue
            }
            let name = withUnsafeBytes(of: di.name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            out.append(Device(index: Int(id), name: name.isEmpty ? "hci\(id)" : name, address: addressString(di.bdaddr), up: di.flags & 1 != 0))
        }
        return .success(out)
    }

    static func isAddress(_ s: String) -> Bool {
        let parts = s.split(separator: ":", omittingEmptySubsequences: false)
        return parts.count == 6 && parts.allSatisfy { $0.count == 2 && $0.allSatisfy(\.isHexDigit) }
    }

    /// bdaddr_t is stored little-endian; the text form is most significant byte first.
    static func addressString(_ a: bdaddr_t) -> String {
        let b = a.b
        return [b.5, b.4, b.3, b.2, b.1, b.0].map { String(format: "%02X", $0) }.joined(separator: ":")
    }

    static func errnoDescription(_ code: Int32) -> String {
        let names: [Int32: String] = [
            EAFNOSUPPORT: "EAFNOSUPPORT", ENODEV: "ENODEV", EPERM: "EPERM", EACCES: "EACCES",
            ENETDOWN: "ENETDOWN", ETIMEDOUT: "ETIMEDOUT", EIO: "EIO", EBUSY: "EBUSY", ERFKILL: "ERFKILL",
        ]
        let text = String(cString: strerror(code))
        return "\(text) (\(names[code] ?? "errno \(code)"))"
    }

    // MARK: Names

    /// Short names of the controller manufacturers met in practice (Bluetooth SIG company ids).
    public static let commonManufacturers: [Int: String] = [
        0: "Ericsson", 2: "Intel", 6: "Microsoft", 10: "Qualcomm (CSR)", 13: "Texas Instruments",
        15: "Broadcom", 18: "Zeevo", 29: "Qualcomm", 48: "STMicroelectronics", 57: "ISSC",
        69: "Atheros", 70: "MediaTek", 72: "Marvell", 76: "Apple", 93: "Realtek", 117: "Samsung",
        224: "Google", 305: "Cypress", 1521: "The Linux Foundation",
    ]

    /// A manufacturer's name: the short table first, then libbluetooth's full company table.
    public static func manufacturerName(_ id: Int) -> String? {
        if let short = commonManufacturers[id] { return short }
        guard id >= 0, id <= 0xFFFF, let c = bt_compidtostr(Int32(id)) else { return nil }
        let name = String(cString: c)
        return name == "not assigned" || name.isEmpty ? nil : name
    }

    /// Bluetooth Core Specification version of an HCI/LMP version number.
    public static func coreSpecification(_ version: Int) -> String? {
        let names = ["1.0b", "1.1", "1.2", "2.0", "2.1", "3.0", "4.0", "4.1", "4.2", "5.0", "5.1", "5.2", "5.3", "5.4", "6.0"]
        return version >= 0 && version < names.count ? "Bluetooth \(names[version])" : nil
    }
}

public struct ControllerListError: Error, CustomStringConvertible, Sendable {
    public var description: String
}
