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
    public init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        let text = try c.decode(String.self)
        guard let state = BundleNodeState(rawValue: text) else {
            throw DecodingError.dataCorruptedError(in: c, debugDescription:
                "\"\(OutsideText.escaped(String(text.prefix(32))))\" is not a node state (\(Self.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        self = state
    }
}

/// How a bundle (manifest.json's `mode`) or a study (study.json's `mode`) was made: in virtual
/// time by `herald-lab simulate`, or on a lab by a coordinator and its agents.
public enum BundleMode: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
    case simulate
    case lab

    public var description: String { rawValue }

    /// A value outside the enum is refused with what it was and what is allowed.
    public init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        let text = try c.decode(String.self)
        guard let mode = BundleMode(rawValue: text) else {
            throw DecodingError.dataCorruptedError(in: c, debugDescription:
                "\"\(OutsideText.escaped(String(text.prefix(32))))\" is not a bundle mode (\(Self.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        self = mode
    }
}
