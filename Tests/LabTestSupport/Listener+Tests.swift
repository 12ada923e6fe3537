import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// Blocking listening sockets for tests (the product listens on NIO: HTTPService, the air).
extension Listener {
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
