import Foundation
import HeraldCore

/// Appends `yyyy-MM-dd HH:mm:ss.SSS+0000` (UTC) to a byte buffer, reusing the date-and-time part
/// while the second does not change: cheap enough for millions of rows.
struct TimestampWriter {
    private var cachedSecond: Int64 = .min
    /// `yyyy-MM-dd HH:mm:ss` of the cached second, in the writer itself (not an array elsewhere
    /// in memory: a row then touches one object less).
    private var prefix: (UInt64, UInt64, UInt64) = (0, 0, 0)
    private var prefixCount = 0

    @inline(__always) mutating func append<S: ByteSink>(_ date: Date, to out: inout S) {
        // A clock from outside can be anything (NaN, 1e300, before year 0): saturated, then held to
        // the years the form can write (0000 to 9999, as HeraldTimestamp writes them), so the
        // arithmetic below cannot overflow (issue 36).
        let ms = min(max(Saturating.int64((date.timeIntervalSince1970 * 1000).rounded(.down)), -62_167_219_200_000), 253_402_300_799_999)
        let second = ms >= 0 ? ms / 1000 : (ms - 999) / 1000
        if second != cachedSecond {
            cachedSecond = second
            let text = Array(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: TimeInterval(second))).utf8)
            prefixCount = min(24, text.count) // always 19
            withUnsafeMutableBytes(of: &prefix) { $0.copyBytes(from: text.prefix(prefixCount)) }
        }
        let count = prefixCount
        withUnsafeBytes(of: &prefix) { out.append(UnsafeBufferPointer(start: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: count)) }
        let milli = Int(ms - second * 1000)
        out.append(46)
        out.append(UInt8(48 + milli / 100))
        out.append(UInt8(48 + milli / 10 % 10))
        out.append(UInt8(48 + milli % 10))
        out.append(43) // +0000
        out.append(48)
        out.append(48)
        out.append(48)
        out.append(48)
    }
}
