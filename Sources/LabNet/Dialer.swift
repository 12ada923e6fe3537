import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Opens every outgoing TCP connection of the product: host names, IPv4 and IPv6.
public enum Dialer {
    /// Resolves `host` (name or literal, IPv6 with or without brackets) and tries each address in
    /// getaddrinfo's order, each with a connect bounded by `timeout`. Returns a blocking,
    /// close-on-exec socket with `TCP_NODELAY` set; the caller closes it.
    public static func connect(host: String, port: UInt16, timeout: TimeInterval = 10) throws -> Int32 {
        let target = HostPort(host: host, port: port)
        let addresses = try NetAddress.resolve(host: target.host, port: port)
        var failures = [(address: NetAddress, error: NetError)]()
        for address in addresses {
            do { return try connect(to: address, timeout: timeout, naming: target) } catch let e as NetError {
                failures.append((address, e))
            }
        }
        // One address (a literal, most names): its own error. Several: each address's cause.
        if failures.count == 1 { throw failures[0].error }
        let kind: NetError.Kind = failures.allSatisfy { $0.error.kind == .timeout } ? .timeout : .connect
        let causes = failures.map { "\($0.address.host): \($0.error.message.components(separatedBy: ": ").last ?? $0.error.message)" }
        throw NetError(kind, "cannot connect to \(target) (\(causes.joined(separator: "; ")))")
    }

    /// Connects to one resolved address; `naming` is what error messages call the target.
    public static func connect(to address: NetAddress, timeout: TimeInterval, naming: HostPort? = nil) throws -> Int32 {
        let name: String = {
            guard let naming, naming.host != address.host else { return address.description }
            return "\(naming) (\(address.host))"
        }()
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw NetError(.connect, "cannot connect to \(name): socket: \(NetError.text(errno: errno))") }
        var ok = false
        defer { if !ok { close(fd) } }
        var rc = address.withSockAddr { Glibc.connect(fd, $0, $1) }
        if rc != 0 {
            guard errno == EINPROGRESS || errno == EINTR else {
                throw NetError(.connect, "cannot connect to \(name): \(NetError.text(errno: errno))")
            }
            let deadline = Date().addingTimeInterval(timeout)
            while true {
                let left = deadline.timeIntervalSinceNow
                guard left > 0 else { throw NetError(.timeout, "timed out connecting to \(name) after \(Self.seconds(timeout))") }
                var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                rc = poll(&p, 1, Int32(min(left * 1000, Double(Int32.max)).rounded(.up)))
                if rc < 0 && errno == EINTR { continue }
                if rc < 0 { throw NetError(.connect, "cannot connect to \(name): poll: \(NetError.text(errno: errno))") }
                if rc > 0 { break }
            }
            var soError: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len)
            guard soError == 0 else { throw NetError(.connect, "cannot connect to \(name): \(NetError.text(errno: soError))") }
        }
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)
        Sockets.setNoDelay(fd)
        ok = true
        return fd
    }

    static func seconds(_ t: TimeInterval) -> String {
        t == t.rounded() ? "\(Int(t)) s" : "\(t) s"
    }
}
