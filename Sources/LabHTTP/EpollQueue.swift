import Foundation
import FlyingSocks
import CLinuxEvents
#if canImport(Glibc)
import Glibc
#endif

/// The epoll queue under the shared socket loop: FlyingSocks' own, made safe for descriptors
/// that are closed while registered and whose numbers come back.
///
/// FlyingSocks' `ePoll` (0.27) keeps a map of what it registered and skips `epoll_ctl` when the
/// map already says so. `HTTPServer.stop()` closes the listening socket before its accept loop's
/// wait is cancelled; the kernel drops a closed descriptor from the epoll set by itself, the late
/// `EPOLL_CTL_DEL` fails, and the entry stays. The next socket given that number (the next
/// server's listening socket, typically) is then never registered: it never accepts. Here every
/// wait re-arms its descriptor with `epoll_ctl` (MOD, or ADD when the kernel no longer knows it),
/// and a failed DEL forgets the entry.
struct EpollQueue: EventQueue {
    private var epoll: Int32 = -1
    private var wake: Int32 = -1
    private var registered: [Int32: Socket.Events] = [:]
    private let maxEvents: Int

    init(maxEvents: Int = 64) { self.maxEvents = maxEvents }

    mutating func open() throws {
        registered = [:]
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw SocketError.makeFailed("epoll_create1") }
        wake = eventfd(0, Int32(EFD_NONBLOCK) | Int32(EFD_CLOEXEC))
        guard wake >= 0 else { throw SocketError.makeFailed("eventfd") }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wake
        guard epoll_ctl(epoll, Int32(EPOLL_CTL_ADD), wake, &event) == 0 else { throw SocketError.makeFailed("epoll_ctl") }
    }

    mutating func stop() throws {
        registered = [:]
        guard wake >= 0 else { throw SocketError.disconnected }
        eventfd_write(wake, 1)
    }

    mutating func close() throws {
        guard epoll >= 0 else { throw SocketError.disconnected }
        Glibc.close(epoll)
        if wake >= 0 { Glibc.close(wake) }
        epoll = -1
        wake = -1
    }

    mutating func addEvents(_ events: Socket.Events, for socket: Socket.FileDescriptor) throws {
        try arm(socket.rawValue, (registered[socket.rawValue] ?? []).union(events))
    }

    mutating func removeEvents(_ events: Socket.Events, for socket: Socket.FileDescriptor) throws {
        let fd = socket.rawValue
        guard let current = registered[fd] else { return }
        let remaining = current.subtracting(events)
        if remaining.isEmpty {
            registered[fd] = nil
            var event = epoll_event()
            // Fails when the descriptor is already closed (the kernel dropped it): nothing to do.
            _ = epoll_ctl(epoll, Int32(EPOLL_CTL_DEL), fd, &event)
        } else if remaining != current {
            try arm(fd, remaining)
        }
    }

    /// Registers `events` for `fd` in the kernel whatever the map says (edge-triggered, so a
    /// MOD also re-arms it).
    private mutating func arm(_ fd: Int32, _ events: Socket.Events) throws {
        var event = epoll_event()
        event.events = EPOLLET.rawValue | EPOLLRDHUP.rawValue
            | (events.contains(.read) ? EPOLLIN.rawValue : 0) | (events.contains(.write) ? EPOLLOUT.rawValue : 0)
        event.data.fd = fd
        var rc = epoll_ctl(epoll, Int32(registered[fd] == nil ? EPOLL_CTL_ADD : EPOLL_CTL_MOD), fd, &event)
        if rc != 0 && errno == ENOENT { rc = epoll_ctl(epoll, Int32(EPOLL_CTL_ADD), fd, &event) }
        if rc != 0 && errno == EEXIST { rc = epoll_ctl(epoll, Int32(EPOLL_CTL_MOD), fd, &event) }
        guard rc == 0 else {
            registered[fd] = nil
            throw SocketError.makeFailed("epoll_ctl")
        }
        registered[fd] = events
    }

    func getNotifications() throws -> [EventNotification] {
        var events = [epoll_event](repeating: epoll_event(), count: maxEvents)
        let n = epoll_wait(epoll, &events, Int32(maxEvents), -1)
        if n < 0 {
            if errno == EINTR { return [] }
            throw SocketError.makeFailed("epoll_wait")
        }
        var out = [EventNotification]()
        for e in events.prefix(Int(n)) {
            if e.data.fd == wake { throw SocketError.disconnected }
            var ready = Socket.Events()
            if e.events & EPOLLIN.rawValue != 0 { ready.insert(.read) }
            if e.events & EPOLLOUT.rawValue != 0 { ready.insert(.write) }
            var errors = Set<EventNotification.Error>()
            if e.events & EPOLLERR.rawValue != 0 { errors.insert(.error) }
            if e.events & (EPOLLHUP.rawValue | EPOLLRDHUP.rawValue) != 0 && ready.isEmpty { errors.insert(.endOfFile) }
            // An error or a hang-up wakes whoever waits, for either direction.
            if !errors.isEmpty && ready.isEmpty { ready = [.read, .write] }
            out.append(EventNotification(file: Socket.FileDescriptor(rawValue: e.data.fd), events: ready, errors: errors))
        }
        return out
    }
}
