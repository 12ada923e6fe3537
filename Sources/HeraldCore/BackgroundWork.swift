/// A long-lived piece of a service's work besides answering HTTP (the coordinator's run driver,
/// heartbeat times, health checks, housekeeping; an agent's heartbeats and dongle refreshes): it
/// runs until its task is cancelled, then returns. A process runs each in its one
/// `ServiceGroup` beside its HTTP server; tests and in-memory labs run them in one task group of
/// the service's own (`start`).
public struct BackgroundWork: Sendable {
    public let name: String
    public let run: @Sendable () async -> Void

    public init(name: String, run: @escaping @Sendable () async -> Void) {
        self.name = name
        self.run = run
    }
}
