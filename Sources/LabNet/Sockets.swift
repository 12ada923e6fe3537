import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Options of the sockets the product opens itself (`Dialer`).
public enum Sockets {
    /// Turns Nagle's algorithm off (`TCP_NODELAY`). On a listening socket, Linux copies it to every
    /// connection the kernel accepts afterwards.
    @discardableResult
    public static func setNoDelay(_ fd: Int32, _ on: Bool = true) -> Bool {
        var v: Int32 = on ? 1 : 0
        return setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &v, socklen_t(MemoryLayout<Int32>.size)) == 0
    }
}
