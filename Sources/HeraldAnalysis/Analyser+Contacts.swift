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

    /// Pass 1 collects which ids were read as which devices; pass 2 records observations.
    static func scanContacts(_ url: URL, observer o: Int, inputs: [DeviceInput], byShortName: [String: Int],
                             summary: inout AnalysisResult.Device, pairs: inout [[PairAccumulator?]],
                             make: (Int, Int) -> PairAccumulator, window w: Window) throws {
        let shift = inputs[o].shift
        let heraldShift = Int64(shift.rounded())
        var columns: Columns?
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

        // Pass 1: read rows.
        var rows = 0
        let root = inputs[o].root
        let first = try CSVScanner.scan(url: url, root: root) { p, line, number in
            if columns == nil {
                if let c = Columns.from(header: p, line) { columns = c; return true }
                columns = Columns.guess(line.count)
            }
            let c = columns!
            guard line.count == c.count else { return false }
            guard isEvent(p, line, c.read, 50) else {
                // Every row's time is checked here (an impossible date is a malformed line), and a
                // measure row's RSSI (a number that cannot be one is a malformed line); pass 2 skips both.
                rows += 1
                guard LogTime.isValid(p, line.starts[c.time], line.ends[c.time]) else { return false }
                if isEvent(p, line, c.measure, 51) {
                    let (ds, de) = field(p, line, c.data)
                    return !Self.rssi(p, ds, de).bad
                }
                return true
            }
            guard let t = LogTime.parse(p, line.starts[c.time], line.ends[c.time]) else { return false }
            rows += 1
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
        summary.rows = rows
        summary.malformedLines = first.malformed
        if first.missingFinalNewline { summary.problems.append("contacts.csv ends in the middle of a line (truncated?)") }
        if columns == nil { summary.problems.append("contacts.csv has no rows") ; return }
        for (d, t) in firstRead {
            let a = pairs[o][d] ?? make(o, d)
            a.firstRead = t
            pairs[o][d] = a
        }

        // Pass 2: observations. Ids are looked up as bytes to avoid building Strings per row.
        var idCache = [Int: [(key: [UInt8], devices: [Int])]]() // hash of id bytes -> entries
        for (id, devs) in idDevices { idCache[Self.hash(Array(id.utf8)), default: []].append((Array(id.utf8), devs)) }
        var measure = 0, read = 0, share = 0
        let c = columns!
        try CSVScanner.scan(url: url, root: root) { p, line, number in
            guard line.count == c.count else { return true }
            if isEvent(p, line, c.measure, 51) {
                measure += 1
                let s = line.starts[c.id], e = line.ends[c.id]
                let h = Self.hash(p, s, e)
                guard let entry = idCache[h]?.first(where: { entry in
                    entry.key.count == e - s && entry.key.withUnsafeBufferPointer { k in (0..<(e - s)).allSatisfy { k[$0] == p[s + $0] } }
                }) else { return true }
                guard let t = LogTime.parse(p, line.starts[c.time], line.ends[c.time]) else { return true }
                let heraldT = t.wallSecond + heraldShift
                let strictT = t.absolute + shift
                let (ds, de) = field(p, line, c.data)
                let (rssi, bad) = Self.rssi(p, ds, de)
                if bad { return true } // counted in pass 1
                for d in entry.devices {
                    let a: PairAccumulator
                    if let existing = pairs[o][d] { a = existing } else { a = make(o, d); pairs[o][d] = a }
                    Self.observe(a, heraldT: heraldT, strictT: strictT, window: w, isRSSI: true, rssi: rssi)
                }
            } else if isEvent(p, line, c.share, 52) {
                share += 1
                guard let t = LogTime.parse(p, line.starts[c.time], line.ends[c.time]) else { return true }
                let heraldT = t.wallSecond + heraldShift
                let strictT = t.absolute + shift
                let (ds, de) = field(p, line, c.data)
                let name = p.string(ds, de)
                // herald mode: the shared name must be an initialBID read in this file (the reference join).
                for d in readBIDs[name] ?? [] where d != o {
                    let a = pairs[o][d] ?? make(o, d)
                    pairs[o][d] = a
                    a.heraldDetected = true
                    Self.observeHerald(a, heraldT: heraldT, window: w)
                }
                // strict mode: the shared shortName itself.
                if let d = byShortName[name], d != o {
                    let a = pairs[o][d] ?? make(o, d)
                    pairs[o][d] = a
                    a.strictDetected = true
                    Self.observeStrict(a, strictT: strictT, window: w)
                    if strictT >= w.filterStart, strictT <= w.filterEnd, a.firstObservation.map({ strictT < $0 }) ?? true { a.firstObservation = strictT }
                }
            } else if isEvent(p, line, c.read, 50) {
                read += 1
            }
            return true
        }
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

    @inline(__always) static func hash(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Int {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for k in s..<e { h = (h ^ UInt64(p[k])) &* 0x0000_0100_0000_01B3 }
        return Int(truncatingIfNeeded: h)
    }

    static func hash(_ bytes: [UInt8]) -> Int {
        bytes.withUnsafeBufferPointer { hash($0, 0, $0.count) }
    }
}
