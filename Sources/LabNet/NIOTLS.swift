import Foundation
import NIOCore
import NIOSSL

extension TLSContext {
    private static let nioLock = NSLock()
    nonisolated(unsafe) private static var nioMade: [ObjectIdentifier: (TLSContext, NIOSSLContext)] = [:]

    /// The swift-nio-ssl configuration made from the very PEM files this context was made from:
    /// a server's certificate chain and key, or a client's trust in the lab CA only (names and
    /// addresses checked).
    public func nioConfiguration() throws -> TLSConfiguration {
        switch material {
        case .server(let certificate, let key):
            return .makeServerConfiguration(certificateChain: try NIOSSLCertificate.fromPEMFile(certificate).map { .certificate($0) },
                                            privateKey: .privateKey(try NIOSSLPrivateKey(file: key, format: .pem)))
        case .client(let ca):
            var c = TLSConfiguration.makeClientConfiguration()
            c.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(ca))
            c.certificateVerification = .fullVerification
            return c
        }
    }

    /// The NIO context for this context's material, made once per `TLSContext` (the air's
    /// connections and the HTTP server's share it).
    public func nioContext() throws -> NIOSSLContext {
        if let hit = Self.nioLock.withLock({ Self.nioMade[ObjectIdentifier(self)] }) { return hit.1 }
        let context = try NIOSSLContext(configuration: try nioConfiguration())
        // The TLSContext is kept with it: its identifier is never another context's.
        Self.nioLock.withLock { Self.nioMade[ObjectIdentifier(self)] = (self, context) }
        return context
    }
}

extension TLSContext {
    /// A client handler for a connection to `host` (a name, or an IPv4 or IPv6 literal, without
    /// brackets): a name is sent in SNI and checked against the certificate's DNS names, an address
    /// against its IP names (NIOSSL checks the connected address when no name is given).
    public func clientHandler(for host: String) throws -> NIOSSLClientHandler {
        let isAddress = (try? SocketAddress(ipAddress: host, port: 0)) != nil
        return try NIOSSLClientHandler(context: nioContext(), serverHostname: isAddress ? nil : host)
    }
}
