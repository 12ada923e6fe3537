#if canImport(Glibc)
import Glibc
#endif

/// One resolved socket address (IPv4 or IPv6), as getaddrinfo gives it.
public struct NetAddress: Sendable, CustomStringConvertible {
    public let storage: sockaddr_storage
    public let length: socklen_t

    public init(storage: sockaddr_storage, length: socklen_t) {
        self.storage = storage
        self.length = length
    }

    public var family: Int32 { Int32(storage.ss_family) }

    /// The numeric host (no brackets), with IPv4-mapped IPv6 addresses shown as IPv4.
    public var host: String { Self.numericHost(storage, length) }

    public var port: UInt16 {
        switch family {
        case AF_INET: return UInt16(bigEndian: ipv4!.sin_port)
        case AF_INET6: return UInt16(bigEndian: ipv6!.sin6_port)
        default: return 0
        }
    }

    public var description: String { HostPort(host: host, port: port).description }

    public var ipv4: sockaddr_in? {
        guard family == AF_INET else { return nil }
        return withUnsafeBytes(of: storage) { $0.load(as: sockaddr_in.self) }
    }

    public var ipv6: sockaddr_in6? {
        guard family == AF_INET6 else { return nil }
        return withUnsafeBytes(of: storage) { $0.load(as: sockaddr_in6.self) }
    }

    public func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
        try withUnsafeBytes(of: storage) { try body($0.baseAddress!.assumingMemoryBound(to: sockaddr.self), length) }
    }

    /// The addresses of `host:port` for a stream socket, in getaddrinfo's order. `passive`
    /// resolves for bind (an empty host is then the wildcard).
    public static func resolve(host: String, port: UInt16, passive: Bool = false) throws -> [NetAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)
        let bare = HostPort.unbracketed(host)
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(bare.isEmpty ? nil : bare, String(port), &hints, &list)
        guard rc == 0, let first = list else {
            let cause = rc == EAI_SYSTEM ? NetError.text(errno: errno) : String(cString: gai_strerror(rc))
            throw NetError(.resolve, "cannot resolve \(bare): \(cause)")
        }
        defer { freeaddrinfo(list) }
        var out = [NetAddress]()
        var p: UnsafeMutablePointer<addrinfo>? = first
        while let ai = p {
            if let sa = ai.pointee.ai_addr, ai.pointee.ai_family == AF_INET || ai.pointee.ai_family == AF_INET6 {
                var storage = sockaddr_storage()
                let len = Int(ai.pointee.ai_addrlen)
                withUnsafeMutableBytes(of: &storage) { dst in
                    dst.copyMemory(from: UnsafeRawBufferPointer(start: UnsafeRawPointer(sa), count: min(len, dst.count)))
                }
                let address = NetAddress(storage: storage, length: ai.pointee.ai_addrlen)
                // getaddrinfo repeats an address when /etc/hosts lists it twice.
                if !out.contains(where: { $0.host == address.host && $0.family == address.family }) { out.append(address) }
            }
            p = ai.pointee.ai_next
        }
        guard !out.isEmpty else { throw NetError(.resolve, "cannot resolve \(bare): no IPv4 or IPv6 address") }
        return out
    }

    /// Whether a numeric host is a loopback address: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into
    /// IPv6. A name is never loopback here (resolve it first): only the address decides.
    public static func isLoopback(numericHost text: String) -> Bool {
        let bare = HostPort.unbracketed(text)
        var v4 = in_addr()
        if inet_pton(AF_INET, bare, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, bare, &v6) == 1 else { return false }
        let b = withUnsafeBytes(of: v6) { Array($0) }
        if b[0..<15].allSatisfy({ $0 == 0 }) && b[15] == 1 { return true }
        return b[0..<10].allSatisfy({ $0 == 0 }) && b[10] == 0xFF && b[11] == 0xFF && b[12] == 127
    }

    /// The wildcard address of a family ("0.0.0.0" or "::").
    public static func any(family: Int32, port: UInt16) -> NetAddress {
        var storage = sockaddr_storage()
        if family == AF_INET6 {
            var a = sockaddr_in6()
            a.sin6_family = sa_family_t(AF_INET6)
            a.sin6_port = port.bigEndian
            a.sin6_addr = in6addr_any
            withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: a, as: sockaddr_in6.self) }
            return NetAddress(storage: storage, length: socklen_t(MemoryLayout<sockaddr_in6>.size))
        }
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = port.bigEndian
        a.sin_addr.s_addr = INADDR_ANY
        withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: a, as: sockaddr_in.self) }
        return NetAddress(storage: storage, length: socklen_t(MemoryLayout<sockaddr_in>.size))
    }

    /// A socket address's host as a numeric text (no brackets; IPv4-mapped IPv6 shown as IPv4).
    public static func numericHost(_ storage: sockaddr_storage, _ length: socklen_t) -> String {
        var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        let rc = withUnsafeBytes(of: storage) {
            getnameinfo($0.baseAddress!.assumingMemoryBound(to: sockaddr.self), length, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST)
        }
        guard rc == 0 else { return "?" }
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.hasPrefix("::ffff:") && text.contains(".") ? String(text.dropFirst(7)) : text
    }
}
