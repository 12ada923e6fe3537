import Foundation
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// Streams a CSV file in 1 MiB chunks and hands each line's fields to a callback as byte
/// slices, without building Strings: memory stays bounded whatever the file size.
/// Tolerates a UTF-8 BOM, CRLF line ends, quoted fields (Herald does not escape inner quotes:
/// a quote ends a quoted field only when a comma or the line end follows) and a last line
/// without a newline. Lines with NUL bytes or over 64 KiB are reported as malformed; a line
/// may hold any number of fields (detection.csv of a folder of 150 phones has 150+).
/// Only regular files are read (`LogFileAccess`): a FIFO, device or directory is refused.
struct CSVScanner {
    /// The fields of one line: `starts[k]..<ends[k]` index into the line's buffer. Any number
    /// of fields: the storage doubles when a line has more fields than it holds.
    struct Line {
        static let initialCapacity = 64
        private(set) var starts: UnsafeMutablePointer<Int>
        private(set) var ends: UnsafeMutablePointer<Int>
        private(set) var capacity: Int
        var count = 0
        init(capacity: Int = Line.initialCapacity) {
            self.capacity = capacity
            starts = .allocate(capacity: capacity)
            ends = .allocate(capacity: capacity)
        }
        func deallocate() { starts.deallocate(); ends.deallocate() }
        @inline(__always) mutating func append(_ s: Int, _ e: Int) {
            if count == capacity { grow() }
            starts[count] = s
            ends[count] = e
            count += 1
        }
        @inline(never) private mutating func grow() {
            let bigger = capacity * 2
            let s = UnsafeMutablePointer<Int>.allocate(capacity: bigger), e = UnsafeMutablePointer<Int>.allocate(capacity: bigger)
            s.update(from: starts, count: count)
            e.update(from: ends, count: count)
            starts.deallocate(); ends.deallocate()
            starts = s; ends = e; capacity = bigger
        }
    }

    static let maximumLine = 64 * 1024

    /// Per-scan state, kept out of closures so the hot loop touches no boxed variables.
    private struct State {
        var line: Line
        var lineNumber = 0
        var malformed = 0
        var first = true
        var overflow = false
        /// Whether a line has been handed to the row handler yet.
        var handed = false
    }

    /// Splits one line (without its newline) into fields and hands it to `row`.
    @inline(__always)
    private static func process<R: CSVRows>(_ p: UnsafeBufferPointer<UInt8>, _ from: Int, _ to: Int, _ st: inout State, _ rows: inout R) {
        var start = from
        var end = to
        if st.first {
            st.first = false
            if end - start >= 3, p[start] == 0xEF, p[start + 1] == 0xBB, p[start + 2] == 0xBF { start += 3 }
        }
        if end > start, p[end - 1] == 13 { end -= 1 }
        st.lineNumber += 1
        if end == start { return }
        if end - start > maximumLine { st.malformed += 1; return }
        st.line.count = 0
        st.handed = true
        var ok = true
        if splitPlain(p, start, end, &st.line, &ok) {
            if !ok || !rows.row(p, &st.line, st.lineNumber) { st.malformed += 1 }
            return
        }
        st.line.count = 0
        ok = true
        var i = start
        while true {
            if i < end, p[i] == 34 {
                // Quoted field: ends at a quote followed by a comma or the line end.
                let fs = i + 1
                var j = fs
                var closed = -1
                while j < end {
                    if p[j] == 34, j + 1 == end || p[j + 1] == 44 { closed = j; break }
                    j += 1
                }
                if closed < 0 { ok = false; st.line.append(fs, end); break }
                st.line.append(fs, closed)
                i = closed + 1
            } else {
                let fs = i
                i = nextComma(p, i, end, &ok)
                st.line.append(fs, i)
            }
            if i >= end { break }
            i += 1 // comma
            if i == end { st.line.append(end, end); break }
        }
        if !ok || !rows.row(p, &st.line, st.lineNumber) { st.malformed += 1 }
    }

    /// Splits a line without quotes at its commas, 32 bytes at a time (a NUL clears `ok`);
    /// false, with `line` to be reset, if the line holds a quote (the general rules apply).
    @inline(__always)
    private static func splitPlain(_ p: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, _ line: inout Line, _ ok: inout Bool) -> Bool {
        let raw = UnsafeRawPointer(p.baseAddress!)
        let comma = SIMD32<UInt8>(repeating: 44), quote = SIMD32<UInt8>(repeating: 34), nul = SIMD32<UInt8>(repeating: 0)
        var fs = start
        var i = start
        while i < end {
            var commas: UInt32 = 0, nuls: UInt32 = 0, quotes: UInt32 = 0
            if i + 32 <= p.count {
                let v = raw.loadUnaligned(fromByteOffset: i, as: SIMD32<UInt8>.self)
                commas = bits(v .== comma)
                // Quotes and NULs are rare: one mask for both, told apart only when it has a bit.
                let rare = bits((v .== quote) .| (v .== nul))
                if rare != 0 {
                    quotes = bits(v .== quote)
                    nuls = rare & ~quotes
                }
            } else {
                for k in 0..<min(32, p.count - i) {
                    let c = p[i + k]
                    if c == 34 { quotes |= 1 << UInt32(k) }
                    if c == 44 { commas |= 1 << UInt32(k) }
                    if c == 0 { nuls |= 1 << UInt32(k) }
                }
            }
            if end - i < 32 {
                let valid = (UInt32(1) << UInt32(end - i)) &- 1
                quotes &= valid
                commas &= valid
                nuls &= valid
            }
            if quotes != 0 { return false }
            if nuls != 0 { ok = false }
            while commas != 0 {
                let k = i + commas.trailingZeroBitCount
                line.append(fs, k)
                fs = k + 1
                commas &= commas - 1
            }
            i += 32
        }
        line.append(fs, end)
        return true
    }

    /// Bit k set where lane k of the mask is.
    @inline(__always) static func bits(_ m: SIMDMask<SIMD32<Int8>>) -> UInt32 {
        let v = unsafeBitCast(m, to: SIMD4<UInt64>.self)
        var r: UInt32 = 0
        for l in 0..<4 { r |= UInt32(truncatingIfNeeded: ((v[l] & 0x8080_8080_8080_8080) &* 0x0002_0408_1020_4081) >> 56) << UInt32(8 * l) }
        return r
    }

    /// Index of the next `,` at or after `i` (or `end`); a NUL byte on the way clears `ok`.
    /// Eight bytes at a time: a field rarely holds either.
    @inline(__always)
    private static func nextComma(_ p: UnsafeBufferPointer<UInt8>, _ from: Int, _ end: Int, _ ok: inout Bool) -> Int {
        var i = from
        let raw = UnsafeRawPointer(p.baseAddress!)
        let ones: UInt64 = 0x0101_0101_0101_0101, highs: UInt64 = 0x8080_8080_8080_8080
        let commas = ones &* 44
        while i + 8 <= end {
            let w = raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            let c = w ^ commas
            // High bit set in each byte that is a comma or a NUL (exact for the lowest such byte).
            let hits = ((c &- ones) & ~c | (w &- ones) & ~w) & highs
            if hits == 0 { i += 8; continue }
            let k = i + hits.trailingZeroBitCount / 8
            if p[k] == 44 { return k }
            ok = false // a NUL, then keep looking for the comma
            i = k + 1
        }
        while i < end {
            let c = p[i]
            if c == 44 { return i }
            if c == 0 { ok = false }
            i += 1
        }
        return end
    }

    /// Calls `row(bytes, line, lineNumber)` for each line; returns (lines, malformed, missing final newline).
    /// `row` returns false for a line it judges malformed.
    ///
    /// `onlyLinesWithField`, asked once `row` has seen its first line: a one-byte field value
    /// (ASCII, not a comma, quote or newline) such that the lines `row` still needs all hold it
    /// as a field that is neither the first nor the last (`,2,` or `,"2",`), or nil. From then
    /// on the other lines are skipped unsplit (a search through whole chunks instead of a look
    /// at every line), and the counts returned are not those of the whole file: only the lines
    /// handed to `row` and whether the file ends without a newline stay exact.
    @discardableResult
    static func scan(url: URL, root: URL? = nil, onlyLinesWithField: (() -> UInt8?)? = nil,
                     _ row: (UnsafeBufferPointer<UInt8>, inout Line, Int) -> Bool) throws -> (lines: Int, malformed: Int, missingFinalNewline: Bool) {
        try withoutActuallyEscaping(row) { row in
            var rows = ClosureRows(body: row)
            return try scan(url: url, root: root, onlyLinesWithField: onlyLinesWithField, rows: &rows)
        }
    }

    /// A closure as a row handler.
    private struct ClosureRows: CSVRows {
        let body: (UnsafeBufferPointer<UInt8>, inout Line, Int) -> Bool
        @inline(__always) func row(_ p: UnsafeBufferPointer<UInt8>, _ line: inout Line, _ number: Int) -> Bool { body(p, &line, number) }
    }

    /// `scan` with the rows handed to `rows` (specialised for its type: no closure call, no
    /// reference counting per line, which costs more than splitting the line).
    @discardableResult
    static func scan<R: CSVRows>(url: URL, root: URL? = nil, onlyLinesWithField: (() -> UInt8?)? = nil,
                                 rows: inout R) throws -> (lines: Int, malformed: Int, missingFinalNewline: Bool) {
        let handle = try LogFileAccess.open(url, root: root)
        defer { try? handle.close() }
        var st = State(line: Line())
        defer { st.line.deallocate() }
        // One buffer: the carried start of a line, then the next chunk read behind it.
        let chunkSize = 1 << 20
        var capacity = chunkSize + maximumLine + 1
        var buffer = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        defer { buffer.deallocate() }
        var carried = 0
        var sawAny = false
        var endedWithNewline = true
        var filter: UInt8?
        var filterDecided = onlyLinesWithField == nil
        let fd = handle.fileDescriptor
        while true {
            if carried + chunkSize > capacity {
                capacity = carried + chunkSize
                let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
                bigger.update(from: buffer, count: carried)
                buffer.deallocate()
                buffer = bigger
            }
            // A whole chunk unless the file ends (chunks of 1 MiB, as lines over 64 KiB are cut by them).
            var got = 0
            while got < chunkSize {
                let r = read(fd, buffer + carried + got, chunkSize - got)
                if r < 0 {
                    if errno == EINTR { continue }
                    throw LogFileAccess.Problem.unreadable(url.lastPathComponent, reason: String(cString: strerror(errno)))
                }
                if r == 0 { break }
                got += r
            }
            if got == 0 { break }
            sawAny = true
            let n = carried + got
            let p = UnsafeBufferPointer(start: buffer, count: n)
            var s = 0
            while s < n {
                if !filterDecided, st.handed {
                    filterDecided = true
                    filter = onlyLinesWithField?()
                }
                if let value = filter {
                    s = processMatching(p, from: s, field: value, &st, &rows)
                    break
                }
                guard let hit = memchr(buffer + s, 10, n - s) else { break }
                let i = buffer.distance(to: hit.assumingMemoryBound(to: UInt8.self))
                process(p, s, i, &st, &rows)
                s = i + 1
            }
            carried = n - s
            if carried > 0, s > 0 { buffer.update(from: buffer + s, count: carried) }
            if carried > maximumLine {
                // A "line" longer than any Herald line: garbage. Drop it.
                st.malformed += 1
                carried = 0
            }
            endedWithNewline = carried == 0
        }
        if carried > 0 {
            process(UnsafeBufferPointer(start: buffer, count: carried), 0, carried, &st, &rows)
        }
        return (st.lineNumber, st.malformed, sawAny && !endedWithNewline)
    }

    /// Processes the complete lines of `p` from `from` that can hold `field` as a middle field
    /// (the byte between commas or quotes); returns where the last complete line ends (the
    /// start of what must be carried).
    private static func processMatching<R: CSVRows>(_ p: UnsafeBufferPointer<UInt8>, from: Int, field: UInt8, _ st: inout State, _ rows: inout R) -> Int {
        let base = p.baseAddress!
        var limit = p.count - 1 // index of the last newline
        while limit >= from, p[limit] != 10 { limit -= 1 }
        guard limit >= from else { return from }
        var pos = from
        while pos < limit, let hit = nextField(p, from: pos, limit: limit, value: field) {
            // The line around the hit.
            var start = hit
            while start > pos, p[start - 1] != 10 { start -= 1 }
            let end = memchr(base + hit, 10, limit + 1 - hit).map { base.distance(to: $0.assumingMemoryBound(to: UInt8.self)) } ?? limit
            process(p, start, end, &st, &rows)
            pos = end + 1
        }
        return limit + 1
    }

    /// The first index in `from ..< limit` of `value` with a comma or a quote on either side.
    /// 32 bytes at a time, each compared with its neighbours on either side (loads one byte off).
    @inline(__always)
    private static func nextField(_ p: UnsafeBufferPointer<UInt8>, from: Int, limit: Int, value: UInt8) -> Int? {
        let raw = UnsafeRawPointer(p.baseAddress!)
        let wanted = SIMD32<UInt8>(repeating: value), comma = SIMD32<UInt8>(repeating: 44), quote = SIMD32<UInt8>(repeating: 34)
        var i = max(from, 1)
        while i + 33 <= p.count, i < limit {
            let v = raw.loadUnaligned(fromByteOffset: i, as: SIMD32<UInt8>.self)
            let before = raw.loadUnaligned(fromByteOffset: i - 1, as: SIMD32<UInt8>.self)
            let after = raw.loadUnaligned(fromByteOffset: i + 1, as: SIMD32<UInt8>.self)
            let hits = (v .== wanted) .& ((before .== comma) .| (before .== quote)) .& ((after .== comma) .| (after .== quote))
            let found = bits(hits)
            if found != 0 {
                let k = i + found.trailingZeroBitCount
                return k < limit ? k : nil
            }
            i += 32
        }
        // The tail, byte by byte.
        var k = max(i, from, 1)
        while k < limit {
            if p[k] == value, k + 1 < p.count {
                let a = p[k - 1], b = p[k + 1]
                if (a == 44 || a == 34) && (b == 44 || b == 34) { return k }
            }
            k += 1
        }
        return nil
    }
}

/// What `CSVScanner.scan` hands each line to: its bytes, its fields and its number; false for a
/// line it judges malformed.
protocol CSVRows {
    mutating func row(_ p: UnsafeBufferPointer<UInt8>, _ line: inout CSVScanner.Line, _ number: Int) -> Bool
}

extension UnsafeBufferPointer where Element == UInt8 {
    @inline(__always) func string(_ s: Int, _ e: Int) -> String { String(decoding: UnsafeBufferPointer(rebasing: self[s..<e]), as: UTF8.self) }
    @inline(__always) func equals(_ s: Int, _ e: Int, _ ascii: StaticString) -> Bool {
        guard e - s == ascii.utf8CodeUnitCount else { return false }
        let a = ascii.utf8Start
        for k in 0..<(e - s) where self[s + k] != a[k] { return false }
        return true
    }
}

/// Times as Herald logs write them, parsed from bytes.
enum LogTime {
    /// Seconds since 1970 of `yyyy-MM-dd HH:mm:ss` read as a wall clock (no zone), the
    /// fractional part (milliseconds), and the zone offset in seconds if the text had one.
    struct Parsed { var wallSecond: Int64; var millis: Int; var zoneOffset: Int?
        /// Absolute time: wall clock + fraction - zone.
        var absolute: Double { Double(wallSecond - Int64(zoneOffset ?? 0)) + Double(millis) / 1000 }
    }

    @inline(__always) static func parse(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Parsed? {
        guard let wall = wallSecond(p, s, e) else { return nil }
        return rest(p, s, e, wall)
    }

    /// Seconds since 1970 of the `yyyy-MM-dd HH:mm:ss` at the start of the field read as a wall
    /// clock, or nil if it is not a possible time.
    @inline(__always) static func wallSecond(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Int64? {
        guard e - s >= 19 else { return nil }
        @inline(__always) func d(_ k: Int) -> Int? { let c = p[s + k]; return c >= 48 && c <= 57 ? Int(c - 48) : nil }
        guard let y0 = d(0), let y1 = d(1), let y2 = d(2), let y3 = d(3), p[s + 4] == 45,
              let m0 = d(5), let m1 = d(6), p[s + 7] == 45, let d0 = d(8), let d1 = d(9),
              p[s + 10] == 32 || p[s + 10] == 84,
              let h0 = d(11), let h1 = d(12), p[s + 13] == 58, let i0 = d(14), let i1 = d(15), p[s + 16] == 58,
              let s0 = d(17), let s1 = d(18) else { return nil }
        let year = y0 * 1000 + y1 * 100 + y2 * 10 + y3, month = m0 * 10 + m1, day = d0 * 10 + d1
        let hour = h0 * 10 + h1, minute = i0 * 10 + i1, second = s0 * 10 + s1
        // Impossible dates and times (2022-02-31, 25:61) are malformed, as are years before 1970.
        guard year >= 1970, (1...12).contains(month), day >= 1, day <= daysIn(month, year), hour < 24, minute < 60, second < 61 else { return nil }
        let days = HeraldTimestamp.daysFromCivil(year, month, day)
        return Int64(days) * 86400 + Int64(hour * 3600 + minute * 60 + second)
    }

    /// The fraction and zone after the seconds.
    @inline(__always) static func rest(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int, _ wall: Int64) -> Parsed {
        var result = Parsed(wallSecond: wall, millis: 0, zoneOffset: nil)
        var k = s + 19
        if k < e, p[k] == 46 {
            k += 1
            var scale = 100, ms = 0
            while k < e, p[k] >= 48, p[k] <= 57 { ms += Int(p[k] - 48) * scale; scale /= 10; k += 1 }
            result.millis = ms
        }
        if k < e {
            if p[k] == 90 { result.zoneOffset = 0 }
            else if p[k] == 43 || p[k] == 45, e - k >= 5 {
                let sign = p[k] == 43 ? 1 : -1
                var digits = (0, 0, 0, 0), n = 0
                var j = k + 1
                while j < e, n < 4 {
                    let c = p[j]
                    if c >= 48 && c <= 57 {
                        let v = Int(c - 48)
                        switch n { case 0: digits.0 = v; case 1: digits.1 = v; case 2: digits.2 = v; default: digits.3 = v }
                        n += 1
                    } else if c != 58 { break }
                    j += 1
                }
                if n == 4 { result.zoneOffset = sign * ((digits.0 * 10 + digits.1) * 3600 + (digits.2 * 10 + digits.3) * 60) }
            }
        }
        return result
    }

    /// The last `yyyy-MM-dd HH:mm:ss` parsed and its seconds: rows come in time order, many in
    /// the same second, so most rows compare 19 bytes instead of parsing them.
    struct Cache {
        private var a: UInt64 = 0, b: UInt64 = 0, c: UInt32 = 0
        private var wall: Int64 = 0
        private var filled = false

        /// `LogTime.wallSecond` of the field, from the cache when its first 19 bytes are the last ones'.
        @inline(__always) mutating func wallSecond(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Int64? {
            guard e - s >= 19 else { return nil }
            let raw = UnsafeRawPointer(p.baseAddress! + s)
            let x = raw.loadUnaligned(as: UInt64.self), y = raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
            let z = raw.loadUnaligned(fromByteOffset: 15, as: UInt32.self)
            if filled, x == a, y == b, z == c { return wall }
            guard let w = LogTime.wallSecond(p, s, e) else { return nil }
            a = x; b = y; c = z; wall = w; filled = true
            return w
        }

        /// The zone of the last `yyyy-MM-dd HH:mm:ss.SSS+hhmm` parsed (its five bytes) and its offset.
        private var zone: (bytes: UInt64, offset: Int?) = (0, nil)
        private var zoneFilled = false

        @inline(__always) mutating func parse(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Parsed? {
            guard let w = wallSecond(p, s, e) else { return nil }
            // Herald's own form, `.SSS` and a `+hhmm` zone, with the zone's bytes those of the last
            // row: the milliseconds read here, the zone from the cache (what `rest` would find).
            if e - s == 28, p[s + 19] == 46 {
                let m0 = Int(p[s + 20]) &- 48, m1 = Int(p[s + 21]) &- 48, m2 = Int(p[s + 22]) &- 48
                if UInt(bitPattern: m0) <= 9, UInt(bitPattern: m1) <= 9, UInt(bitPattern: m2) <= 9 {
                    let z = UnsafeRawPointer(p.baseAddress! + s).loadUnaligned(fromByteOffset: 20, as: UInt64.self) >> 24
                    let millis = m0 * 100 + m1 * 10 + m2
                    if zoneFilled, z == zone.bytes { return Parsed(wallSecond: w, millis: millis, zoneOffset: zone.offset) }
                    let c = p[s + 23]
                    if c == 43 || c == 45 {
                        let r = LogTime.rest(p, s, e, w)
                        zone = (z, r.zoneOffset)
                        zoneFilled = true
                        return r
                    }
                }
            }
            return LogTime.rest(p, s, e, w)
        }

        @inline(__always) mutating func isValid(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Bool {
            wallSecond(p, s, e) != nil
        }
    }

    @inline(__always) static func daysIn(_ month: Int, _ year: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Whether the field holds a possible time (the same rules as `parse`, which also accepts
    /// anything after the seconds): only the checks, none of the arithmetic, for rows whose time
    /// is not needed until pass 2.
    @inline(__always) static func isValid(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Bool {
        guard e - s >= 19 else { return false }
        @inline(__always) func d(_ k: Int) -> Int { Int(p[s + k]) &- 48 }
        @inline(__always) func digits(_ k: Int) -> Bool { UInt(bitPattern: d(k)) <= 9 && UInt(bitPattern: d(k + 1)) <= 9 }
        guard digits(0), digits(2), digits(5), digits(8), digits(11), digits(14), digits(17), p[s + 4] == 45, p[s + 7] == 45, p[s + 10] == 32 || p[s + 10] == 84, p[s + 13] == 58, p[s + 16] == 58 else { return false }
        let year = d(0) * 1000 + d(1) * 100 + d(2) * 10 + d(3), month = d(5) * 10 + d(6), day = d(8) * 10 + d(9)
        return year >= 1970 && month >= 1 && month <= 12 && day >= 1 && day <= daysIn(month, year)
            && d(11) * 10 + d(12) < 24 && d(14) * 10 + d(15) < 60 && d(17) * 10 + d(18) < 61
    }

    /// Parses a time given as text (flags, manifests): `YYYY-MM-DD HH:MM:SS[.SSS][zone]`, in the
    /// logs' time base (a zone, when given, is applied).
    static func parse(text: String) -> Double? {
        guard text.utf8.count <= 64 else { return nil }
        var t = text
        return t.withUTF8 { u in parse(u, 0, u.count)?.absolute }
    }

    /// `YYYY-MM-DD HH:MM:SS`.
    static func format(_ seconds: Double) -> String {
        HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: seconds))
    }
}
