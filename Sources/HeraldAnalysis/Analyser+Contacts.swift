import Foundation

extension Analyser {
    typealias Window = (ceStart: Double, ceEnd: Double, ceStartSec: Int64, filterStart: Double, filterEnd: Double, cetotal: Int)

    /// Column positions of a contacts.csv (11- or 9-column, from its header).
    struct Columns {
        var time = 0, id = 2, detect = 3, read = 4, measure = 5, share = 6, data = 8
        var count = 9
        static func from(header p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line) -> Columns? {
            var c = Columns()
            var found = 0
            for k in 0..<line.count {
                let s = line.starts[k], e = line.ends[k]
                if p.equals(s, e, "time") { c.time = k; found += 1 }
                else if p.equals(s, e, "id") { c.id = k; found += 1 }
                else if p.equals(s, e, "detect") { c.detect = k }
                else if p.equals(s, e, "read") { c.read = k; found += 1 }
                else if p.equals(s, e, "measure") { c.measure = k; found += 1 }
                else if p.equals(s, e, "share") { c.share = k }
                else if p.equals(s, e, "data") { c.data = k; found += 1 }
            }
            c.count = line.count
            return found >= 5 ? c : nil
        }
        /// Without a header: by field count.
        static func guess(_ count: Int) -> Columns {
            var c = Columns()
            c.count = count
            c.data = count >= 11 ? 10 : 8
            return c
        }
    }

    /// Pass 1 collects which ids were read as which devices (it looks only at lines that can be
    /// read rows); pass 2 checks every line and records observations. `pairs` is the observer's
    /// row (one accumulator per observed device).
    static func scanContacts(_ url: URL, observer o: Int, inputs: [DeviceInput], byShortName: [String: Int],
                             summary: inout AnalysisResult.Device, pairs: inout [PairAccumulator?],
                             make: (Int, Int) -> PairAccumulator, window w: Window) throws {
        let shift = inputs[o].shift
        let heraldShift = Int64(shift.rounded())
        var columns: Columns?
        var hasHeader = false
        // id -> devices its read rows name (Herald's mactobid); initialBID -> devices (for share rows in herald mode).
        var idDevices = [String: [Int]]()
        var readBIDs = [String: [Int]]()
        var firstRead = [Int: Double]()

        @inline(__always) func field(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ k: Int) -> (Int, Int) {
            k < line.count ? (line.starts[k], line.ends[k]) : (0, 0)
        }
        @inline(__always) func isEvent(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ k: Int, _ digit: UInt8) -> Bool {
            guard k < line.count else { return false }
            let s = line.starts[k], e = line.ends[k]
            return e - s == 1 && p[s] == digit
        }

        // Pass 1: read rows. Once the columns are known, only lines holding the read column's
        // `2` as a field (",2," or ",\"2\",", when it is neither the first nor the last column) are split.
        let root = inputs[o].root
        let first = try CSVScanner.scan(url: url, root: root, onlyLinesWithField: {
            guard let c = columns, c.read > 0, c.read < c.count - 1 else { return nil }
            return 50 // "2"
        }) { p, line, number in
            if columns == nil {
                if let c = Columns.from(header: p, line) { columns = c; hasHeader = true; return true }
                columns = Columns.guess(line.count)
            }
            let c = columns!
            guard line.count == c.count, isEvent(p, line, c.read, 50), let t = LogTime.parse(p, line.starts[c.time], line.ends[c.time]) else { return true }
            let (ds, de) = field(p, line, c.data)
            let data = p.string(ds, de)
            let bid = String(data.prefix(6))
            let id = p.string(line.starts[c.id], line.ends[c.id])
            if let d = byShortName[bid], d != o {
                if !(idDevices[id]?.contains(d) ?? false) { idDevices[id, default: []].append(d) }
                if !(readBIDs[bid]?.contains(d) ?? false) { readBIDs[bid, default: []].append(d) }
                let at = t.absolute + shift
                if at >= w.filterStart, at <= w.filterEnd, firstRead[d].map({ at < $0 }) ?? true { firstRead[d] = at }
            }
            return true
        }
        if first.missingFinalNewline { summary.problems.append("contacts.csv ends in the middle of a line (truncated?)") }
        guard let c = columns else {
            // No line reached the columns: pass 1 saw every line, and its count of malformed ones is whole.
            summary.malformedLines = first.malformed
            summary.problems.append("contacts.csv has no rows")
            return
        }
        for (d, t) in firstRead {
            let a = pairs[d] ?? make(o, d)
            a.firstRead = t
            pairs[d] = a
        }

        // Pass 2: every line is checked (an impossible date, a measure row's RSSI that cannot be a
        // number, the wrong number of fields: malformed) and observations are recorded. Ids are
        // looked up as bytes to avoid building Strings per row.
        let ids = IDTable(idDevices)
        var rows = 0, measure = 0, read = 0, share = 0
        var skipHeader = hasHeader

        /// An RSSI row of a known id (`t`: its parsed time, nil if impossible).
        @inline(__always) func measured(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ t: LogTime.Parsed?, _ rssi: (value: Int?, bad: Bool)) {
            guard let devices = ids.devices(p, line.starts[c.id], line.ends[c.id]), let t, !rssi.bad else { return }
            let heraldT = t.wallSecond + heraldShift
            let strictT = t.absolute + shift
            for d in devices {
                let a: PairAccumulator
                if let existing = pairs[d] { a = existing } else { a = make(o, d); pairs[d] = a }
                Self.observe(a, heraldT: heraldT, strictT: strictT, window: w, isRSSI: true, rssi: rssi.value)
            }
        }
        @inline(__always) func shared(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ t: LogTime.Parsed) {
            let heraldT = t.wallSecond + heraldShift
            let strictT = t.absolute + shift
            let (ds, de) = field(p, line, c.data)
            let name = p.string(ds, de)
            // herald mode: the shared name must be an initialBID read in this file (the reference join).
            for d in readBIDs[name] ?? [] where d != o {
                let a = pairs[d] ?? make(o, d)
                pairs[d] = a
                a.heraldDetected = true
                Self.observeHerald(a, heraldT: heraldT, window: w)
            }
            // strict mode: the shared shortName itself.
            if let d = byShortName[name], d != o {
                let a = pairs[d] ?? make(o, d)
                pairs[d] = a
                a.strictDetected = true
                Self.observeStrict(a, strictT: strictT, window: w)
                if strictT >= w.filterStart, strictT <= w.filterEnd, a.firstObservation.map({ strictT < $0 }) ?? true { a.firstObservation = strictT }
            }
        }

        let second = try CSVScanner.scan(url: url, root: root) { p, line, number in
            if skipHeader { skipHeader = false; return true }
            guard line.count == c.count else { return false }
            let ts = line.starts[c.time], te = line.ends[c.time]
            if isEvent(p, line, c.read, 50) {
                // A read row (counted when its time is possible); as a measure or share row too if it says so.
                let valid = LogTime.isValid(p, ts, te)
                if valid { rows += 1 }
                if isEvent(p, line, c.measure, 51) {
                    measure += 1
                    let (ds, de) = field(p, line, c.data)
                    measured(p, line, LogTime.parse(p, ts, te), Self.rssi(p, ds, de))
                } else if isEvent(p, line, c.share, 52) {
                    share += 1
                    if let t = LogTime.parse(p, ts, te) { shared(p, line, t) }
                } else {
                    read += 1
                }
                return valid
            }
            rows += 1
            if isEvent(p, line, c.measure, 51) {
                measure += 1
                let t = LogTime.parse(p, ts, te)
                let (ds, de) = field(p, line, c.data)
                let rssi = Self.rssi(p, ds, de)
                measured(p, line, t, rssi)
                return t != nil && !rssi.bad
            }
            if isEvent(p, line, c.share, 52) {
                share += 1
                guard let t = LogTime.parse(p, ts, te) else { return false }
                shared(p, line, t)
                return true
            }
            return LogTime.isValid(p, ts, te)
        }
        summary.rows = rows
        summary.malformedLines = second.malformed
        summary.measureRows = measure
        summary.readRows = read
        summary.shareRows = share
    }

    @inline(__always) static func observe(_ a: PairAccumulator, heraldT: Int64, strictT: Double, window w: Window, isRSSI: Bool, rssi: Int?) {
        // Detection: an RSSI row inside the filter window.
        if Double(heraldT) >= w.filterStart.rounded(.up), Double(heraldT) <= w.filterEnd { a.heraldDetected = true }
        if strictT >= w.filterStart, strictT <= w.filterEnd {
            a.strictDetected = true
            if a.firstObservation.map({ strictT < $0 }) ?? true { a.firstObservation = strictT }
        }
        observeHerald(a, heraldT: heraldT, window: w)
        if observeStrict(a, strictT: strictT, window: w) {
            a.addSample(at: strictT, rssi: rssi, bin: Int((strictT - w.ceStart) / 30))
        }
    }

    @inline(__always) static func observeHerald(_ a: PairAccumulator, heraldT: Int64, window w: Window) {
        let k = heraldT - w.ceStartSec
        if k >= 0, k < Int64(a.heraldSeconds.count), Double(heraldT) >= w.ceStart, Double(heraldT) <= w.ceEnd { a.heraldSeconds.insert(Int(k)) }
    }

    /// Returns whether the time is inside the contact event.
    @discardableResult
    @inline(__always) static func observeStrict(_ a: PairAccumulator, strictT: Double, window w: Window) -> Bool {
        guard strictT >= w.ceStart, strictT < w.ceEnd else { return false }
        a.strictBins.insert(Int((strictT - w.ceStart) / 30))
        return true
    }

    /// Largest RSSI magnitude read, dBm: beyond it the value is garbage and the row malformed.
    /// (Far wider than physics, so that every row Herald's script counts still counts.)
    static let maximumRSSIMagnitude = 100_000

    /// `RSSI:-47.0` (optionally `[BLETransmitPower:..]`) -> -47; `bad` when the number is out of
    /// range (it is never accumulated past the range, so nothing overflows).
    @inline(__always) static func rssi(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> (value: Int?, bad: Bool) {
        guard e - s >= 6, p[s] == 82, p[s + 4] == 58 else { return (nil, false) } // "R", ":"
        var k = s + 5
        var sign = 1
        if k < e, p[k] == 45 { sign = -1; k += 1 }
        var v = 0, digits = 0
        while k < e, p[k] >= 48, p[k] <= 57 {
            v = v * 10 + Int(p[k] - 48); k += 1; digits += 1
            if v > maximumRSSIMagnitude { return (nil, true) }
        }
        return (digits > 0 ? sign * v : nil, false)
    }

}

/// The ids read as devices in one contacts.csv, looked up by their bytes in a row: an open-
/// addressing table hashed with FNV-1a, so that no String is made per row.
struct IDTable {
    private var keys: [[UInt8]] = []
    private var values: [[Int]] = []
    private var hashes: [UInt64] = []
    private var slots: [Int32]

    init(_ ids: [String: [Int]]) {
        var size = 16
        while size < ids.count * 2 { size *= 2 }
        slots = [Int32](repeating: -1, count: size)
        // Sorted, so that the table is the same in every run (not that lookups depend on it).
        for (id, devices) in ids.sorted(by: { $0.key < $1.key }) {
            let key = Array(id.utf8)
            let h = key.withUnsafeBufferPointer { Self.hash($0, 0, $0.count) }
            var i = Int(truncatingIfNeeded: h) & (size - 1)
            while slots[i] >= 0 { i = (i + 1) & (size - 1) }
            slots[i] = Int32(keys.count)
            keys.append(key)
            values.append(devices)
            hashes.append(h)
        }
    }

    @inline(__always) static func hash(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for k in s..<e { h = (h ^ UInt64(p[k])) &* 0x0000_0100_0000_01B3 }
        return h
    }

    /// The devices the id in bytes `s..<e` was read as, or nil.
    @inline(__always) func devices(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> [Int]? {
        guard !keys.isEmpty else { return nil }
        let h = Self.hash(p, s, e)
        let mask = slots.count - 1
        var i = Int(truncatingIfNeeded: h) & mask
        while true {
            let k = Int(slots[i])
            if k < 0 { return nil }
            if hashes[k] == h, keys[k].count == e - s,
               e == s || keys[k].withUnsafeBufferPointer({ memcmp($0.baseAddress!, p.baseAddress! + s, e - s) == 0 }) {
                return values[k]
            }
            i = (i + 1) & mask
        }
    }
}
