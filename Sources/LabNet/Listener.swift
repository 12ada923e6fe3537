import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Opens every listening TCP socket of the product.
public enum Listener {
    /// The address to bind for `host`: "0.0.0.0" is IPv4's any address; "::", "" and "*" are
    /// IPv6's (dual-stack, IPv4 too, where the kernel allows; IPv4's where there is no IPv6);
    /// a literal is itself; a name is the first of its addresses (getaddrinfo's order).
    public static func addresses(host: String, port: UInt16) throws -> [NetAddress] {
        let bare = HostPort.unbracketed(host)
        if bare == "0.0.0.0" { return [NetAddress.any(family: AF_INET, port: port)] }
        if HostPort.isWildcard(bare) { return [NetAddress.any(family: AF_INET6, port: port), NetAddress.any(family: AF_INET, port: port)] }
        return try NetAddress.resolve(host: bare, port: port, passive: true)
    }

    /// The numeric address to listen on for `host` when only loopback will do (a service without
    /// authentication): the host is resolved as `listen` would resolve it (a wildcard is itself),
    /// never judged by its text, and every address it has must be loopback; the first is
    /// returned, so that the service binds the very address that was checked (a second lookup
    /// could answer otherwise). `resolve` gives a host's numeric addresses (tests inject one).
    public static func loopbackAddress(host: String, resolve: (String) throws -> [String] = { try addresses(host: $0, port: 0).map(\.host) }) throws -> String {
        let found = try resolve(host)
        guard let first = found.first else { throw NetError(.resolve, "cannot resolve \(host): no address") }
        let outside = found.filter { !NetAddress.isLoopback(numericHost: $0) }
        guard outside.isEmpty else {
            throw NetError(.badAddress, "\(host) is not a loopback address (it is \(outside.joined(separator: ", ")))")
        }
        return first
    }

    /// Binds and listens on `host:port` (port 0: any free port) and returns the socket (blocking,
    /// close-on-exec, SO_REUSEADDR, TCP_NODELAY, which accepted connections inherit) and the
    /// bound port. A name's addresses are tried in turn until one binds.
    public static func listen(host: String, port: UInt16, backlog: Int32 = 128) throws -> (fd: Int32, port: UInt16) {
        let name = HostPort(host: host, port: port)
        var last: NetError?
        for address in try addresses(host: host, port: port) {
            do { return try listen(on: address, backlog: backlog, naming: name) } catch let e as NetError { last = e }
        }
        throw last ?? NetError(.listen, "cannot listen on \(name): no address")
    }

    public static func listen(on address: NetAddress, backlog: Int32 = 128, naming: HostPort? = nil) throws -> (fd: Int32, port: UInt16) {
        let name = naming.map { "\($0)" } ?? address.description
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw NetError(.listen, "cannot listen on \(name): socket: \(NetError.text(errno: errno))") }
        var ok = false
        defer { if !ok { close(fd) } }
        var one: Int32 = 1, zero: Int32 = 0
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if address.family == AF_INET6 {
            // Dual-stack for "::" where the kernel allows it (net.ipv6.bindv6only may forbid).
            setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &zero, socklen_t(MemoryLayout<Int32>.size))
        }
        Sockets.setNoDelay(fd)
        guard address.withSockAddr({ bind(fd, $0, $1) }) == 0 else {
            throw NetError(.listen, "cannot listen on \(name): \(NetError.text(errno: errno))")
        }
        guard Glibc.listen(fd, backlog) == 0 else { throw NetError(.listen, "cannot listen on \(name): \(NetError.text(errno: errno))") }
        guard let bound = Sockets.localAddress(fd) else { throw NetError(.listen, "cannot listen on \(name): getsockname: \(NetError.text(errno: errno))") }
        ok = true
        return (fd, bound.port)
    }
}

extension Listener {
    /// Accepts one connection (close-on-exec); nil when the listening socket was closed. Transient
    /// failures (a connection reset before it was accepted, out of descriptors) are waited out.
    public static func accept(_ fd: Int32) -> Int32? {
        while true {
            let c = Glibc.accept(fd, nil, nil)
            if c >= 0 {
                _ = fcntl(c, F_SETFD, FD_CLOEXEC)
                return c
            }
            switch errno {
            case EINTR, ECONNABORTED, EPROTO: continue
            case EMFILE, ENFILE, ENOBUFS, ENOMEM: usleep(100_000); continue
            default: return nil
            }
        }
    }
}
