import Foundation
import Logging
import ServiceLifecycle

/// A long-running service of this process (the air, an agent, the coordinator) under
/// swift-service-lifecycle: it runs until the group shuts down gracefully (SIGTERM or SIGINT), then
/// `stop` finishes or persists what it holds (an agent's run state is already durable; the
/// coordinator's runs resume from its store) and the command returns, exit 0.
struct LabService: Service {
    let name: String
    let stop: @Sendable () async -> Void

    func run() async throws {
        do {
            try await gracefulShutdown()
        } catch {
            // The group cancelled the service (its shutdown took too long, or a second signal):
            // stop all the same, so that nothing is left half-written.
        }
        await stop()
    }
}

/// A service's background work (the coordinator's run driver, heartbeat times, health checks, housekeeping;
/// the shared history's outbox): it runs until the group shuts down gracefully, which cancels it.
struct BackgroundService: Service {
    let name: String
    let work: @Sendable () async -> Void

    func run() async throws {
        await cancelWhenGracefulShutdown { await work() }
    }
}

/// Runs one service until SIGTERM or SIGINT, then stops it (`LabService`), with its HTTP
/// `server` and its `background` work in the same group: the group shuts services down in
/// reverse order, so the background work ends before `stop` runs (which closes the server's
/// connections), and the server last. A server that cannot listen shuts the group down and its
/// error is thrown.
func runService(_ name: String, logger: Logger = lifecycleLogger, server: (any Service)? = nil, background: [BackgroundService] = [],
                stop: @escaping @Sendable () async -> Void) async throws {
    let front: [ServiceGroupConfiguration.ServiceConfiguration] = server.map {
        [.init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup)]
    } ?? []
    let group = ServiceGroup(configuration: .init(
        services: front + [.init(service: LabService(name: name, stop: stop),
                         successTerminationBehavior: .gracefullyShutdownGroup,
                         failureTerminationBehavior: .gracefullyShutdownGroup)]
            + background.map { .init(service: $0, successTerminationBehavior: .ignore, failureTerminationBehavior: .gracefullyShutdownGroup) },
        gracefulShutdownSignals: [.sigterm, .sigint],
        logger: logger))
    try await group.run()
}

/// The group's own logger: warnings and worse (its start and signal lines are not the service's).
let lifecycleLogger: Logger = {
    var l = Logger(label: "herald-lab.lifecycle")
    l.logLevel = .warning
    return l
}()
