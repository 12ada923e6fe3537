import CTLS
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A TLS context over the system's OpenSSL: a server's certificate and key, or a client's trust
/// in the lab CA. Made once per process and shared by every connection.
public final class TLSContext: @unchecked Sendable {
    let raw: OpaquePointer
    public let isServer: Bool
    /// The PEM files the context was made from: what another TLS stack (the air's, on NIO)
    /// makes its own context from.
    public let material: Material

    public enum Material: Sendable, Hashable {
        /// A server's certificate chain and key.
        case server(certificate: String, key: String)
        /// A client's trust: the lab CA's certificates.
        case client(trusting: String)
    }

    /// OpenSSL writes to sockets with write(2): a peer that has gone raises SIGPIPE, which would
    /// end the process. It is ignored once, before the first TLS context; writes then fail with
    /// EPIPE, which every caller handles.
    private static let ignoreSIGPIPE: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// A server presenting `certificate` (PEM, chain) with `key`.
    public init(certificate: String, key: String) throws {
        Self.ignoreSIGPIPE
        var err = [CChar](repeating: 0, count: 512)
        guard let ctx = ctls_server_ctx(certificate, key, &err, err.count) else { throw NetError(.tls, NetError.text(cBuffer: err)) }
        raw = ctx
        isServer = true
        material = .server(certificate: certificate, key: key)
    }

    /// A client trusting only the CA certificates in `trusting` (PEM) and checking the peer's name.
    public init(trusting ca: String) throws {
        Self.ignoreSIGPIPE
        var err = [CChar](repeating: 0, count: 512)
        guard let ctx = ctls_client_ctx(ca, &err, err.count) else { throw NetError(.tls, NetError.text(cBuffer: err)) }
        raw = ctx
        isServer = false
        material = .client(trusting: ca)
    }

    deinit { ctls_ctx_free(raw) }
}

/// What this process trusts when it dials `https://` URLs and TLS air addresses: the lab CA,
/// set once at start from `--ca` (or the credentials folder) before any connection is made.
public enum LabTrust {
    nonisolated(unsafe) private static var context: TLSContext?
    private static let lock = NSLock()

    public static var client: TLSContext? { lock.withLock { context } }

    /// The lab CA's PEM file that `client` was made from (LabClient's TLS reads it too).
    public static var caFile: String? {
        guard case .client(let ca)? = client?.material else { return nil }
        return ca
    }

    /// Trusts the CA certificates in the PEM file `ca` from now on; returns the client context.
    @discardableResult
    public static func trust(caFile ca: String) throws -> TLSContext {
        let c = try TLSContext(trusting: ca)
        lock.withLock { context = c }
        return c
    }

    /// Trusts no CA any more: https and TLS air addresses are refused until `trust` again.
    public static func forget() { lock.withLock { context = nil } }

    /// The client context for a URL's scheme: nil for http, the lab CA for https.
    public static func context(for url: URL) throws -> TLSContext? {
        switch url.scheme?.lowercased() {
        case "http": return nil
        case "https":
            guard let c = client else {
                throw NetError(.tls, "\(url.absoluteString): https needs the lab CA to check the server (--ca FILE, or ca.pem in --credentials DIR)")
            }
            return c
        default: throw NetError(.badAddress, "only http:// and https:// are supported: \(url.absoluteString)")
        }
    }
}

extension Connection {
    /// Dials a URL's host and port: TLS checked against the lab CA for https.
    public static func dial(url: URL, timeout: TimeInterval) throws -> Connection {
        let tls = try LabTrust.context(for: url)
        let target = try HostPort(url: url)
        return try dial(host: target.host, port: target.port, timeout: timeout, tls: tls)
    }
}
