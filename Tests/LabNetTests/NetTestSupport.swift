import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// Whether this machine can bind the IPv6 loopback (containers often have no IPv6).
func hasIPv6Loopback() -> Bool {
    guard let (fd, _) = try? Listener.listen(host: "::1", port: 0) else { return false }
    close(fd)
    return true
}

func requireIPv6Loopback() throws {
    if !hasIPv6Loopback() { throw XCTSkip("no IPv6 loopback on this machine") }
}

/// A port nothing listens on: one the kernel just handed out and that was closed again.
func closedPort() throws -> UInt16 {
    let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
    close(fd)
    return port
}

/// Accepts one connection (blocking) and returns its socket.
func acceptOne(_ listener: Int32) -> Int32 {
    while true {
        let c = accept(listener, nil, nil)
        if c >= 0 || errno != EINTR { return c }
    }
}
