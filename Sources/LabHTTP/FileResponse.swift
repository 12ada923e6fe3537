import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// Files served from disk: whole, or one byte range (206), streamed and never held in memory.
extension Response {
    /// A file streamed from disk, never held in memory (256 KiB at a time through Hummingbird's body writer).
    /// With a `Range: bytes=…` header (`range`), answers 206 with that part and `Content-Range`,
    /// so an interrupted download can resume; a range that cannot be satisfied or is not a
    /// valid byte range is 416 with `Content-Range: bytes */LEN` (RFC 9110 15.5.17), never a
    /// 206 with an impossible range. Throws 404 with `missing` when the file is not there or is
    /// not a regular file.
    public static func file(_ url: URL, contentType: String = "application/octet-stream", range: String? = nil, missing: String) throws -> Response {
        guard let file = OpenFile(path: url.path) else { throw HTTPError(.notFound, message: missing) }
        let size = file.size
        switch range.map({ ByteRange.parse($0, size: size) }) ?? .whole {
        case .part(let r):
            return .file(file, r, status: .partialContent, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes",
                                                                     "Content-Range": "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(size)"])
        case .unsatisfiable(let why):
            var r = Response.error(.rangeNotSatisfiable, "Range \(HTTPService.escaped(range ?? "")): \(why) (the file has \(size) bytes)")
            r["Content-Range"] = "bytes */\(size)"
            r["Accept-Ranges"] = "bytes"
            return r
        case .whole:
            return .file(file, 0..<size, status: .ok, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes"])
        }
    }

    /// `range` of an open regular file, read 256 KiB at a time when the answer is written.
    static func file(_ file: OpenFile, _ range: Range<Int>, status: HTTPResponse.Status, headers: [String: String]) -> Response {
        var r = Response(status, headers: headers)
        r.body = ResponseBody(contentLength: range.count) { writer in
            var offset = range.lowerBound
            var buffer = ByteBufferAllocator().buffer(capacity: 256 * 1024)
            while offset < range.upperBound {
                buffer.clear()
                let want = min(256 * 1024, range.upperBound - offset)
                let n = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: want) { raw in
                    max(0, file.read(into: raw, count: want, at: offset))
                }
                guard n > 0 else { throw HTTPError(.internalServerError, message: "the file ended at \(offset) of \(range.upperBound) bytes") }
                offset += n
                try await writer.write(buffer)
            }
            try await writer.finish(nil)
        }
        return r
    }
}

/// What a `Range` header asks of a representation of `size` bytes (RFC 9110 14.1.2, 14.2).
enum ByteRange: Equatable {
    /// Answer it whole (200): no range, another unit, or several ranges (not served as
    /// multipart; RFC 9110 lets a server ignore Range).
    case whole
    /// One satisfiable range, clamped to the file (206).
    case part(Range<Int>)
    /// A byte range that is invalid (`5-2`, signs, garbage) or starts at or past the end, or a
    /// zero suffix (416).
    case unsatisfiable(String)

    static func parse(_ header: String, size: Int) -> ByteRange {
        let text = header.trimmingCharacters(in: .whitespaces)
        guard let eq = text.firstIndex(of: "="), text[..<eq].trimmingCharacters(in: .whitespaces).lowercased() == "bytes" else { return .whole }
        let set = text[text.index(after: eq)...]
        if set.contains(",") { return .whole }
        let spec = set.trimmingCharacters(in: .whitespaces)
        let parts = spec.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2 else { return .unsatisfiable("not a byte range") }
        /// Plain digits only (no sign, no spaces), at most 18 of them (no overflow).
        func number(_ s: Substring) -> Int? {
            guard !s.isEmpty, s.count <= 18, s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int(s)
        }
        if parts[0].isEmpty {
            // -N: the last N bytes.
            guard let suffix = number(parts[1]) else { return .unsatisfiable("not a byte range") }
            guard suffix > 0, size > 0 else { return .unsatisfiable("an empty suffix") }
            return .part(max(0, size - suffix)..<size)
        }
        guard let first = number(parts[0]) else { return .unsatisfiable("not a byte range") }
        var last = size - 1
        if !parts[1].isEmpty {
            guard let l = number(parts[1]) else { return .unsatisfiable("not a byte range") }
            guard l >= first else { return .unsatisfiable("its end comes before its start") }
            last = min(l, size - 1)
        }
        guard first < size else { return .unsatisfiable("it starts at or past the end") }
        return .part(first..<(last + 1))
    }
}

/// A regular file opened for reading, closed when the last reference goes. Opened when the
/// answer is made (its size is then fixed for the answer), read when the answer is written.
public final class OpenFile: Sendable {
    public let fd: Int32
    public let size: Int

    /// Opens `path` if it is a regular file (a FIFO, device or directory is refused without
    /// blocking on it); nil otherwise.
    public init?(path: String) {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { Glibc.close(fd); return nil }
        self.fd = fd
        self.size = Int(st.st_size)
    }

    deinit { Glibc.close(fd) }

    /// Reads at most `count` bytes at `offset` into `buffer`; 0 at the end of the file.
    func read(into buffer: UnsafeMutableRawBufferPointer, count: Int, at offset: Int) -> Int {
        while true {
            let n = pread(fd, buffer.baseAddress!, min(count, buffer.count), off_t(offset))
            if n < 0 && errno == EINTR { continue }
            return n
        }
    }
}
