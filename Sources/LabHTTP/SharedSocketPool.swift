import Foundation
import FlyingFox
import FlyingSocks

/// One socket event loop for every HTTP server of the process. FlyingFox's default pool keeps a
/// dispatch thread in epoll_wait per server; with dozens of agents in one process (benchmarks, test
/// modes) that exhausts the dispatch thread pool and everything stalls.
final class SharedSocketPool: AsyncSocketPool, @unchecked Sendable {
    static let shared = SharedSocketPool()

    /// FlyingSocks' pool on `EpollQueue`, not `HTTPServer.defaultPool()`, whose epoll queue loses
    /// track of a descriptor number closed while registered (see `EpollQueue`).
    private let inner: any AsyncSocketPool = SocketPool(queue: EpollQueue())
    private let lock = NSLock()
    private var prepareTask: Task<Void, Error>?
    private var runTask: Task<Void, Error>?

    func prepare() async throws {
        let t = lock.withLock { () -> Task<Void, Error> in
            if prepareTask == nil { prepareTask = Task { [inner] in try await inner.prepare() } }
            return prepareTask!
        }
        try await t.value
    }

    /// Starts the shared loop once; each server's call then waits until that server is cancelled.
    func run() async throws {
        lock.withLock {
            if runTask == nil { runTask = Task { [inner] in try await inner.run() } }
        }
        while true { try await Task.sleep(nanoseconds: 3_600_000_000_000) }
    }

    func suspendSocket(_ socket: Socket, untilReadyFor events: Socket.Events) async throws {
        try await inner.suspendSocket(socket, untilReadyFor: events)
    }
}
