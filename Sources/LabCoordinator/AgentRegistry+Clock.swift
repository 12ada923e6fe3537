import Foundation
import HeraldCore
import LabHTTP
import LabLink
import LabPlan

/// Each agent's clock against the coordinator's, for the common start and the bundle's offsets.
///
/// Heartbeats carry it. The coordinator answers every heartbeat with when it received it and when
/// it answered (`LabWire.ClockReply`, its clock) and keeps those two stamps; the agent's next
/// heartbeat says when it sent that one and when the answer came back (`LabWire.HeartbeatClock`,
/// its clock). The four make one NTP exchange, one sample, at no cost beyond a few numbers in
/// messages that flow anyway. Arming takes an agent's clock from the samples of its last
/// `heartbeatClockWindow` seconds when they agree and pin it tightly enough; only an agent whose
/// heartbeats do not (a slow or jittery link, a coordinator just restarted, an agent from before
/// heartbeat clocks) is probed (`ClockProbe`: up to 32 exchanges on a connection of its own).
/// With a thousand agents, the probes were most of arming's time (ARCHITECTURE.md, "Clocks").
/// The samples are the agent registry's; probing is the coordinator's (it calls the agent).
extension AgentRegistry {
    /// The coordinator's two stamps of its answer to heartbeat `sequence` of boot `boot`.
    struct PendingClock {
        var boot: String
        var sequence: UInt64
        var received: Double
        var sent: Double
    }

    /// A clock sample from a heartbeat, and when (coordinator clock) the coordinator answered it.
    struct TimedClockSample {
        var at: Double
        var sample: LabWire.ClockSample
    }

    /// Samples kept per agent: a window's worth at several heartbeats a second.
    static let heartbeatClocksKept = 64

    /// A heartbeat's clock report, checked for shape before anything else of the heartbeat is
    /// taken: numbers that are not times are a bad request, named.
    static func checkClock(_ clock: LabWire.HeartbeatClock?) throws {
        guard let clock else { return }
        for (field, value) in [("sent", clock.sent), ("answered", clock.answered)] where !(value.isFinite && value >= 0 && value < 1e11) {
            throw LabRefusal(.invalid, "clock.\(field) \(value) is not a time (seconds since 1970)")
        }
        guard clock.answered >= clock.sent, clock.answered - clock.sent <= 3600 else {
            throw LabRefusal(.invalid, "clock: answered \(clock.answered) is not within an hour after sent \(clock.sent)")
        }
    }

    /// Agent clock minus coordinator clock, from the heartbeats of the last window, when they make
    /// a good enough estimate: at least `heartbeatClockSamples` samples, all agreeing
    /// (`ClockSample.agreeing`), bounding the offset to ± `heartbeatClockRoundTrip`/2. nil
    /// otherwise, and for an agent now registered at another URL than `url`.
    func heartbeatClock(agent: String, url: String) -> LabWire.ClockSample? {
        let t = clock.now()
        let samples = withRecords { agents -> [LabWire.ClockSample] in
            guard let a = agents[agent], a.info.url == url else { return [] }
            return a.clocks.filter { $0.at <= t && t - $0.at <= rules.heartbeatClockWindow }.map(\.sample)
        }
        guard samples.count >= max(1, rules.heartbeatClockSamples), let estimate = LabWire.ClockSample.agreeing(samples),
              estimate.roundTrip <= rules.heartbeatClockRoundTrip else { return nil }
        return estimate
    }
}

extension RunController {
    /// A node's agent's clock (`from` says how it was measured): from its heartbeats when they
    /// suffice, else probed over `link` (over HTTP: `ClockProbe`, up to 32 exchanges on one
    /// kept-alive connection, fewer once a round trip under 1 ms was seen after 8). nil with the
    /// reason when the probes got no answer.
    func clock(of node: RunRecord.Node, over link: any AgentLink) async -> (LabWire.ClockSample?, String?) {
        if var estimate = registry.heartbeatClock(agent: node.agent, url: node.agentURL) {
            estimate.from = .heartbeats
            return (estimate, nil)
        }
        let samples: [LabWire.ClockSample]
        do { samples = try await link.clockSamples(count: 32, settle: 8) } catch { return (nil, "\(error)") }
        guard !samples.isEmpty else { return (nil, "no answer to clock probes at \(node.agentURL)") }
        guard var best = LabWire.ClockSample.combined(samples) else {
            return (nil, "no usable clock from \(node.agentURL): \(samples.count) probe answers, none with a round trip of 0 to \(Int(LabWire.ClockSample.maxRoundTrip)) s and an offset within 10 years")
        }
        best.from = .probes
        return (best, nil)
    }
}

extension AgentRegistry.AgentRecord {
    /// Takes the agent's stamps of its previous heartbeat: with the coordinator's of its answer to
    /// that very heartbeat (same boot, same sequence), one sample. Stamps of another heartbeat (its
    /// answer was lost, the coordinator restarted) or a negative round trip (a clock stepped)
    /// make none. Called with the coordinator's lock held.
    mutating func takeClock(_ clock: LabWire.HeartbeatClock, boot: String) {
        guard let p = clockPending, p.boot == boot, p.sequence == clock.sequence else { return }
        clockPending = nil
        // The agent's side of the exchange (t0, t3 its stamps) gives coordinator minus agent.
        var sample = LabWire.ClockSample(t0: clock.sent, t1: p.received, t2: p.sent, t3: clock.answered)
        sample.offset = -sample.offset
        guard sample.isUsable else { return }
        clocks.append(AgentRegistry.TimedClockSample(at: p.sent, sample: sample))
        if clocks.count > AgentRegistry.heartbeatClocksKept { clocks.removeFirst(clocks.count - AgentRegistry.heartbeatClocksKept) }
    }
}
