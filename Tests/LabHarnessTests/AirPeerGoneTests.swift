import Foundation
import XCTest
import LabNet
import LabTestSupport
@testable import RadioAir
#if canImport(Glibc)
import Glibc
#endif

/// The air's connections when their peer has gone (issue 19, item 2): the first failed write
/// ends the connection, what was queued behind it is dropped, and nothing keeps using CPU.
final class AirPeerGoneTests: AirTestCase {
    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    /// A node's line socket (NIO) connected to a server end made here (a `TestServer`: TLS with
    /// swift-nio-ssl, or plain): the server's end and the node's socket.
    func pair(tls: Bool) throws -> (server: TestStream, client: LineSocket) {
        let listener = try TestServer(tls: tls ? try serverTLS() : nil)
        defer { listener.close() }
        let client = try LineSocket.connect(host: "127.0.0.1", port: listener.port, tls: tls ? try clientTLS() : nil, timeout: 10)
        let server = try listener.accept()
        server.timeout = 30
        return (server, client)
    }

    /// A thousand lines queued for a peer that has reset: the first failed write drops the rest
    /// and closes the connection (its reader ends), on TLS and plain connections alike.
    func testLinesQueuedForAPeerThatHasGoneAreDropped() throws {
        for tls in [true, false] {
            let (server, socket) = try pair(tls: tls)
            // Closing with a reset (SO_LINGER 0): the node's next write fails at once.
            try server.reset()
            for i in 0..<1000 { socket.send(AirRequest(id: i, .powerOn)) }
            // The queue drains (a write that retried for ever would hold it): bounded wait.
            let drained = DispatchSemaphore(value: 0)
            Thread { socket.drain(); drained.signal() }.start()
            XCTAssertEqual(drained.wait(timeout: .now() + 30), .success, "tls \(tls): the write queue never drained")
            // The reader ends: the connection was closed.
            let ended = DispatchSemaphore(value: 0)
            socket.startReading(AirAnswer.self, onMessage: { _ in }, onClose: { ended.signal() })
            XCTAssertEqual(ended.wait(timeout: .now() + 30), .success, "tls \(tls): the reader did not end")
            XCTAssertTrue(socket.hasFailed || !socket.channel.isActive, "tls \(tls)")
            socket.close()
        }
    }

    /// Nodes that attach, pipeline requests and reset without reading, and strangers that send
    /// junk and a refused hello and reset: the air drops them all, and then uses no CPU (under
    /// 1 % of a core over 10 s, a bound on CPU time, not a timing).
    func testAirDropsPeersThatHaveGoneAndStaysIdle() throws {
        let air = AirServer(token: "secret", logger: LogCapture.quiet())
        let port = try air.start(host: "127.0.0.1", port: 0, tls: try serverTLS())
        defer { air.stop() }
        let clientTLS = try clientTLS()
        func line(_ object: [String: Any]) -> String {
            String(decoding: try! JSONSerialization.data(withJSONObject: object), as: UTF8.self) + "\n"
        }
        for i in 0..<4 {
            // A node with the token: attached, then 500 requests that each get a reply.
            let node = try TestStream.connect(host: "127.0.0.1", port: port, timeout: 10, tls: clientTLS)
            try node.write(line(["t": "hello", "id": 0, "node": "n\(i)", "token": "secret"]))
            XCTAssertFalse(try node.read().isEmpty, "hello answered")
            try node.write((1...500).map { line(["t": "read", "id": $0]) }.joined())
            try node.reset()
            // A stranger: junk, then a hello without the token (refused), then gone (a reset).
            let stranger = try TestStream.connect(host: "127.0.0.1", port: port, timeout: 10, tls: clientTLS)
            try stranger.write("junk \u{1B}[2J\n{\"t\":\n" + line(["t": "hello", "id": 1, "node": "x"]))
            try stranger.reset()
        }
        let deadline = Date().addingTimeInterval(30)
        while air.attachedCount > 0 && Date() < deadline { usleep(20_000) }
        XCTAssertEqual(air.attachedCount, 0, "nodes still attached after they left")
        // Whatever the air still had to write to them is dropped by now (a second to settle).
        usleep(1_000_000)
        let before = Self.cpuSeconds()
        usleep(10_000_000)
        let used = Self.cpuSeconds() - before
        print("AirPeerGoneTests: \(String(format: "%.3f", used)) s of CPU in the 10 s after 8 peers left")
        XCTAssertLessThan(used, 0.1, "the air used CPU after its peers left")
    }
}

extension AirPeerGoneTests {
    /// Strangers that connect to the air and say nothing hold nothing for long (issue 19,
    /// item 2): each is closed once the hello timeout has passed, and beyond `maxPending`
    /// connections not yet attached a new one is closed at once; a node then attaches.
    func testSilentStrangersAreClosedAndBounded() throws {
        func hello(_ port: UInt16) throws -> String {
            let node = try TestStream.connect(host: "127.0.0.1", port: port, timeout: 10)
            defer { node.close() }
            try node.write(String(decoding: try JSONSerialization.data(withJSONObject: ["t": "hello", "id": 1, "node": "n1", "token": "secret"]), as: UTF8.self) + "\n")
            return String(decoding: try node.read(), as: UTF8.self)
        }

        // Silent connections are closed at the hello timeout, and their places come back.
        let air = AirServer(token: "secret", logger: LogCapture.quiet())
        air.helloTimeout = 0.5
        air.maxPending = 4
        let port = try air.start(host: "127.0.0.1", port: 0)
        defer { air.stop() }
        let silent = try (0..<4).map { _ in try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5) }
        for fd in silent {
            XCTAssertTrue(Self.closedByAir(fd, within: 20), "a silent connection was left open")
            close(fd)
        }
        let deadline = Date().addingTimeInterval(20)
        while air.pendingCount > 0 && Date() < deadline { usleep(20_000) }
        XCTAssertEqual(air.pendingCount, 0)
        XCTAssertTrue(try hello(port).contains("\"ok\":true"))

        // Beyond `maxPending` connections that have not attached, a new one is closed at once.
        let bounded = AirServer(token: "secret", logger: LogCapture.quiet())
        bounded.helloTimeout = 120
        bounded.maxPending = 4
        let port2 = try bounded.start(host: "127.0.0.1", port: 0)
        defer { bounded.stop() }
        let holders = try (0..<4).map { _ in try Dialer.connect(host: "127.0.0.1", port: port2, timeout: 5) }
        defer { for fd in holders { close(fd) } }
        while bounded.pendingCount < 4 && Date() < deadline { usleep(20_000) }
        XCTAssertEqual(bounded.pendingCount, 4)
        let fifth = try Dialer.connect(host: "127.0.0.1", port: port2, timeout: 5)
        XCTAssertTrue(Self.closedByAir(fifth, within: 20), "a fifth pending connection was kept")
        close(fifth)
    }
}

extension AirPeerGoneTests {
    /// A peer that sends a hello and ends its side at once still reads the air's answer: what
    /// was read before the end is handled before the connection is closed (before, the reader
    /// closed first and most refusals were dropped).
    func testAnswersToWhatWasReadBeforeThePeerEndedAreSent() throws {
        let air = AirServer(token: "secret", logger: LogCapture.quiet())
        let port = try air.start(host: "127.0.0.1", port: 0)
        defer { air.stop() }
        for hello in [#"{"t":"hello","id":1,"node":"x"}"#, #"{"t":"hello","id":1,"node":"n1","token":"secret"}"#] {
            var answered = 0
            for _ in 0..<50 {
                let fd = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
                defer { close(fd) }
                Sockets.setTimeouts(fd, seconds: 10)
                let line = Array((hello + "\n").utf8)
                XCTAssertEqual(line.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }, line.count)
                shutdown(fd, Int32(SHUT_WR))
                var got = [UInt8]()
                var buf = [UInt8](repeating: 0, count: 4096)
                while true {
                    let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
                    if n <= 0 { break }
                    got += buf[0..<n]
                }
                if String(decoding: got, as: UTF8.self).hasPrefix(#"{""#) { answered += 1 }
            }
            XCTAssertEqual(answered, 50, hello)
        }
    }
}
