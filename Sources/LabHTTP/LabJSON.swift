import Foundation
import Hummingbird
import LabPlan

/// JSON as every HeraldLab endpoint speaks it (times are numbers: seconds since 1970).
public enum LabJSON {
    public static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return e
    }()
    public static let decoder = JSONDecoder()

    /// A request body as `T`: the bytes as they are for `Data`, nothing for `NoBody`, JSON
    /// otherwise (400 "request body is not a valid T: ..." when it is not one).
    public static func decode<T: Decodable>(_ type: T.Type, from data: Data) throws -> T {
        if let raw = data as? T { return raw }
        if let none = NoBody() as? T { return none }
        do { return try decoder.decode(T.self, from: data) } catch {
            throw HTTPError(.badRequest, message: "request body is not a valid \(T.self): \(describe(error))")
        }
    }

    static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let ctx): return "missing field \((ctx.codingPath + [key]).map(\.stringValue).joined(separator: "."))"
        case DecodingError.typeMismatch(_, let ctx), DecodingError.valueNotFound(_, let ctx), DecodingError.dataCorrupted(let ctx):
            return "\(ctx.codingPath.map(\.stringValue).joined(separator: ".")): \(ctx.debugDescription)"
        default: return "\(error)"
        }
    }
}
