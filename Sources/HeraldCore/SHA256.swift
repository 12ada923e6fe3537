import Crypto
import Foundation

/// SHA-256, streaming: swift-crypto's (BoringSSL's compression function, on the CPU's SHA
/// extensions where it has them). Used to checksum every file of a bundle, on nodes and on the
/// coordinator alike, and for the HMAC of air tickets; this type adds file hashing and hex.
public struct SHA256: Sendable {
    private var hasher = Crypto.SHA256()

    public init() {}

    public mutating func update(_ data: Data) { hasher.update(data: data) }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) { hasher.update(bufferPointer: bytes) }

    /// The digest of everything fed so far (feeding may go on).
    public mutating func finalize() -> [UInt8] { Array(hasher.finalize()) }

    public mutating func finalizeHex() -> String { Data(finalize()).hexEncodedString.lowercased() }

    /// HMAC-SHA256 (RFC 2104) of `message` under `key`, hex.
    public static func hmac(key: Data, message: Data) -> String {
        Data(HMAC<Crypto.SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key))).hexEncodedString.lowercased()
    }

    public static func digest(_ data: Data) -> [UInt8] {
        var s = SHA256()
        s.update(data)
        return s.finalize()
    }

    public static func hash(_ data: Data) -> String {
        var s = SHA256()
        s.update(data)
        return s.finalizeHex()
    }

    /// Feeds a whole file, in 1 MiB chunks; returns its byte count.
    @discardableResult
    public mutating func update(contentsOf url: URL) throws -> Int64 {
        let handle = try FileHandle(forReadingFrom: url)
        defer { try? handle.close() }
        var total: Int64 = 0
        while let chunk = try handle.read(upToCount: 1 << 20), !chunk.isEmpty {
            update(chunk)
            total += Int64(chunk.count)
        }
        return total
    }

    /// Hashes a file; returns (hex digest, byte count).
    public static func hash(fileAt url: URL) throws -> (sha256: String, bytes: Int64) {
        var s = SHA256()
        let total = try s.update(contentsOf: url)
        return (s.finalizeHex(), total)
    }

    /// Whether this CPU has the SHA extensions BoringSSL's SHA-256 uses (benchmarks print it).
    public static let isAccelerated: Bool = {
        guard let info = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8) else { return false }
        return info.split(separator: "\n").contains { $0.hasPrefix("flags") && $0.split(separator: " ").contains("sha_ni") }
    }()
}
