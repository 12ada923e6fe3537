import Foundation
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// Opens the tests' blocking TCP connections (raw clients): host names, IPv4 and IPv6. The
/// product's own connections are SwiftNIO's.
public enum Dialer {
    /// Resolves `host` (name or literal, IPv6 with or without brackets) and tries each address in
    /// getaddrinfo's order, each with a connect bounded by `timeout`. Returns a blocking,
    /// close-on-exec socket with `TCP_NODELAY` set; the caller closes it.
    public static func connect(host: String, port: UInt16, timeout: TimeInterval = 10) throws -> Int32 {
        let target = HostPort(host: host, port: port)
        let addresses = try NetAddress.resolve(host: target.host, port: port)
        var failures = [(address: NetAddress, failure: Failure)]()
        for address in addresses {
            switch attempt(address, timeout: timeout) {
            case .success(let fd): return fd
            case .failure(let f): failures.append((address, f))
            }
        }
        // A literal, or a name with one address: "cannot connect to n1.lab:8701 (10.0.0.5): cause".
        // A name with several: each address with its cause.
        let name = target.host == addresses[0].host ? "\(target)" : "\(target) (\(addresses.map(\.host).joined(separator: ", ")))"
        if failures.count == 1 { throw failures[0].failure.error(naming: name, timeout: timeout) }
        let kind: NetError.Kind = failures.allSatisfy { $0.failure.kind == .timeout } ? .timeout : .connect
        let causes = failures.map { "\($0.address.host): \($0.failure.kind == .timeout ? "timed out after \(seconds(timeout))" : $0.failure.cause)" }
        throw NetError(kind, "cannot connect to \(target) (\(causes.joined(separator: "; ")))")
    }

    /// Connects to one resolved address.
    public static func connect(to address: NetAddress, timeout: TimeInterval) throws -> Int32 {
        try attempt(address, timeout: timeout).mapError { $0.error(naming: address.description, timeout: timeout) }.get()
    }

    struct Failure: Error {
        var kind: NetError.Kind
        var cause: String

        func error(naming name: String, timeout: TimeInterval) -> NetError {
            kind == .timeout ? NetError(.timeout, "timed out connecting to \(name) after \(Dialer.seconds(timeout))")
                : NetError(kind, "cannot connect to \(name): \(cause)")
        }
    }

    static func attempt(_ address: NetAddress, timeout: TimeInterval) -> Result<Int32, Failure> {
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return .failure(Failure(kind: .connect, cause: "socket: \(NetError.text(errno: errno))")) }
        func fail(_ kind: NetError.Kind, _ cause: String) -> Result<Int32, Failure> {
            close(fd)
            return .failure(Failure(kind: kind, cause: cause))
        }
        if address.withSockAddr({ Glibc.connect(fd, $0, $1) }) != 0 {
            guard errno == EINPROGRESS || errno == EINTR else { return fail(.connect, NetError.text(errno: errno)) }
            let deadline = Date().addingTimeInterval(timeout)
            while true {
                let left = deadline.timeIntervalSinceNow
                guard left > 0 else { return fail(.timeout, "timed out") }
                var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                let rc = poll(&p, 1, Int32(min(left * 1000, Double(Int32.max)).rounded(.up)))
                if rc < 0 && errno == EINTR { continue }
                if rc < 0 { return fail(.connect, "poll: \(NetError.text(errno: errno))") }
                if rc > 0 { break }
            }
            var soError: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len)
            guard soError == 0 else { return fail(.connect, NetError.text(errno: soError)) }
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        Sockets.setNoDelay(fd)
        return .success(fd)
    }

    static func seconds(_ t: TimeInterval) -> String {
        t == t.rounded() ? "\(Int(t)) s" : "\(t) s"
    }
}
