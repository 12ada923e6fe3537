import Foundation

/// Where a run's common start is put (the look-up "where is the start barrier computed"): every
/// agent is armed, then all start at one instant, `margin` seconds after the last was armed, in
/// each agent's own clock. The margin covers sending the starts (about as long as arming took)
/// and the slowest link, plus a little per node; a margin over `maxStartMargin` (or not finite)
/// would hold every agent of the run idle for it, so the run is refused instead.
struct StartBarrier: Equatable, Sendable {
    /// Seconds between the last agent armed and the common start.
    var margin: Double
    /// Whether the start can be bounded: `margin` is finite and at most `maxStartMargin`.
    var bounded: Bool

    /// The barrier for a run of `nodes` nodes whose arming took `armTime` seconds, with the
    /// slowest clock's round trip `worstRoundTrip`: at least `startMargin`.
    static func compute(startMargin: Double, maxStartMargin: Double, armTime: Double, worstRoundTrip: Double, nodes: Int) -> StartBarrier {
        let margin = max(startMargin, 1.5 * armTime + 10 * worstRoundTrip + 0.5) + 0.002 * Double(nodes)
        return StartBarrier(margin: margin, bounded: margin.isFinite && margin <= maxStartMargin)
    }
}
