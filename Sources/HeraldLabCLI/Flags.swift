import ArgumentParser
import Foundation
import LabLog
import LabPlan
import Logging

/// Command-line values with units: every duration flag takes what plans take (`500ms`, `30s`,
/// `2m`, `8h`, `30d`) and refuses a bare number with the unit that would put it in range.
enum Flags {
    /// A transform for `@Option(transform:)`: the duration in seconds, from `min` to `max`.
    static func duration(min: TimeInterval, max: TimeInterval, allowZero: Bool = false) -> @Sendable (String) throws -> TimeInterval {
        { text in
            do { return try Plan.duration(text, min: min, max: max, allowZero: allowZero) } catch {
                throw ValidationError("\(error)")
            }
        }
    }

    /// A transform for `--log-level`: trace, debug, info, notice, warning, error or critical.
    static let logLevel: @Sendable (String) throws -> Logger.Level = { text in
        do { return try LabLogLevel.parse(text) } catch {
            throw ValidationError("\(error)\(CLIConventions.didYouMean(text, among: Logger.Level.allCases.map(\.rawValue)))")
        }
    }
}
