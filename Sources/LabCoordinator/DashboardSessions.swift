import Foundation
import Synchronization
import HeraldCore
import LabHTTP

/// The dashboard's signed-in browsers (ARCHITECTURE.md, "The dashboard"): a session is a random
/// id in a cookie (HttpOnly, SameSite=Strict, Secure under TLS, an expiry) and a CSRF token of its
/// own that every state-changing form carries. Kept in memory only: a restarted coordinator signs
/// everybody out. Time is passed in, so expiry is tested without waiting.
public struct DashboardSession: Sendable, Equatable {
    public let id: String
    public let csrf: String
    public let expires: Double
}

public final class DashboardSessions: Sendable {
    public static let cookieName = "heraldlab_session"
    /// A session ends this long after sign-in (seconds).
    public let lifetime: Double
    /// Sessions kept at once; the oldest goes first past it.
    public let capacity: Int
    /// The sessions, and the event streams each holds open, under one lock.
    private struct Table {
        var sessions: [String: DashboardSession] = [:]
        var streams: [String: Int] = [:]
    }
    private let table = Mutex(Table())

    public init(lifetime: Double = 8 * 3600, capacity: Int = 64) {
        self.lifetime = lifetime
        self.capacity = max(1, capacity)
    }

    /// 32 random bytes from the system's generator, in hex.
    static func randomToken() -> String {
        var g = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }

    public func create(now: Double) -> DashboardSession { signIn(now: now).session }

    /// A new session, and how many live sessions it ended to stay within `capacity` (the oldest
    /// first): a sign-in over the cap says so instead of signing somebody out without a word.
    public func signIn(now: Double) -> (session: DashboardSession, ended: Int) {
        let s = DashboardSession(id: Self.randomToken(), csrf: Self.randomToken(), expires: now + lifetime)
        var ended = 0
        table.withLock { t in
            t.sessions = t.sessions.filter { $0.value.expires > now }
            while t.sessions.count >= capacity, let oldest = t.sessions.min(by: { $0.value.expires < $1.value.expires }) {
                t.sessions[oldest.key] = nil
                t.streams[oldest.key] = nil
                ended += 1
            }
            t.sessions[s.id] = s
        }
        return (s, ended)
    }

    /// Event streams one session may hold open at once (a browser's tabs on live runs), so that
    /// one session cannot take all of the service's 32.
    public static let streamsPerSession = 4

    /// Takes one of the session's stream places; false when it holds `streamsPerSession`.
    public func openStream(_ id: String) -> Bool {
        table.withLock { t in
            guard t.streams[id, default: 0] < Self.streamsPerSession else { return false }
            t.streams[id, default: 0] += 1
            return true
        }
    }

    public func closeStream(_ id: String) {
        table.withLock { t in
            guard let n = t.streams[id] else { return }
            t.streams[id] = n > 1 ? n - 1 : nil
        }
    }

    /// The live session a request's `Cookie` header names, if any.
    public func find(cookieHeader: String?, now: Double) -> DashboardSession? {
        guard let id = Self.cookieValue(cookieHeader), id.utf8.count == 64 else { return nil }
        return table.withLock { t in
            guard let s = t.sessions[id] else { return nil }
            guard s.expires > now else { t.sessions[id] = nil; return nil }
            return s
        }
    }

    public func end(_ id: String) { table.withLock { $0.sessions[id] = nil } }

    /// Whether a form's CSRF token is the session's (constant time).
    public static func csrfMatches(_ session: DashboardSession, _ given: String?) -> Bool {
        guard let given else { return false }
        return HTTPService.constantTimeEqual(given, session.csrf)
    }

    /// `Set-Cookie` for a session (or, with nil, one that removes it).
    public static func setCookie(_ session: DashboardSession?, secure: Bool, now: Double) -> String {
        let value = session?.id ?? ""
        let age = session.map { max(0, Saturating.int($0.expires - now)) } ?? 0
        return "\(cookieName)=\(value); Path=/; Max-Age=\(age); HttpOnly; SameSite=Strict\(secure ? "; Secure" : "")"
    }

    /// The session cookie's value in a `Cookie` header.
    static func cookieValue(_ header: String?) -> String? {
        guard let header else { return nil }
        for part in header.split(separator: ";") {
            let kv = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            if kv.count == 2, kv[0] == cookieName { return kv[1] }
        }
        return nil
    }

    /// An `application/x-www-form-urlencoded` body as fields (the last of a repeated name wins).
    public static func form(_ body: Data) -> [String: String] {
        var out = [String: String]()
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String? { String(s).replacingOccurrences(of: "+", with: " ").removingPercentEncoding }
            guard let k = decode(kv[0]), let v = kv.count > 1 ? decode(kv[1]) : "" else { continue }
            out[k] = v
        }
        return out
    }
}
