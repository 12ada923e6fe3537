import XCTest
@testable import HeraldAnalysis

/// Missing, empty, truncated and garbled files are named, the device is flagged, the rest is analysed.
final class BadInputTests: XCTestCase {
    var root: URL!
    override func setUpWithError() throws {
        root = TestPaths.temp("bad").appendingPathComponent("test")
        try ReaderTests.makeDevices(at: root)
    }
    override func tearDown() { try? FileManager.default.removeItem(at: root.deletingLastPathComponent()) }

    func analyse() throws -> AnalysisResult {
        var o = AnalysisOptions()
        o.ceStart = AnalysisTime.parse("2024-01-01 10:00:00")
        o.ceEnd = AnalysisTime.parse("2024-01-01 10:05:00")
        return try Analyser.analyse(root, options: o).result
    }
    func device(_ r: AnalysisResult, _ name: String) -> AnalysisResult.Device { r.devices.first { $0.folder == name }! }
    func windows(_ r: AnalysisResult, _ o: String, _ d: String) -> Int { r.pairs.first { $0.observer == o && $0.observed == d }!.strictWindows }

    func testMissingContactsIsNamedAndTheRestAnalysed() throws {
        try FileManager.default.removeItem(at: root.appendingPathComponent("C/contacts.csv"))
        let r = try analyse()
        XCTAssertEqual(device(r, "C").problems, ["contacts.csv is missing"])
        XCTAssertTrue(r.problems.contains("C: contacts.csv is missing"))
        XCTAssertEqual(windows(r, "A", "B"), 3)
        XCTAssertEqual(windows(r, "B", "A"), 2)
    }

    func testEmptyContactsAndMissingDetection() throws {
        try Data().write(to: root.appendingPathComponent("C/contacts.csv"))
        try FileManager.default.removeItem(at: root.appendingPathComponent("B/detection.csv"))
        let r = try analyse()
        XCTAssertEqual(device(r, "C").problems, ["contacts.csv is empty"])
        XCTAssertTrue(device(r, "B").problems.contains("detection.csv is missing"))
        XCTAssertEqual(windows(r, "A", "C"), 0)
        XCTAssertEqual(windows(r, "C", "A"), 0)
    }

    func testTruncatedFileCountsTheBrokenLine() throws {
        let url = root.appendingPathComponent("A/contacts.csv")
        var data = try Data(contentsOf: url)
        data.removeLast(20) // cut inside the last row
        try data.write(to: url)
        let r = try analyse()
        let a = device(r, "A")
        XCTAssertTrue(a.problems.contains { $0.contains("truncated") }, "\(a.problems)")
        XCTAssertEqual(a.malformedLines, 1)
        XCTAssertEqual(windows(r, "A", "B"), 2, "rows before the cut still count")
    }

    func testGarbledFileNeverCrashes() throws {
        var g = SystemRandomNumberGenerator()
        var junk = Data((0..<200_000).map { _ in UInt8.random(in: 0...255, using: &g) })
        junk.append(contentsOf: Array("\n2024-01-01 10:01:01,BLE,\"A,MAC\",,,3,,,RSSI:-70.0\n".utf8))
        try junk.write(to: root.appendingPathComponent("C/contacts.csv"))
        try Data([0, 1, 2, 0xFF]).write(to: root.appendingPathComponent("B/battery.csv"))
        try Data("only,three,fields\n".utf8).write(to: root.appendingPathComponent("A/detection.csv"))
        let r = try analyse()
        XCTAssertGreaterThan(device(r, "C").malformedLines, 0)
        XCTAssertTrue(device(r, "C").problems.contains { $0.contains("malformed") })
        XCTAssertTrue(device(r, "A").problems.contains { $0.contains("detection.csv is truncated") })
        XCTAssertEqual(windows(r, "B", "A"), 0, "A has no shortName now: nobody can be matched to it")
        XCTAssertEqual(windows(r, "B", "C"), 1, "the rest is analysed")
    }

    func testLinesWithTheWrongFieldCountAreSkippedAndCounted() throws {
        let url = root.appendingPathComponent("B/contacts.csv")
        var text = try String(contentsOf: url, encoding: .utf8)
        text += "2024-01-01 10:04:00,BLE,UUID-A,,,3\r\nnot a time,BLE,UUID-A,,,3,,,RSSI:-1.0\r\n"
        try text.write(to: url, atomically: true, encoding: .utf8)
        let r = try analyse()
        XCTAssertEqual(device(r, "B").malformedLines, 2)
        XCTAssertEqual(windows(r, "B", "A"), 2)
    }

    func testNoDevicesOrNoWindowIsAClearError() throws {
        let empty = TestPaths.temp("empty")
        defer { try? FileManager.default.removeItem(at: empty) }
        XCTAssertThrowsError(try Analyser.analyse(empty)) { XCTAssertTrue("\($0)".contains("no device folders")) }
        XCTAssertThrowsError(try Analyser.analyse(root)) { XCTAssertTrue("\($0)".contains("--ce-start")) }
        XCTAssertThrowsError(try Analyser.analyse(root.appendingPathComponent("nope"))) { XCTAssertTrue("\($0)".contains("no such folder")) }
    }
}
