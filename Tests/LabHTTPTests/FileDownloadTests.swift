import Foundation
import Hummingbird
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
/// the page-cache path for file systems that refuse O_DIRECT; and against raw servers: the ring
/// full (back-pressure), chunked bodies, a silent server. Every check is on the bytes and the
/// checksum; on time only where a timeout is the point.
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
        service.serve { r in
            r.routes().get("/files/:name") { request, context in
                try Response.file(root.appendingPathComponent(context.parameter("name")), range: request.headers[.range], missing: "no such file")
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        return port
    }

    func serve(_ data: Data, as name: String) throws {
        try data.write(to: served.appendingPathComponent(name))
    }

    /// Downloads `name` into `file`, resuming from `from` bytes when given; the result and the
    /// hex digest of `prefix` + the body.
    func download(_ port: UInt16, _ name: String, to file: URL, from: Int? = nil, prefix: Data = Data(),
                  mode: FileDownload.WriteMode = .direct) async throws -> (FileDownload.Result, String) {
        let url = URL(string: "http://127.0.0.1:\(port)/files/\(name)")!
        let headers = from.map { ["Range": "bytes=\($0)-"] } ?? [:]
        var hasher = SHA256()
        hasher.update(prefix)
        let result = try await FileDownload.get(url, headers: headers, appendingTo: file, hasher: &hasher, timeout: 10, mode: mode)
        return (result, hasher.finalizeHex())
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
        var hasher = SHA256()
        var outcome: Error?
        do { _ = try await FileDownload.get(url, headers: [:], appendingTo: file, hasher: &hasher, timeout: 10) } catch { outcome = error }
        let error = try XCTUnwrap(outcome, "a short body was taken as whole")
        XCTAssertTrue("\(error)".contains("connection closed after \(sent.count) of \(3 * Self.mib) bytes"), "\(error)")
        XCTAssertTrue(try Data(contentsOf: file) == sent, "the file holds what came, in order")
    }

    /// Back-pressure: while the writer is held, the download takes no more of a 96 MiB body
    /// than the ring (16 MiB) and the sockets' buffers hold, the client's event loops all still
    /// answer (nothing waits on them), another request goes through, and the wait for the disk
    /// does not count as the server being silent (timeout 1 s, writer held longer). Once the
    /// writer goes on, the file and the checksum are exact.
    func testBackPressureWhenTheRingIsFull() async throws {
        let body = Self.content(96 * Self.mib)
        let head = Data("HTTP/1.1 200 OK\r\nContent-Length: \(body.count)\r\n\r\n".utf8)
        let server = try OneShotServer(head + body)
        let file = dir.appendingPathComponent("out")
        FileManager.default.createFile(atPath: file.path, contents: nil)
        let gate = DispatchSemaphore(value: 0)
        let url = URL(string: "http://127.0.0.1:\(server.port)/f")!
        let download = Task { () throws -> (FileDownload.Result, String) in
            var hasher = SHA256()
            // The writer waits at the gate until it opens, then every batch passes.
            let result = try await FileDownload.get(url, headers: [:], appendingTo: file, hasher: &hasher, timeout: 1, mode: .direct,
                                                    beforeWrite: { gate.wait(); gate.signal() })
            return (result, hasher.finalizeHex())
        }
        // Until the server has sent nothing more for 1.5 s (the client has stopped reading).
        var last = -1, still = Date()
        let start = Date()
        while Date().timeIntervalSince(still) < 1.5 && Date().timeIntervalSince(start) < 30 {
            try await Task.sleep(nanoseconds: 100_000_000)
            let now = server.sent
            if now != last { (last, still) = (now, Date()) }
        }
        let taken = server.sent - head.count
        XCTAssertGreaterThanOrEqual(taken, 16 * Self.mib, "the ring was not filled")
        XCTAssertLessThan(taken, 48 * Self.mib, "the client read on while no buffer was free")
        // Every event loop of the client answers, and another request goes through them.
        let answered = Counter()
        var loops = 0
        for loop in LabHTTPClient.shared.eventLoopGroup.makeIterator() {
            loops += 1
            loop.execute { answered.add() }
        }
        for _ in 0..<50 where answered.value < loops { try await Task.sleep(nanoseconds: 100_000_000) }
        guard answered.value == loops else {
            XCTFail("an event loop is blocked")
            gate.signal() // (what blocks it may wait for the writer)
            _ = try? await download.value
            return
        }
        let port = try await startServer()
        let health: [String: String] = try await LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: nil).call("GET", "/health", timeout: 5)
        XCTAssertEqual(health["status"], "ok")
        gate.signal()
        let (result, sha) = try await download.value
        XCTAssertEqual(result.status, 200)
        XCTAssertEqual(result.bytes, Int64(body.count))
        XCTAssertEqual(sha, SHA256.hash(body))
        XCTAssertTrue(try Data(contentsOf: file) == body, "the file is not the body")
    }

    /// A resumed download (206 from inside a page) whose body ends early while the writer lags
    /// (the ring full, parts waiting for a buffer): an error naming what was written, the file
    /// is the part it had and that much of the rest, in order, and the hasher ends at its checksum.
    func testResumedBodyThatEndsEarlyWhileTheWriterLagsKeepsTheFileStart() async throws {
        let whole = Self.content(40 * Self.mib + 333)
        let have = 5000
        let rest = whole[have...]
        let head = Data("HTTP/1.1 206 Partial Content\r\nContent-Length: \(rest.count)\r\nContent-Range: bytes \(have)-\(whole.count - 1)/\(whole.count)\r\n\r\n".utf8)
        let sent = rest.prefix(25 * Self.mib + 777)
        let server = try OneShotServer(head + sent)
        let file = dir.appendingPathComponent("out")
        try whole.prefix(have).write(to: file)
        var hasher = SHA256()
        hasher.update(whole.prefix(have))
        let url = URL(string: "http://127.0.0.1:\(server.port)/f")!
        var outcome: Error?
        do {
            _ = try await FileDownload.get(url, headers: ["Range": "bytes=\(have)-"], appendingTo: file, hasher: &hasher, timeout: 10, mode: .direct,
                                           beforeWrite: { usleep(30_000) }) // a slow disk
        } catch { outcome = error }
        let error = "\(try XCTUnwrap(outcome, "a short body was taken as whole"))"
        let pattern = try NSRegularExpression(pattern: "connection closed after ([0-9]+) of \(rest.count) bytes")
        let match = try XCTUnwrap(pattern.firstMatch(in: error, range: NSRange(error.startIndex..., in: error)), error)
        let written = try XCTUnwrap(Int(error[Range(match.range(at: 1), in: error)!]))
        XCTAssertGreaterThan(written, 0)
        XCTAssertLessThanOrEqual(written, sent.count)
        XCTAssertTrue(try Data(contentsOf: file) == whole.prefix(have + written), "the file is not the body's start, in order")
        XCTAssertEqual(hasher.finalizeHex(), SHA256.hash(whole.prefix(have + written)))
    }

    /// A chunked body is written as it comes; one that ends before its last chunk is an error
    /// and the file holds what came.
    func testChunkedBodies() async throws {
        let body = Self.content(2 * Self.mib + 4321)
        var answer = Data("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
        var at = 0
        for size in [1000, Self.mib + 5, 70_000, 4096] + [body.count] {
            let n = min(size, body.count - at)
            guard n > 0 else { break }
            answer += Data(String(n, radix: 16).utf8) + Data("\r\n".utf8) + body[at..<(at + n)] + Data("\r\n".utf8)
            at += n
        }
        let file = dir.appendingPathComponent("out")
        try Data(repeating: 0xEE, count: 3 * Self.mib).write(to: file)
        let whole = try OneShotServer(answer + Data("0\r\n\r\n".utf8))
        var hasher = SHA256()
        let result = try await FileDownload.get(URL(string: "http://127.0.0.1:\(whole.port)/f")!, headers: [:], appendingTo: file, hasher: &hasher, timeout: 10)
        XCTAssertEqual(result.status, 200)
        XCTAssertEqual(result.bytes, Int64(body.count))
        XCTAssertEqual(hasher.finalizeHex(), SHA256.hash(body))
        XCTAssertTrue(try Data(contentsOf: file) == body)

        let cut = try OneShotServer(answer) // no last chunk
        hasher = SHA256()
        do {
            _ = try await FileDownload.get(URL(string: "http://127.0.0.1:\(cut.port)/f")!, headers: [:], appendingTo: file, hasher: &hasher, timeout: 10)
            XCTFail("a chunked body without its last chunk was taken as whole")
        } catch {
            XCTAssertTrue("\(error)".contains("connection closed after \(body.count) bytes, before the body's end"), "\(error)")
        }
        XCTAssertTrue(try Data(contentsOf: file) == body)
    }

    /// A server that goes silent in the middle of the body: an error after the timeout (no
    /// progress for that long), not later, and the file holds what came.
    func testSilentServerTimesOut() async throws {
        let part = Self.content(3 * Self.mib + 10)
        let server = try OneShotServer(Data("HTTP/1.1 200 OK\r\nContent-Length: \(10 * Self.mib)\r\n\r\n".utf8) + part, linger: 10)
        let file = dir.appendingPathComponent("out")
        FileManager.default.createFile(atPath: file.path, contents: nil)
        var hasher = SHA256()
        let t0 = Date()
        do {
            _ = try await FileDownload.get(URL(string: "http://127.0.0.1:\(server.port)/f")!, headers: [:], appendingTo: file, hasher: &hasher, timeout: 1)
            XCTFail("a silent server was waited for")
        } catch {
            XCTAssertTrue("\(error)".contains("nothing received for 1 s, after \(part.count) of \(10 * Self.mib) bytes"), "\(error)")
        }
        let waited = Date().timeIntervalSince(t0)
        XCTAssertGreaterThanOrEqual(waited, 0.9)
        XCTAssertLessThan(waited, 5)
        XCTAssertTrue(try Data(contentsOf: file) == part)
        XCTAssertEqual(hasher.finalizeHex(), SHA256.hash(part))
        // Silent before the head: the file is not touched.
        let mute = try OneShotServer(Data(), linger: 10)
        do {
            _ = try await FileDownload.get(URL(string: "http://127.0.0.1:\(mute.port)/f")!, headers: [:], appendingTo: file, hasher: &hasher, timeout: 1)
            XCTFail("a server that never answered was waited for")
        } catch {
            XCTAssertTrue("\(error)".hasSuffix("/f: no answer within 1 s"), "\(error)")
        }
        XCTAssertTrue(try Data(contentsOf: file) == part)
    }

    /// Another status than 200 or 206: its status and the body's first bytes; the file is untouched.
    func testRefusalCarriesStatusAndBody() async throws {
        let port = try await startServer()
        let file = dir.appendingPathComponent("out")
        try Data("kept".utf8).write(to: file)
        var hasher = SHA256()
        do {
            _ = try await FileDownload.get(URL(string: "http://127.0.0.1:\(port)/files/none")!, headers: [:], appendingTo: file, hasher: &hasher, timeout: 10)
            XCTFail("a 404 was taken")
        } catch let e as LabClient.Failure {
            XCTAssertEqual(e.status, 404)
            XCTAssertTrue(e.message.contains("no such file"), e.message)
        }
        XCTAssertEqual(try Data(contentsOf: file), Data("kept".utf8))
    }

    /// A target that cannot be opened, and writes that fail (/dev/full: no space left), are
    /// errors that say so; the download stops early (the ring does not wait on the writer).
    func testWriteFailuresAreErrors() async throws {
        let port = try await startServer()
        try serve(Self.content(20 * Self.mib + 5), as: "f")
        func failure(_ target: URL, headers: [String: String] = [:]) async throws -> String {
            let url = URL(string: "http://127.0.0.1:\(port)/files/f")!
            var hasher = SHA256()
            var outcome: Error?
            do { _ = try await FileDownload.get(url, headers: headers, appendingTo: target, hasher: &hasher, timeout: 10) } catch { outcome = error }
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

/// A count several threads add to.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.withLock { n += 1 } }
    func set(_ v: Int) { lock.withLock { n = v } }
    var value: Int { lock.withLock { n } }
}

/// A server of one connection over plain sockets: reads the request to its end, sends `answer`
/// (head and body) 64 KiB at a time, waits `linger` seconds and closes. `sent` is how much of
/// the answer the kernel has taken so far.
final class OneShotServer: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let count = Counter()
    var sent: Int { count.value }

    init(_ answer: Data, linger: TimeInterval = 0) throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        (listener, self.port) = (fd, port)
        let count = self.count
        Thread {
            guard let c = Listener.accept(fd) else { return }
            defer { close(c) }
            // The request, to its end, before answering (so that closing sends no reset).
            var request = [UInt8]()
            var chunk = [UInt8](repeating: 0, count: 4096)
            while !request.suffix(4).elementsEqual([13, 10, 13, 10]) {
                let n = chunk.withUnsafeMutableBytes { recv(c, $0.baseAddress!, $0.count, 0) }
                if n <= 0 { return }
                request += chunk[0..<n]
            }
            answer.withUnsafeBytes { raw in
                var off = 0
                while off < raw.count {
                    let n = send(c, raw.baseAddress! + off, min(64 << 10, raw.count - off), Int32(MSG_NOSIGNAL))
                    if n <= 0 { return }
                    off += n
                    count.set(off)
                }
            }
            if linger > 0 { Thread.sleep(forTimeInterval: linger) }
        }.start()
    }

    deinit { close(listener) }
}
