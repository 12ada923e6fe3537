import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `Connection.sendFile` (sendfile(2) on plain TCP): ranges, a file that ends before the range,
/// and a peer that takes nothing (a timeout on a blocking socket and on a non-blocking one).
final class SendFileTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("sendfile-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(at: dir)
    }

    /// A TCP connection on loopback: the sending end (a Connection) and the receiving socket.
    func connected() throws -> (Connection, Int32) {
        let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(listener) }
        let client = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        let server = acceptOne(listener)
        XCTAssertGreaterThanOrEqual(server, 0)
        return (Connection(fd: server, name: "test"), client)
    }

    func open(_ url: URL) throws -> Int32 {
        let fd = Glibc.open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw NetError(.protocolError, "cannot open \(url.path)") }
        return fd
    }

    func testSendsRangesAndStopsWhereTheFileEnds() throws {
        let content = Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 11) })
        let url = dir.appendingPathComponent("f")
        try content.write(to: url)
        let file = try open(url)
        defer { close(file) }
        let (sender, reader) = try connected()
        defer { close(reader) }
        Sockets.setTimeouts(reader, seconds: 10)
        let received = ReceivedBytes()
        let done = DispatchSemaphore(value: 0)
        Thread {
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = chunk.withUnsafeMutableBytes { recv(reader, $0.baseAddress!, $0.count, 0) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                received.append(chunk[0..<n])
            }
            done.signal()
        }.start()
        sender.setTimeouts(seconds: 10)
        XCTAssertEqual(try sender.sendFile(file, offset: 1000, count: 200_000), 200_000)
        XCTAssertEqual(try sender.sendFile(file, offset: 250_001, count: 100_000), 49_999, "the file ends first")
        XCTAssertEqual(try sender.sendFile(file, offset: 300_000, count: 10), 0)
        sender.close()
        done.wait()
        XCTAssertTrue(received.data == content[1000..<201_000] + content[250_001...])
    }

    /// A peer that reads nothing: once the socket's buffers are full the send gives up after the
    /// timeout, as `write` does, whether the socket blocks (SO_SNDTIMEO) or not (poll).
    func testPeerThatTakesNothingTimesOut() throws {
        let url = dir.appendingPathComponent("sparse")
        FileManager.default.createFile(atPath: url.path, contents: nil)
        XCTAssertEqual(truncate(url.path, 64 << 20), 0) // a hole: nothing to read from the disk
        let file = try open(url)
        defer { close(file) }
        for nonBlocking in [false, true] {
            let (sender, reader) = try connected()
            defer { close(reader); sender.close() }
            sender.setTimeouts(seconds: 0.3)
            if nonBlocking { XCTAssertEqual(fcntl(sender.fd, F_SETFL, fcntl(sender.fd, F_GETFL) | O_NONBLOCK), 0) }
            XCTAssertThrowsError(try sender.sendFile(file, offset: 0, count: 64 << 20), "non-blocking \(nonBlocking)") { error in
                XCTAssertEqual((error as? NetError)?.kind, .timeout, "\(error)")
            }
        }
    }
}

final class ReceivedBytes: @unchecked Sendable {
    private let lock = NSLock()
    private var bytes = Data()
    func append(_ chunk: ArraySlice<UInt8>) { lock.withLock { bytes.append(contentsOf: chunk) } }
    var data: Data { lock.withLock { bytes } }
}
