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
    /// Only the bytes the six characters come from are encoded (it is asked for on every
    /// measurement with a payload).
    public var shortName: String {
        let n = data.count
        if n == 0 { return "" }
        if n <= 3 { return data.base64EncodedString() }
        return data.withUnsafeBytes { raw in Self.base64Prefix(raw, from: 3, count: min(6, n - 3)) }
    }

    /// The first six characters (fewer when shorter, padding included) of standard Base64 of
    /// `count` (1...6) bytes at `from`: what Base64 of all the bytes from `from` begins with.
    private static func base64Prefix(_ raw: UnsafeRawBufferPointer, from: Int, count: Int) -> String {
        let alphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        let a = alphabet.utf8Start
        let length = min(6, (count + 2) / 3 * 4)
        return String(unsafeUninitializedCapacity: 8) { out in
            var o = 0, i = 0
            while i < count {
                let b0 = UInt32(raw[from + i])
                let b1 = i + 1 < count ? UInt32(raw[from + i + 1]) : 0
                let b2 = i + 2 < count ? UInt32(raw[from + i + 2]) : 0
                let v = b0 << 16 | b1 << 8 | b2
                out[o] = a[Int(v >> 18 & 63)]
                out[o + 1] = a[Int(v >> 12 & 63)]
                out[o + 2] = i + 1 < count ? a[Int(v >> 6 & 63)] : 61 // "="
                out[o + 3] = i + 2 < count ? a[Int(v & 63)] : 61
                o += 4
                i += 3
            }
            return length
        }
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
