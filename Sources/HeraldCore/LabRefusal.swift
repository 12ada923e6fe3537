/// Why a lab rule said no, in the domain's words. The coordinator's and the agent's rules throw
/// it; the HTTP edge maps each kind to one status (`LabHTTP`), and the in-memory links carry it
/// as it is, so a rule's test asserts the kind, not a status code (issue 39).
public struct LabRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable, CaseIterable {
        /// The request itself is wrong: a field, a name or a number out of range (HTTP 400).
        case invalid
        /// Who asks has not shown who they are, e.g. a dashboard page without its session (401).
        case unauthenticated
        /// Who asks may not do this: another agent's name, a revoked one (403).
        case forbidden
        /// No such run, agent, dongle or file (404).
        case notFound
        /// It exists, but its state does not allow this now (409).
        case conflict
        /// Well formed but refused for what it says, e.g. a plan this lab cannot run (422).
        case unprocessable
        /// The lab itself failed: a store, a file, a missing resource (500).
        case failed
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// The HTTP status the edge answers with, e.g. "400 url: ..." as before the kinds existed.
    public var description: String { "\(kind.status) \(message)" }
}

extension LabRefusal.Kind {
    /// The one mapping from a refusal to an HTTP status code (the HTTP edge and LinkError use it).
    public var status: Int {
        switch self {
        case .invalid: return 400
        case .unauthenticated: return 401
        case .forbidden: return 403
        case .notFound: return 404
        case .conflict: return 409
        case .unprocessable: return 422
        case .failed: return 500
        }
    }
}
