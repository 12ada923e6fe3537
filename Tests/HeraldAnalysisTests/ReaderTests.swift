import XCTest
@testable import HeraldAnalysis

/// Every Herald log variant, in one small synthetic test: A writes the current 11-column form
/// with UTC milliseconds, B is an iPhone (9 columns, local seconds, CRLF, BOM, battery without a
/// header), C an older Android (9 columns, UTC seconds, quoted fields, NULL).
final class ReaderTests: XCTestCase {
    var root: URL!

    override func setUpWithError() throws {
        root = TestPaths.temp("variants").appendingPathComponent("test")
        try Self.makeDevices(at: root)
    }
    override func tearDown() { try? FileManager.default.removeItem(at: root.deletingLastPathComponent()) }

    static func makeDevices(at root: URL) throws {
        try TestPaths.write("A,Android,33,AAAAAA,BBBBBB\n", to: root.appendingPathComponent("A/detection.csv"))
        try TestPaths.write("""
        time,sensor,id,detect,read,measure,share,visit,detectHerald,delete,data
        2024-01-01 09:59:00.000+0000,BLE,B1,1,,,,,,,
        2024-01-01 09:59:01.000+0000,BLE,B1,,,3,,,,,RSSI:-50.0
        2024-01-01 09:59:02.000+0000,BLE,B1,,,,,,6,,
        2024-01-01 09:59:02.000+0000,BLE,B1,,2,,,,,,BBBBBB
        2024-01-01 10:00:05.500+0000,BLE,B1,,,3,,,,,RSSI:-51.0
        2024-01-01 10:00:40.100+0000,BLE,B1,,,3,,,,,RSSI:-52.0[BLETransmitPower:12.0]
        2024-01-01 10:01:10.000+0000,BLE,X9,,,3,,,,,RSSI:-40.0
        2024-01-01 10:04:59.999+0000,BLE,B1,,,3,,,,,RSSI:-53.0

        """, to: root.appendingPathComponent("A/contacts.csv"))
        try TestPaths.write("time,source,level\n2024-01-01 10:00:00.000+0000,external,100.0\n", to: root.appendingPathComponent("A/battery.csv"))

        try TestPaths.write("B,iOS,16.0,BBBBBB\r\n", to: root.appendingPathComponent("B/detection.csv"))
        try TestPaths.write("\u{FEFF}time,sensor,id,detect,read,measure,share,visit,data\r\n"
            + "2024-01-01 10:00:00,BLE,UUID-A,,2,,,,AAAAAA\r\n"
            + "2024-01-01 10:00:00,BLE,UUID-A,,,3,,,RSSI:-60.0\r\n"
            + "2024-01-01 10:02:30,BLE,UUID-A,,,3,,,RSSI:-61.0\r\n"
            + "2024-01-01 10:03:00,BLE,UUID-S,,,,4,,CCCCCC\r\n", to: root.appendingPathComponent("B/contacts.csv"))
        try TestPaths.write("2024-01-01 10:00:00,battery,50.0\n2024-01-01 10:00:30,battery,49.0\n", to: root.appendingPathComponent("B/battery.csv"))

        try TestPaths.write("C,Android,28,CCCCCC\n", to: root.appendingPathComponent("C/detection.csv"))
        try TestPaths.write("""
        time,sensor,id,detect,read,measure,share,visit,data
        2024-01-01 10:01:00,BLE,"A,MAC",,2,,,,AAAAAA
        2024-01-01 10:01:01,BLE,"A,MAC",,,3,,,RSSI:-70.0
        2024-01-01 10:01:02,BLE,NULL,,,3,,,RSSI:-70.0
        2024-01-01 10:01:03,BLE,"A,MAC",,,3,,,"RSSI:-71.0"

        """, to: root.appendingPathComponent("C/contacts.csv"))
    }

    func analyse() throws -> AnalysisResult {
        var o = AnalysisOptions()
        o.ceStart = AnalysisTime.parse("2024-01-01 10:00:00")
        o.ceEnd = AnalysisTime.parse("2024-01-01 10:05:00")
        return try Analyser.analyse(root, options: o).result
    }

    func pair(_ r: AnalysisResult, _ o: String, _ d: String) -> AnalysisResult.PairMetrics { r.pairs.first { $0.observer == o && $0.observed == d }! }

    func testEveryVariantIsRead() throws {
        let r = try analyse()
        XCTAssertEqual(r.devices.map(\.shortName), ["AAAAAA", "BBBBBB", "CCCCCC"])
        XCTAssertEqual(r.devices.map(\.measureRows), [5, 2, 3])
        XCTAssertEqual(r.devices.map(\.malformedLines), [0, 0, 0])
        XCTAssertEqual(r.devices.map(\.label), ["1 - A - Android 33", "2 - B - iOS 16.0", "3 - C - Android 28"])
        XCTAssertTrue(r.devices.allSatisfy { $0.problems.isEmpty }, "\(r.devices.map(\.problems))")
        // 11 columns, milliseconds: bins 0, 1 and 9; the unread id X9 and rows before the window do not count.
        XCTAssertEqual(pair(r, "A", "B").strictWindows, 3)
        XCTAssertEqual(pair(r, "A", "B").heraldWindows, 3)
        XCTAssertEqual(pair(r, "A", "B").rssiSamples, 3)
        XCTAssertEqual(pair(r, "A", "B").rssiMedian, -52)
        // 9 columns, local seconds, CRLF and BOM.
        XCTAssertEqual(pair(r, "B", "A").strictWindows, 2)
        // Quoted id with a comma; NULL id dropped; quoted data.
        XCTAssertEqual(pair(r, "C", "A").strictWindows, 1)
        XCTAssertEqual(pair(r, "C", "A").rssiSamples, 2)
        // battery.csv with and without header
        XCTAssertEqual(r.devices[0].batteryLast, 100)
        XCTAssertEqual(r.devices[1].batterySource, "battery")
        XCTAssertEqual(r.devices[1].batteryLast, 49)
        XCTAssertNil(r.devices[2].batteryLast)
    }

    func testShareRowsCountInStrictModeAndOnlyWhenReadInHeraldMode() throws {
        let r = try analyse()
        XCTAssertEqual(pair(r, "B", "C").strictWindows, 1)
        XCTAssertTrue(pair(r, "B", "C").detected)
        XCTAssertEqual(pair(r, "B", "C").heraldWindows, 0, "the reference joins shared names through read rows")
        XCTAssertEqual(r.strict.achieveddetections, 4)
        XCTAssertEqual(r.herald.achieveddetections, 3)
        XCTAssertEqual(r.parameters.cetotal, 10)
        XCTAssertEqual(r.herald.maxwindows, 60)
    }

    func testTimeshiftMovesADevicesTimes() throws {
        var o = AnalysisOptions()
        o.ceStart = AnalysisTime.parse("2024-01-01 10:00:00")
        o.ceEnd = AnalysisTime.parse("2024-01-01 10:05:00")
        o.timeshifts["B"] = 150 // 10:02:30 + 150 s = 10:05:00, outside
        let r = try Analyser.analyse(root, options: o).result
        // 10:00:00 + 150 s falls in bin 5; 10:02:30 + 150 s is the contact-event end, excluded in strict mode.
        XCTAssertEqual(pair(r, "B", "A").strictWindows, 1)
        XCTAssertEqual(r.devices[1].shift, 150)
        o.timeshifts = ["nobody": 1]
        XCTAssertThrowsError(try Analyser.analyse(root, options: o))
    }

    func testReadRowsAreFoundWhereverTheyStandAndMalformedLinesCountOnce() throws {
        // The first pass splits only lines holding ",2," or ",\"2\","; here read rows are quoted,
        // after CRLF, straddle the 1 MiB chunk boundary, follow a line over 64 KiB, and stand
        // beside lines that only look like read rows.
        let d = root.appendingPathComponent("D")
        try TestPaths.write("D,Android,33,DDDDDD\n", to: d.appendingPathComponent("detection.csv"))
        var text = "time,sensor,id,detect,read,measure,share,visit,detectHerald,delete,data\n"
        text += "2024-01-01 10:00:01.000+0000,BLE,QA,,\"2\",,,,,,AAAAAA\n"           // quoted read
        text += "2024-01-01 10:00:02.000+0000,BLE,QA,,,3,,,,,RSSI:-50.0\n"
        text += "2024-01-01 10:00:03.000+0000,BLE,\"x,2,y\",,,3,,,,,RSSI:-50.0\n"    // looks like one, is not
        text += "2024-13-01 10:00:04.000+0000,BLE,BAD,,2,,,,,,BBBBBB\n"               // read row, impossible date: malformed
        text += "2024-01-01 10:00:05.000+0000,BLE,SHORT,,2,,,,,BBBBBB\n"              // one field short: malformed
        let filler = "2024-01-01 10:00:06.000+0000,BLE,QA,,,3,,,,,RSSI:-51.0\n"
        while text.utf8.count + filler.utf8.count < (1 << 20) - 20 { text += filler }
        text += "2024-01-01 10:00:07.000+0000,BLE,CB,,2,,,,,,CCCCCC\n"              // straddles the chunk boundary
        text += "2024-01-01 10:00:08.000+0000,BLE,CB,,,3,,,,,RSSI:-52.0\r\n"
        text += String(repeating: "z", count: 70_000) + ",2,\n"                        // over 64 KiB: malformed
        text += "2024-01-01 10:00:09.000+0000,BLE,BB,,2,,,,,,BBBBBB\r\n"             // CRLF read
        text += "2024-01-01 10:00:10.000+0000,BLE,BB,,,3,,,,,RSSI:-53.0\n"
        text += "2024-01-01 10:00:11.000+0000,BLE,BB,,2,3,,,,,BBBBBB\n"               // read and measure at once
        try TestPaths.write(text, to: d.appendingPathComponent("contacts.csv"))
        var results = [AnalysisResult]()
        for threads in [1, 3] {
            var o = AnalysisOptions()
            o.ceStart = AnalysisTime.parse("2024-01-01 10:00:00")
            o.ceEnd = AnalysisTime.parse("2024-01-01 10:05:00")
            o.threads = threads
            results.append(try Analyser.analyse(root, options: o).result)
        }
        let r = results[0]
        let dev = r.devices.first { $0.folder == "D" }!
        XCTAssertEqual(dev.malformedLines, 3)
        XCTAssertEqual(dev.readRows, 4, "read rows, counted whether their date is possible or not")
        XCTAssertEqual(pair(r, "D", "A").timeToFirstRead, 1, "the quoted read row")
        XCTAssertEqual(pair(r, "D", "A").rssiSamples, (dev.measureRows - 4), "every QA row but the look-alike")
        XCTAssertEqual(pair(r, "D", "C").timeToFirstRead, 7, "the read row across the chunk boundary")
        XCTAssertEqual(pair(r, "D", "C").rssiSamples, 1)
        XCTAssertEqual(pair(r, "D", "B").timeToFirstRead, 9, "the CRLF read row after the long line")
        XCTAssertEqual(pair(r, "D", "B").rssiSamples, 2, "a read row that is also a measure row counts as a measurement (as before)")
        // Any number of threads: the same result.
        let e = JSONEncoder()
        e.outputFormatting = .sortedKeys
        results = results.map { var x = $0; x.elapsedSeconds = 0; return x }
        XCTAssertEqual(try e.encode(results[0]), try e.encode(results[1]))
    }

    func testTimeFormsParse() {
        func parse(_ s: String) -> LogTime.Parsed? { var t = s; return t.withUTF8 { LogTime.parse($0, 0, $0.count) } }
        XCTAssertEqual(parse("2022-11-29 22:21:56.552+0000")?.absolute, 1_669_760_516.552)
        XCTAssertEqual(parse("2022-11-29 22:21:56")?.absolute, 1_669_760_516)
        XCTAssertEqual(parse("2022-11-29 23:21:56+0100")?.absolute, 1_669_760_516)
        XCTAssertEqual(parse("2022-11-29 23:21:56+0100")?.wallSecond, 1_669_764_116, "herald mode reads the wall clock, as R does")
        XCTAssertNil(parse("2022-11-29"))
        XCTAssertNil(parse("garbage-garbage-garbage"))
    }
}
