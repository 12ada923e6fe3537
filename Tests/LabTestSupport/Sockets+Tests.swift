import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// Options and addresses of tests' blocking sockets (the product's sockets are SwiftNIO's).
public enum Sockets {
    /// Turns Nagle's algorithm off (`TCP_NODELAY`). On a listening socket, Linux copies it to every
    /// connection the kernel accepts afterwards.
    @discardableResult
    public static func setNoDelay(_ fd: Int32, _ on: Bool = true) -> Bool {
        var v: Int32 = on ? 1 : 0
        return setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &v, socklen_t(MemoryLayout<Int32>.size)) == 0
    }

    /// Whether `TCP_NODELAY` is set.
    public static func noDelay(_ fd: Int32) -> Bool {
        var v: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &v, &len) == 0 && v != 0
    }

    /// Sends and receives time out after `seconds` (blocking sockets).
    public static func setTimeouts(_ fd: Int32, seconds: Double) {
        let whole = max(0, seconds)
        var tv = timeval(tv_sec: Int(whole), tv_usec: Int((whole - Double(Int(whole))) * 1e6))
        if tv.tv_sec == 0 && tv.tv_usec == 0 { tv.tv_usec = 1000 }
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// The numeric address of the peer (IPv4 or IPv6, no brackets; IPv4-mapped IPv6 shown as
    /// IPv4), or nil when the socket is not connected.
    public static func peerHost(_ fd: Int32) -> String? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutableBytes(of: &storage) { getpeername(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len) }
        guard rc == 0 else { return nil }
        return NetAddress.numericHost(storage, len)
    }

    /// The local address the socket is bound to.
    public static func localAddress(_ fd: Int32) -> NetAddress? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutableBytes(of: &storage) { getsockname(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len) }
        guard rc == 0, storage.ss_family == sa_family_t(AF_INET) || storage.ss_family == sa_family_t(AF_INET6) else { return nil }
        return NetAddress(storage: storage, length: len)
    }
}
