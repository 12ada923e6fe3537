import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where the shared results store is (issue 41): a `postgres://USER@HOST[:PORT]/DB` URL, with
/// libpq's `sslmode` (`disable`, `require`, `verify-ca`, `verify-full`), `sslrootcert` (a CA
/// file) and `host` (a Unix socket folder) as query items. A password in the URL is refused:
/// it would stand on a command line and in logs; it is read from a file instead (mode 0600).
public struct ResultsLocation: Sendable, Equatable, CustomStringConvertible {
    public enum TLSMode: String, Sendable, Equatable, CaseIterable {
        case disable, require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    public var user: String
    /// A host name or address; nil with `socketDirectory`.
    public var host: String?
    public var port: Int
    /// The folder of PostgreSQL's Unix socket (`?host=/run/postgresql`): `.s.PGSQL.<port>` in it.
    public var socketDirectory: String?
    public var database: String
    public var tls: TLSMode
    /// The CA file TLS verifies the server against (`sslrootcert`, or --history-ca-file).
    public var caFile: String?

    public init(user: String, host: String?, port: Int = 5432, socketDirectory: String? = nil, database: String, tls: TLSMode = .disable, caFile: String? = nil) {
        self.user = user; self.host = host; self.port = port; self.socketDirectory = socketDirectory
        self.database = database; self.tls = tls; self.caFile = caFile
    }

    /// Whether `text` names a shared store (a PostgreSQL URL) rather than a SQLite file.
    public static func isURL(_ text: String) -> Bool {
        let t = text.lowercased()
        return t.hasPrefix("postgres://") || t.hasPrefix("postgresql://")
    }

    public static func parse(_ text: String) throws -> ResultsLocation {
        guard isURL(text) else { throw ResultsStoreError.badURL("\(redact(text)): not a postgres:// URL (postgres://USER@HOST[:PORT]/DB)") }
        guard let c = URLComponents(string: text) else { throw ResultsStoreError.badURL("\(redact(text)): not a URL") }
        if c.password != nil {
            throw ResultsStoreError.badURL("\(redact(text)): a password in the URL is refused (it would be on the command line and in logs); put it in a file of mode 0600 and give that file (--history-password-file)")
        }
        guard let user = c.user, !user.isEmpty else { throw ResultsStoreError.badURL("\(redact(text)): no user (postgres://USER@HOST/DB)") }
        var host = c.host.flatMap { $0.isEmpty ? nil : $0 }
        if let h = host, h.hasPrefix("["), h.hasSuffix("]") { host = String(h.dropFirst().dropLast()) }
        var socket: String?
        if let h = host, h.hasPrefix("/") { socket = h; host = nil }
        let database = String(c.path.drop { $0 == "/" })
        guard !database.isEmpty, !database.contains("/") else { throw ResultsStoreError.badURL("\(redact(text)): no database (postgres://USER@HOST/DB)") }
        var tls = TLSMode.disable, ca: String?
        for item in c.queryItems ?? [] {
            let value = item.value ?? ""
            switch item.name {
            case "sslmode":
                // libpq's allow and prefer fall back to plain text: not offered.
                guard let m = TLSMode(rawValue: value) else {
                    throw ResultsStoreError.badURL("\(redact(text)): sslmode \(value.debugDescription) (one of \(TLSMode.allCases.map(\.rawValue).joined(separator: ", ")))")
                }
                tls = m
            case "sslrootcert": ca = value
            case "host":
                guard value.hasPrefix("/") else { throw ResultsStoreError.badURL("\(redact(text)): host= names the folder of a Unix socket (an absolute path)") }
                socket = value
            case "password":
                throw ResultsStoreError.badURL("\(redact(text)): a password in the URL is refused; give a password file (--history-password-file)")
            default:
                throw ResultsStoreError.badURL("\(redact(text)): unknown parameter \(item.name.debugDescription) (sslmode, sslrootcert, host)")
            }
        }
        if host == nil && socket == nil { throw ResultsStoreError.badURL("\(redact(text)): no host (postgres://USER@HOST/DB, or ?host=/socket/folder)") }
        if socket != nil && tls != .disable { throw ResultsStoreError.badURL("\(redact(text)): TLS over a Unix socket is not offered (sslmode=disable there)") }
        if ca != nil && tls == .disable { throw ResultsStoreError.badURL("\(redact(text)): sslrootcert without TLS (sslmode=verify-full)") }
        let port = c.port ?? 5432
        guard (1...65535).contains(port) else { throw ResultsStoreError.badURL("\(redact(text)): port \(port)") }
        return ResultsLocation(user: user, host: host, port: port, socketDirectory: socket, database: database, tls: tls, caFile: ca)
    }

    /// The URL as logs show it: never a password.
    public var description: String {
        func enc(_ s: String) -> String { s.addingPercentEncoding(withAllowedCharacters: .urlUserAllowed.subtracting(CharacterSet(charactersIn: ":@/"))) ?? s }
        var query = [String]()
        if let s = socketDirectory { query.append("host=\(s)") }
        if tls != .disable { query.append("sslmode=\(tls.rawValue)") }
        if let ca = caFile { query.append("sslrootcert=\(ca)") }
        let h = host.map { $0.contains(":") ? "[\($0)]" : $0 } ?? ""
        return "postgres://\(enc(user))@\(h)\(port == 5432 ? "" : ":\(port)")/\(enc(database))\(query.isEmpty ? "" : "?" + query.joined(separator: "&"))"
    }

    /// Any text with the password of a URL in it removed (`postgres://u:secret@h` → `postgres://u:***@h`).
    public static func redact(_ text: String) -> String {
        var out = text
        if let scheme = out.range(of: "://") {
            let rest = out[scheme.upperBound...]
            let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
                out.replaceSubrange(out.index(after: colon)..<at, with: "***")
            }
        }
        if let r = out.range(of: "password=") {
            let end = out[r.upperBound...].firstIndex { $0 == "&" || $0 == "#" } ?? out.endIndex
            out.replaceSubrange(r.upperBound..<end, with: "***")
        }
        return out
    }

    /// The password in `path`: a file only its owner may read (no group or other bits), its
    /// first line without the line end. The content is never logged.
    public static func readPassword(file path: String) throws -> String {
        var st = stat()
        guard stat(path, &st) == 0 else { throw ResultsStoreError.passwordFile("\(path): cannot read it (\(String(cString: strerror(errno))))") }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw ResultsStoreError.passwordFile("\(path): not a regular file") }
        guard st.st_mode & 0o077 == 0 else {
            throw ResultsStoreError.passwordFile("\(path): mode \(String(st.st_mode & 0o777, radix: 8)); a password file must be readable by its owner only (chmod 600)")
        }
        guard st.st_size <= 4096 else { throw ResultsStoreError.passwordFile("\(path): over 4096 bytes; a password file holds one line") }
        guard let data = FileManager.default.contents(atPath: path) else { throw ResultsStoreError.passwordFile("\(path): cannot read it") }
        guard let text = String(data: data, encoding: .utf8) else { throw ResultsStoreError.passwordFile("\(path): not UTF-8") }
        // "\r\n" is one Character: split on the scalars.
        let password = String(String.UnicodeScalarView(text.unicodeScalars.prefix { $0 != "\n" && $0 != "\r" }))
        guard !password.isEmpty else { throw ResultsStoreError.passwordFile("\(path): empty") }
        guard !password.contains("\u{0}") else { throw ResultsStoreError.passwordFile("\(path): holds a NUL byte") }
        return password
    }
}
