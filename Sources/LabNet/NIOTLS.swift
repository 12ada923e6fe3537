import Foundation
import NIOSSL

extension TLSContext {
    /// A client's TLS handler for a connection dialled to `host` (a name or an address, with or
    /// without brackets): a name is sent in SNI and checked against the certificate's DNS names;
    /// an address is checked against its IP names (swift-nio-ssl checks the connected address
    /// when no name is given).
    public func clientHandler(for host: String) throws -> NIOSSLClientHandler {
        let bare = HostPort.unbracketed(host)
        let isAddress = HostPort.isIPv4(bare) || HostPort.isIPv6(bare)
        return try NIOSSLClientHandler(context: nio, serverHostname: isAddress ? nil : bare)
    }
}
