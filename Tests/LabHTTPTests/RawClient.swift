import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A client on a raw socket: sends exactly the bytes a test gives, reads answers as they come.
final class RawClient: @unchecked Sendable {
    let fd: Int32
    private var buffer = [UInt8]()
    private let lock = NSLock()
    private var closed = false

    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: Data
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    init(port: UInt16, timeout: Double = 10) throws {
        fd = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        Sockets.setTimeouts(fd, seconds: timeout)
    }

    /// A client connecting from the loopback address `source` (127.0.0.2 and so on: another
    /// host, as the server sees it).
    init(port: UInt16, from source: String, timeout: Double = 10) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var local = sockaddr_in()
        local.sin_family = sa_family_t(AF_INET)
        local.sin_addr.s_addr = inet_addr(source)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let rc = bound != 0 ? bound : withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { Glibc.close(fd); throw NetError(.connect, "connect from \(source): \(NetError.text(errno: errno))") }
        Sockets.setTimeouts(fd, seconds: timeout)
    }

    /// A client whose receive buffer is `receiveBuffer` bytes (set before it connects, so that
    /// the window it offers stays that small).
    init(port: UInt16, receiveBuffer: Int32, timeout: Double = 10) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var size = receiveBuffer
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { Glibc.close(fd); throw NetError(.connect, "connect: \(NetError.text(errno: errno))") }
        Sockets.setTimeouts(fd, seconds: timeout)
    }

    deinit { close() }

    func close() {
        lock.lock(); defer { lock.unlock() }
        if !closed { closed = true; Glibc.close(fd) }
    }

    /// Sends every byte; false when the connection refuses them (reset, closed).
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, $0.count - off, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    @discardableResult
    func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// Reads more bytes into the buffer; false at the end of the stream, a reset or a timeout.
    private func receive() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            buffer.append(contentsOf: chunk[0..<n])
            return true
        }
    }

    /// One answer: head, then Content-Length bytes of body (none for `head: true`).
    func answer(head: Bool = false) -> Answer? {
        var end: Int?
        while true {
            if buffer.count >= 4 {
                for i in 0...(buffer.count - 4) where buffer[i] == 13 && buffer[i + 1] == 10 && buffer[i + 2] == 13 && buffer[i + 3] == 10 {
                    end = i
                    break
                }
            }
            if end != nil { break }
            guard receive() else { return nil }
        }
        let lines = String(decoding: buffer[0..<end!], as: UTF8.self).components(separatedBy: "\r\n")
        let parts = lines[0].split(separator: " ")
        guard parts.count >= 2, let status = Int(parts[1]) else { return nil }
        var headers = [String: String]()
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        buffer.removeFirst(end! + 4)
        let length = head ? 0 : Int(headers["content-length"] ?? "0") ?? 0
        while buffer.count < length {
            guard receive() else { return nil }
        }
        let body = Data(buffer[0..<length])
        buffer.removeFirst(length)
        return Answer(status: status, headers: headers, body: body)
    }

    /// Whether the server has closed the connection: reads until the end of the stream (true),
    /// or a timeout (false). Bytes that arrive meanwhile are kept.
    func closedByServer() -> Bool {
        while true {
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n > 0 { buffer.append(contentsOf: chunk[0..<n]); continue }
            if n == 0 { return true }
            return errno == ECONNRESET
        }
    }

    /// Bytes received and not yet taken by `answer()`.
    var pending: Int { buffer.count }
}

/// A GET with the usual fields.
func get(_ path: String, token: String? = nil, extra: String = "") -> String {
    "GET \(path) HTTP/1.1\r\nHost: test\r\n" + (token.map { "Authorization: Bearer \($0)\r\n" } ?? "") + extra + "\r\n"
}
