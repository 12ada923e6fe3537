import Foundation
import Dispatch

/// Work spread over a bounded number of threads, results kept in input order: the analyser's
/// only parallelism (one item per observer's files), so its output never depends on timing.
enum Parallel {
    /// `body(i)` for every index, on at most `threads` threads (the caller's among them), the
    /// items of greatest `cost` started first; the results in index order. `body` must touch
    /// nothing shared that it writes.
    static func map<T>(_ indices: Range<Int>, threads: Int, cost: (Int) -> Int64, _ body: (Int) -> T) -> [T] {
        let count = indices.count
        guard count > 0 else { return [] }
        let workers = max(1, min(threads, count))
        if workers == 1 { return indices.map(body) }
        let order = indices.map { ($0, cost($0)) }.sorted { $0.1 != $1.1 ? $0.1 > $1.1 : $0.0 < $1.0 }.map(\.0)
        let results = UnsafeMutablePointer<T?>.allocate(capacity: count)
        results.initialize(repeating: nil, count: count)
        defer { results.deinitialize(count: count); results.deallocate() }
        withoutActuallyEscaping(body) { body in
            let shared = Shared(order: order, results: results, body: body, first: indices.lowerBound)
            DispatchQueue.concurrentPerform(iterations: workers) { _ in shared.work() }
        }
        return (0..<count).map { results[$0]! }
    }

    /// What the threads share: the queue of items (under a lock) and one result slot each.
    // Invariant (unchecked Sendable): the next item is taken under the lock; each result slot is
    // written by the one thread that took its item, and read only after concurrentPerform returns.
    private final class Shared<T>: @unchecked Sendable {
        let order: [Int]
        let results: UnsafeMutablePointer<T?>
        let body: (Int) -> T
        let first: Int
        let lock = NSLock()
        var next = 0
        init(order: [Int], results: UnsafeMutablePointer<T?>, body: @escaping (Int) -> T, first: Int) {
            self.order = order
            self.results = results
            self.body = body
            self.first = first
        }
        func work() {
            while true {
                lock.lock()
                guard next < order.count else { lock.unlock(); return }
                let i = order[next]
                next += 1
                lock.unlock()
                results[i - first] = body(i)
            }
        }
    }
}
