import Foundation
import CLinuxEvents
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// Monotonic seconds (deadlines).
func monotonicNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// One accepted connection of an `HTTPService`, as the server keeps it between requests. Owned
/// by one party at a time: the event loop (idle, waiting for bytes), a worker (reading a
/// request, writing an answer) or a handler's task (between the two).
final class ServerConnection: @unchecked Sendable {
    let id: UInt64
    let fd: Int32
    /// `host:port` of the peer.
    let remote: String
    let peerHost: String?
    let service: HTTPService
    /// The byte stream, once the connection has been wrapped (on a worker, at its first bytes).
    var connection: Connection?
    /// Bytes read and not yet used (a pipelined request's start).
    var input = InputBuffer()
    /// When the current request's head began to arrive (the header deadline counts from it).
    var headStarted = 0.0
    /// How far a head that arrives in pieces has been scanned.
    var scan = HeadScan()
    /// Whether the descriptor is in the epoll set.
    var registered = false

    init(id: UInt64, fd: Int32, remote: String, peerHost: String?, service: HTTPService) {
        self.id = id
        self.fd = fd
        self.remote = remote
        self.peerHost = peerHost
        self.service = service
    }

    /// Closes the socket, through the connection once wrapped (it owns the descriptor then).
    func close() {
        if let connection { connection.close() } else { _ = Glibc.close(fd) }
    }
}

/// Bytes read from a connection and not yet consumed.
struct InputBuffer {
    var bytes: [UInt8] = []
    var start = 0
    var available: Int { bytes.count - start }

    mutating func consume(_ n: Int) {
        start += n
        if start >= bytes.count {
            bytes.removeAll(keepingCapacity: bytes.capacity <= 65536)
            start = 0
        }
    }

    /// Drops consumed bytes (the indices of what is left change).
    mutating func compact() {
        if start > 0 {
            bytes.removeFirst(start)
            start = 0
        }
    }
}

/// The one epoll loop of the process, for every HTTPService in it: it accepts connections,
/// waits for idle (kept-alive) connections to have bytes, closes idle ones at their deadline,
/// drains connections being closed after an error (so that the answer is not lost to a reset),
/// and answers 503 to connections over a service's limit, all without a thread per
/// connection. A connection with bytes to read goes to a worker (`workers`), which reads the
/// request with deadlines, starts its handler and writes the answer, and then gives the
/// connection back (`park`). A thousand services in one process (the arm benchmark) cost one
/// thread here.
final class EventLoop: @unchecked Sendable {
    static let shared = EventLoop()

    /// Guards this loop's tables and every HTTPService's connection accounting.
    let lock = NSLock()
    /// Threads that read requests and write answers: bounded, so that a flood of connections
    /// cannot create threads without end (those beyond wait in order for a free one).
    let workers = BlockingThreads(maxThreads: EventLoop.maxWorkers, maxIdle: 16, idleTimeout: 10, stackSize: 512 * 1024)
    static let maxWorkers = 64

    /// After an error answer, how long and how much the loop reads and discards before closing.
    static let lingerTime = 2.0
    static let lingerBytes = 4 << 20
    /// At most this many connections linger at once (beyond, they are closed at once).
    static let maxLingering = 1024
    /// A listener that fails to accept (no descriptors left) rests this long.
    static let acceptPause = 0.1

    private let epfd: Int32
    private let wakefd: Int32
    private var nextID: UInt64 = 1

    private struct Listening {
        let fd: Int32
        let service: HTTPService
        var pausedUntil: Double?
    }

    private enum Parked {
        /// Waiting for its next request (or its first).
        case idle(ServerConnection, deadline: Double)
        /// Answered and shut down for writing; read and discarded until the peer closes.
        case linger(fd: Int32, owner: ServerConnection?, service: HTTPService?, drained: Int, deadline: Double)
    }

    private var listeners: [UInt64: Listening] = [:]
    private var parked: [UInt64: Parked] = [:]
    private var lingering = 0
    private var nextDeadline = Double.infinity

    private init() {
        epfd = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakefd = eventfd(0, Int32(EFD_NONBLOCK) | Int32(EFD_CLOEXEC))
        precondition(epfd >= 0 && wakefd >= 0, "cannot create the HTTP event loop: \(NetError.text(errno: errno))")
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.u64 = 0
        epoll_ctl(epfd, Int32(EPOLL_CTL_ADD), wakefd, &event)
        let thread = Thread { [unowned self] in self.run() }
        thread.name = "heraldlab.http.loop"
        thread.stackSize = 512 * 1024
        thread.start()
    }

    private func newID() -> UInt64 {
        defer { nextID += 1 }
        return nextID
    }

    private func wake() { eventfd_write(wakefd, 1) }

    /// Sets a deadline the loop must wake for (lock held); true when it is earlier than the
    /// one the loop sleeps towards.
    private func due(_ deadline: Double) -> Bool {
        guard deadline < nextDeadline else { return false }
        nextDeadline = deadline
        return true
    }

    // MARK: Listeners

    /// Accepts connections on `fd` (a listening socket, made non-blocking here) for `service`.
    func addListener(_ fd: Int32, service: HTTPService) throws -> UInt64 {
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else {
            throw NetError(.listen, "cannot make the listening socket non-blocking: \(NetError.text(errno: errno))")
        }
        return try lock.withLock {
            let id = newID()
            var event = epoll_event()
            event.events = EPOLLIN.rawValue
            event.data.u64 = id
            guard epoll_ctl(epfd, Int32(EPOLL_CTL_ADD), fd, &event) == 0 else {
                throw NetError(.listen, "cannot watch the listening socket: \(NetError.text(errno: errno))")
            }
            listeners[id] = Listening(fd: fd, service: service)
            return id
        }
    }

    /// Stops accepting on a listener and closes its socket.
    func removeListener(_ id: UInt64) {
        lock.withLock {
            guard let l = listeners.removeValue(forKey: id) else { return }
            var event = epoll_event()
            _ = epoll_ctl(epfd, Int32(EPOLL_CTL_DEL), l.fd, &event)
            _ = Glibc.close(l.fd)
        }
    }

    /// Accepts what is pending on a listener (lock held; on the loop's thread).
    private func acceptPending(_ id: UInt64, now: Double) {
        guard let l = listeners[id] else { return }
        let service = l.service
        for _ in 0..<64 {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let fd = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { heraldlab_accept_cloexec(l.fd, $0, &length) }
            }
            if fd < 0 {
                let e = errno
                if e == EINTR || e == ECONNABORTED || e == EPROTO { continue }
                if e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM {
                    // Out of descriptors or memory: the pending connection stays queued and the
                    // socket stays readable, so rest the listener rather than spin on it.
                    var event = epoll_event()
                    event.data.u64 = id
                    _ = epoll_ctl(epfd, Int32(EPOLL_CTL_MOD), l.fd, &event)
                    listeners[id]?.pausedUntil = now + Self.acceptPause
                    _ = due(now + Self.acceptPause)
                    service.noteAcceptFailure(NetError.text(errno: e), now: now)
                }
                return
            }
            let peer = NetAddress(storage: storage, length: length)
            if service.stopping {
                _ = Glibc.close(fd)
                continue
            }
            if service.open >= service.limits.maxConnections {
                refuseOverLimit(fd, service: service, now: now)
                continue
            }
            service.open += 1
            let c = ServerConnection(id: newID(), fd: fd, remote: peer.description, peerHost: peer.host, service: service)
            if !register(c, deadline: now + service.limits.idleTimeout) {
                service.open -= 1
                _ = Glibc.close(fd)
            }
        }
    }

    /// A connection over the service's limit: a 503 written without waiting (it fits the socket's
    /// buffer), then closed after lingering; no thread waits on it. On a TLS port no HTTP is
    /// written in the clear (a client would read it as a broken record): the refusal is a TLS
    /// fatal alert, internal_error, which may be sent unencrypted before the handshake (RFC 8446
    /// 6), so the client's TLS reports an alert from the server rather than garbage. No
    /// handshake is made for it: a flood over the limit costs no asymmetric crypto, no worker.
    private func refuseOverLimit(_ fd: Int32, service: HTTPService, now: Double) {
        let answer: [UInt8]
        if service.isTLS {
            answer = Self.tlsInternalErrorAlert
        } else {
            let body = "{\"error\":\"too many connections (\(service.limits.maxConnections)); try again later\"}"
            answer = Array(("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" + body).utf8)
        }
        var scratch = [UInt8](repeating: 0, count: 16384)
        // What the client sent already is read first: closing a socket with unread bytes resets it.
        _ = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
        _ = answer.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        _ = Glibc.shutdown(fd, Int32(SHUT_WR))
        service.noteRefusedOverLimit(now: now)
        lingerLocked(fd: fd, owner: nil, service: nil, now: now)
    }

    /// A TLS record (content type 21, alert; legacy version TLS 1.2; 2 bytes) holding a fatal
    /// internal_error (80).
    static let tlsInternalErrorAlert: [UInt8] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50]

    // MARK: Connections

    /// Puts `c` in the epoll set to wait for bytes until `deadline` (lock held).
    private func register(_ c: ServerConnection, deadline: Double) -> Bool {
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLRDHUP.rawValue | EPOLLONESHOT.rawValue
        event.data.u64 = c.id
        guard epoll_ctl(epfd, Int32(c.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD), c.fd, &event) == 0 else { return false }
        c.registered = true
        parked[c.id] = .idle(c, deadline: deadline)
        _ = due(deadline)
        return true
    }

    /// Gives a served connection back to wait for its next request (until the idle deadline),
    /// or for the rest of a head (until `deadline`, the header deadline), or closes it when its
    /// service is stopping. From a worker.
    func park(_ c: ServerConnection, deadline: Double? = nil) {
        let service = c.service
        let (kept, woke) = lock.withLock { () -> (Bool, Bool) in
            service.active[c.id] = nil
            let before = nextDeadline
            if !service.stopping && register(c, deadline: deadline ?? monotonicNow() + service.limits.idleTimeout) {
                return (true, nextDeadline < before)
            }
            service.open -= 1
            return (false, false)
        }
        if !kept { c.close() }
        if woke { wake() }
    }

    /// Closes a connection at once (no unread bytes, or nothing more to say). From a worker.
    func release(_ c: ServerConnection) {
        lock.withLock {
            c.service.active[c.id] = nil
            c.service.open -= 1
        }
        c.close()
    }

    /// Shuts down writing (the peer sees the end of the answer) and reads and discards what the
    /// peer still sends, for at most `lingerTime` and `lingerBytes`, before closing: a socket
    /// closed with unread bytes sends a reset, which can destroy the answer before it is read.
    /// The connection no longer counts against its service's limit. From a worker.
    func linger(_ c: ServerConnection) {
        _ = Glibc.shutdown(c.fd, Int32(SHUT_WR))
        let woke = lock.withLock { () -> Bool in
            c.service.active[c.id] = nil
            c.service.open -= 1
            let before = nextDeadline
            lingerLocked(fd: c.fd, owner: c, service: c.service, now: monotonicNow())
            return nextDeadline < before
        }
        if woke { wake() }
    }

    private func lingerLocked(fd: Int32, owner: ServerConnection?, service: HTTPService?, now: Double) {
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLRDHUP.rawValue | EPOLLONESHOT.rawValue
        let id = owner?.id ?? newID()
        event.data.u64 = id
        let registered = owner?.registered ?? false
        guard lingering < Self.maxLingering,
              epoll_ctl(epfd, Int32(registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD), fd, &event) == 0 else {
            if let owner { owner.close() } else { _ = Glibc.close(fd) }
            return
        }
        owner?.registered = true
        lingering += 1
        let deadline = now + Self.lingerTime
        parked[id] = .linger(fd: fd, owner: owner, service: service, drained: 0, deadline: deadline)
        _ = due(deadline)
    }

    /// The connections of `service` waiting in the loop (tests).
    func parkedConnections(of service: HTTPService) -> [ServerConnection] {
        lock.withLock {
            parked.values.compactMap { p in
                if case .idle(let c, _) = p, c.service === service { return c }
                return nil
            }
        }
    }

    /// Closes every idle and lingering connection of `service` (it is stopping).
    func closeParked(of service: HTTPService) {
        var closing = [() -> Void]()
        lock.withLock {
            for (id, p) in parked {
                switch p {
                case .idle(let c, _) where c.service === service:
                    parked[id] = nil
                    service.open -= 1
                    closing.append { c.close() }
                case .linger(let fd, let owner, let s, _, _) where s === service:
                    parked[id] = nil
                    lingering -= 1
                    closing.append { if let owner { owner.close() } else { _ = Glibc.close(fd) } }
                default: break
                }
            }
        }
        for close in closing { close() }
    }

    // MARK: The loop

    private func run() {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        var scratch = [UInt8](repeating: 0, count: 65536)
        while true {
            let timeout: Int32 = lock.withLock {
                guard nextDeadline.isFinite else { return -1 }
                return Int32(max(0, min(3_600_000, ((nextDeadline - monotonicNow()) * 1000).rounded(.up))))
            }
            let n = epoll_wait(epfd, &events, Int32(events.count), timeout)
            if n < 0 {
                if errno != EINTR { usleep(10_000) }
                continue
            }
            var dispatch = [ServerConnection]()
            var closing = [() -> Void]()
            lock.lock()
            let now = monotonicNow()
            for i in 0..<Int(n) {
                let id = events[i].data.u64
                if id == 0 {
                    var value: eventfd_t = 0
                    _ = eventfd_read(wakefd, &value)
                    continue
                }
                if listeners[id] != nil {
                    acceptPending(id, now: now)
                    continue
                }
                guard let p = parked[id] else { continue }
                switch p {
                case .idle(let c, _):
                    parked[id] = nil
                    c.service.active[c.id] = c
                    // A new request's head starts now; a head in pieces, or a TLS handshake,
                    // keeps its start.
                    if c.input.available == 0 && c.connection?.isHandshaking != true { c.headStarted = now }
                    dispatch.append(c)
                case .linger(let fd, let owner, let service, var drained, let deadline):
                    var done = false
                    while true {
                        let r = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
                        if r > 0 {
                            drained += r
                            if drained >= Self.lingerBytes { done = true; break }
                            continue
                        }
                        if r < 0 && errno == EINTR { continue }
                        done = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)
                        break
                    }
                    var event = epoll_event()
                    event.events = EPOLLIN.rawValue | EPOLLRDHUP.rawValue | EPOLLONESHOT.rawValue
                    event.data.u64 = id
                    if !done && epoll_ctl(epfd, Int32(EPOLL_CTL_MOD), fd, &event) == 0 {
                        parked[id] = .linger(fd: fd, owner: owner, service: service, drained: drained, deadline: deadline)
                    } else {
                        parked[id] = nil
                        lingering -= 1
                        closing.append { if let owner { owner.close() } else { _ = Glibc.close(fd) } }
                    }
                }
            }
            if now >= nextDeadline { expire(now: now, closing: &closing, dispatch: &dispatch) }
            lock.unlock()
            for close in closing { close() }
            for c in dispatch {
                workers.run { c.service.serve(c) }
            }
        }
    }

    /// Closes what is past its deadline and resumes rested listeners (lock held).
    private func expire(now: Double, closing: inout [() -> Void], dispatch: inout [ServerConnection]) {
        var next = Double.infinity
        for (id, p) in parked {
            switch p {
            case .idle(let c, let deadline):
                if deadline <= now && c.input.available > 0 {
                    // Part of a head, and its deadline passed: a worker answers 408.
                    parked[id] = nil
                    c.service.active[c.id] = c
                    dispatch.append(c)
                } else if deadline <= now {
                    // Idle too long: closed without a word (RFC 9112 9.8 allows it).
                    parked[id] = nil
                    c.service.open -= 1
                    closing.append { c.close() }
                } else {
                    next = min(next, deadline)
                }
            case .linger(let fd, let owner, _, _, let deadline):
                if deadline <= now {
                    parked[id] = nil
                    lingering -= 1
                    closing.append { if let owner { owner.close() } else { _ = Glibc.close(fd) } }
                } else {
                    next = min(next, deadline)
                }
            }
        }
        for (id, l) in listeners {
            guard let until = l.pausedUntil else { continue }
            if until <= now {
                var event = epoll_event()
                event.events = EPOLLIN.rawValue
                event.data.u64 = id
                _ = epoll_ctl(epfd, Int32(EPOLL_CTL_MOD), l.fd, &event)
                listeners[id]?.pausedUntil = nil
            } else {
                next = min(next, until)
            }
        }
        // Deadlines closer together than 50 ms are handled in one pass (one scan, not one each).
        nextDeadline = next.isFinite ? max(next, now + 0.05) : next
    }
}
