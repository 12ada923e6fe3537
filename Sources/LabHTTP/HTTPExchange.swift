import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// One HTTP/1.1 request and its answer over a socket from `Dialer` (`Connection: close`): what
/// `LabClient` sends its calls with. Blocking, so it runs on a thread of its own.
///
/// It replaces URLSession, whose Linux implementation (swift-corelibs-foundation over libcurl's
/// multi-socket API) spins while it waits for an answer: libcurl first asks to watch a new
/// connection for writing (CURL_POLL_OUT, the connect), then only for reading (CURL_POLL_IN),
/// and Foundation adds a read source without cancelling the write source. The socket stays
/// writable, so the write source fires without end and every firing runs
/// curl_multi_socket_action: a core busy for as long as a server takes to answer, the whole
/// timeout when a coordinator is stopped or unreachable.
enum HTTPExchange {
    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: Data
    }

    /// `timeout` bounds the connect and every wait for bytes (like URLSession's request timeout).
    static func perform(_ method: String, _ url: URL, headers: [String: String], body: Data?, timeout: TimeInterval) throws -> Answer {
        let target = try HostPort(url: url)
        let fd = try Connection.dial(url: url, timeout: timeout)
        defer { fd.close() }
        fd.setTimeouts(seconds: timeout)
        let components = URLComponents(url: url, resolvingAgainstBaseURL: true)
        var requestTarget = components?.percentEncodedPath ?? "/"
        if requestTarget.isEmpty { requestTarget = "/" }
        if let q = components?.percentEncodedQuery { requestTarget += "?" + q }
        var head = "\(method) \(requestTarget) HTTP/1.1\r\nHost: \(target)\r\nConnection: close\r\nAccept: */*\r\n"
        for (k, v) in headers.sorted(by: { $0.key < $1.key }) where !["host", "connection", "content-length"].contains(k.lowercased()) {
            head += "\(k): \(v)\r\n"
        }
        if body != nil || ["POST", "PUT", "PATCH"].contains(method) { head += "Content-Length: \(body?.count ?? 0)\r\n" }
        head += "\r\n"
        var request = Data(head.utf8)
        if let body { request.append(body) }
        try sendAll(fd, request, timeout: timeout)
        return try readAnswer(fd, method: method, timeout: timeout)
    }

    private static func sendAll(_ fd: Connection, _ data: Data, timeout: TimeInterval) throws {
        do { try fd.write(data) } catch let e as NetError where e.kind == .timeout {
            throw NetError(.timeout, "timed out sending after \(Int(timeout)) s")
        }
    }

    /// Reads bytes into `buffer`; false at the end of the stream.
    private static func receive(_ fd: Connection, into buffer: inout Data, timeout: TimeInterval) throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n: Int
        do { n = try fd.read(into: &chunk) } catch let e as NetError where e.kind == .timeout {
            throw NetError(.timeout, "no answer within \(Int(timeout)) s")
        }
        if n == 0 { return false }
        buffer.append(contentsOf: chunk[0..<n])
        return true
    }

    private static func readAnswer(_ fd: Connection, method: String, timeout: TimeInterval) throws -> Answer {
        var data = Data()
        let separator = Data("\r\n\r\n".utf8)
        var headEnd: Range<Data.Index>?
        while headEnd == nil {
            guard try receive(fd, into: &data, timeout: timeout) else {
                throw NetError(.protocolError, data.isEmpty ? "the server closed the connection without an answer" : "the answer's head is cut short")
            }
            headEnd = data.range(of: separator)
            if headEnd == nil && data.count > 1 << 20 { throw NetError(.protocolError, "the answer's head is over 1 MB") }
        }
        let lines = String(decoding: data[data.startIndex..<headEnd!.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let statusParts = lines.first?.split(separator: " ") ?? []
        guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/"), let status = Int(statusParts[1]) else {
            throw NetError(.protocolError, "bad status line \"\(lines.first ?? "")\"")
        }
        var headers = [String: String]()
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        var rest = Data(data[headEnd!.upperBound...])
        if method == "HEAD" || status == 204 || status == 304 || (100..<200).contains(status) {
            return Answer(status: status, headers: headers, body: Data())
        }
        if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
            return Answer(status: status, headers: headers, body: try readChunked(fd, &rest, timeout: timeout))
        }
        if let lengthText = headers["content-length"] {
            guard let length = Int(lengthText), length >= 0 else { throw NetError(.protocolError, "bad Content-Length \"\(lengthText)\"") }
            while rest.count < length {
                guard try receive(fd, into: &rest, timeout: timeout) else {
                    throw NetError(.protocolError, "the connection closed after \(rest.count) of \(length) bytes")
                }
            }
            return Answer(status: status, headers: headers, body: rest.prefix(length))
        }
        while try receive(fd, into: &rest, timeout: timeout) {}
        return Answer(status: status, headers: headers, body: rest)
    }

    private static func readChunked(_ fd: Connection, _ buffer: inout Data, timeout: TimeInterval) throws -> Data {
        var body = Data()
        let crlf = Data("\r\n".utf8)
        func line() throws -> String {
            while true {
                if let r = buffer.range(of: crlf) {
                    let text = String(decoding: buffer[buffer.startIndex..<r.lowerBound], as: UTF8.self)
                    buffer = Data(buffer[r.upperBound...])
                    return text
                }
                guard try receive(fd, into: &buffer, timeout: timeout) else { throw NetError(.protocolError, "the chunked answer is cut short") }
            }
        }
        while true {
            let sizeText = try line().split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
            guard let size = Int(sizeText, radix: 16), size >= 0 else { throw NetError(.protocolError, "bad chunk size \"\(sizeText)\"") }
            if size == 0 {
                while try !line().isEmpty {}   // trailers
                return body
            }
            while buffer.count < size + 2 {
                guard try receive(fd, into: &buffer, timeout: timeout) else { throw NetError(.protocolError, "the chunked answer is cut short") }
            }
            body.append(buffer.prefix(size))
            buffer = Data(buffer.dropFirst(size + 2))
        }
    }
}
