#if canImport(Glibc)
import Glibc
#endif

/// Why a connection could not be made or a socket not opened: the text always names what was
/// asked for (`host:port`, a URL, a flag's text) and the cause.
public struct NetError: Error, CustomStringConvertible, Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The text is not a host and port (bad flag, bad URL).
        case badAddress
        /// The host name does not resolve.
        case resolve
        /// Every address refused or was unreachable.
        case connect
        /// No address answered within the timeout.
        case timeout
        /// The socket could not be bound or listen.
        case listen
        /// Connected, but the other end did not answer as expected.
        case protocolError
        /// TLS could not be set up: a certificate or key unreadable, a handshake refused, a peer
        /// whose certificate the lab CA did not sign or that names another host.
        case tls
        /// The peer has gone while the stream was in use: a reset, a broken pipe, TLS closed
        /// under a write or ended by a fatal alert. The connection is over (never retried).
        case closed
    }

    /// errno values that mean the peer has gone (the connection is over, not slow).
    public static func peerGone(_ code: Int32) -> Bool {
        code == EPIPE || code == ECONNRESET || code == ENOTCONN || code == ECONNABORTED || code == ESHUTDOWN
    }

    public var kind: Kind
    public var message: String
    public var description: String { message }

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// A NUL-terminated C message buffer as text.
    public static func text(cBuffer buffer: [CChar]) -> String {
        String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The text of an `errno` value ("Connection refused").
    public static func text(errno code: Int32) -> String {
        String(cString: strerror(code))
    }
}
