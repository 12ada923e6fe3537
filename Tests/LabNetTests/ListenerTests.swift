import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

final class ListenerTests: XCTestCase {
    func testPortZeroGivesTheRealPort() throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        XCTAssertNotEqual(port, 0)
        XCTAssertEqual(Sockets.localAddress(fd)?.port, port)
        XCTAssertEqual(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC)
    }

    func testListensOnLocalhostByName() throws {
        let (fd, port) = try Listener.listen(host: "localhost", port: 0)
        defer { close(fd) }
        let c = try Dialer.connect(host: "localhost", port: port, timeout: 5)
        close(c)
    }

    func testIPv4WildcardAcceptsIPv4() throws {
        let (fd, port) = try Listener.listen(host: "0.0.0.0", port: 0)
        defer { close(fd) }
        XCTAssertEqual(Sockets.localAddress(fd)?.family, AF_INET)
        XCTAssertEqual(Sockets.localAddress(fd)?.host, "0.0.0.0")
        let c = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        close(c)
    }

    func testIPv6WildcardIsDualStack() throws {
        try requireIPv6Loopback()
        let (fd, port) = try Listener.listen(host: "::", port: 0)
        defer { close(fd) }
        XCTAssertEqual(Sockets.localAddress(fd)?.family, AF_INET6)
        let v6 = try Dialer.connect(host: "::1", port: port, timeout: 5)
        let a6 = acceptOne(fd)
        XCTAssertEqual(Sockets.peerHost(a6), "::1")
        close(a6); close(v6)
        var v6only: Int32 = 1
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &v6only, &len)
        if v6only == 0 {
            let v4 = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
            let a4 = acceptOne(fd)
            XCTAssertEqual(Sockets.peerHost(a4), "127.0.0.1", "IPv4-mapped peers are shown as IPv4")
            close(a4); close(v4)
        }
    }

    func testAcceptedSocketsInheritNoDelay() throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        XCTAssertTrue(Sockets.noDelay(fd))
        let c = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        defer { close(c) }
        let accepted = acceptOne(fd)
        defer { close(accepted) }
        XCTAssertGreaterThanOrEqual(accepted, 0)
        XCTAssertTrue(Sockets.noDelay(accepted), "Linux copies TCP_NODELAY from the listening socket")
    }

    func testBusyPortIsNamed() throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        XCTAssertThrowsError(try Listener.listen(host: "127.0.0.1", port: port)) { error in
            XCTAssertEqual((error as? NetError)?.kind, .listen)
            XCTAssertEqual("\(error)", "cannot listen on 127.0.0.1:\(port): Address already in use")
        }
    }
}
