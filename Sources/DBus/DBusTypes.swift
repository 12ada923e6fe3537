// Public message, error, match-rule and export types of the DBus module.
import Foundation

/// An error reply on the bus (received from a peer, or thrown by a method handler to answer with
/// an error). `name` is a D-Bus error name such as `org.bluez.Error.InProgress`.
public struct DBusMethodError: Error, Sendable, Equatable, CustomStringConvertible {
    public var name: String
    public var message: String

    public init(_ name: String, _ message: String = "") {
        self.name = name
        self.message = message
    }

    public var description: String { "\(name): \(message)" }

    public static let failedName = "org.freedesktop.DBus.Error.Failed"
    public static let invalidArgsName = "org.freedesktop.DBus.Error.InvalidArgs"
    public static let unknownMethodName = "org.freedesktop.DBus.Error.UnknownMethod"
    public static let unknownObjectName = "org.freedesktop.DBus.Error.UnknownObject"
    public static let unknownInterfaceName = "org.freedesktop.DBus.Error.UnknownInterface"
    public static let unknownPropertyName = "org.freedesktop.DBus.Error.UnknownProperty"
    public static let propertyReadOnlyName = "org.freedesktop.DBus.Error.PropertyReadOnly"
    public static let noReplyName = "org.freedesktop.DBus.Error.NoReply"

    public static func failed(_ message: String) -> DBusMethodError { .init(failedName, message) }
    public static func invalidArgs(_ message: String) -> DBusMethodError { .init(invalidArgsName, message) }
}

/// Errors of the connection itself (not replies from peers).
public enum DBusConnectionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Opening or registering the connection failed (libdbus error name and message).
    case connectFailed(name: String, message: String)
    /// No reply arrived within the call's timeout.
    case timeout
    /// The connection is closed or was lost.
    case disconnected
    /// An argument (path, interface, member, bus name, value) is invalid.
    case invalidArgument(String)
    /// The reply did not have the expected signature.
    case unexpectedReply(String)

    public var description: String {
        switch self {
        case .connectFailed(let name, let message): return "connect failed: \(name): \(message)"
        case .timeout: return "D-Bus call timed out"
        case .disconnected: return "D-Bus connection closed"
        case .invalidArgument(let why): return "invalid argument: \(why)"
        case .unexpectedReply(let why): return "unexpected reply: \(why)"
        }
    }
}

/// A method call received on an exported object.
public struct DBusMethodCall: Sendable {
    public var sender: String?
    public var destination: String?
    public var path: String
    public var interface: String?
    public var member: String
    public var signature: String
    public var arguments: [DBusValue]
}

/// A signal received through a match rule.
/// What a connection could not do and had no caller to tell (`DBusConnection.onProblem`): a
/// signal arrived whose body it could not read, so it was not delivered (an empty or partial
/// argument list would read as another signal); or a signal its exported objects emit
/// (InterfacesAdded, InterfacesRemoved, PropertiesChanged) could not be built or queued.
public enum DBusProblem: Sendable, Equatable, CustomStringConvertible {
    case unreadableSignal(sender: String?, path: String, interface: String, member: String, reason: String)
    case signalNotEmitted(path: String, interface: String, member: String, reason: String)

    public var description: String {
        switch self {
        case .unreadableSignal(let sender, let path, let interface, let member, let reason):
            return "signal \(interface).\(member) at \(path) from \(sender ?? "an unnamed sender") not delivered: its body cannot be read: \(reason)"
        case .signalNotEmitted(let path, let interface, let member, let reason):
            return "signal \(interface).\(member) at \(path) not emitted: \(reason)"
        }
    }
}

public struct DBusSignal: Sendable, Equatable {
    public var sender: String?
    public var path: String
    public var interface: String
    public var member: String
    public var arguments: [DBusValue]

    public init(sender: String?, path: String, interface: String, member: String, arguments: [DBusValue]) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.arguments = arguments
    }
}

/// A signal match rule (`type='signal'`). The bus filters with it; the connection filters the
/// delivered signals again locally so that each subscription sees only what its rule matches
/// (for a well-known `sender`, against the name's current owner).
public struct DBusMatchRule: Sendable, Hashable {
    public var sender: String?
    public var interface: String?
    public var member: String?
    public var path: String?
    public var pathNamespace: String?
    /// argN='value' (string arguments only).
    public var args: [Int: String]
    /// argNpath='value' (string or object path arguments, path-prefix semantics).
    public var argPaths: [Int: String]

    public init(sender: String? = nil, interface: String? = nil, member: String? = nil,
                path: String? = nil, pathNamespace: String? = nil,
                args: [Int: String] = [:], argPaths: [Int: String] = [:]) {
        self.sender = sender
        self.interface = interface
        self.member = member
        self.path = path
        self.pathNamespace = pathNamespace
        self.args = args
        self.argPaths = argPaths
    }

    private static func quote(_ s: String) -> String {
        "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }

    /// The rule as passed to `org.freedesktop.DBus.AddMatch`.
    public var ruleString: String {
        var parts = ["type='signal'"]
        if let sender { parts.append("sender=" + Self.quote(sender)) }
        if let interface { parts.append("interface=" + Self.quote(interface)) }
        if let member { parts.append("member=" + Self.quote(member)) }
        if let path { parts.append("path=" + Self.quote(path)) }
        if let pathNamespace { parts.append("path_namespace=" + Self.quote(pathNamespace)) }
        for (n, v) in args.sorted(by: { $0.key < $1.key }) { parts.append("arg\(n)=" + Self.quote(v)) }
        for (n, v) in argPaths.sorted(by: { $0.key < $1.key }) { parts.append("arg\(n)path=" + Self.quote(v)) }
        return parts.joined(separator: ",")
    }

    /// Local filtering of a delivered signal. A well-known `sender` matches signals from that
    /// name's current unique owner, `senderOwner` (the connection tracks it with NameOwnerChanged).
    public func matches(_ signal: DBusSignal, senderOwner: String? = nil) -> Bool {
        if let sender, signal.sender != sender {
            if sender.hasPrefix(":") || sender == "org.freedesktop.DBus" { return false }
            guard let senderOwner, signal.sender == senderOwner else { return false }
        }
        if let interface, signal.interface != interface { return false }
        if let member, signal.member != member { return false }
        if let path, signal.path != path { return false }
        if let ns = pathNamespace, ns != "/", signal.path != ns, !signal.path.hasPrefix(ns + "/") { return false }
        for (n, v) in args {
            guard n < signal.arguments.count, case .string(let s) = signal.arguments[n], s == v else { return false }
        }
        for (n, v) in argPaths {
            guard n < signal.arguments.count else { return false }
            let s: String
            switch signal.arguments[n] {
            case .string(let x), .objectPath(let x): s = x
            default: return false
            }
            let ok = s == v || (v.hasSuffix("/") && s.hasPrefix(v)) || (s.hasSuffix("/") && v.hasPrefix(s))
            if !ok { return false }
        }
        return true
    }
}

// MARK: - Exported objects

/// A method of an exported interface. The handler runs as a Swift task, never on the
/// connection's queue, so it may itself await calls on the same connection before it returns.
/// Throw `DBusMethodError` to answer with that error; any other error answers
/// `org.freedesktop.DBus.Error.Failed`.
public struct DBusMethod: Sendable {
    /// Expected input signature; a call with another signature is answered InvalidArgs.
    /// nil accepts any arguments.
    public var inSignature: String?
    /// Output signature (introspection, and checked before replying); nil: not checked.
    public var outSignature: String?
    public var inNames: [String]
    public var outNames: [String]
    public var handler: @Sendable (DBusMethodCall) async throws -> [DBusValue]

    public init(in inSignature: String? = "", out outSignature: String? = "",
                inNames: [String] = [], outNames: [String] = [],
                _ handler: @escaping @Sendable (DBusMethodCall) async throws -> [DBusValue]) {
        self.inSignature = inSignature
        self.outSignature = outSignature
        self.inNames = inNames
        self.outNames = outNames
        self.handler = handler
    }
}

public enum DBusPropertyAccess: String, Sendable {
    case read
    case readwrite
    case write
}

/// A property of an exported interface. The connection stores the current value: Get/GetAll
/// read it, Set (when writable) calls `setter` (which may throw to refuse) and then stores the
/// value and emits PropertiesChanged; `DBusConnection.setProperty` updates it from the app.
public struct DBusProperty: Sendable {
    public var value: DBusValue
    public var access: DBusPropertyAccess
    public var setter: (@Sendable (DBusValue) async throws -> Void)?

    public init(_ value: DBusValue, access: DBusPropertyAccess = .read,
                setter: (@Sendable (DBusValue) async throws -> Void)? = nil) {
        self.value = value
        self.access = access
        self.setter = setter
    }

    public var signature: String { value.signature }
}

/// An interface on an exported object.
public struct DBusInterface: Sendable {
    public var name: String
    public var methods: [String: DBusMethod]
    public var properties: [String: DBusProperty]
    /// Signal name -> signature (introspection only).
    public var signals: [String: String]

    public init(_ name: String, methods: [String: DBusMethod] = [:],
                properties: [String: DBusProperty] = [:], signals: [String: String] = [:]) {
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    /// Readable properties as an `a{sv}`.
    var propertiesDictionary: DBusValue {
        .dictionary(keySignature: "s", valueSignature: "v",
                    properties.keys.sorted().compactMap { key in
                        let p = properties[key]!
                        guard p.access != .write else { return nil }
                        return DBusDictEntry(.string(key), .variant(p.value))
                    })
    }
}

/// Result of `org.freedesktop.DBus.RequestName`.
public enum DBusRequestNameReply: UInt32, Sendable {
    case primaryOwner = 1
    case inQueue = 2
    case exists = 3
    case alreadyOwner = 4
}

public struct DBusNameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let allowReplacement = DBusNameFlags(rawValue: 1)
    public static let replaceExisting = DBusNameFlags(rawValue: 2)
    public static let doNotQueue = DBusNameFlags(rawValue: 4)
}

/// Well-known interface names.
public enum DBusStandardInterface {
    public static let properties = "org.freedesktop.DBus.Properties"
    public static let objectManager = "org.freedesktop.DBus.ObjectManager"
    public static let introspectable = "org.freedesktop.DBus.Introspectable"
    public static let peer = "org.freedesktop.DBus.Peer"
}
