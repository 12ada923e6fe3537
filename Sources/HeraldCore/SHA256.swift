import CSHA256
import Foundation

/// SHA-256 (FIPS 180-4), streaming. Used to checksum every file of a bundle, on nodes and on the
/// coordinator alike (Foundation on Linux has no CryptoKit). The compression function is in C
/// (CSHA256): the CPU's SHA extensions where it has them (about 1.7 GB/s a core), portable C
/// otherwise; this type keeps the buffering, the padding and the API.
public struct SHA256 {
    private var h: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) =
        (0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19)
    private var buffer = [UInt8](repeating: 0, count: 64)
    private var buffered = 0
    private var length: UInt64 = 0

    public init() {}

    public mutating func update(_ data: Data) {
        data.withUnsafeBytes { update(UnsafeRawBufferPointer($0)) }
    }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        var i = 0
        let n = bytes.count
        length &+= UInt64(n)
        if buffered > 0 {
            let take = min(64 - buffered, n)
            for j in 0..<take { buffer[buffered + j] = base.load(fromByteOffset: j, as: UInt8.self) }
            buffered += take
            i = take
            if buffered == 64 {
                buffer.withUnsafeBytes { compress(UnsafeRawPointer($0.baseAddress!), blocks: 1) }
                buffered = 0
            }
        }
        if n - i >= 64 {
            let blocks = (n - i) / 64
            compress(base + i, blocks: blocks)
            i += 64 * blocks
        }
        while i < n {
            buffer[buffered] = base.load(fromByteOffset: i, as: UInt8.self)
            buffered += 1
            i += 1
        }
    }

    public mutating func finalize() -> [UInt8] {
        let bitLength = length &* 8
        var pad = [UInt8](repeating: 0, count: buffered < 56 ? 56 - buffered : 120 - buffered)
        pad[0] = 0x80
        let savedLength = length
        pad.withUnsafeBytes { update($0) }
        var lenBytes = [UInt8](repeating: 0, count: 8)
        for j in 0..<8 { lenBytes[j] = UInt8(truncatingIfNeeded: bitLength >> (56 - 8 * UInt64(j))) }
        lenBytes.withUnsafeBytes { update($0) }
        length = savedLength
        var out = [UInt8]()
        out.reserveCapacity(32)
        for word in [h.0, h.1, h.2, h.3, h.4, h.5, h.6, h.7] {
            out.append(UInt8(word >> 24)); out.append(UInt8(truncatingIfNeeded: word >> 16))
            out.append(UInt8(truncatingIfNeeded: word >> 8)); out.append(UInt8(truncatingIfNeeded: word))
        }
        return out
    }

    public mutating func finalizeHex() -> String { Data(finalize()).hexEncodedString.lowercased() }

    /// HMAC-SHA256 (RFC 2104) of `message` under `key`, hex.
    public static func hmac(key: Data, message: Data) -> String {
        var k = key.count > 64 ? Data(SHA256.digest(key)) : key
        k.append(Data(repeating: 0, count: 64 - k.count))
        var inner = SHA256()
        inner.update(Data(k.map { $0 ^ 0x36 }))
        inner.update(message)
        var outer = SHA256()
        outer.update(Data(k.map { $0 ^ 0x5c }))
        outer.update(Data(inner.finalize()))
        return outer.finalizeHex()
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

    /// Whether the compression runs on the CPU's SHA extensions (benchmarks print it).
    public static var isAccelerated: Bool { csha256_accelerated() != 0 }

    private mutating func compress(_ p: UnsafeRawPointer, blocks: Int) {
        withUnsafeMutableBytes(of: &h) { state in
            csha256_blocks(state.baseAddress!.assumingMemoryBound(to: UInt32.self), p.assumingMemoryBound(to: UInt8.self), blocks)
        }
    }
}
