import XCTest
import HeraldCore
import HeraldRadio
@testable import HeraldLogs

final class LogsTests: XCTestCase {
    var dir: URL!
    var scheduler: VirtualScheduler!
    let start = Date(timeIntervalSince1970: 1_607_468_105.25) // 2020-12-08 22:55:05.250 UTC

    override func setUp() {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("logs-\(UUID().uuidString)")
        scheduler = VirtualScheduler(start: start)
    }
    override func tearDown() { try? FileManager.default.removeItem(at: dir) }

    func read(_ name: String) -> String { (try? String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8)) ?? "" }
    func lines(_ name: String) -> [String] { read(name).split(separator: "\n", omittingEmptySubsequences: false).map(String.init).filter { !$0.isEmpty } }

    func testGoldenLinesForEveryContactsEvent() {
        let log = ContactLog(url: dir.appendingPathComponent("contacts.csv"), scheduler: scheduler)
        let id = TargetIdentifier("78:68:06:DE:ED:7F")
        let payload = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData
        log.sensor(.BLE, didDetect: id)
        log.sensor(.BLE, available: true, didDeleteOrDetect: id)
        log.sensor(.BLE, didRead: payload, fromTarget: id)
        log.sensor(.BLE, didMeasure: .rssi(-48), fromTarget: id)
        log.sensor(.BLE, didMeasure: .rssi(-42, txPower: 12), fromTarget: id, withPayload: payload)
        log.sensor(.BLE, didMeasure: .rssi(-42, txPower: 12), fromTarget: id)
        log.sensor(.BLE, didShare: [payload, FixedPayloadSupplier(identifier: -502_964_310).payloadData], fromTarget: "D74D2A62-B970-38B8-A8B5-FBDF1C14D37A")
        log.sensor(.BLE, didVisit: Location("lab, bench 2"))
        log.sensor(.BLE, available: false, didDeleteOrDetect: id)
        log.close()
        XCTAssertEqual(lines("contacts.csv"), [
            "time,sensor,id,detect,read,measure,share,visit,detectHerald,delete,data",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,1,,,,,,,",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,,,,,,6,,",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,,2,,,,,,ZqFdag",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,,,3,,,,,RSSI:-48.0",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,,,3,,,,,RSSI:-42.0[BLETransmitPower:12.0]",
            "2020-12-08 22:55:05.250+0000,BLE,D74D2A62-B970-38B8-A8B5-FBDF1C14D37A,,,,4,,,,ZqFdag",
            "2020-12-08 22:55:05.250+0000,BLE,D74D2A62-B970-38B8-A8B5-FBDF1C14D37A,,,,4,,,,ql8F4g",
            "2020-12-08 22:55:05.250+0000,BLE,,,,,,5,,,\"lab, bench 2\"",
            "2020-12-08 22:55:05.250+0000,BLE,78:68:06:DE:ED:7F,,,,,,,7,",
        ])
        // Every row has 11 columns (the quoted location counts as one).
        for l in lines("contacts.csv") where !l.contains("\"") { XCTAssertEqual(l.split(separator: ",", omittingEmptySubsequences: false).count, 11, l) }
    }

    func testHeaderWrittenOnceAcrossReopen() {
        ContactLog(url: dir.appendingPathComponent("contacts.csv"), scheduler: scheduler).close()
        let again = ContactLog(url: dir.appendingPathComponent("contacts.csv"), scheduler: scheduler)
        again.sensor(.BLE, didDetect: "A")
        again.close()
        XCTAssertEqual(lines("contacts.csv").filter { $0.hasPrefix("time,") }.count, 1)
        XCTAssertEqual(lines("contacts.csv").count, 2)
    }

    func testRowsReachDiskWithinTheFlushIntervalWithoutClose() {
        let log = ContactLog(url: dir.appendingPathComponent("contacts.csv"), scheduler: scheduler)
        scheduler.advance(by: 0.5)
        log.sensor(.BLE, didDetect: "A")
        XCTAssertEqual(lines("contacts.csv").count, 0, "buffered")
        scheduler.advance(by: 2)
        XCTAssertEqual(lines("contacts.csv").count, 2, "flushed by the 2 s timer")
        withExtendedLifetime(log) {}
    }

    func testMillisecondsAndSecondRollover() {
        let log = ContactLog(url: dir.appendingPathComponent("contacts.csv"), scheduler: scheduler)
        scheduler.advance(by: 0.749)
        log.sensor(.BLE, didDetect: "A")
        scheduler.advance(by: 0.002)
        log.sensor(.BLE, didDetect: "B")
        log.close()
        XCTAssertEqual(lines("contacts.csv").dropFirst().map { String($0.prefix(28)) },
                       ["2020-12-08 22:55:05.999+0000", "2020-12-08 22:55:06.001+0000"])
    }

    func testQuotingRule() {
        var out = [UInt8]()
        for v in ["plain", "a,b", "say \"hi\"", "it's", "it’s"] { Bytes.appendCSV(v, to: &out); out.append(124) }
        XCTAssertEqual(String(decoding: out, as: UTF8.self), "plain|\"a,b\"|\"say \"hi\"\"|\"it's\"|\"it’s\"|")
    }

    func testDetectionLogSortedWithoutSelfRewrittenWhole() {
        let own = FixedPayloadSupplier(identifier: 1).payloadData
        let log = DetectionLog(url: dir.appendingPathComponent("detection.csv"), deviceName: "node1", osVersion: "6.1", ownShortName: own.shortName)
        XCTAssertEqual(read("detection.csv"), "node1,Linux,6.1,\(own.shortName)\n")
        let b = FixedPayloadSupplier(identifier: -502_964_310).payloadData, a = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData
        log.sensor(.BLE, didRead: a, fromTarget: "X")
        log.sensor(.BLE, didShare: [b, own, a], fromTarget: "Y")
        XCTAssertEqual(read("detection.csv"), "node1,Linux,6.1,\(own.shortName),ZqFdag,ql8F4g\n")
    }

    func testDetectionLogOfAResumedNodeKeepsWhatItHadSeen() {
        let own = FixedPayloadSupplier(identifier: 1).payloadData
        let url = dir.appendingPathComponent("detection.csv")
        let a = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData, b = FixedPayloadSupplier(identifier: -502_964_310).payloadData
        let first = DetectionLog(url: url, deviceName: "node,1", osVersion: "6.1", ownShortName: own.shortName)
        first.sensor(.BLE, didRead: a, fromTarget: "X")
        // The agent restarts: a new logger over the same folder.
        let resumed = DetectionLog(url: url, deviceName: "node,1", osVersion: "6.1", ownShortName: own.shortName)
        XCTAssertEqual(resumed.seen, [a.shortName], "not rewritten empty")
        resumed.sensor(.BLE, didRead: b, fromTarget: "Y")
        XCTAssertEqual(read("detection.csv"), "\"node,1\",Linux,6.1,\(own.shortName),ZqFdag,ql8F4g\n")
    }

    func testALogFileThatCannotBeWrittenSaysSo() throws {
        let file = LogFile(url: URL(fileURLWithPath: "/dev/full"), scheduler: nil)
        XCTAssertNil(file.writeError)
        file.append("row\n")
        file.flush()
        XCTAssertEqual(file.writeError, "full: write failed (No space left on device)")
        XCTAssertEqual(file.size, 4, "the row stays buffered for the next flush")
    }

    func testALogFileWhoseFolderCannotBeMadeSaysWhy() throws {
        // A file where the node's folder should be: the folder cannot be made, so neither can the log.
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let blocker = dir.appendingPathComponent("node")
        try Data("x".utf8).write(to: blocker)
        let file = LogFile(url: blocker.appendingPathComponent("contacts.csv"), scheduler: nil)
        let said = try XCTUnwrap(file.writeError)
        XCTAssertTrue(said.hasPrefix("contacts.csv: cannot open (Not a directory)") && said.contains("its folder could not be made"), said)
    }

    func testStatisticsOfIntervals() {
        let a = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData
        let log = StatisticsLog(url: dir.appendingPathComponent("statistics.csv"), scheduler: scheduler, ownShortName: "self00")
        log.sensor(.BLE, didRead: a, fromTarget: "X")
        scheduler.advance(by: 1)
        log.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "X", withPayload: a)
        scheduler.advance(by: 3)
        log.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "X", withPayload: a)
        log.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "X") // without payload: not counted
        log.close()
        XCTAssertEqual(read("statistics.csv"), "payload,count,mean,sd,min,max\nZqFdag,2,2.0,1.4142135623730951,1.0,3.0\n")
    }

    func testStatisticsOfManyPayloadsMatchAPlainComputation() {
        // 300 payloads (the table grows several times), own payload and an empty one among them.
        let own = FixedPayloadSupplier(identifier: 5).payloadData
        let log = StatisticsLog(url: dir.appendingPathComponent("statistics.csv"), scheduler: scheduler, ownShortName: own.shortName)
        var g = SeededGenerator(seed: 9, stream: "stats")
        let payloads = (0..<300).map { FixedPayloadSupplier(identifier: Int32($0) * 7919 - 1_000_000).payloadData } + [own, PayloadData()]
        var last = [String: Double](), intervals = [String: [Double]]()
        var t = 0.0
        for _ in 0..<5000 {
            let p = payloads[Int(g.next() % UInt64(payloads.count))]
            let dt = Double(g.next() % 1000) / 100
            scheduler.advance(by: dt)
            t += dt
            log.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "X", withPayload: p)
            let name = p.shortName
            guard name != own.shortName else { continue }
            if let l = last[name] { intervals[name, default: []].append(scheduler.now.timeIntervalSince(Date(timeIntervalSince1970: l))) }
            last[name] = scheduler.now.timeIntervalSince1970
        }
        XCTAssertEqual(Set(log.samples.keys), Set(intervals.keys))
        for (name, xs) in intervals {
            let s = log.samples[name]!
            XCTAssertEqual(s.count, xs.count, name)
            XCTAssertEqual(s.mean, xs.reduce(0, +) / Double(xs.count), accuracy: 1e-6, name)
            XCTAssertEqual(s.max, xs.max()!, accuracy: 1e-6, name)
        }
        let names = log.text.split(separator: "\n").dropFirst().map { String($0.split(separator: ",", omittingEmptySubsequences: false)[0]) }
        XCTAssertEqual(names, intervals.keys.sorted())
        withExtendedLifetime(t) {}
    }

    func testBatteryRowsEveryThirtySecondsAndOnChange() {
        final class Scripted: PowerSource {
            var reading: (String, Double) = ("battery", 80)
            func read() -> (source: String, level: Double) { (reading.0, reading.1) }
        }
        let power = Scripted()
        let log = BatteryLog(url: dir.appendingPathComponent("battery.csv"), scheduler: scheduler, power: power)
        scheduler.advance(by: 61)
        power.reading = ("external", 81)
        scheduler.advance(by: 5)
        log.close()
        XCTAssertEqual(lines("battery.csv"), [
            "time,source,level",
            "2020-12-08 22:55:05.250+0000,battery,80.0",
            "2020-12-08 22:55:35.250+0000,battery,80.0",
            "2020-12-08 22:56:05.250+0000,battery,80.0",
            "2020-12-08 22:56:10.250+0000,external,81.0",
        ])
    }

    func testSysfsPowerSupply() throws {
        let root = dir.appendingPathComponent("ps")
        try FileManager.default.createDirectory(at: root.appendingPathComponent("BAT0"), withIntermediateDirectories: true)
        XCTAssertEqual(SysfsPowerSupply(root: root.appendingPathComponent("none")).read().source, "external")
        try "Battery\n".write(to: root.appendingPathComponent("BAT0/type"), atomically: true, encoding: .utf8)
        try "57\n".write(to: root.appendingPathComponent("BAT0/capacity"), atomically: true, encoding: .utf8)
        try "Discharging\n".write(to: root.appendingPathComponent("BAT0/status"), atomically: true, encoding: .utf8)
        let r = SysfsPowerSupply(root: root).read()
        XCTAssertEqual(r.source, "battery")
        XCTAssertEqual(r.level, 57)
        // A headset's battery (scope Device) is not the node's; mains online means external power.
        try FileManager.default.createDirectory(at: root.appendingPathComponent("hid-headset-battery"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: root.appendingPathComponent("AC"), withIntermediateDirectories: true)
        for (file, text) in [("hid-headset-battery/type", "Battery"), ("hid-headset-battery/scope", "Device"), ("hid-headset-battery/capacity", "5"),
                             ("AC/type", "Mains"), ("AC/online", "0")] {
            try (text + "\n").write(to: root.appendingPathComponent(file), atomically: true, encoding: .utf8)
        }
        XCTAssertTrue(SysfsPowerSupply(root: root).read() == ("battery", 57))
        try "1\n".write(to: root.appendingPathComponent("AC/online"), atomically: true, encoding: .utf8)
        XCTAssertTrue(SysfsPowerSupply(root: root).read() == ("external", 57))
        // Energy counters when there is no capacity file.
        try FileManager.default.removeItem(at: root.appendingPathComponent("BAT0/capacity"))
        try "30000\n".write(to: root.appendingPathComponent("BAT0/energy_now"), atomically: true, encoding: .utf8)
        try "40000\n".write(to: root.appendingPathComponent("BAT0/energy_full"), atomically: true, encoding: .utf8)
        XCTAssertTrue(SysfsPowerSupply(root: root).read() == ("external", 75))
        try FileManager.default.removeItem(at: root.appendingPathComponent("BAT0"))
        XCTAssertTrue(SysfsPowerSupply(root: root).read() == ("external", 100), "only a device battery: mains")
    }

    func testSensorLoggerFormatLevelsAndBound() {
        let log = SensorLogger(url: dir.appendingPathComponent("log.txt"), scheduler: scheduler, minimumLevel: .info, maximumBytes: 300)
        log.log(.debug, subsystem: "Sensor", category: "BLE", "hidden")
        log.log(.info, subsystem: "Sensor", category: "BLE", "read \"ZqFdag\"")
        log.log(.fault, subsystem: "Sensor", category: "BLE", "a, b")
        for i in 0..<10 { log.log(.info, subsystem: "Sensor", category: "BLE", "filler line number \(i)") }
        log.log(.fault, subsystem: "Sensor", category: "BLE", "still written")
        log.close()
        let l = lines("log.txt")
        XCTAssertEqual(l[0], "2020-12-08 22:55:05.250+0000,info,Sensor,BLE,read 'ZqFdag'")
        XCTAssertEqual(l[1], "2020-12-08 22:55:05.250+0000,fault,Sensor,BLE,\"a, b\"")
        XCTAssertTrue(l.contains { $0.contains("only faults are written") })
        XCTAssertEqual(l.last, "2020-12-08 22:55:05.250+0000,fault,Sensor,BLE,still written")
        XCTAssertLessThan(l.count, 13)
    }

    func testBatchWritingGivesTheSameFilesAtCloseAndWritesChangesOnlyThen() throws {
        let live = dir.appendingPathComponent("live"), batch = dir.appendingPathComponent("batch")
        let a = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData, b = FixedPayloadSupplier(identifier: -502_964_310).payloadData
        let nodes = [NodeLogs(directory: live, deviceName: "node1", osVersion: "6.1", ownShortName: "hBWwSg", scheduler: scheduler),
                     NodeLogs(directory: batch, deviceName: "node1", osVersion: "6.1", ownShortName: "hBWwSg", scheduler: scheduler, writing: .batch)]
        for step in 0..<200 {
            for node in nodes {
                for d in node.delegates {
                    d.sensor(.BLE, didMeasure: .rssi(-40 - step % 30, txPower: step % 3 == 0 ? 12 : nil), fromTarget: "A", withPayload: step % 2 == 0 ? a : b)
                    if step == 3 { d.sensor(.BLE, didRead: a, fromTarget: "A") }
                    if step == 150 { d.sensor(.BLE, didShare: [b], fromTarget: "A") }
                }
                node.logger.log(.info, subsystem: "Sensor", category: "BLE", "step \(step)")
            }
            if step == 10 {
                XCTAssertEqual(read("live/detection.csv"), "node1,Linux,6.1,hBWwSg,ZqFdag\n")
                XCTAssertEqual(read("batch/detection.csv"), "node1,Linux,6.1,hBWwSg\n", "written at close")
                XCTAssertEqual(read("batch/contacts.csv"), "", "no timed flush")
            }
            scheduler.advance(by: 0.7)
        }
        for node in nodes { node.close() }
        for file in NodeLogs.fileNames {
            let l = try Data(contentsOf: live.appendingPathComponent(file)), b = try Data(contentsOf: batch.appendingPathComponent(file))
            XCTAssertFalse(l.isEmpty, file)
            XCTAssertEqual(l, b, file)
        }
        XCTAssertEqual(read("batch/detection.csv"), "node1,Linux,6.1,hBWwSg,ZqFdag,ql8F4g\n")
    }

    func testNodeLogsWritesExactlyTheHeraldFiles() throws {
        let node = NodeLogs(directory: dir, deviceName: "node1", osVersion: "6.1", ownShortName: "hBWwSg", scheduler: scheduler)
        for d in node.delegates { d.sensor(.BLE, didDetect: "A") }
        node.logger.log(.info, subsystem: "Sensor", category: "BLE", "hello")
        node.close()
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted(), NodeLogs.fileNames.sorted())
    }
}
