/// Double to integer conversions that cannot trap. `Int64(x)` traps on NaN, on infinities and on
/// anything beyond ±9.2e18, and a Double from outside (a clock answer, a stored record, a plan)
/// can be any of them: an agent answering a clock probe with 5e10 once put a run's start 5e11 s
/// ahead, and every later `GET /metrics` trapped converting it to nanoseconds (issue 36).
/// NaN is 0; values beyond the type's range are its bounds; the rest are truncated toward zero,
/// as `Int64(x)` would. Inlinable: the analyser converts in its row loop.
public enum Saturating {
    @inlinable public static func int64(_ x: Double) -> Int64 {
        guard !x.isNaN else { return 0 }
        if x >= 9_223_372_036_854_775_807.0 { return .max }  // 2^63 as a Double: Int64.max + 1
        if x <= -9_223_372_036_854_775_808.0 { return .min }
        return Int64(x)
    }

    @inlinable public static func int(_ x: Double) -> Int { Int(int64(x)) }

    @inlinable public static func uint64(_ x: Double) -> UInt64 {
        guard !x.isNaN, x > 0 else { return 0 }
        if x >= 18_446_744_073_709_551_615.0 { return .max }  // 2^64 as a Double
        return UInt64(x)
    }

    /// Seconds as nanoseconds, negative values 0 (a duration or a delay from outside).
    @inlinable public static func nanoseconds(_ seconds: Double) -> Int64 { max(0, int64(seconds * 1e9)) }

    /// Seconds as milliseconds, negative values 0.
    @inlinable public static func milliseconds(_ seconds: Double) -> Int64 { max(0, int64(seconds * 1000)) }
}
