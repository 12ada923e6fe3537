// DBusValue: one self-describing value type for every D-Bus signature BlueZ uses.
//
// Every case knows its own signature, including empty containers: arrays carry their element
// signature and dictionaries their key and value signatures, so an empty `ao`, `as` or `a{sv}`
// still marshals with the right type.

/// A D-Bus value with its type.
public indirect enum DBusValue: Sendable, Hashable {
    case byte(UInt8)             // y
    case bool(Bool)              // b
    case int16(Int16)            // n
    case uint16(UInt16)          // q
    case int32(Int32)            // i
    case uint32(UInt32)          // u
    case int64(Int64)            // x
    case uint64(UInt64)          // t
    case double(Double)          // d
    case string(String)          // s
    case objectPath(String)      // o
    case signature(String)       // g
    /// A unix file descriptor (h). When read from a message the descriptor is a duplicate owned
    /// by the receiver; when written, libdbus duplicates it.
    case unixFD(Int32)           // h
    case variant(DBusValue)      // v
    /// `ay` fast path: marshalled with the fixed-array append, read with the fixed-array getter.
    case bytes([UInt8])          // ay
    /// An array whose elements all have `elementSignature` (one complete type).
    case array(elementSignature: String, [DBusValue])
    /// A dictionary `a{KV}`; `keySignature` is a basic type. Entry order is preserved.
    case dictionary(keySignature: String, valueSignature: String, [DBusDictEntry])
    /// A struct `(...)` with at least one field.
    case structure([DBusValue])

    /// The complete D-Bus type signature of this value.
    public var signature: String {
        switch self {
        case .byte: return "y"
        case .bool: return "b"
        case .int16: return "n"
        case .uint16: return "q"
        case .int32: return "i"
        case .uint32: return "u"
        case .int64: return "x"
        case .uint64: return "t"
        case .double: return "d"
        case .string: return "s"
        case .objectPath: return "o"
        case .signature: return "g"
        case .unixFD: return "h"
        case .variant: return "v"
        case .bytes: return "ay"
        case .array(let element, _): return "a" + element
        case .dictionary(let k, let v, _): return "a{" + k + v + "}"
        case .structure(let fields): return "(" + fields.map(\.signature).joined() + ")"
        }
    }
}

/// One entry of a D-Bus dictionary.
public struct DBusDictEntry: Sendable, Hashable {
    public var key: DBusValue
    public var value: DBusValue
    public init(_ key: DBusValue, _ value: DBusValue) {
        self.key = key
        self.value = value
    }
}

/// The signature of a list of values (a message body).
public func dbusSignature(of values: [DBusValue]) -> String {
    values.map(\.signature).joined()
}

// MARK: - Construction helpers

extension DBusValue {
    /// `as`
    public static func stringArray(_ strings: [String]) -> DBusValue {
        .array(elementSignature: "s", strings.map { .string($0) })
    }

    /// `ao`
    public static func objectPathArray(_ paths: [String]) -> DBusValue {
        .array(elementSignature: "o", paths.map { .objectPath($0) })
    }

    /// `a{sv}` from a Swift dictionary; keys are sorted so the output is deterministic.
    /// Values are wrapped in variants unless they already are variants.
    public static func variantDictionary(_ dict: [String: DBusValue]) -> DBusValue {
        .dictionary(keySignature: "s", valueSignature: "v", dict.keys.sorted().map { key in
            let value = dict[key]!
            if case .variant = value { return DBusDictEntry(.string(key), value) }
            return DBusDictEntry(.string(key), .variant(value))
        })
    }

    /// `a{qv}` (BlueZ manufacturer data: company id -> variant ay), sorted by key.
    public static func manufacturerData(_ dict: [UInt16: [UInt8]]) -> DBusValue {
        .dictionary(keySignature: "q", valueSignature: "v", dict.keys.sorted().map { key in
            DBusDictEntry(.uint16(key), .variant(.bytes(dict[key]!)))
        })
    }
}

// MARK: - Convenience accessors

extension DBusValue {
    /// The value inside any number of nested variants.
    public var unwrapped: DBusValue {
        if case .variant(let inner) = self { return inner.unwrapped }
        return self
    }

    public var stringValue: String? {
        switch unwrapped {
        case .string(let s), .objectPath(let s), .signature(let s): return s
        default: return nil
        }
    }

    public var boolValue: Bool? {
        if case .bool(let b) = unwrapped { return b }
        return nil
    }

    /// Any integer case converted to Int (nil for other types or if out of range).
    public var intValue: Int? {
        switch unwrapped {
        case .byte(let v): return Int(v)
        case .int16(let v): return Int(v)
        case .uint16(let v): return Int(v)
        case .int32(let v): return Int(v)
        case .uint32(let v): return Int(v)
        case .int64(let v): return Int(v)
        case .uint64(let v): return Int(exactly: v)
        case .unixFD(let v): return Int(v)
        default: return nil
        }
    }

    public var doubleValue: Double? {
        if case .double(let d) = unwrapped { return d }
        return nil
    }

    /// Bytes of an `ay` (also accepts a generic array of bytes).
    public var bytesValue: [UInt8]? {
        switch unwrapped {
        case .bytes(let b): return b
        case .array("y", let elements):
            var out: [UInt8] = []
            for e in elements { guard case .byte(let b) = e else { return nil }; out.append(b) }
            return out
        default: return nil
        }
    }

    /// Elements of an array (an `ay` gives `.byte` elements; a dictionary gives nil).
    public var arrayValue: [DBusValue]? {
        switch unwrapped {
        case .array(_, let elements): return elements
        case .bytes(let b): return b.map { .byte($0) }
        default: return nil
        }
    }

    /// Strings of an `as`, `ao` or `ag`.
    public var stringArrayValue: [String]? {
        guard let elements = arrayValue else { return nil }
        var out: [String] = []
        for e in elements { guard let s = e.stringValue else { return nil }; out.append(s) }
        return out
    }

    /// Entries of a dictionary.
    public var dictionaryEntries: [DBusDictEntry]? {
        if case .dictionary(_, _, let entries) = unwrapped { return entries }
        return nil
    }

    /// A string-keyed dictionary (`a{sv}`, `a{oa{sv}}`, ...), values as they are (not unwrapped).
    public var stringKeyedDictionary: [String: DBusValue]? {
        guard let entries = dictionaryEntries else { return nil }
        var out: [String: DBusValue] = [:]
        for e in entries { guard let k = e.key.stringValue else { return nil }; out[k] = e.value }
        return out
    }

    /// Looks a key up in a string- or object-path-keyed dictionary.
    public subscript(key: String) -> DBusValue? {
        dictionaryEntries?.first(where: { $0.key.stringValue == key })?.value
    }

    /// Fields of a struct.
    public var structFields: [DBusValue]? {
        if case .structure(let f) = unwrapped { return f }
        return nil
    }
}

// MARK: - Literals

extension DBusValue: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
}

extension DBusValue: ExpressibleByBooleanLiteral {
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}

extension DBusValue: CustomStringConvertible {
    public var description: String {
        switch self {
        case .byte(let v): return "y \(v)"
        case .bool(let v): return "b \(v)"
        case .int16(let v): return "n \(v)"
        case .uint16(let v): return "q \(v)"
        case .int32(let v): return "i \(v)"
        case .uint32(let v): return "u \(v)"
        case .int64(let v): return "x \(v)"
        case .uint64(let v): return "t \(v)"
        case .double(let v): return "d \(v)"
        case .string(let v): return "s \"\(v)\""
        case .objectPath(let v): return "o \"\(v)\""
        case .signature(let v): return "g \"\(v)\""
        case .unixFD(let v): return "h \(v)"
        case .variant(let v): return "v <\(v)>"
        case .bytes(let b): return "ay [\(b.map { String($0) }.joined(separator: ","))]"
        case .array(let sig, let e): return "a\(sig) [\(e.map(\.description).joined(separator: ", "))]"
        case .dictionary(let k, let v, let e):
            return "a{\(k)\(v)} {\(e.map { "\($0.key.description): \($0.value.description)" }.joined(separator: ", "))}"
        case .structure(let f): return "(\(f.map(\.description).joined(separator: ", ")))"
        }
    }
}

// MARK: - Signature parsing

/// Signature utilities (pure Swift; libdbus validates as well before anything is marshalled).
public enum DBusSignature {
    static let basicCodes: Set<Character> = ["y", "b", "n", "q", "i", "u", "x", "t", "d", "s", "o", "g", "h"]

    public static func isBasic(_ sig: String) -> Bool {
        sig.count == 1 && basicCodes.contains(sig.first!)
    }

    /// Splits a signature into its complete types; nil if malformed.
    public static func split(_ sig: String) -> [String]? {
        let chars = Array(sig)
        var i = 0
        var out: [String] = []
        while i < chars.count {
            guard let end = completeTypeEnd(chars, i, depth: 0) else { return nil }
            out.append(String(chars[i..<end]))
            i = end
        }
        return out
    }

    private static func completeTypeEnd(_ c: [Character], _ start: Int, depth: Int) -> Int? {
        guard start < c.count, depth < 64 else { return nil }
        let ch = c[start]
        if basicCodes.contains(ch) || ch == "v" { return start + 1 }
        switch ch {
        case "a":
            if start + 1 < c.count, c[start + 1] == "{" {
                guard start + 2 < c.count, basicCodes.contains(c[start + 2]) else { return nil }
                guard let vEnd = completeTypeEnd(c, start + 3, depth: depth + 1),
                      vEnd < c.count, c[vEnd] == "}" else { return nil }
                return vEnd + 1
            }
            return completeTypeEnd(c, start + 1, depth: depth + 1)
        case "(":
            var i = start + 1
            var fields = 0
            while i < c.count, c[i] != ")" {
                guard let e = completeTypeEnd(c, i, depth: depth + 1) else { return nil }
                i = e
                fields += 1
            }
            guard i < c.count, fields > 0 else { return nil }
            return i + 1
        default:
            return nil
        }
    }
}
