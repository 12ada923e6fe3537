import XCTest
@testable import HeraldAnalysis

/// Every number from a file, a flag or a manifest is range-checked; only regular files inside the
/// analysed folder are read; memory follows the rows seen. Nothing here may crash or hang.
final class InputValidationTests: XCTestCase {
    var tmp: URL!
    var root: URL!
    override func setUpWithError() throws {
        tmp = TestPaths.temp("validation")
        root = tmp.appendingPathComponent("test")
        try ReaderTests.makeDevices(at: root)
    }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func options(_ start: String = "2024-01-01 10:00:00", _ end: String = "2024-01-01 10:05:00") -> AnalysisOptions {
        var o = AnalysisOptions()
        o.ceStart = AnalysisTime.parse(start)
        o.ceEnd = AnalysisTime.parse(end)
        return o
    }
    func analyse(_ o: AnalysisOptions? = nil) throws -> AnalysisResult { try Analyser.analyse(root, options: o ?? options()).result }
    func device(_ r: AnalysisResult, _ name: String) -> AnalysisResult.Device { r.devices.first { $0.folder == name }! }
    func windows(_ r: AnalysisResult, _ o: String, _ d: String) -> Int { r.pairs.first { $0.observer == o && $0.observed == d }!.strictWindows }
    func append(_ text: String, to file: String) throws {
        let h = try FileHandle(forWritingTo: root.appendingPathComponent(file))
        h.seekToEndOfFile()
        h.write(Data(text.utf8))
        h.closeFile()
    }

    // MARK: Numbers in rows

    func testRSSIOverflowRowIsCountedAsBad() throws {
        try append("2024-01-01 10:03:00.000+0000,BLE,B1,,,3,,,,,RSSI:-99999999999999999999999\n", to: "A/contacts.csv")
        let r = try analyse()
        XCTAssertEqual(device(r, "A").malformedLines, 1)
        XCTAssertTrue(device(r, "A").problems.contains("contacts.csv: 1 malformed line(s) skipped"))
        XCTAssertEqual(windows(r, "A", "B"), 3, "the bad row is no observation; the others still count")
    }

    func testImpossibleDatesAreMalformedLines() throws {
        try append("2022-02-31 10:03:00,BLE,UUID-A,,,3,,,RSSI:-60.0\r\n2024-01-01 25:61:00,BLE,UUID-A,,,3,,,RSSI:-60.0\r\n"
                   + "2023-02-29 10:03:00,BLE,UUID-A,,2,,,,AAAAAA\r\n0001-01-01 10:03:00,BLE,UUID-A,,,3,,,RSSI:-60.0\r\n", to: "B/contacts.csv")
        let r = try analyse()
        XCTAssertEqual(device(r, "B").malformedLines, 4)
        XCTAssertEqual(windows(r, "B", "A"), 2)
        XCTAssertNil(AnalysisTime.parse("2022-02-31 00:00:00"))
        XCTAssertNil(AnalysisTime.parse("2023-02-29 00:00:00"))
        XCTAssertNil(AnalysisTime.parse("2020-12-08 25:61:00"))
        XCTAssertNil(AnalysisTime.parse("1969-12-31 23:59:59"))
        XCTAssertNotNil(AnalysisTime.parse("2024-02-29 00:00:00"), "a leap day is a date")
        XCTAssertNotNil(AnalysisTime.parse("2000-02-29 00:00:00"))
        XCTAssertNil(AnalysisTime.parse("1900-02-29 00:00:00"))
    }

    // MARK: Files that are not regular files

    func testFIFOAsContactsIsFlaggedNotRead() throws {
        let c = root.appendingPathComponent("C/contacts.csv")
        try FileManager.default.removeItem(at: c)
        XCTAssertEqual(mkfifo(c.path, 0o600), 0)
        let r = try analyse() // would block forever if the FIFO were opened for reading
        XCTAssertEqual(device(r, "C").problems, ["contacts.csv is a FIFO, not a regular file: not read"])
        XCTAssertEqual(windows(r, "A", "B"), 3)
    }

    func testLinksAreFollowedOnlyToRegularFilesInsideTheFolder() throws {
        let fm = FileManager.default
        // A: /dev/zero (would never end); B: a file outside; C: a file inside the folder (followed).
        try fm.removeItem(at: root.appendingPathComponent("A/contacts.csv"))
        try fm.createSymbolicLink(atPath: root.appendingPathComponent("A/contacts.csv").path, withDestinationPath: "/dev/zero")
        let outside = tmp.appendingPathComponent("outside.csv")
        try fm.moveItem(at: root.appendingPathComponent("B/contacts.csv"), to: outside)
        try fm.createSymbolicLink(atPath: root.appendingPathComponent("B/contacts.csv").path, withDestinationPath: outside.path)
        try fm.moveItem(at: root.appendingPathComponent("C/contacts.csv"), to: root.appendingPathComponent("C/real.csv"))
        try fm.createSymbolicLink(atPath: root.appendingPathComponent("C/contacts.csv").path, withDestinationPath: "real.csv")
        let r = try analyse()
        XCTAssertEqual(device(r, "A").problems, ["contacts.csv leads to /dev/zero, outside the analysed folder: not followed"])
        XCTAssertTrue(device(r, "B").problems[0].hasPrefix("contacts.csv leads to "), "\(device(r, "B").problems)")
        XCTAssertTrue(device(r, "C").problems.isEmpty, "\(device(r, "C").problems)")
        XCTAssertGreaterThan(device(r, "C").rows, 0)
    }

    func testDirectoryNamedContactsIsFlagged() throws {
        let c = root.appendingPathComponent("C/contacts.csv")
        try FileManager.default.removeItem(at: c)
        try FileManager.default.createDirectory(at: c, withIntermediateDirectories: true)
        let r = try analyse()
        XCTAssertEqual(device(r, "C").problems, ["contacts.csv is a directory, not a regular file: not read"])
    }

    func testDeviceFolderLinkedOutsideIsNotRead() throws {
        let elsewhere = tmp.appendingPathComponent("elsewhere")
        try FileManager.default.moveItem(at: root.appendingPathComponent("C"), to: elsewhere)
        try FileManager.default.createSymbolicLink(atPath: root.appendingPathComponent("C").path, withDestinationPath: elsewhere.path)
        let r = try analyse()
        XCTAssertTrue(device(r, "C").problems.contains { $0.hasPrefix("contacts.csv leads to ") }, "\(device(r, "C").problems)")
        XCTAssertEqual(device(r, "C").rows, 0)
    }

    // MARK: Manifests and flags

    func bundle(offset: String, contactEvent: String = #"{"start": "2024-01-01T10:00:00Z", "end": "2024-01-01T10:05:00Z"}"#) throws -> URL {
        let b = tmp.appendingPathComponent("bundle")
        try ReaderTests.makeDevices(at: b.appendingPathComponent("nodes"))
        try TestPaths.write(#"{"runId": "r", "contactEvent": \#(contactEvent), "nodes": [{"name": "A", "clockOffset": \#(offset)}]}"#,
                            to: b.appendingPathComponent("manifest.json"))
        return b
    }

    func testHugeClockOffsetInAManifestIsRejected() throws {
        for offset in ["1e300", "-9.3e18", "4e9"] {
            XCTAssertThrowsError(try Analyser.analyse(try bundle(offset: offset)), offset) { error in
                XCTAssertTrue("\(error)".hasPrefix("manifest.json: nodes[0].clockOffset"), "\(error)")
            }
            try FileManager.default.removeItem(at: tmp.appendingPathComponent("bundle"))
        }
        XCTAssertNoThrow(try Analyser.analyse(try bundle(offset: "0.25")))
    }

    func testAbsurdContactEventsInAManifestAreRejected() throws {
        XCTAssertThrowsError(try Analyser.analyse(try bundle(offset: "0", contactEvent: #"{"start": "0001-01-01T00:00:00Z", "end": "2024-01-01T10:05:00Z"}"#))) {
            XCTAssertTrue("\($0)".contains("contactEvent.start"), "\($0)")
        }
        try FileManager.default.removeItem(at: tmp.appendingPathComponent("bundle"))
        XCTAssertThrowsError(try Analyser.analyse(try bundle(offset: "0", contactEvent: #"{"start": "2024-01-01T10:00:00Z", "end": "9999-01-01T00:00:00Z"}"#))) {
            XCTAssertTrue("\($0)".contains("at most 366"), "\($0)")
        }
    }

    func testFIFOManifestIsAnErrorNotAHang() throws {
        let b = tmp.appendingPathComponent("bundle")
        try ReaderTests.makeDevices(at: b.appendingPathComponent("nodes"))
        XCTAssertEqual(mkfifo(b.appendingPathComponent("manifest.json").path, 0o600), 0)
        XCTAssertThrowsError(try Analyser.analyse(b)) { XCTAssertTrue("\($0)".contains("manifest.json is a FIFO"), "\($0)") }
    }

    func testNonFiniteOrHugeTimeshiftIsABadFlag() throws {
        for v in [Double.nan, .infinity, 1e300] {
            var o = options()
            o.timeshifts["A"] = v
            XCTAssertThrowsError(try analyse(o)) { XCTAssertTrue("\($0)".hasPrefix("--timeshift A="), "\($0)") }
        }
        var o = options()
        o.ceStart = 1e300
        XCTAssertThrowsError(try analyse(o)) { XCTAssertTrue("\($0)".hasPrefix("--ce-start"), "\($0)") }
    }

    // MARK: Memory follows the rows, not the window

    func testLongContactEventCostsMemoryOnlyWhereRowsFall() throws {
        // 300 days: dense bitsets would take ~3 MB per pair; the results must not change.
        let r = try analyse(options("2024-01-01 10:00:00", "2024-10-27 10:00:00"))
        XCTAssertEqual(r.parameters.cetotal, 300 * 2880)
        XCTAssertEqual(windows(r, "A", "B"), 3)
        XCTAssertEqual(windows(r, "B", "A"), 2)
        var b = Bitset(count: 1 << 40)
        for i in [5, 1 << 39, 70, (1 << 40) - 1, 4096, 5] { b.insert(i) }
        XCTAssertEqual(b.cardinality, 5)
        XCTAssertEqual(b.first, 5)
        var seen = [Int]()
        b.forEach { seen.append($0) }
        XCTAssertEqual(seen, [5, 70, 4096, 1 << 39, (1 << 40) - 1])
        XCTAssertTrue(b.contains(1 << 39))
        XCTAssertFalse(b.contains(6))
        XCTAssertFalse(b.contains(1 << 40))
    }

    // MARK: Wide folders

    func testDetectionWith150FieldsKeepsEveryShortName() throws {
        let wide = tmp.appendingPathComponent("wide")
        let n = 150
        let names = (0..<n).map { String(format: "N%05d", $0) }
        for i in 0..<n {
            let dir = wide.appendingPathComponent(String(format: "dev%03d", i))
            try TestPaths.write(([String(format: "dev%03d", i), "Linux", "6.1", names[i]] + names.filter { $0 != names[i] }).joined(separator: ",") + "\n",
                                to: dir.appendingPathComponent("detection.csv"))
            let next = names[(i + 1) % n]
            try TestPaths.write("time,sensor,id,detect,read,measure,share,visit,data\n2024-01-01 10:00:00,BLE,ID,,2,,,,\(next)\n2024-01-01 10:00:01,BLE,ID,,,3,,,RSSI:-50.0\n",
                                to: dir.appendingPathComponent("contacts.csv"))
        }
        let r = try Analyser.analyse(wide, options: options()).result
        XCTAssertEqual(r.devices.count, n)
        XCTAssertEqual(r.devices.map(\.shortName), names)
        XCTAssertTrue(r.devices.allSatisfy { $0.problems.isEmpty }, "\(r.devices.first { !$0.problems.isEmpty }!.problems)")
        XCTAssertEqual(r.strict.achieveddetections, n, "each device sees the next one")
    }

    func testScannerTakesAnyNumberOfFields() throws {
        let url = tmp.appendingPathComponent("wide.csv")
        let line = (0..<1000).map(String.init).joined(separator: ",")
        try TestPaths.write(line + "\n" + line + ",x\n", to: url)
        var counts = [Int]()
        var last = ""
        let result = try CSVScanner.scan(url: url) { p, l, _ in
            counts.append(l.count)
            last = p.string(l.starts[l.count - 1], l.ends[l.count - 1])
            return true
        }
        XCTAssertEqual(counts, [1000, 1001])
        XCTAssertEqual(last, "x")
        XCTAssertEqual(result.malformed, 0)
    }
}

/// The same through the command: a clear message naming the flag or field, exit code 2.
final class InputValidationCommandTests: XCTestCase {
    var tmp: URL!
    override func setUpWithError() throws {
        guard FileManager.default.isExecutableFile(atPath: TestPaths.binary.path) else { throw XCTSkip("build herald-lab first (swift build)") }
        tmp = TestPaths.temp("validation-cmd")
        try ReaderTests.makeDevices(at: tmp.appendingPathComponent("test"))
    }
    override func tearDown() { if let tmp { try? FileManager.default.removeItem(at: tmp) } }

    func herald(_ args: [String]) throws -> (Int32, String, String) {
        try TestPaths.run(TestPaths.binary.path, args, environment: ["HERALDLAB_RESULTS": tmp.appendingPathComponent("results").path])
    }
    var window: [String] { ["--ce-start", "2024-01-01 10:00:00", "--ce-end", "2024-01-01 10:05:00", "--no-history", "--out", tmp.appendingPathComponent("out").path] }

    func testTimeshiftNaNExitsTwo() throws {
        for value in ["nan", "inf", "1e300"] {
            let (code, _, err) = try herald(["analyse", tmp.appendingPathComponent("test").path, "--timeshift", "A=\(value)"] + window)
            XCTAssertEqual(code, 2, value)
            XCTAssertTrue(err.contains("--timeshift \"A=\(value)\""), err)
        }
    }

    func testImpossibleFlagTimesExitTwo() throws {
        let (code, _, err) = try herald(["analyse", tmp.appendingPathComponent("test").path, "--ce-start", "2022-02-31 00:00:00", "--ce-end", "2024-01-01 10:05:00", "--no-history"])
        XCTAssertEqual(code, 2)
        XCTAssertTrue(err.contains("--ce-start \"2022-02-31 00:00:00\""), err)
    }

    func testReportIsNeverWrittenThroughALink() throws {
        let outside = tmp.appendingPathComponent("outside")
        try FileManager.default.createDirectory(at: outside, withIntermediateDirectories: true)
        let out = tmp.appendingPathComponent("link")
        try FileManager.default.createSymbolicLink(atPath: out.path, withDestinationPath: outside.path)
        let (code, _, err) = try herald(["analyse", tmp.appendingPathComponent("test").path, "--ce-start", "2024-01-01 10:00:00", "--ce-end", "2024-01-01 10:05:00", "--no-history", "--out", out.path])
        XCTAssertEqual(code, 2, err)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: outside.path), [])
    }

    func testBadToleranceAndMaxDurationExitTwo() throws {
        let test = tmp.appendingPathComponent("test").path
        let (code, _, err) = try herald(["regress", test, "--baseline", test, "--tolerance", "nan"])
        XCTAssertEqual(code, 2)
        XCTAssertTrue(err.contains("--tolerance"), err)
        let plan = TestPaths.packageRoot.appendingPathComponent("plans/smoke.yaml").path
        let (code2, _, err2) = try herald(["simulate", plan, "--max-duration", "1e308h", "--out", tmp.appendingPathComponent("sim").path])
        XCTAssertEqual(code2, 2)
        XCTAssertTrue(err2.contains("--max-duration"), err2)
    }
}
