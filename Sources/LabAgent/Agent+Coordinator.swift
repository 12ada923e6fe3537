import Foundation
import HeraldCore
import LabLink
import LabPlan
import Logging

/// The agent's link to its coordinator (`coordinatorLink`): register, then heartbeat with the
/// status. A coordinator that does not answer is retried with exponential backoff (up to
/// `maxBackoff`), so an agent left alone idles; a run in progress goes on regardless.
extension Agent {
    func heartbeatLoop() async {
        guard let link = coordinatorLink else { return }
        let coordinator = link.address
        var registered = false
        var failures = 0
        // Every message of this boot gets the next counter: a replayed one is refused.
        var sequence: UInt64 = 0
        func next() -> UInt64 { sequence += 1; return sequence }
        // The clock stamps of the last heartbeat the coordinator answered with its own, reported
        // in the next: the coordinator's clock samples (Coordinator+Clock).
        var clock: LabWire.HeartbeatClock?
        while !Task.isCancelled {
            do throws(LinkError) {
                if !registered {
                    var me = info
                    me.boot = boot
                    me.sequence = next()
                    try await link.register(me)
                    registered = true
                    logger.notice("registered with \(coordinator) as \(url)")
                }
                var beat = status
                let number = next()
                beat.boot = boot
                beat.sequence = number
                beat.clock = clock
                // A heartbeat that fails leaves no stamps to report.
                clock = nil
                let answer = try await link.heartbeat(agent: config.name, beat)
                if answer.reply != nil { clock = LabWire.HeartbeatClock(sequence: number, sent: answer.sent, answered: answer.answered) }
                if failures > 0 { logger.notice("coordinator \(coordinator) answers again") }
                failures = 0
            } catch {
                let status = error.status
                if status == 404 || status == nil { registered = false }
                failures += 1
                if failures == 1 || failures.isMultiple(of: 20) {
                    if status == 401 || status == 403 {
                        logger.error("coordinator \(coordinator) refuses this agent's credential (\(error)); was it revoked? enrol it again (herald-lab agents enrol \(config.name)); retrying in \(Self.backoffSeconds(failures, base: config.heartbeatInterval, cap: config.maxBackoff)) s")
                    } else if status == 409 {
                        logger.error("coordinator \(coordinator) refuses this agent (\(error)); retrying in \(Self.backoffSeconds(failures, base: config.heartbeatInterval, cap: config.maxBackoff)) s")
                    } else {
                        logger.warning("coordinator \(coordinator) unreachable (\(error)); any run goes on; retrying in \(Self.backoffSeconds(failures, base: config.heartbeatInterval, cap: config.maxBackoff)) s")
                    }
                }
            }
            let wait = failures == 0 ? config.heartbeatInterval : Self.backoff(failures, base: config.heartbeatInterval, cap: config.maxBackoff)
            // Cancelled (the agent stops): the loop ends.
            do { try await config.clock.sleep(for: wait) } catch { return }
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
