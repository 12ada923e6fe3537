import Foundation
import LabNet

/// Streamed answers (`HTTPResponse.Body.stream`, server-sent events): the head is written by a
/// worker, then the producer runs as a task and each chunk it gives is written by a worker (no
/// worker waits between chunks). A stream never pins the server: at most `maxStreams` run at
/// once (one more is 503), each ends after `streamSeconds` (its next `write` throws; an
/// EventSource reconnects), and the connection is closed at its end (never kept alive).
extension HTTPService {
    static let maxStreams = 32
    static let streamSeconds = 300.0
    private static let streams = StreamCount()

    final class StreamCount: @unchecked Sendable {
        private let lock = NSLock()
        private var open = 0
        func enter(limit: Int) -> Bool { lock.withLock { guard open < limit else { return false }; open += 1; return true } }
        func leave() { lock.withLock { open -= 1 } }
    }

    func stream(_ c: ServerConnection, _ head: RequestHead, _ response: HTTPResponse,
                _ produce: @escaping @Sendable (_ write: @Sendable (Data) async throws -> Void) async throws -> Void) {
        let loop = EventLoop.shared
        guard head.method != "HEAD" else {
            do { try write(response, to: c, head: head, close: true) } catch {}
            loop.release(c)
            return
        }
        guard Self.streams.enter(limit: Self.maxStreams) else {
            do { try write(.error(.serviceUnavailable, "too many event streams open; try again later"), to: c, head: head, close: true) } catch {}
            loop.release(c)
            return
        }
        guard let connection = c.connection, (try? write(response, to: c, head: head, close: true)) != nil else {
            Self.streams.leave()
            loop.release(c)
            return
        }
        let deadline = monotonicNow() + Self.streamSeconds
        let chunk: @Sendable (Data) async throws -> Void = { [self] data in
            guard !data.isEmpty else { return }
            guard monotonicNow() < deadline, !loop.lock.withLock({ stopping }) else { throw ReadEnd.closed }
            let framed = Data((String(data.count, radix: 16) + "\r\n").utf8) + data + Data("\r\n".utf8)
            try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, Error>) in
                loop.workers.run {
                    do { try connection.write(framed); done.resume() } catch { done.resume(throwing: error) }
                }
            }
        }
        Task.detached {
            do { try await produce(chunk) } catch {}
            loop.workers.run {
                // The last chunk, when the peer is still there; the connection ends either way.
                do { try connection.write("0\r\n\r\n") } catch {}
                Self.streams.leave()
                loop.release(c)
            }
        }
    }
}
