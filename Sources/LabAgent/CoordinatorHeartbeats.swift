import Foundation
import HeraldCore
import LabLink
import LabPlan
import Logging

/// The agent's link to its coordinator, as a service: register, then heartbeat with the status,
/// in the agent's clock. A coordinator that does not answer is retried with exponential backoff
/// (up to `maxBackoff`), so an agent left alone idles; a run in progress goes on regardless.
/// `run()` is its whole life: the agent runs it as a child task of its background work and ends
/// it by cancelling.
///
/// It owns what the loop keeps between beats (registered or not, the message counter, the last
/// clock stamps): locals of `run()`, so there is no shared state; what it reports it reads through
/// the agent's `info` and `status` (each safe from any task).
struct CoordinatorHeartbeats: Sendable {
    let link: any CoordinatorLink
    let agent: String
    let boot: String
    let clock: any LabClock
    let interval: Double
    let maxBackoff: Double
    let logger: Logger
    /// What registers the agent, what each beat says, and the URL it is announced at.
    /// nil: the agent is gone, the heartbeats end.
    let info: @Sendable () -> LabWire.AgentInfo?
    let status: @Sendable () -> LabWire.AgentStatus?
    let url: @Sendable () -> String

    /// Heartbeats until the task is cancelled.
    func run() async {
        let coordinator = link.address
        var registered = false
        var failures = 0
        // Every message of this boot gets the next counter: a replayed one is refused.
        var sequence: UInt64 = 0
        func next() -> UInt64 { sequence += 1; return sequence }
        // The clock stamps of the last heartbeat the coordinator answered with its own, reported
        // in the next: the coordinator's clock samples (Coordinator+Clock).
        var stamps: LabWire.HeartbeatClock?
        while !Task.isCancelled {
            do throws(LinkError) {
                if !registered {
                    guard var me = info() else { return }
                    me.boot = boot
                    me.sequence = next()
                    try await link.register(me)
                    registered = true
                    logger.notice("registered with \(coordinator) as \(url())")
                }
                guard var beat = status() else { return }
                let number = next()
                beat.boot = boot
                beat.sequence = number
                beat.clock = stamps
                // A heartbeat that fails leaves no stamps to report.
                stamps = nil
                let answer = try await link.heartbeat(agent: agent, beat)
                if answer.reply != nil { stamps = LabWire.HeartbeatClock(sequence: number, sent: answer.sent, answered: answer.answered) }
                if failures > 0 { logger.notice("coordinator \(coordinator) answers again") }
                failures = 0
            } catch {
                let status = error.status
                if status == 404 || status == nil { registered = false }
                failures += 1
                if failures == 1 || failures.isMultiple(of: 20) {
                    let retry = Self.backoffSeconds(failures, base: interval, cap: maxBackoff)
                    if status == 401 || status == 403 {
                        logger.error("coordinator \(coordinator) refuses this agent's credential (\(error)); was it revoked? enrol it again (herald-lab agents enrol \(agent)); retrying in \(retry) s")
                    } else if status == 409 {
                        logger.error("coordinator \(coordinator) refuses this agent (\(error)); retrying in \(retry) s")
                    } else {
                        logger.warning("coordinator \(coordinator) unreachable (\(error)); any run goes on; retrying in \(retry) s")
                    }
                }
            }
            let wait = failures == 0 ? interval : Self.backoff(failures, base: interval, cap: maxBackoff)
            // Cancelled (the agent stops): the loop ends.
            do { try await clock.sleep(for: wait) } catch { return }
        }
    }

    /// base × 2^(failures−1), capped.
    static func backoff(_ failures: Int, base: Double, cap: Double) -> Double {
        min(cap, base * pow(2, Double(min(failures - 1, 16))))
    }

    /// The backoff in whole seconds, for the log: saturated (the interval and the cap are
    /// configuration, which can say NaN or 1e300; issue 36).
    static func backoffSeconds(_ failures: Int, base: Double, cap: Double) -> Int {
        Saturating.int(backoff(failures, base: base, cap: cap))
    }
}
