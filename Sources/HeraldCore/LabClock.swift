import Foundation

/// The time the coordinator's and the agent's rules see (issue 39 item 5): seconds since 1970
/// in this clock, and waiting until an instant of it. Services take one at `init`; a process
/// runs on `WallClock`, an in-memory lab on a virtual clock that its driver advances, so a
/// two-minute plan takes no two minutes and the same rules run as over HTTP.
public protocol LabClock: Sendable {
    /// Seconds since 1970 in this clock.
    func now() -> Double
    /// Returns once this clock reads `deadline` or later; throws `CancellationError` when the
    /// task is cancelled first.
    func sleep(until deadline: Double) async throws
}

extension LabClock {
    /// Waits `seconds` of this clock (none when not positive).
    public func sleep(for seconds: Double) async throws {
        try await sleep(until: now() + max(0, seconds))
    }
}

/// The system's real-time clock (`Date`), waiting with `Task.sleep`.
public struct WallClock: LabClock {
    public init() {}

    public func now() -> Double { Date().timeIntervalSince1970 }

    public func sleep(until deadline: Double) async throws {
        let left = deadline - now()
        guard left > 0 else { try Task.checkCancellation(); return }
        try await Task.sleep(nanoseconds: UInt64(Saturating.nanoseconds(left)))
    }
}
