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
    public var shortName: String {
        if data.isEmpty { return "" }
        if data.count <= 3 { return data.base64EncodedString() }
        return String(data.dropFirst(3).base64EncodedString().prefix(6))
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
