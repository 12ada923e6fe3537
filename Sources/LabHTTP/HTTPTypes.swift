import Foundation
import HeraldCore
import Hummingbird
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

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

/// JSON as every HeraldLab endpoint speaks it (times are numbers: seconds since 1970).
public enum LabJSON {
    public static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return e
    }()
    public static let decoder = JSONDecoder()

    /// A request body as `T`: the bytes as they are for `Data`, nothing for `NoBody`, JSON
    /// otherwise (400 "request body is not a valid T: ..." when it is not one).
    public static func decode<T: Decodable>(_ type: T.Type, from data: Data) throws -> T {
        if let raw = data as? T { return raw }
        if let none = NoBody() as? T { return none }
        do { return try decoder.decode(T.self, from: data) } catch {
            throw HTTPError(.badRequest, message: "request body is not a valid \(T.self): \(describe(error))")
        }
    }

    static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let ctx): return "missing field \((ctx.codingPath + [key]).map(\.stringValue).joined(separator: "."))"
        case DecodingError.typeMismatch(_, let ctx), DecodingError.valueNotFound(_, let ctx), DecodingError.dataCorrupted(let ctx):
            return "\(ctx.codingPath.map(\.stringValue).joined(separator: ".")): \(ctx.debugDescription)"
        default: return "\(error)"
        }
    }
}

/// The shared token: `HERALDLAB_TOKEN`, or the first line of a token file.
public enum LabToken {
    public static func load(file: String?) throws -> String? {
        if let file {
            let text: String
            do { text = try String(contentsOfFile: file, encoding: .utf8) } catch {
                throw ServiceError("cannot read the token file \(file): \(error.localizedDescription)")
            }
            let token = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
            guard token.count >= minimumLength else {
                throw ServiceError("the token in \(file) is shorter than \(minimumLength) characters (\(token.count)): too easy to guess; herald-lab ca init writes one of 64")
            }
            return token
        }
        if let env = ProcessInfo.processInfo.environment["HERALDLAB_TOKEN"], !env.isEmpty {
            guard env.count >= minimumLength else {
                throw ServiceError("HERALDLAB_TOKEN is shorter than \(minimumLength) characters (\(env.count)): too easy to guess; herald-lab ca init writes one of 64")
            }
            return env
        }
        return nil
    }

    /// The shortest credential a service or client takes (a 2-character HERALDLAB_TOKEN was
    /// accepted once, issue 36).
    public static let minimumLength = 32

    /// A new random token (hex, 32 bytes).
    public static func generate() -> String {
        var g = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }
}
