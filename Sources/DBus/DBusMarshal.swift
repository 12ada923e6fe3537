// Recursive reader and writer between DBusValue and libdbus message iterators.
//
// Called only on the connection's queue (they touch libdbus messages). Values are validated
// in Swift before anything is appended: libdbus aborts the process on many check failures
// (invalid object path, element type mismatch), so nothing invalid may reach it.
import CDBus

/// D-Bus type codes (`DBUS_TYPE_*` are cast macros that do not import into Swift).
enum DBusTypeCode {
    static let invalid: Int32 = 0
    static let byte = Int32(UInt8(ascii: "y"))
    static let boolean = Int32(UInt8(ascii: "b"))
    static let int16 = Int32(UInt8(ascii: "n"))
    static let uint16 = Int32(UInt8(ascii: "q"))
    static let int32 = Int32(UInt8(ascii: "i"))
    static let uint32 = Int32(UInt8(ascii: "u"))
    static let int64 = Int32(UInt8(ascii: "x"))
    static let uint64 = Int32(UInt8(ascii: "t"))
    static let double = Int32(UInt8(ascii: "d"))
    static let string = Int32(UInt8(ascii: "s"))
    static let objectPath = Int32(UInt8(ascii: "o"))
    static let signature = Int32(UInt8(ascii: "g"))
    static let unixFD = Int32(UInt8(ascii: "h"))
    static let array = Int32(UInt8(ascii: "a"))
    static let variant = Int32(UInt8(ascii: "v"))
    static let structure = Int32(UInt8(ascii: "r"))
    static let dictEntry = Int32(UInt8(ascii: "e"))
}

/// Errors building or reading a message.
public enum DBusMarshalError: Error, Sendable, Equatable, CustomStringConvertible {
    case invalidValue(String)
    case outOfMemory
    case unsupportedType(Int32)

    public var description: String {
        switch self {
        case .invalidValue(let why): return "invalid D-Bus value: \(why)"
        case .outOfMemory: return "libdbus out of memory"
        case .unsupportedType(let t): return "unsupported D-Bus type code \(t)"
        }
    }
}

// MARK: - Validation

enum DBusValidate {
    static func objectPath(_ path: String) -> Bool {
        !path.utf8.contains(0) && dbus_validate_path(path, nil) != 0
    }

    static func singleType(_ sig: String) -> Bool {
        !sig.utf8.contains(0) && dbus_signature_validate_single(sig, nil) != 0
    }

    static func signature(_ sig: String) -> Bool {
        !sig.utf8.contains(0) && dbus_signature_validate(sig, nil) != 0
    }

    static func interfaceName(_ name: String) -> Bool {
        !name.utf8.contains(0) && dbus_validate_interface(name, nil) != 0
    }

    static func memberName(_ name: String) -> Bool {
        !name.utf8.contains(0) && dbus_validate_member(name, nil) != 0
    }

    static func busName(_ name: String) -> Bool {
        !name.utf8.contains(0) && dbus_validate_bus_name(name, nil) != 0
    }

    static func errorName(_ name: String) -> Bool {
        !name.utf8.contains(0) && dbus_validate_error_name(name, nil) != 0
    }

    /// Checks a value recursively so that libdbus never sees anything it would reject.
    static func value(_ v: DBusValue, depth: Int = 0) throws {
        guard depth < 32 else { throw DBusMarshalError.invalidValue("nesting deeper than 32") }
        switch v {
        case .string(let s):
            if s.utf8.contains(0) { throw DBusMarshalError.invalidValue("string contains NUL") }
        case .objectPath(let p):
            if !objectPath(p) { throw DBusMarshalError.invalidValue("invalid object path '\(p)'") }
        case .signature(let g):
            if !signature(g) { throw DBusMarshalError.invalidValue("invalid signature '\(g)'") }
        case .variant(let inner):
            try value(inner, depth: depth + 1)
        case .array(let element, let elements):
            guard singleType(element) else {
                throw DBusMarshalError.invalidValue("invalid array element signature '\(element)'")
            }
            if element.hasPrefix("{") {
                throw DBusMarshalError.invalidValue("use .dictionary for dict entries")
            }
            for e in elements {
                guard e.signature == element else {
                    throw DBusMarshalError.invalidValue("array element \(e.signature) in a\(element)")
                }
                try value(e, depth: depth + 1)
            }
        case .dictionary(let k, let vs, let entries):
            guard DBusSignature.isBasic(k) else {
                throw DBusMarshalError.invalidValue("dictionary key '\(k)' is not a basic type")
            }
            guard singleType(vs) else {
                throw DBusMarshalError.invalidValue("invalid dictionary value signature '\(vs)'")
            }
            for entry in entries {
                guard entry.key.signature == k, entry.value.signature == vs else {
                    throw DBusMarshalError.invalidValue(
                        "entry {\(entry.key.signature)\(entry.value.signature)} in a{\(k)\(vs)}")
                }
                try value(entry.key, depth: depth + 1)
                try value(entry.value, depth: depth + 1)
            }
        case .structure(let fields):
            if fields.isEmpty { throw DBusMarshalError.invalidValue("empty struct") }
            for f in fields { try value(f, depth: depth + 1) }
        default:
            break
        }
        if case .array = v, !singleType(v.signature) {
            throw DBusMarshalError.invalidValue("invalid signature \(v.signature)")
        }
    }
}

// MARK: - Writer

enum DBusWriter {
    /// Appends `values` to `message` (validated first).
    static func append(_ values: [DBusValue], to message: OpaquePointer) throws {
        for v in values { try DBusValidate.value(v) }
        let sig = dbusSignature(of: values)
        guard sig.utf8.count <= 255 else { throw DBusMarshalError.invalidValue("signature longer than 255") }
        var it = DBusMessageIter()
        dbus_message_iter_init_append(message, &it)
        for v in values { try write(v, &it) }
    }

    private static func basic<T>(_ iter: inout DBusMessageIter, _ type: Int32, _ v: T) throws {
        var copy = v
        let ok = withUnsafePointer(to: &copy) { dbus_message_iter_append_basic(&iter, type, $0) }
        if ok == 0 { throw DBusMarshalError.outOfMemory }
    }

    private static func cString(_ iter: inout DBusMessageIter, _ type: Int32, _ s: String) throws {
        let ok = s.withCString { cstr -> dbus_bool_t in
            var p: UnsafePointer<CChar>? = cstr
            return withUnsafePointer(to: &p) { dbus_message_iter_append_basic(&iter, type, $0) }
        }
        if ok == 0 { throw DBusMarshalError.outOfMemory }
    }

    private static func container(_ iter: inout DBusMessageIter, _ type: Int32, _ sig: String?,
                                  _ body: (inout DBusMessageIter) throws -> Void) throws {
        var sub = DBusMessageIter()
        let opened: dbus_bool_t
        if let sig {
            opened = sig.withCString { dbus_message_iter_open_container(&iter, type, $0, &sub) }
        } else {
            opened = dbus_message_iter_open_container(&iter, type, nil, &sub)
        }
        if opened == 0 { throw DBusMarshalError.outOfMemory }
        do {
            try body(&sub)
        } catch {
            dbus_message_iter_abandon_container(&iter, &sub)
            throw error
        }
        if dbus_message_iter_close_container(&iter, &sub) == 0 { throw DBusMarshalError.outOfMemory }
    }

    static func write(_ v: DBusValue, _ it: inout DBusMessageIter) throws {
        switch v {
        case .byte(let x): try basic(&it, DBusTypeCode.byte, x)
        case .bool(let x): try basic(&it, DBusTypeCode.boolean, dbus_bool_t(x ? 1 : 0))
        case .int16(let x): try basic(&it, DBusTypeCode.int16, x)
        case .uint16(let x): try basic(&it, DBusTypeCode.uint16, x)
        case .int32(let x): try basic(&it, DBusTypeCode.int32, x)
        case .uint32(let x): try basic(&it, DBusTypeCode.uint32, x)
        case .int64(let x): try basic(&it, DBusTypeCode.int64, x)
        case .uint64(let x): try basic(&it, DBusTypeCode.uint64, x)
        case .double(let x): try basic(&it, DBusTypeCode.double, x)
        case .unixFD(let x): try basic(&it, DBusTypeCode.unixFD, x)
        case .string(let s): try cString(&it, DBusTypeCode.string, s)
        case .objectPath(let s): try cString(&it, DBusTypeCode.objectPath, s)
        case .signature(let s): try cString(&it, DBusTypeCode.signature, s)
        case .variant(let inner):
            try container(&it, DBusTypeCode.variant, inner.signature) { sub in try write(inner, &sub) }
        case .bytes(let bytes):
            try container(&it, DBusTypeCode.array, "y") { sub in
                guard !bytes.isEmpty else { return }
                let ok = bytes.withUnsafeBufferPointer { buf -> dbus_bool_t in
                    var p: UnsafePointer<UInt8>? = buf.baseAddress
                    return withUnsafeMutablePointer(to: &p) {
                        dbus_message_iter_append_fixed_array(&sub, DBusTypeCode.byte, $0, Int32(buf.count))
                    }
                }
                if ok == 0 { throw DBusMarshalError.outOfMemory }
            }
        case .array(let element, let elements):
            try container(&it, DBusTypeCode.array, element) { sub in
                for e in elements { try write(e, &sub) }
            }
        case .dictionary(let k, let vs, let entries):
            try container(&it, DBusTypeCode.array, "{" + k + vs + "}") { sub in
                for entry in entries {
                    try container(&sub, DBusTypeCode.dictEntry, nil) { e in
                        try write(entry.key, &e)
                        try write(entry.value, &e)
                    }
                }
            }
        case .structure(let fields):
            try container(&it, DBusTypeCode.structure, nil) { sub in
                for f in fields { try write(f, &sub) }
            }
        }
    }
}

// MARK: - Reader

enum DBusReader {
    /// Reads every argument of `message`.
    static func readAll(_ message: OpaquePointer) throws -> [DBusValue] {
        var it = DBusMessageIter()
        guard dbus_message_iter_init(message, &it) != 0 else { return [] }
        return try readSequence(&it)
    }

    static func readSequence(_ it: inout DBusMessageIter) throws -> [DBusValue] {
        var out: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&it) != DBusTypeCode.invalid {
            out.append(try read(&it))
            _ = dbus_message_iter_next(&it)
        }
        return out
    }

    private static func basic<T>(_ it: inout DBusMessageIter, _ zero: T) -> T {
        var v = zero
        withUnsafeMutablePointer(to: &v) { dbus_message_iter_get_basic(&it, $0) }
        return v
    }

    private static func string(_ it: inout DBusMessageIter) -> String {
        var p: UnsafePointer<CChar>? = nil
        withUnsafeMutablePointer(to: &p) { dbus_message_iter_get_basic(&it, $0) }
        return p.map { String(cString: $0) } ?? ""
    }

    /// The signature of the value the iterator points at.
    static func currentSignature(_ it: inout DBusMessageIter) -> String {
        guard let c = dbus_message_iter_get_signature(&it) else { return "" }
        defer { dbus_free(c) }
        return String(cString: c)
    }

    static func read(_ it: inout DBusMessageIter) throws -> DBusValue {
        let type = dbus_message_iter_get_arg_type(&it)
        switch type {
        case DBusTypeCode.byte: return .byte(basic(&it, UInt8(0)))
        case DBusTypeCode.boolean: return .bool(basic(&it, dbus_bool_t(0)) != 0)
        case DBusTypeCode.int16: return .int16(basic(&it, Int16(0)))
        case DBusTypeCode.uint16: return .uint16(basic(&it, UInt16(0)))
        case DBusTypeCode.int32: return .int32(basic(&it, Int32(0)))
        case DBusTypeCode.uint32: return .uint32(basic(&it, UInt32(0)))
        case DBusTypeCode.int64: return .int64(basic(&it, Int64(0)))
        case DBusTypeCode.uint64: return .uint64(basic(&it, UInt64(0)))
        case DBusTypeCode.double: return .double(basic(&it, Double(0)))
        case DBusTypeCode.unixFD: return .unixFD(basic(&it, Int32(-1)))
        case DBusTypeCode.string: return .string(string(&it))
        case DBusTypeCode.objectPath: return .objectPath(string(&it))
        case DBusTypeCode.signature: return .signature(string(&it))
        case DBusTypeCode.variant:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&it, &sub)
            return .variant(try read(&sub))
        case DBusTypeCode.structure:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&it, &sub)
            return .structure(try readSequence(&sub))
        case DBusTypeCode.array:
            let full = currentSignature(&it)           // "a..."
            let elementSig = String(full.dropFirst())
            let elementType = dbus_message_iter_get_element_type(&it)
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&it, &sub)
            if elementType == DBusTypeCode.byte {
                var p: UnsafeRawPointer? = nil
                var n: Int32 = 0
                withUnsafeMutablePointer(to: &p) { dbus_message_iter_get_fixed_array(&sub, $0, &n) }
                guard let p, n > 0 else { return .bytes([]) }
                return .bytes(Array(UnsafeBufferPointer(start: p.assumingMemoryBound(to: UInt8.self), count: Int(n))))
            }
            if elementType == DBusTypeCode.dictEntry {
                // elementSig is "{KV}"
                let inner = elementSig.dropFirst().dropLast()
                let keySig = String(inner.prefix(1))
                let valueSig = String(inner.dropFirst())
                var entries: [DBusDictEntry] = []
                while dbus_message_iter_get_arg_type(&sub) == DBusTypeCode.dictEntry {
                    var e = DBusMessageIter()
                    dbus_message_iter_recurse(&sub, &e)
                    let key = try read(&e)
                    _ = dbus_message_iter_next(&e)
                    let value = try read(&e)
                    entries.append(DBusDictEntry(key, value))
                    _ = dbus_message_iter_next(&sub)
                }
                return .dictionary(keySignature: keySig, valueSignature: valueSig, entries)
            }
            return .array(elementSignature: elementSig, try readSequence(&sub))
        default:
            throw DBusMarshalError.unsupportedType(type)
        }
    }
}
