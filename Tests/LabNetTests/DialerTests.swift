import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

final class DialerTests: XCTestCase {
    func testDialsLocalhostByName() throws {
        let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(listener) }
        let fd = try Dialer.connect(host: "localhost", port: port, timeout: 5)
        defer { close(fd) }
        XCTAssertTrue(Sockets.noDelay(fd), "every dialled socket has TCP_NODELAY")
        XCTAssertEqual(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC)
        XCTAssertEqual(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "handed back blocking")
        let accepted = acceptOne(listener)
        defer { close(accepted) }
        XCTAssertEqual(Sockets.peerHost(accepted), "127.0.0.1")
    }

    func testDialsIPv6Loopback() throws {
        try requireIPv6Loopback()
        let (listener, port) = try Listener.listen(host: "::1", port: 0)
        defer { close(listener) }
        for host in ["::1", "[::1]"] {
            let fd = try Dialer.connect(host: host, port: port, timeout: 5)
            XCTAssertTrue(Sockets.noDelay(fd))
            let accepted = acceptOne(listener)
            XCTAssertEqual(Sockets.peerHost(accepted), "::1")
            XCTAssertEqual(Sockets.peerHost(fd), "::1")
            close(accepted)
            close(fd)
        }
    }

    func testUnresolvableNameIsNamed() {
        XCTAssertThrowsError(try Dialer.connect(host: "no-such-host.invalid", port: 8701, timeout: 5)) { error in
            let e = error as? NetError
            XCTAssertEqual(e?.kind, .resolve)
            XCTAssertTrue("\(error)".hasPrefix("cannot resolve no-such-host.invalid: "), "\(error)")
        }
    }

    func testRefusedConnectionNamesHostAndPort() throws {
        let port = try closedPort()
        XCTAssertThrowsError(try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)) { error in
            XCTAssertEqual((error as? NetError)?.kind, .connect)
            XCTAssertEqual("\(error)", "cannot connect to 127.0.0.1:\(port): Connection refused")
        }
        XCTAssertThrowsError(try Dialer.connect(host: "localhost", port: port, timeout: 5)) { error in
            XCTAssertTrue("\(error)".hasPrefix("cannot connect to localhost:\(port)"), "\(error)")
            XCTAssertTrue("\(error)".contains("Connection refused"), "\(error)")
        }
    }
}

final class DialerTimeoutTests: XCTestCase {
    /// A listener whose backlog is full drops new handshakes: the connect times out.
    func testTimeoutNamesHostPortAndTheWait() throws {
        let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0, backlog: 0)
        defer { close(listener) }
        var held = [Int32]()
        defer { held.forEach { close($0) } }
        var timedOut: NetError?
        for _ in 0..<8 {
            do { held.append(try Dialer.connect(host: "127.0.0.1", port: port, timeout: 0.5)) } catch let e as NetError {
                timedOut = e
                break
            }
        }
        guard let timedOut else { throw XCTSkip("this kernel completes handshakes beyond the backlog") }
        XCTAssertEqual(timedOut.kind, .timeout)
        XCTAssertEqual(timedOut.description, "timed out connecting to 127.0.0.1:\(port) after 0.5 s")
    }
}
