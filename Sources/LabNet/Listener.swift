import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The addresses every listening socket of the product binds (the HTTP server's and the air's,
/// on NIO); tests listen on blocking sockets with `Listener.listen` (LabTestSupport).
public enum Listener {
    /// The address to bind for `host`: "0.0.0.0" is IPv4's any address; "::", "" and "*" are
    /// IPv6's (dual-stack, IPv4 too, where the kernel allows; IPv4's where there is no IPv6);
    /// a literal is itself; a name is the first of its addresses (getaddrinfo's order).
    public static func addresses(host: String, port: UInt16) throws -> [NetAddress] {
        let bare = HostPort.unbracketed(host)
        if bare == "0.0.0.0" { return [NetAddress.any(family: AF_INET, port: port)] }
        if HostPort.isWildcard(bare) { return [NetAddress.any(family: AF_INET6, port: port), NetAddress.any(family: AF_INET, port: port)] }
        return try NetAddress.resolve(host: bare, port: port, passive: true)
    }

    /// The numeric address to listen on for `host` when only loopback will do (a service without
    /// authentication): the host is resolved as a listener resolves it (a wildcard is itself),
    /// never judged by its text, and every address it has must be loopback; the first is
    /// returned, so that the service binds the very address that was checked (a second lookup
    /// could answer otherwise). `resolve` gives a host's numeric addresses (tests inject one).
    public static func loopbackAddress(host: String, resolve: (String) throws -> [String] = { try addresses(host: $0, port: 0).map(\.host) }) throws -> String {
        let found = try resolve(host)
        guard let first = found.first else { throw NetError(.resolve, "cannot resolve \(host): no address") }
        let outside = found.filter { !NetAddress.isLoopback(numericHost: $0) }
        guard outside.isEmpty else {
            throw NetError(.badAddress, "\(host) is not a loopback address (it is \(outside.joined(separator: ", ")))")
        }
        return first
    }
}
