import Foundation

/// Why an input was rejected by a codec. Codecs never trap on bad input.
public enum CodecError: Error, Equatable, CustomStringConvertible, Sendable {
    case empty
    case unknownAction(UInt8)
    case truncated(String)
    case invalidLength(String)
    case tooLarge(String)

    public var description: String {
        switch self {
        case .empty: return "empty bundle"
        case .unknownAction(let code): return String(format: "unknown action code 0x%02X", code)
        case .truncated(let why): return "truncated: \(why)"
        case .invalidLength(let why): return "invalid length: \(why)"
        case .tooLarge(let why): return "too large: \(why)"
        }
    }
}

/// The bundles one Herald device writes to another's signal characteristic (PROTOCOL.md).
/// All integers little-endian.
public enum SignalBundle: Equatable, Sendable {
    case writePayload(PayloadData)
    case writeRSSI(Int16)
    /// RSSI of the receiver as seen by the sender (127 when there is nothing to share), and the
    /// concatenated payloads (no per-item lengths).
    case payloadSharing(rssi: Int16, data: Data)
    case immediateSend(Data)

    /// The largest data part any bundle may carry.
    public static let maximumDataLength = 510

    public enum Action: UInt8, Sendable {
        case writePayload = 0x01, writeRSSI = 0x02, payloadSharing = 0x03, immediateSend = 0x04
    }

    public var action: Action {
        switch self {
        case .writePayload: return .writePayload
        case .writeRSSI: return .writeRSSI
        case .payloadSharing: return .payloadSharing
        case .immediateSend: return .immediateSend
        }
    }

    public func encoded() throws(CodecError) -> Data {
        var out = Data([action.rawValue])
        switch self {
        case .writePayload(let payload):
            try Self.appendLengthPrefixed(payload.data, to: &out)
        case .writeRSSI(let rssi):
            out.appendLittleEndian(rssi)
        case .payloadSharing(let rssi, let data):
            out.appendLittleEndian(rssi)
            try Self.appendLengthPrefixed(data, to: &out)
        case .immediateSend(let data):
            try Self.appendLengthPrefixed(data, to: &out)
        }
        return out
    }

    private static func appendLengthPrefixed(_ data: Data, to out: inout Data) throws(CodecError) {
        guard data.count <= maximumDataLength else {
            throw .tooLarge("\(data.count) bytes, the limit is \(maximumDataLength)")
        }
        out.appendLittleEndian(Int16(data.count))
        out.append(data)
    }

    /// Decodes one complete bundle; the total length must match exactly.
    public static func decode(_ data: Data) -> Result<SignalBundle, CodecError> {
        switch status(of: data) {
        case .complete(let bundle): return .success(bundle)
        case .incomplete(let why): return .failure(.truncated(why))
        case .invalid(let error): return .failure(error)
        }
    }

    /// The state of a buffer of concatenated fragments.
    public enum BufferStatus: Equatable, Sendable {
        case complete(SignalBundle)
        /// More fragments are needed.
        case incomplete(String)
        /// The buffer can never become a valid bundle.
        case invalid(CodecError)
    }

    public static func status(of data: Data) -> BufferStatus {
        guard let code = data.first else { return .incomplete("no bytes yet") }
        guard let action = Action(rawValue: code) else { return .invalid(.unknownAction(code)) }
        let bytes = data.dropFirst()
        func length(at offset: Int) -> Int? { Data(bytes).readLittleEndian(Int16.self, at: offset).map(Int.init) }
        switch action {
        case .writeRSSI:
            guard let rssi = Data(bytes).readLittleEndian(Int16.self, at: 0) else { return .incomplete("RSSI needs 2 bytes, have \(bytes.count)") }
            guard bytes.count == 2 else { return .invalid(.invalidLength("RSSI bundle is \(data.count) bytes, expected 3")) }
            return .complete(.writeRSSI(rssi))
        case .writePayload, .immediateSend:
            guard let n = length(at: 0) else { return .incomplete("length needs 2 bytes, have \(bytes.count)") }
            if let bad = checkLength(n) { return .invalid(bad) }
            let body = Data(bytes.dropFirst(2))
            if body.count < n { return .incomplete("have \(body.count) of \(n) data bytes") }
            if body.count > n { return .invalid(.invalidLength("\(body.count) data bytes after a length of \(n)")) }
            return .complete(action == .writePayload ? .writePayload(PayloadData(body)) : .immediateSend(body))
        case .payloadSharing:
            guard let rssi = Data(bytes).readLittleEndian(Int16.self, at: 0) else { return .incomplete("RSSI needs 2 bytes") }
            guard let n = length(at: 2) else { return .incomplete("length needs 2 bytes") }
            if let bad = checkLength(n) { return .invalid(bad) }
            let body = Data(bytes.dropFirst(4))
            if body.count < n { return .incomplete("have \(body.count) of \(n) data bytes") }
            if body.count > n { return .invalid(.invalidLength("\(body.count) data bytes after a length of \(n)")) }
            return .complete(.payloadSharing(rssi: rssi, data: body))
        }
    }

    private static func checkLength(_ n: Int) -> CodecError? {
        if n < 0 { return .invalidLength("negative length \(n)") }
        if n > maximumDataLength { return .tooLarge("length \(n), the limit is \(maximumDataLength)") }
        return nil
    }

    /// Splits an encoded bundle into writes of at most `size` bytes (20 on a default ATT MTU).
    public static func fragments(of data: Data, size: Int = 20) -> [Data] {
        precondition(size > 0)
        var out = [Data]()
        var i = data.startIndex
        while i < data.endIndex {
            let end = min(i + size, data.endIndex)
            out.append(Data(data[i..<end]))
            i = end
        }
        return out
    }
}

/// Reassembles fragmented signal writes per remote device: concatenate until the buffer
/// decodes as one complete bundle, then deliver and clear; clear on invalid data and on disconnect.
public struct SignalReassembler<Key: Hashable> {
    private var buffers: [Key: Data] = [:]

    public init() {}

    public enum Outcome: Equatable {
        case bundle(SignalBundle)
        case waiting
        case rejected(CodecError)
    }

    public mutating func append(_ fragment: Data, from key: Key) -> Outcome {
        var buffer = buffers[key] ?? Data()
        buffer.append(fragment)
        switch SignalBundle.status(of: buffer) {
        case .complete(let bundle):
            buffers[key] = nil
            return .bundle(bundle)
        case .incomplete:
            if buffer.count > SignalBundle.maximumDataLength + 5 {
                buffers[key] = nil
                return .rejected(.tooLarge("\(buffer.count) buffered bytes"))
            }
            buffers[key] = buffer
            return .waiting
        case .invalid(let error):
            buffers[key] = nil
            return .rejected(error)
        }
    }

    public mutating func clear(_ key: Key) { buffers[key] = nil }
    public var pendingCount: Int { buffers.count }
}
