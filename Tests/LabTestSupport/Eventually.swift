import Foundation

/// A condition the test awaits, with a deadline: checked every 10 ms (nothing here notifies),
/// and a failure names what was awaited and for how long. The one wait of the in-process tests;
/// never a fixed sleep.
public struct WaitTimedOut: Error, CustomStringConvertible {
    public let what: String
    public let seconds: Double
    public var description: String { "waited \(seconds) s for \(what)" }
}

public func eventually(_ what: String, within seconds: Double = 30, _ condition: () async throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(seconds)
    while try await !condition() {
        guard Date() < deadline else { throw WaitTimedOut(what: what, seconds: seconds) }
        try await Task.sleep(nanoseconds: 10_000_000)
    }
}
