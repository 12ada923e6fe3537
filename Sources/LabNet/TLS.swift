import Foundation
import NIOCore
import NIOSSL
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TLS context: a server's certificate and key, or a client's trust in the lab CA. Made once
/// per process and shared by every connection. The files are read once, at init, into the
/// swift-nio-ssl context every TLS connection of the product uses (`nio`: the HTTP server, the
/// air, its nodes), so that building it is the check of the files: a file that cannot be read,
/// holds no certificate, or a key that is not the certificate's, is a `NetError(.tls)` naming it.
public final class TLSContext: Sendable {
    public let isServer: Bool
    /// The PEM files the context was made from (LabTrust.caFile, AsyncHTTPClient's trust roots).
    public let material: Material
    /// The swift-nio-ssl context made from `material`.
    public let nio: NIOSSLContext

    public enum Material: Sendable, Hashable {
        /// A server's certificate chain and key.
        case server(certificate: String, key: String)
        /// A client's trust: the lab CA's certificates.
        case client(trusting: String)
    }

    /// How long a server's closing connection waits for the peer's close_notify.
    public static let closeNotifyWait = TimeAmount.milliseconds(500)

    /// A server presenting `certificate` (PEM, chain) with `key`.
    public init(certificate: String, key: String) throws {
        let chain = try Self.certificates(certificate, "certificate chain")
        let privateKey: NIOSSLPrivateKey
        do { privateKey = try NIOSSLPrivateKey(file: key, format: .pem) } catch {
            throw NetError(.tls, "\(key): cannot load the private key: \(Self.reason(error, file: key))")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(privateKey))
        // A connection being closed waits this long for the peer's close_notify (swift-nio-ssl's
        // default is 5 s). A server shutting down waits for its connections to close, so a
        // stranger that never answers (a handshake held half-done) would hold the exit for 5 s.
        configuration.shutdownTimeout = Self.closeNotifyWait
        do { nio = try NIOSSLContext(configuration: configuration) } catch NIOSSLError.failedToLoadCertificate {
            // BoringSSL takes an EC certificate for a server only with digitalSignature in its key
            // usage: a CA's certificate (keyCertSign only) is refused here, not at a handshake.
            throw NetError(.tls, "\(certificate): this certificate cannot serve TLS (an EC server certificate needs digitalSignature in its key usage; a CA's own certificate has not: serve the one the CA issued, cert.pem)")
        } catch {
            throw NetError(.tls, "\(key): the private key does not pair with the certificate in \(certificate): \(error)")
        }
        isServer = true
        material = .server(certificate: certificate, key: key)
    }

    /// A client trusting only the CA certificates in `trusting` (PEM) and checking the peer's
    /// name, or its address when it was dialled by address.
    public init(trusting ca: String) throws {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.trustRoots = .certificates(try Self.certificates(ca, "CA certificates"))
        configuration.certificateVerification = .fullVerification
        do { nio = try NIOSSLContext(configuration: configuration) } catch {
            throw NetError(.tls, "\(ca): cannot make a TLS client trusting it: \(error)")
        }
        isServer = false
        material = .client(trusting: ca)
    }

    /// The certificates of a PEM file, at least one.
    private static func certificates(_ file: String, _ what: String) throws -> [NIOSSLCertificate] {
        let found: [NIOSSLCertificate]
        do { found = try NIOSSLCertificate.fromPEMFile(file) } catch {
            throw NetError(.tls, "\(file): cannot load the \(what): \(reason(error, file: file))")
        }
        guard !found.isEmpty else { throw NetError(.tls, "\(file): cannot load the \(what): no certificate in it") }
        return found
    }

    /// Why a file could not be loaded: that it is missing or unreadable when it is, else the
    /// TLS library's error (swift-nio-ssl does not say which).
    private static func reason(_ error: Error, file: String) -> String {
        if access(file, F_OK) != 0 { return "no such file" }
        if access(file, R_OK) != 0 { return "not readable" }
        return "\(error)"
    }
}

/// What this process trusts when it dials `https://` URLs and TLS air addresses: the lab CA,
/// set once at start from `--ca` (or the credentials folder) before any connection is made.
public enum LabTrust {
    private static let trusted = Mutex<TLSContext?>(nil)

    public static var client: TLSContext? { trusted.withLock { $0 } }

    /// The lab CA's PEM file that `client` was made from (LabClient's TLS reads it too).
    public static var caFile: String? {
        guard case .client(let ca)? = client?.material else { return nil }
        return ca
    }

    /// Trusts the CA certificates in the PEM file `ca` from now on; returns the client context.
    @discardableResult
    public static func trust(caFile ca: String) throws -> TLSContext {
        let c = try TLSContext(trusting: ca)
        trusted.withLock { $0 = c }
        return c
    }

    /// Trusts no CA any more: https and TLS air addresses are refused until `trust` again.
    public static func forget() { trusted.withLock { $0 = nil } }

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
