import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A host (name, IPv4 or IPv6 literal, without brackets) and a TCP port, as flags like
/// `--air coord.lab:8702` or `--air [fd00::2]:8702` give them.
public struct HostPort: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = Self.unbracketed(host)
        self.port = port
    }

    /// Parses `host:port`, `name:port` or `[v6addr]:port` (port 0...65535). A bare IPv6 address
    /// with a port is refused: it needs brackets to tell the port from the address.
    public init(parsing text: String) throws {
        func bad(_ problem: String) -> NetError {
            NetError(.badAddress, "bad address \"\(text)\": \(problem) (expected HOST:PORT or [IPv6]:PORT)")
        }
        let s = text.trimmingCharacters(in: .whitespaces)
        guard !s.isEmpty else { throw bad("it is empty") }
        guard !s.contains("://") else { throw bad("a URL is not a host and port") }
        let hostPart: Substring, portPart: Substring
        if s.hasPrefix("[") {
            guard let close = s.firstIndex(of: "]") else { throw bad("the \"[\" has no \"]\"") }
            hostPart = s[s.index(after: s.startIndex)..<close]
            let rest = s[s.index(after: close)...]
            guard rest.hasPrefix(":") else { throw bad(rest.isEmpty ? "the port is missing" : "\":PORT\" must follow \"]\"") }
            portPart = rest.dropFirst()
            guard Self.isIPv6(String(hostPart)) else { throw bad("\"\(hostPart)\" is not an IPv6 address") }
        } else {
            let colons = s.filter { $0 == ":" }.count
            guard colons > 0 else { throw bad("the port is missing") }
            guard colons == 1 else { throw bad("an IPv6 address needs brackets, as in [::1]:8702") }
            let colon = s.firstIndex(of: ":")!
            hostPart = s[..<colon]
            portPart = s[s.index(after: colon)...]
            guard !hostPart.isEmpty else { throw bad("the host is missing") }
            guard hostPart.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == "_" }) else {
                throw bad("\"\(hostPart)\" is not a host name or address")
            }
        }
        guard !portPart.isEmpty else { throw bad("the port is missing") }
        guard portPart.allSatisfy(\.isASCII), portPart.allSatisfy(\.isNumber), let p = Int(portPart), p <= 65535 else {
            throw bad("\"\(portPart)\" is not a port (0-65535)")
        }
        self.init(host: String(hostPart), port: UInt16(p))
    }

    /// The host and port of `url` (http://, https://, ws://): Foundation on Linux gives an IPv6
    /// host with or without brackets; both are accepted. A missing port is the scheme's default.
    public init(url: URL) throws {
        guard let host = url.host, !host.isEmpty else { throw NetError(.badAddress, "bad URL \"\(url.absoluteString)\": no host") }
        let port: Int
        if let p = url.port { port = p } else {
            switch url.scheme?.lowercased() {
            case "http", "ws": port = 80
            case "https", "wss": port = 443
            default: throw NetError(.badAddress, "bad URL \"\(url.absoluteString)\": no port")
            }
        }
        guard (0...65535).contains(port) else { throw NetError(.badAddress, "bad URL \"\(url.absoluteString)\": port \(port) out of range") }
        self.init(host: host, port: UInt16(port))
    }

    /// `host:port`, with the host in brackets when it is an IPv6 address.
    public var description: String { "\(Self.urlHost(host)):\(port)" }

    /// True for the hosts that mean "every interface": "0.0.0.0", "::", "" and "*".
    public static func isWildcard(_ host: String) -> Bool {
        ["0.0.0.0", "::", "[::]", "", "*"].contains(host)
    }

    /// The host as it goes into a URL or a Host header: IPv6 addresses in brackets.
    public static func urlHost(_ host: String) -> String {
        let bare = unbracketed(host)
        return bare.contains(":") ? "[\(bare)]" : bare
    }

    /// True when `host` is an IPv6 literal (with or without a zone such as `%eth0`).
    public static func isIPv6(_ host: String) -> Bool {
        let bare = unbracketed(host)
        let address = bare.split(separator: "%", maxSplits: 1).first.map(String.init) ?? bare
        var a = in6_addr()
        return inet_pton(AF_INET6, address, &a) == 1
    }

    /// True when `host` is an IPv4 literal (dotted quad).
    public static func isIPv4(_ host: String) -> Bool {
        var a = in_addr()
        return inet_pton(AF_INET, host, &a) == 1
    }

    public static func unbracketed(_ host: String) -> String {
        host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
    }
}
