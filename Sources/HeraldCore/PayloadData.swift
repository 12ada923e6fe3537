import Foundation

/// The bytes a Herald device shares over the air: read from its payload characteristic,
/// written in signal bundles, and shown in every log by its `shortName`.
public struct PayloadData: Hashable, Sendable, CustomStringConvertible {
    public var data: Data

    public init(_ data: Data = Data()) { self.data = data }
    public init(_ bytes: [UInt8]) { self.data = Data(bytes) }

    public var count: Int { data.count }
    public var isEmpty: Bool { data.isEmpty }

    /// Herald's short name: empty payload -> ""; up to 3 bytes -> Base64 of it all; otherwise
    /// the first 6 characters of standard Base64 of bytes 3..end (skipping the header).
    public var shortName: String { Self.shortName(code: shortNameCode) }

    /// The short name's characters packed into an integer (the first in the lowest byte, the
    /// length in the top byte): equal codes, equal short names, and no String made. Only the
    /// bytes the characters come from are encoded (it is asked for on every measurement).
    public var shortNameCode: UInt64 {
        let n = data.count
        if n == 0 { return 0 }
        return data.withUnsafeBytes { raw in
            n <= 3 ? Self.base64Code(raw, from: 0, count: n, limit: 4) : Self.base64Code(raw, from: 3, count: min(6, n - 3), limit: 6)
        }
    }

    /// The short name a `shortNameCode` stands for.
    public static func shortName(code: UInt64) -> String {
        let length = Int(code >> 56)
        return String(unsafeUninitializedCapacity: length) { out in
            for k in 0..<length { out[k] = UInt8(truncatingIfNeeded: code >> UInt64(8 * k)) }
            return length
        }
    }

    /// The first `limit` characters (fewer when shorter, padding included) of standard Base64 of
    /// `count` bytes at `from`, packed as in `shortNameCode`.
    @inline(__always) private static func base64Code(_ raw: UnsafeRawBufferPointer, from: Int, count: Int, limit: Int) -> UInt64 {
        let alphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        let a = alphabet.utf8Start
        var code: UInt64 = 0, length = 0
        @inline(__always) func put(_ c: UInt8) {
            if length < limit { code |= UInt64(c) << UInt64(8 * length); length += 1 }
        }
        var i = 0
        while i < count, length < limit {
            let b0 = UInt32(raw[from + i])
            let b1 = i + 1 < count ? UInt32(raw[from + i + 1]) : 0
            let b2 = i + 2 < count ? UInt32(raw[from + i + 2]) : 0
            let v = b0 << 16 | b1 << 8 | b2
            put(a[Int(v >> 18 & 63)])
            put(a[Int(v >> 12 & 63)])
            put(i + 1 < count ? a[Int(v >> 6 & 63)] : 61) // "="
            put(i + 2 < count ? a[Int(v & 63)] : 61)
            i += 3
        }
        return code | UInt64(length) << 56
    }

    public var hexEncodedString: String { data.hexEncodedString }
    public var base64EncodedString: String { data.base64EncodedString() }
    public var description: String { shortName }
}

extension Data {
    /// Upper-case hex without separators.
    public var hexEncodedString: String {
        let digits = Array("0123456789ABCDEF".utf8)
        var out = [UInt8]()
        out.reserveCapacity(count * 2)
        for byte in self {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Parses hex (either case, optional separators `:`, `-` or spaces); nil on a bad digit.
    public init?(hexEncoded text: String) {
        var bytes = [UInt8]()
        var high: UInt8?
        for c in text.utf8 {
            let v: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): v = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): v = c - UInt8(ascii: "A") + 10
            case UInt8(ascii: ":"), UInt8(ascii: "-"), UInt8(ascii: " "): continue
            default: return nil
            }
            if let h = high { bytes.append(h << 4 | v); high = nil } else { high = v }
        }
        if high != nil { return nil }
        self.init(bytes)
    }

    mutating func appendLittleEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) }
    }

    func readLittleEndian<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T? {
        let size = MemoryLayout<T>.size
        guard offset >= 0, offset + size <= count else { return nil }
        var value: T = 0
        let start = startIndex + offset
        for i in 0..<size { value |= T(truncatingIfNeeded: self[start + i]) << (8 * i) }
        return value
    }
}
