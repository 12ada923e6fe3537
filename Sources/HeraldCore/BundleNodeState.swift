/// A node's state in a bundle's manifest.json (docs/BUNDLE.md), as the coordinator writes it and
/// the analyser reads it: one type for both sides, so a state one side writes is one the other
/// knows, and any other value is a manifest that does not decode (a named error, never a guess).
public enum BundleNodeState: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
    /// The logs cover the whole run.
    case complete
    /// The logs have gaps (the manifest's `gaps`), or the run was stopped early.
    case partial
    /// Nothing could be gathered.
    case lost

    public var description: String { rawValue }
}

extension BundleNodeState {
    /// A value outside the enum is refused with what it was and what is allowed.
    public init(from decoder: Decoder) throws { self = try Self.decodeNamed(from: decoder, as: "a node state") }
}

extension RawRepresentable where Self: CaseIterable, RawValue == String {
    /// The case a JSON string names, or a decoding error saying the value (escaped, cut) is not
    /// `what` and listing the allowed values.
    static func decodeNamed(from decoder: Decoder, as what: String) throws -> Self {
        let c = try decoder.singleValueContainer()
        let text = try c.decode(String.self)
        guard let value = Self(rawValue: text) else {
            throw DecodingError.dataCorruptedError(in: c, debugDescription:
                "\"\(OutsideText.escaped(String(text.prefix(32))))\" is not \(what) (\(allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        return value
    }
}

/// How a bundle (manifest.json's `mode`) or a study (study.json's `mode`) was made: in virtual
/// time by `herald-lab simulate`, or on a lab by a coordinator and its agents.
public enum BundleMode: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
    case simulate
    case lab

    public var description: String { rawValue }

    /// A value outside the enum is refused with what it was and what is allowed.
    public init(from decoder: Decoder) throws { self = try Self.decodeNamed(from: decoder, as: "a bundle mode") }
}
