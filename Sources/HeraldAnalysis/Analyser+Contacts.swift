import Foundation
import HeraldCore

/// The size of every pair's accumulator in one analysis.
struct AccumulatorShape: Sendable {
    let ceSeconds: Int
    let bins: Int
    /// Buckets of the run-over-time charts (per node: RSSI rows, reads, battery).
    var timeline = Timeline(from: 0, to: 0)
    func make() -> PairAccumulator { PairAccumulator(ceSeconds: ceSeconds, bins: bins) }
}

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
                             make: AccumulatorShape, window w: Window, series: inout NodeSeries) throws {
        let shift = inputs[o].shift
        let heraldShift = Saturating.int64(shift.rounded())
        var columns: Columns?
        var hasHeader = false
        // id -> devices its read rows name (Herald's mactobid); initialBID -> devices (for share rows in herald mode).
        var idDevices = [String: [Int]]()
        var readBIDs = [String: [Int]]()
        var firstRead = [Int: Double]()
        var seenReads = PairKeyMap()

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
            let (ids, ide) = (line.starts[c.id], line.ends[c.id])
            // An id read with the same data before (phones log a read row every few seconds) can
            // only move the device's first read: no Strings, no lookups by them.
            let d: Int
            if let known = seenReads.value(p, ids, ide, ds, de) {
                d = known
            } else {
                let data = p.string(ds, de)
                let bid = String(data.prefix(6))
                let id = p.string(ids, ide)
                d = byShortName[bid].map { $0 == o ? -1 : $0 } ?? -1
                if d >= 0 {
                    if !(idDevices[id]?.contains(d) ?? false) { idDevices[id, default: []].append(d) }
                    if !(readBIDs[bid]?.contains(d) ?? false) { readBIDs[bid, default: []].append(d) }
                }
                seenReads.insert(p, ids, ide, ds, de, value: d)
            }
            if d >= 0 {
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
            let a = pairs[d] ?? make.make()
            a.firstRead = t
            pairs[d] = a
        }

        // Pass 2: every line is checked (an impossible date, a measure row's RSSI that cannot be a
        // number, the wrong number of fields: malformed) and observations are recorded.
        let pass = ObservationPass(observer: o, columns: c, skipHeader: hasHeader, shift: shift, window: w, ids: IDTable(idDevices),
                                   readBIDs: readBIDs, byShortName: byShortName, pairs: pairs, make: make, series: series)
        var rows = ObservationPass.Rows(pass: Unmanaged.passUnretained(pass))
        let second = try withExtendedLifetime(pass) { try CSVScanner.scan(url: url, root: root, rows: &rows) }
        pairs = pass.pairs
        series = pass.finishedSeries()
        summary.rows = pass.rows
        summary.malformedLines = second.malformed
        summary.measureRows = pass.measure
        summary.readRows = pass.read
        summary.shareRows = pass.share
    }

    /// The second pass over one observer's contacts.csv: one object holding everything the row
    /// loop needs, so that a row costs no reference counting of what it uses (and the threads
    /// reading other observers share nothing counted: the maps are this pass's own copies).
    final class ObservationPass {
        let o: Int
        let c: Columns
        let shift: Double
        let heraldShift: Int64
        let w: Window
        let ids: IDTable
        let readBIDs: [String: [Int]]
        let byShortName: [String: Int]
        let make: AccumulatorShape
        /// Herald's detection starts at the first whole second of the filter window.
        let heraldFilterStart: Double
        @exclusivity(unchecked) var pairs: [PairAccumulator?]
        /// `pairs` again, unretained (`pairs` owns them): an RSSI row updates its accumulators
        /// without reference counting, which would cost more than the update.
        let handles: UnsafeMutablePointer<Unmanaged<PairAccumulator>?>
        @exclusivity(unchecked) var times = LogTime.Cache()
        @exclusivity(unchecked) var skipHeader: Bool
        @exclusivity(unchecked) var rows = 0, measure = 0, read = 0, share = 0
        /// The node's run-over-time series, its RSSI rows and reads per bucket counted in
        /// buffers of the pass's own (an array in an object is checked for sharing at every write).
        let series: NodeSeries
        let rssiRowCounts: UnsafeMutableBufferPointer<UInt32>
        let readCounts: UnsafeMutableBufferPointer<UInt32>

        init(observer o: Int, columns: Columns, skipHeader: Bool, shift: Double, window: Window, ids: IDTable,
             readBIDs: [String: [Int]], byShortName: [String: Int], pairs: [PairAccumulator?], make: AccumulatorShape, series: NodeSeries) {
            self.o = o
            c = columns
            self.skipHeader = skipHeader
            self.shift = shift
            heraldShift = Saturating.int64(shift.rounded())
            w = window
            self.ids = ids
            self.readBIDs = readBIDs
            // Copies with storage of their own (a shared dictionary's count would bounce between cores).
            self.byShortName = Dictionary(uniqueKeysWithValues: byShortName.map { (String(decoding: Array($0.key.utf8), as: UTF8.self), $0.value) })
            self.pairs = pairs
            self.make = make
            heraldFilterStart = window.filterStart.rounded(.up)
            handles = .allocate(capacity: max(1, pairs.count))
            handles.initialize(from: pairs.map { $0.map(Unmanaged.passUnretained) }, count: pairs.count)
            self.series = series
            rssiRowCounts = .allocate(capacity: series.rssiRows.count)
            _ = rssiRowCounts.initialize(from: series.rssiRows)
            readCounts = .allocate(capacity: series.reads.count)
            _ = readCounts.initialize(from: series.reads)
        }

        deinit {
            handles.deallocate()
            rssiRowCounts.deallocate()
            readCounts.deallocate()
        }

        /// The series with the pass's counts.
        func finishedSeries() -> NodeSeries {
            var s = series
            s.rssiRows = Array(rssiRowCounts)
            s.reads = Array(readCounts)
            return s
        }

        /// The pass as `CSVScanner`'s row handler, unretained (and not retained per row): the
        /// caller keeps the pass alive.
        struct Rows: CSVRows {
            let pass: Unmanaged<ObservationPass>
            @inline(__always) func row(_ p: UnsafeBufferPointer<UInt8>, _ line: inout CSVScanner.Line, _ number: Int) -> Bool {
                pass._withUnsafeGuaranteedRef { $0.row(p, line) }
            }
        }

        @inline(__always) func field(_ line: CSVScanner.Line, _ k: Int) -> (Int, Int) {
            k < line.count ? (line.starts[k], line.ends[k]) : (0, 0)
        }
        @inline(__always) func isEvent(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ k: Int, _ digit: UInt8) -> Bool {
            guard k < line.count else { return false }
            let s = line.starts[k], e = line.ends[k]
            return e - s == 1 && p[s] == digit
        }
        /// Observed device `d`'s accumulator, made at its first observation.
        @inline(__always) func accumulator(_ d: Int) -> Unmanaged<PairAccumulator> {
            if let a = handles[d] { return a }
            return makeAccumulator(d)
        }
        @inline(never) func makeAccumulator(_ d: Int) -> Unmanaged<PairAccumulator> {
            let a = make.make()
            pairs[d] = a
            handles[d] = Unmanaged.passUnretained(a)
            return handles[d]!
        }

        /// One line: false if it is malformed.
        @inline(__always) func row(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line) -> Bool {
            if skipHeader { skipHeader = false; return true }
            guard line.count == c.count else { return false }
            let ts = line.starts[c.time], te = line.ends[c.time]
            if isEvent(p, line, c.read, 50) {
                // A read row (counted when its time is possible); as a measure or share row too if it says so.
                let valid = times.isValid(p, ts, te)
                if valid { rows += 1 }
                if isEvent(p, line, c.measure, 51) {
                    measure += 1
                    let (ds, de) = field(line, c.data)
                    let t = times.parse(p, ts, te)
                    tally(rssiRowCounts, t)
                    measured(p, line, t, Analyser.rssi(p, ds, de))
                } else if isEvent(p, line, c.share, 52) {
                    share += 1
                    if let t = times.parse(p, ts, te) { shared(p, line, t) }
                } else {
                    read += 1
                    if valid { tally(readCounts, times.parse(p, ts, te)) }
                }
                return valid
            }
            rows += 1
            if isEvent(p, line, c.measure, 51) {
                measure += 1
                let t = times.parse(p, ts, te)
                tally(rssiRowCounts, t)
                let (ds, de) = field(line, c.data)
                let rssi = Analyser.rssi(p, ds, de)
                measured(p, line, t, rssi)
                return t != nil && !rssi.bad
            }
            if isEvent(p, line, c.share, 52) {
                share += 1
                guard let t = times.parse(p, ts, te) else { return false }
                shared(p, line, t)
                return true
            }
            return times.isValid(p, ts, te)
        }

        /// One more row in the bucket of time `t` (rows outside the filter window are not drawn).
        @inline(__always) func tally(_ counts: UnsafeMutableBufferPointer<UInt32>, _ t: LogTime.Parsed?) {
            guard let t, let k = bucket(t), k < counts.count, counts[k] < UInt32.max else { return }
            counts[k] += 1
        }

        /// The second (wall second less the zone) whose rows all fall in bucket `secondsBucket`
        /// (nil: not all in one), the last one asked about.
        @exclusivity(unchecked) var bucketSecond = Int64.min
        @exclusivity(unchecked) var secondsBucket: Int?

        /// `make.timeline.index(t.absolute + shift)`, without its two divisions for most rows:
        /// the bucket is monotonic in the time, so when a second's first and last millisecond
        /// (`absolute` computed as it is for a row) fall in one bucket, every row of it does.
        @inline(__always) func bucket(_ t: LogTime.Parsed) -> Int? {
            let second = t.wallSecond - Int64(t.zoneOffset ?? 0)
            if second != bucketSecond {
                bucketSecond = second
                let first = make.timeline.index(LogTime.Parsed(wallSecond: second, millis: 0, zoneOffset: nil).absolute + shift)
                let last = make.timeline.index(LogTime.Parsed(wallSecond: second, millis: 999, zoneOffset: nil).absolute + shift)
                secondsBucket = first != nil && first == last ? first : nil
            }
            return secondsBucket ?? make.timeline.index(t.absolute + shift)
        }

        /// An RSSI row of a known id (`t`: its parsed time, nil if impossible).
        @inline(__always) func measured(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ t: LogTime.Parsed?, _ rssi: (value: Int?, bad: Bool)) {
            guard let devices = ids.lookup(p, line.starts[c.id], line.ends[c.id]), let t, !rssi.bad else { return }
            let heraldT = t.wallSecond + heraldShift
            let strictT = t.absolute + shift
            for i in devices {
                accumulator(ids.device(at: i))._withUnsafeGuaranteedRef {
                    Analyser.observe($0, heraldT: heraldT, strictT: strictT, window: w, heraldFilterStart: heraldFilterStart, rssi: rssi.value)
                }
            }
        }

        func shared(_ p: UnsafeBufferPointer<UInt8>, _ line: CSVScanner.Line, _ t: LogTime.Parsed) {
            let heraldT = t.wallSecond + heraldShift
            let strictT = t.absolute + shift
            let (ds, de) = field(line, c.data)
            let name = p.string(ds, de)
            // herald mode: the shared name must be an initialBID read in this file (the reference join).
            for d in readBIDs[name] ?? [] where d != o {
                let a = accumulator(d).takeUnretainedValue()
                a.heraldDetected = true
                Analyser.observeHerald(a, heraldT: heraldT, window: w)
            }
            // strict mode: the shared shortName itself.
            if let d = byShortName[name], d != o {
                let a = accumulator(d).takeUnretainedValue()
                a.strictDetected = true
                Analyser.observeStrict(a, strictT: strictT, window: w)
                if strictT >= w.filterStart, strictT <= w.filterEnd, a.firstObservation.map({ strictT < $0 }) ?? true { a.firstObservation = strictT }
            }
        }
    }

    /// An RSSI row (`heraldFilterStart`: the filter window's start rounded up).
    @inline(__always) static func observe(_ a: PairAccumulator, heraldT: Int64, strictT: Double, window w: Window, heraldFilterStart: Double, rssi: Int?) {
        // Detection: an RSSI row inside the filter window.
        if Double(heraldT) >= heraldFilterStart, Double(heraldT) <= w.filterEnd { a.heraldDetected = true }
        if strictT >= w.filterStart, strictT <= w.filterEnd {
            a.strictDetected = true
            if a.firstObservation.map({ strictT < $0 }) ?? true { a.firstObservation = strictT }
        }
        observeHerald(a, heraldT: heraldT, window: w)
        guard strictT >= w.ceStart, strictT < w.ceEnd else { return }
        let bin = Saturating.rowInt((strictT - w.ceStart) / 30)
        a.strictBins.insert(bin)
        a.addSample(at: strictT, rssi: rssi, bin: bin)
    }

    @inline(__always) static func observeHerald(_ a: PairAccumulator, heraldT: Int64, window w: Window) {
        let k = heraldT - w.ceStartSec
        if k >= 0, k < Int64(a.heraldSeconds.count), Double(heraldT) >= w.ceStart, Double(heraldT) <= w.ceEnd { a.heraldSeconds.insert(Int(k)) }
    }

    /// Returns whether the time is inside the contact event.
    @discardableResult
    @inline(__always) static func observeStrict(_ a: PairAccumulator, strictT: Double, window w: Window) -> Bool {
        guard strictT >= w.ceStart, strictT < w.ceEnd else { return false }
        a.strictBins.insert(Saturating.int((strictT - w.ceStart) / 30))
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
/// addressing table over flat arrays (the ids' bytes side by side, their devices side by side)
/// hashed eight bytes at a time, so that no String is made and few cache lines are touched per row.
final class IDTable {
    private let bytes: UnsafeMutablePointer<UInt8>
    private let starts: UnsafeMutablePointer<Int>
    private let hashes: UnsafeMutablePointer<UInt64>
    private let deviceStarts: UnsafeMutablePointer<Int>
    private let deviceList: UnsafeMutablePointer<Int>
    private let slots: UnsafeMutablePointer<Int32>
    private let size: Int
    private let count: Int

    init(_ ids: [String: [Int]]) {
        var size = 16
        while size < ids.count * 2 { size *= 2 }
        var slots = [Int32](repeating: -1, count: size)
        var bytes = [UInt8](), starts = [0], hashes = [UInt64](), deviceStarts = [0], deviceList = [Int]()
        // Sorted, so that the table is the same in every run (not that lookups depend on it).
        for (id, devices) in ids.sorted(by: { $0.key < $1.key }) {
            let key = Array(id.utf8)
            let h = key.withUnsafeBufferPointer { Self.hash($0, 0, $0.count) }
            var i = Self.slot(h, size)
            while slots[i] >= 0 { i = (i + 1) & (size - 1) }
            slots[i] = Int32(hashes.count)
            bytes.append(contentsOf: key)
            starts.append(bytes.count)
            hashes.append(h)
            deviceList.append(contentsOf: devices)
            deviceStarts.append(deviceList.count)
        }
        func copy<T>(_ a: [T]) -> UnsafeMutablePointer<T> {
            let p = UnsafeMutablePointer<T>.allocate(capacity: max(1, a.count))
            p.initialize(from: a, count: a.count)
            return p
        }
        self.size = size
        self.count = hashes.count
        self.bytes = copy(bytes)
        self.starts = copy(starts)
        self.hashes = copy(hashes)
        self.deviceStarts = copy(deviceStarts)
        self.deviceList = copy(deviceList)
        self.slots = copy(slots)
    }

    deinit {
        for p in [UnsafeMutableRawPointer(bytes), UnsafeMutableRawPointer(starts), UnsafeMutableRawPointer(hashes),
                  UnsafeMutableRawPointer(deviceStarts), UnsafeMutableRawPointer(deviceList), UnsafeMutableRawPointer(slots)] { p.deallocate() }
    }

    @inline(__always) private static func slot(_ h: UInt64, _ size: Int) -> Int { Int(truncatingIfNeeded: h >> 40) & (size - 1) }

    /// Eight bytes at a time (the tail byte by byte): ids are 17 (MAC) to 36 (UUID) bytes.
    @inline(__always) static func hash(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> UInt64 {
        var h: UInt64 = 0x9E37_79B9_7F4A_7C15 ^ UInt64(truncatingIfNeeded: e - s)
        var i = s
        if let base = p.baseAddress {
            let raw = UnsafeRawPointer(base)
            while i + 8 <= e {
                h = (h ^ raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)) &* 0xFF51_AFD7_ED55_8CCD
                h ^= h >> 32
                i += 8
            }
        }
        if i < e {
            var t: UInt64 = 0
            while i < e { t = t << 8 | UInt64(p[i]); i += 1 }
            h = (h ^ t) &* 0xC4CE_B9FE_1A85_EC53
        }
        return h ^ (h >> 29)
    }

    /// The devices the id in bytes `s..<e` was read as (positions in `devices(at:)`), or nil.
    @inline(__always) func lookup(_ p: UnsafeBufferPointer<UInt8>, _ s: Int, _ e: Int) -> Range<Int>? {
        guard count > 0 else { return nil }
        let h = Self.hash(p, s, e)
        let mask = size - 1
        var i = Self.slot(h, size)
        while true {
            let k = Int(slots[i])
            if k < 0 { return nil }
            if hashes[k] == h {
                let ks = starts[k], n = starts[k + 1] - ks
                if n == e - s, Self.same(bytes + ks, p.baseAddress! + s, n) {
                    return deviceStarts[k] ..< deviceStarts[k + 1]
                }
            }
            i = (i + 1) & mask
        }
    }

    @inline(__always) func device(at i: Int) -> Int { deviceList[i] }

    /// Whether `n` bytes at `a` and `b` are equal, eight at a time.
    @inline(__always) private static func same(_ a: UnsafePointer<UInt8>, _ b: UnsafePointer<UInt8>, _ n: Int) -> Bool {
        let x = UnsafeRawPointer(a), y = UnsafeRawPointer(b)
        var i = 0
        while i + 8 <= n {
            if x.loadUnaligned(fromByteOffset: i, as: UInt64.self) != y.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
            i += 8
        }
        while i < n {
            if a[i] != b[i] { return false }
            i += 1
        }
        return true
    }
}

/// (id, data) byte pairs of read rows seen, with the device they named (-1: none): a growable
/// open-addressing table over flat bytes, so that a repeated read row makes no String.
struct PairKeyMap {
    private var bytes: [UInt8] = []
    private var starts: [Int] = [0]
    private var splits: [Int] = []
    private var hashes: [UInt64] = []
    private var values: [Int] = []
    private var slots = [Int32](repeating: -1, count: 64)

    @inline(__always) private static func hash(_ p: UnsafeBufferPointer<UInt8>, _ s1: Int, _ e1: Int, _ s2: Int, _ e2: Int) -> UInt64 {
        IDTable.hash(p, s1, e1) &* 0x9E37_79B9_7F4A_7C15 ^ IDTable.hash(p, s2, e2)
    }

    @inline(__always) private func matches(_ k: Int, _ p: UnsafeBufferPointer<UInt8>, _ s1: Int, _ e1: Int, _ s2: Int, _ e2: Int) -> Bool {
        let ks = starts[k], split = splits[k], ke = starts[k + 1]
        guard split - ks == e1 - s1, ke - split == e2 - s2 else { return false }
        for i in 0..<(e1 - s1) where bytes[ks + i] != p[s1 + i] { return false }
        for i in 0..<(e2 - s2) where bytes[split + i] != p[s2 + i] { return false }
        return true
    }

    func value(_ p: UnsafeBufferPointer<UInt8>, _ s1: Int, _ e1: Int, _ s2: Int, _ e2: Int) -> Int? {
        let h = Self.hash(p, s1, e1, s2, e2)
        let mask = slots.count - 1
        var i = Int(truncatingIfNeeded: h >> 40) & mask
        while true {
            let k = Int(slots[i])
            if k < 0 { return nil }
            if hashes[k] == h, matches(k, p, s1, e1, s2, e2) { return values[k] }
            i = (i + 1) & mask
        }
    }

    /// At most this many pairs are kept (beyond, reads are looked up the slow way): memory stays
    /// bounded whatever a file holds.
    static let capacity = 1 << 16

    mutating func insert(_ p: UnsafeBufferPointer<UInt8>, _ s1: Int, _ e1: Int, _ s2: Int, _ e2: Int, value: Int) {
        guard hashes.count < Self.capacity, e1 - s1 + e2 - s2 <= 256 else { return }
        let h = Self.hash(p, s1, e1, s2, e2)
        bytes.append(contentsOf: p[s1..<e1])
        splits.append(bytes.count)
        bytes.append(contentsOf: p[s2..<e2])
        starts.append(bytes.count)
        hashes.append(h)
        values.append(value)
        if hashes.count * 2 > slots.count {
            slots = [Int32](repeating: -1, count: slots.count * 2)
            for k in hashes.indices { place(k) }
        } else {
            place(hashes.count - 1)
        }
    }

    private mutating func place(_ k: Int) {
        let mask = slots.count - 1
        var i = Int(truncatingIfNeeded: hashes[k] >> 40) & mask
        while slots[i] >= 0 { i = (i + 1) & mask }
        slots[i] = Int32(k)
    }
}
