import Foundation

/// Timestamps in the forms Herald logs use, formatted without DateFormatter (fast, thread-safe).
public enum HeraldTimestamp {
    /// `yyyy-MM-dd HH:mm:ss.SSS+0000`, UTC: the current Android form, what HeraldLab nodes write.
    public static func utcMillis(_ date: Date) -> String {
        let ms = Saturating.int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        return format(epochMillis: ms, millis: true) + "+0000"
    }

    /// `yyyy-MM-dd HH:mm:ss`, UTC.
    public static func utcSeconds(_ date: Date) -> String {
        format(epochMillis: Saturating.int64((date.timeIntervalSince1970 * 1000).rounded(.down)), millis: false)
    }

    /// ISO 8601 with milliseconds and Z, as used in manifests.
    public static func iso8601(_ date: Date) -> String {
        let s = format(epochMillis: Saturating.int64((date.timeIntervalSince1970 * 1000).rounded(.down)), millis: true)
        var chars = Array(s)
        chars[10] = "T"
        return String(chars) + "Z"
    }

    /// Parses `yyyy-MM-dd[ T]HH:mm:ss[.SSS][Z|+0000|+00:00]` as UTC (a zone offset is applied).
    public static func parse(_ text: String) -> Date? {
        let b = Array(text.utf8)
        func num(_ from: Int, _ n: Int) -> Int? {
            guard from + n <= b.count else { return nil }
            var v = 0
            for i in from..<(from + n) {
                let c = b[i]
                guard c >= 48, c <= 57 else { return nil }
                v = v * 10 + Int(c - 48)
            }
            return v
        }
        guard b.count >= 19, let y = num(0, 4), b[4] == 45, let mo = num(5, 2), b[7] == 45, let d = num(8, 2),
              b[10] == 32 || b[10] == 84, let h = num(11, 2), b[13] == 58, let mi = num(14, 2), b[16] == 58,
              let s = num(17, 2), (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, s < 61 else { return nil }
        var i = 19
        var millis = 0.0
        if i < b.count, b[i] == 46 {
            i += 1
            var scale = 100.0
            while i < b.count, b[i] >= 48, b[i] <= 57 { millis += Double(b[i] - 48) * scale; scale /= 10; i += 1 }
        }
        var offsetSeconds = 0
        if i < b.count {
            let c = b[i]
            if c == 90 { i += 1 } else if c == 43 || c == 45 {
                let sign = c == 43 ? 1 : -1
                guard let oh = num(i + 1, 2) else { return nil }
                var j = i + 3
                if j < b.count, b[j] == 58 { j += 1 }
                guard let om = num(j, 2) else { return nil }
                offsetSeconds = sign * (oh * 3600 + om * 60)
                i = j + 2
            } else { return nil }
        }
        guard i == b.count else { return nil }
        let days = daysFromCivil(y, mo, d)
        let secs = Double(days * 86400 + h * 3600 + mi * 60 + s - offsetSeconds)
        return Date(timeIntervalSince1970: secs + millis / 1000)
    }

    static func format(epochMillis: Int64, millis: Bool) -> String {
        // Years 0000 to 9999, the only ones the form can write: a date from outside beyond them
        // is written as the nearest (the arithmetic below would overflow at Int64's ends).
        var ms = min(max(epochMillis, -62_167_219_200_000), 253_402_300_799_999)
        let days = ms >= 0 ? ms / 86_400_000 : (ms - 86_399_999) / 86_400_000
        ms -= days * 86_400_000
        let (y, m, d) = civilFromDays(days)
        let secOfDay = Int(ms / 1000)
        let milli = Int(ms % 1000)
        var out = [UInt8]()
        out.reserveCapacity(23)
        func put(_ v: Int, _ width: Int) {
            var digits = [UInt8](repeating: 48, count: width)
            var x = v
            for k in stride(from: width - 1, through: 0, by: -1) { digits[k] = UInt8(48 + x % 10); x /= 10 }
            out.append(contentsOf: digits)
        }
        put(y, 4); out.append(45); put(m, 2); out.append(45); put(d, 2); out.append(32)
        put(secOfDay / 3600, 2); out.append(58); put(secOfDay / 60 % 60, 2); out.append(58); put(secOfDay % 60, 2)
        if millis { out.append(46); put(milli, 3) }
        return String(decoding: out, as: UTF8.self)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    public static func daysFromCivil(_ y0: Int, _ m: Int, _ d: Int) -> Int {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    static func civilFromDays(_ z0: Int64) -> (Int, Int, Int) {
        let z = Int(z0) + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp + (mp < 10 ? 3 : -9)
        return (m <= 2 ? y + 1 : y, m, d)
    }
}
