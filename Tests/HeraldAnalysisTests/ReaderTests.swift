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
