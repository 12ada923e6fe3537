import Foundation
import XCTest
import HeraldCore
import LabNet
import LabTestSupport
@testable import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// FileDownload against the server's file answers (sent with sendfile): bodies that are not whole
/// pages or whole buffers, downloads resumed in the middle of a page, a body that ends early, and
/// the page-cache path for file systems that refuse O_DIRECT. Every check is on the bytes and the
/// checksum; none on time.
final class FileDownloadTests: XCTestCase {
    var services: [HTTPService] = []
    var dir: URL!
    var served: URL { dir.appendingPathComponent("served") }

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("filedownload-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: served, withIntermediateDirectories: true)
    }

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
        try? FileManager.default.removeItem(at: dir)
    }

    static let mib = 1 << 20

    /// `count` bytes that repeat with no period of a page or a buffer (xorshift).
    static func content(_ count: Int, seed: UInt64 = 0x9E37_79B9_7F4A_7C15) -> Data {
        var words = [UInt64](repeating: 0, count: (count + 7) / 8)
        var x = seed
        for i in words.indices {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17
            words[i] = x
        }
        return words.withUnsafeBytes { Data($0.prefix(count)) }
    }

    /// A service answering `GET /files/:name` from `served`, ranges included.
    func startServer() async throws -> UInt16 {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        let root = served
        service.route("GET", "/files/:name") { req in
            try .file(root.appendingPathComponent(req.parameters["name"]!), range: req.headers["range"], missing: "no such file")
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        return port
    }

    func serve(_ data: Data, as name: String) throws {
        try data.write(to: served.appendingPathComponent(name))
    }

    /// Downloads `name` into `file` (off the test's thread, as the coordinator does), resuming
    /// from `from` bytes when given; the result and the hex digest of `prefix` + the body.
    func download(_ port: UInt16, _ name: String, to file: URL, from: Int? = nil, prefix: Data = Data(),
                  mode: FileDownload.WriteMode = .direct) async throws -> (FileDownload.Result, String) {
        let url = URL(string: "http://127.0.0.1:\(port)/files/\(name)")!
        let headers = from.map { ["Range": "bytes=\($0)-"] } ?? [:]
        return try await Task.detached { () throws -> (FileDownload.Result, String) in
            var hasher = SHA256()
            hasher.update(prefix)
            let result = try FileDownload.get(url, headers: headers, appendingTo: file, hasher: &hasher, timeout: 10, mode: mode)
            return (result, hasher.finalizeHex())
        }.value
    }

    /// Bodies that are not a multiple of a page (4096) or of a buffer (1 MiB), and a few that are,
    /// into a file that held more before (truncated on 200): every byte and the checksum exact.
    func testSizesThatAreNotWholePagesOrBuffers() async throws {
        let port = try await startServer()
        for mode in [FileDownload.WriteMode.direct, .buffered] {
            for size in [0, 1, 1000, 4096, 4097, Self.mib - 1, Self.mib, Self.mib + 1, 3 * Self.mib + 5 * 4096 + 1234, 4 * Self.mib] {
                let body = Self.content(size, seed: UInt64(size + 1))
                try serve(body, as: "f")
                let file = dir.appendingPathComponent("out")
                try Data(repeating: 0xEE, count: 5 * Self.mib).write(to: file)
                let (result, sha) = try await download(port, "f", to: file, mode: mode)
                XCTAssertEqual(result.status, 200)
                XCTAssertEqual(result.bytes, Int64(size), "\(mode) \(size)")
                XCTAssertEqual(sha, SHA256.hash(body), "\(mode) \(size)")
                XCTAssertTrue(try Data(contentsOf: file) == body, "\(mode) \(size): the file is not the body")
                if mode == .buffered { XCTAssertFalse(result.direct) }
            }
        }
    }

    /// A download resumed (206) at offsets in the middle of a page (and one a few bytes before
    /// the end): the file is the whole body, and the hasher, fed the part already there, ends
    /// with the whole body's checksum. Through O_DIRECT, the page cache, and O_DIRECT refused
    /// at its first write.
    func testResumedDownloadAtAnOffsetInsideAPage() async throws {
        let port = try await startServer()
        let size = 3 * Self.mib + 4096 + 99
        let body = Self.content(size)
        try serve(body, as: "f")
        let file = dir.appendingPathComponent("out")
        for mode in [FileDownload.WriteMode.direct, .buffered, .directRefusedAtFirstWrite] {
            for have in [1, 100, 4095, 4097, Self.mib + 777, 2 * Self.mib - 3, size - 10] {
                let prefix = body.prefix(have)
                try prefix.write(to: file)
                let (result, sha) = try await download(port, "f", to: file, from: have, prefix: prefix, mode: mode)
                XCTAssertEqual(result.status, 206, "\(mode) from \(have)")
                XCTAssertEqual(result.bytes, Int64(size - have), "\(mode) from \(have)")
                XCTAssertEqual(sha, SHA256.hash(body), "\(mode) from \(have)")
                XCTAssertTrue(try Data(contentsOf: file) == body, "\(mode) from \(have): the file is not the body")
            }
        }
    }

    /// The page cache when O_DIRECT is refused: at its first write (as by a file system that
    /// takes the flag at open but not the write), or not asked for; and a target in tmpfs
    /// (/dev/shm), whichever way its kernel answers O_DIRECT. The bytes are exact every time.
    func testPageCacheWhenDirectWritesAreRefused() async throws {
        let port = try await startServer()
        let size = 2 * Self.mib + 12345
        let body = Self.content(size)
        try serve(body, as: "f")
        let file = dir.appendingPathComponent("out")
        FileManager.default.createFile(atPath: file.path, contents: nil)
        for mode in [FileDownload.WriteMode.directRefusedAtFirstWrite, .buffered] {
            let (result, sha) = try await download(port, "f", to: file, mode: mode)
            XCTAssertFalse(result.direct, "\(mode): every byte through the page cache")
            XCTAssertEqual(result.bytes, Int64(size))
            XCTAssertEqual(sha, SHA256.hash(body))
            XCTAssertTrue(try Data(contentsOf: file) == body)
        }
        var shm = ObjCBool(false)
        guard FileManager.default.fileExists(atPath: "/dev/shm", isDirectory: &shm), shm.boolValue else { return }
        let inShm = URL(fileURLWithPath: "/dev/shm/filedownload-\(UUID().uuidString)")
        FileManager.default.createFile(atPath: inShm.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: inShm) }
        let (result, sha) = try await download(port, "f", to: inShm)
        XCTAssertEqual(result.bytes, Int64(size))
        XCTAssertEqual(sha, SHA256.hash(body))
        XCTAssertTrue(try Data(contentsOf: inShm) == body)
        // Resumed in the middle of a page, in tmpfs too.
        try body.prefix(5000).write(to: inShm)
        let (resumed, whole) = try await download(port, "f", to: inShm, from: 5000, prefix: body.prefix(5000))
        XCTAssertEqual(resumed.status, 206)
        XCTAssertEqual(whole, SHA256.hash(body))
        XCTAssertTrue(try Data(contentsOf: inShm) == body)
    }

    /// A body that ends before its Content-Length: an error naming how much came, and the file
    /// holds exactly what came, in order (a retry resumes from its size).
    func testBodyThatEndsEarlyThrowsAndKeepsWhatCame() async throws {
        let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(listener) }
        let sent = Self.content(Self.mib + 4096 * 3 + 17)
        let server = Thread {
            guard let c = Listener.accept(listener) else { return }
            defer { close(c) }
            // The request, to its end, before answering (so that closing sends no reset).
            var request = [UInt8]()
            var chunk = [UInt8](repeating: 0, count: 4096)
            while !request.suffix(4).elementsEqual([13, 10, 13, 10]) {
                let n = chunk.withUnsafeMutableBytes { recv(c, $0.baseAddress!, $0.count, 0) }
                if n <= 0 { return }
                request += chunk[0..<n]
            }
            let answer = Data("HTTP/1.1 200 OK\r\nContent-Length: \(3 * Self.mib)\r\nConnection: close\r\n\r\n".utf8) + sent
            answer.withUnsafeBytes { raw in
                var off = 0
                while off < raw.count {
                    let n = send(c, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
                    if n <= 0 { return }
                    off += n
                }
            }
        }
        server.start()
        let file = dir.appendingPathComponent("out")
        FileManager.default.createFile(atPath: file.path, contents: nil)
        let url = URL(string: "http://127.0.0.1:\(port)/files/f")!
        let outcome = await Task.detached { () -> Error? in
            var hasher = SHA256()
            do {
                _ = try FileDownload.get(url, headers: [:], appendingTo: file, hasher: &hasher, timeout: 10)
                return nil
            } catch { return error }
        }.value
        let error = try XCTUnwrap(outcome, "a short body was taken as whole")
        XCTAssertTrue("\(error)".contains("connection closed after \(sent.count) of \(3 * Self.mib) bytes"), "\(error)")
        XCTAssertTrue(try Data(contentsOf: file) == sent, "the file holds what came, in order")
    }

    /// A target that cannot be opened, and writes that fail (/dev/full: no space left), are
    /// errors that say so; the download stops early (the ring does not wait on the writer).
    func testWriteFailuresAreErrors() async throws {
        let port = try await startServer()
        try serve(Self.content(20 * Self.mib + 5), as: "f")
        func failure(_ target: URL, headers: [String: String] = [:]) async throws -> String {
            let url = URL(string: "http://127.0.0.1:\(port)/files/f")!
            let outcome = await Task.detached { () -> Error? in
                var hasher = SHA256()
                do {
                    _ = try FileDownload.get(url, headers: headers, appendingTo: target, hasher: &hasher, timeout: 10)
                    return nil
                } catch { return error }
            }.value
            return "\(try XCTUnwrap(outcome, "no error writing to \(target.path)"))"
        }
        let missing = dir.appendingPathComponent("missing/out")
        let e1 = try await failure(missing)
        XCTAssertTrue(e1.contains("cannot open \(missing.path) for writing: No such file or directory"), e1)
        guard FileManager.default.isWritableFile(atPath: "/dev/full") else { return }
        // Appended (206), as a resumed download: /dev/full takes no truncation, and refuses every write.
        let e2 = try await failure(URL(fileURLWithPath: "/dev/full"), headers: ["Range": "bytes=0-"])
        XCTAssertTrue(e2.contains("writing /dev/full failed: No space left on device"), e2)
    }

    /// Ranges of a file larger than the socket's buffers, sent with sendfile (plain HTTP): the
    /// middle at offsets inside pages, the tail, the whole; and HEAD sends no body. (A client
    /// that has not read a large answer yet is not served a next one on the same connection:
    /// one connection each.)
    func testRangesAreSentWithSendfile() async throws {
        let port = try await startServer()
        let size = 6 * Self.mib + 321
        let body = Self.content(size)
        try serve(body, as: "big.csv")
        func answer(_ request: String, head: Bool = false) throws -> RawClient.Answer {
            let c = try RawClient(port: port)
            c.send(request)
            return try XCTUnwrap(c.answer(head: head), request)
        }
        let middle = try answer(get("/files/big.csv", extra: "Range: bytes=123457-4567890\r\n"))
        XCTAssertEqual(middle.status, 206)
        XCTAssertEqual(middle.headers["content-range"], "bytes 123457-4567890/\(size)")
        XCTAssertTrue(middle.body == body[123_457...4_567_890])
        let tail = try answer(get("/files/big.csv", extra: "Range: bytes=\(size - 5000)-\r\n"))
        XCTAssertEqual(tail.status, 206)
        XCTAssertEqual(tail.headers["content-range"], "bytes \(size - 5000)-\(size - 1)/\(size)")
        XCTAssertTrue(tail.body == body[(size - 5000)...])
        let whole = try answer(get("/files/big.csv"))
        XCTAssertEqual(whole.status, 200)
        XCTAssertTrue(whole.body == body)
        // A small range and HEAD on one kept-alive connection, and the connection goes on.
        let c = try RawClient(port: port)
        c.send(get("/files/big.csv", extra: "Range: bytes=4095-8192\r\n"))
        XCTAssertTrue(try XCTUnwrap(c.answer()).body == body[4095...8192])
        c.send("HEAD /files/big.csv HTTP/1.1\r\nHost: t\r\n\r\n")
        let head = try XCTUnwrap(c.answer(head: true))
        XCTAssertEqual(head.headers["content-length"], "\(size)")
        c.send(get("/health"))
        XCTAssertEqual(c.answer()?.status, 200, "the connection carries on after a file")
    }

    /// A client that goes away in the middle of a file: the server carries on (no SIGPIPE from
    /// sendfile) and serves the next client.
    func testClientLeavingInTheMiddleOfAFile() async throws {
        let port = try await startServer()
        let body = Self.content(16 * Self.mib)
        try serve(body, as: "big.csv")
        for _ in 0..<3 {
            let c = try RawClient(port: port, receiveBuffer: 4096)
            c.send(get("/files/big.csv"))
            var some = [UInt8](repeating: 0, count: 1000)
            XCTAssertGreaterThan(some.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress!, $0.count, 0) }, 0)
            c.close()
        }
        let c = try RawClient(port: port)
        c.send(get("/files/big.csv", extra: "Range: bytes=0-99\r\n"))
        XCTAssertTrue(try XCTUnwrap(c.answer()).body == body.prefix(100))
    }
}
