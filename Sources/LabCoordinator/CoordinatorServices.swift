import Foundation
import HeraldCore
import LabPlan
import Logging

/// A long-lived piece of the coordinator's work besides answering HTTP: it runs until its task
/// is cancelled, then returns. The `herald-lab coordinator` process runs each in its
/// `ServiceGroup` beside the HTTP server (ServiceRunner.swift); `Coordinator.start` and
/// `startUnserved` run them in one task group of their own when asked to (tests, in-memory labs).
public struct CoordinatorService: Sendable {
    public let name: String
    public let run: @Sendable () async -> Void

    public init(name: String, run: @escaping @Sendable () async -> Void) {
        self.name = name
        self.run = run
    }
}

/// Writes heartbeat times to SQLite in batches (`AgentRegistry.persistSeen`): woken by the first
/// time due, it waits a second of the coordinator's clock and writes all those then pending.
enum SeenFlusher {
    /// The wake-ups: at most one pending (a wake-up while one is pending adds nothing).
    final class Signal: Sendable {
        let stream: AsyncStream<Void>
        private let continuation: AsyncStream<Void>.Continuation

        init() { (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1)) }

        func wake() { continuation.yield() }
    }

    static func service(_ registry: AgentRegistry, clock: any LabClock) -> CoordinatorService {
        CoordinatorService(name: "heartbeat times") {
            for await _ in registry.seenDue.stream {
                // Cancelled while waiting: what is pending is written at once, then the loop ends
                // (the iterator returns nil once cancelled); `Coordinator.stop` writes the rest.
                do { try await clock.sleep(for: 1) } catch {}
                registry.flushSeen()
            }
        }
    }
}
