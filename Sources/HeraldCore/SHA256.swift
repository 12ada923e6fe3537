import Foundation

/// SHA-256 (FIPS 180-4), streaming. Used to checksum every file of a bundle, on nodes and on the
/// coordinator alike (Foundation on Linux has no CryptoKit).
public struct SHA256 {
    private var h: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) =
        (0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19)
    private var buffer = [UInt8](repeating: 0, count: 64)
    private var buffered = 0
    private var length: UInt64 = 0

    private static let k: [UInt32] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ]

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
                buffer.withUnsafeBytes { compress(UnsafeRawPointer($0.baseAddress!)) }
                buffered = 0
            }
        }
        while n - i >= 64 {
            compress(base + i)
            i += 64
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

    @inline(__always) private static func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }

    private mutating func compress(_ p: UnsafeRawPointer) {
        withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
            for t in 0..<16 {
                w[t] = UInt32(bigEndian: p.loadUnaligned(fromByteOffset: 4 * t, as: UInt32.self))
            }
            for t in 16..<64 {
                let s0 = Self.rotr(w[t - 15], 7) ^ Self.rotr(w[t - 15], 18) ^ (w[t - 15] >> 3)
                let s1 = Self.rotr(w[t - 2], 17) ^ Self.rotr(w[t - 2], 19) ^ (w[t - 2] >> 10)
                w[t] = w[t - 16] &+ s0 &+ w[t - 7] &+ s1
            }
            var (a, b, c, d, e, f, g, hh) = h
            Self.k.withUnsafeBufferPointer { k in
                for t in 0..<64 {
                    let S1 = Self.rotr(e, 6) ^ Self.rotr(e, 11) ^ Self.rotr(e, 25)
                    let ch = (e & f) ^ (~e & g)
                    let t1 = hh &+ S1 &+ ch &+ k[t] &+ w[t]
                    let S0 = Self.rotr(a, 2) ^ Self.rotr(a, 13) ^ Self.rotr(a, 22)
                    let maj = (a & b) ^ (a & c) ^ (b & c)
                    let t2 = S0 &+ maj
                    hh = g; g = f; f = e; e = d &+ t1; d = c; c = b; b = a; a = t1 &+ t2
                }
            }
            h = (h.0 &+ a, h.1 &+ b, h.2 &+ c, h.3 &+ d, h.4 &+ e, h.5 &+ f, h.6 &+ g, h.7 &+ hh)
        }
    }
}
