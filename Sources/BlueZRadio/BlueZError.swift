// Mapping between BlueZ's D-Bus errors and the transport's typed errors, both ways.
import DBus
import HeraldRadio

enum BlueZError {
    static let prefix = "org.bluez.Error."

    /// A failed call to bluetoothd as a transport error. `operation` names the call for messages;
    /// `connecting` maps a generic failure to `connectionFailed`.
    static func transportError(_ error: Error, operation: String, connecting: Bool = false) -> TransportError {
        if let t = error as? TransportError { return t }
        if let c = error as? DBusConnectionError {
            switch c {
            case .timeout: return .timeout(operation)
            case .disconnected: return .adapterUnavailable("the D-Bus connection to bluetoothd closed during \(operation)")
            case .connectFailed(let name, let message):
                return .adapterUnavailable("cannot reach the system bus (\(name): \(message)); is dbus running, and may this user use it?")
            case .invalidArgument(let why), .unexpectedReply(let why): return .failed("\(operation): \(why)")
            }
        }
        guard let m = error as? DBusMethodError else { return .failed("\(operation): \(error)") }
        let detail = m.message.isEmpty ? operation : "\(operation): \(m.message)"
        switch m.name {
        case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
            return .adapterUnavailable("bluetoothd is not running (no org.bluez on the system bus)")
        case "org.freedesktop.DBus.Error.AccessDenied":
            return .notPermitted
        case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout", "org.freedesktop.DBus.Error.TimedOut":
            return .timeout(operation)
        case "org.freedesktop.DBus.Error.UnknownObject", "org.freedesktop.DBus.Error.UnknownMethod":
            return .failed("\(detail) (object gone)")
        case prefix + "InProgress": return .inProgress
        case prefix + "NotPermitted", prefix + "NotAuthorized": return .notPermitted
        case prefix + "NotSupported": return .notSupported(detail)
        case prefix + "InvalidOffset": return .invalidOffset
        case prefix + "InvalidValueLength": return .invalidValueLength
        case prefix + "NotConnected": return .notConnected
        case prefix + "NotReady": return .adapterUnavailable("adapter not ready (powered off?)")
        case prefix + "NotAvailable": return .adapterUnavailable(detail)
        default:
            return connecting ? .connectionFailed(detail) : .failed("\(m.name.replacingOccurrences(of: prefix, with: "")): \(detail)")
        }
    }

    /// The error an exported characteristic answers bluetoothd with (it becomes the ATT error).
    static func methodError(_ error: ATTError) -> DBusMethodError {
        switch error {
        case .invalidOffset: return DBusMethodError(prefix + "InvalidOffset", "invalid offset")
        case .invalidValueLength: return DBusMethodError(prefix + "InvalidValueLength", "invalid value length")
        case .notPermitted: return DBusMethodError(prefix + "NotPermitted", "not permitted")
        case .notSupported: return DBusMethodError(prefix + "NotSupported", "not supported")
        case .failed(let why): return DBusMethodError(prefix + "Failed", why)
        }
    }

    static func isNamed(_ error: Error, _ names: String...) -> Bool {
        guard let m = error as? DBusMethodError else { return false }
        return names.contains { m.name == prefix + $0 }
    }
}
