import Foundation
import HeraldCore
import LabPlan
import Logging

/// The coordinator's background work (`Coordinator.services`): run in the `herald-lab coordinator`
/// process's ServiceGroup (ServiceRunner.swift), or by `start`/`startUnserved` in one task group.
public typealias CoordinatorService = BackgroundWork

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
