import Foundation

/// Produces this device's payload for a given time, and splits concatenated shared payloads.
public protocol PayloadDataSupplier: AnyObject {
    /// The payload to serve at `timestamp` (and for a given device, where that matters).
    func payload(_ timestamp: Date, device: TargetIdentifier?) -> PayloadData?
    /// Splits the data of a payload-sharing bundle into payloads.
    func payload(_ data: Data) -> [PayloadData]
}

extension PayloadDataSupplier {
    public func payload(_ timestamp: Date) -> PayloadData? { payload(timestamp, device: nil) }

    /// The default split: fixed-length chunks the length of this node's own payload (at epoch 0),
    /// trailing bytes that do not make a whole payload are dropped.
    public func payload(_ data: Data) -> [PayloadData] {
        guard let own = payload(Date(timeIntervalSince1970: 0), device: nil), own.count > 0 else { return [] }
        var result = [PayloadData]()
        var index = data.startIndex
        while index + own.count <= data.endIndex {
            result.append(PayloadData(data[index..<(index + own.count)]))
            index += own.count
        }
        return result
    }
}

/// The fixed-identifier payload of Herald's formal tests: 129 bytes, protocol 0x00,
/// country 0x0000, Int32 identifier little-endian, then zeros. Its shortName depends only on
/// the identifier.
public final class FixedPayloadSupplier: PayloadDataSupplier {
    public static let length = 129
    public let identifier: Int32
    public let payloadData: PayloadData

    public init(identifier: Int32) {
        self.identifier = identifier
        var data = Data()
        data.append(0x00)
        data.appendLittleEndian(UInt16(0))
        data.appendLittleEndian(identifier)
        data.append(Data(repeating: 0, count: Self.length - data.count))
        self.payloadData = PayloadData(data)
    }

    /// A supplier whose identifier is derived from a stable device text (see `TestIdentifier`).
    public convenience init(deviceText: String) {
        self.init(identifier: TestIdentifier.derive(from: deviceText))
    }

    public func payload(_ timestamp: Date, device: TargetIdentifier?) -> PayloadData? { payloadData }

    public var shortName: String { payloadData.shortName }
}

/// Identifier derivation of Herald's iOS test app: h = 5381, then for each UTF-8 byte b,
/// h = 127 * (h & 0x00FFFFFFFFFFFFFF) + b in UInt64 arithmetic; identifier = h % 2147483647.
public enum TestIdentifier {
    public static func derive(from deviceText: String) -> Int32 {
        var h: UInt64 = 5381
        for b in deviceText.utf8 {
            h = 127 &* (h & 0x00FF_FFFF_FFFF_FFFF) &+ UInt64(b)
        }
        return Int32(h % 2_147_483_647)
    }

    /// The device text HeraldLab uses for a Linux node, so a node keeps its identifier across runs.
    public static func deviceText(nodeName: String, osVersion: String = "6.1") -> String {
        "\(nodeName):Linux:Linux:\(osVersion)"
    }
}
