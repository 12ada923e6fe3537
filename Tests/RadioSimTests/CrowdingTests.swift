import XCTest
import HeraldCore
import HeraldRadio
@testable import RadioSim

/// The crowding model: collisions, scanner duty, report rate, connection limit and load. Seeded,
/// virtual time.
final class CrowdingTests: XCTestCase {
    let start = Date(timeIntervalSince1970: 1_767_225_600)
    let advert = Advertisement(serviceUUIDs: [HeraldUUIDs.service], manufacturerData: [0x05F1: Data([1, 2, 3, 4, 5, 6])], txPower: 0, interval: 0.02)

    /// Only the parts a test names.
    func crowding(_ change: (inout CrowdingParameters) -> Void) -> RadioParameters {
        var c = CrowdingParameters.off
        change(&c)
        var p = RadioParameters()
        p.crowding = c
        p.reportLoss = 0
        p.connectSuccess = 1
        return p
    }

    /// `advertisers` nodes around one scanner (node 0) within a metre; returns reports per
    /// advertiser per second at the scanner.
    func reportRate(advertisers: Int, parameters: RadioParameters, seconds: Double = 20) -> (Double, SimMedium, Listener) {
        let scheduler = VirtualScheduler(start: start)
        let medium = SimMedium(scheduler: scheduler, parameters: parameters, seed: 7)
        let scanner = medium.addNode(name: "scanner", x: 0, y: 0)
        let listener = Listener()
        scanner.delegate = listener
        var nodes = [SimTransport]()
        for k in 0..<advertisers {
            let angle = Double(k) / Double(advertisers) * 2 * Double.pi
            nodes.append(medium.addNode(name: "a\(k)", x: cos(angle), y: sin(angle)))
        }
        for t in [scanner] + nodes { t.powerOn { _ in } }
        scheduler.run(until: start)
        for t in nodes { t.startAdvertising(advert) { _ in } }
        scanner.startScanning(filter: ScanFilter()) { _ in }
        scheduler.run(until: start.addingTimeInterval(seconds))
        return (Double(listener.reports.count) / Double(advertisers) / seconds, medium, listener)
    }

    func testCollisionsGrowWithAdvertisersOnOneChannel() {
        let p = crowding { $0.collisions = true; $0.scanWindow = 0.01125 }
        let (two, quiet, _) = reportRate(advertisers: 1, parameters: p)
        let (fifty, busy, _) = reportRate(advertisers: 50, parameters: p)
        XCTAssertEqual(quiet.collisionsLost, 0, "one advertiser collides with nobody")
        XCTAssertGreaterThan(busy.collisionsLost, 0)
        // 50 adverts of 264 µs every 20 ms on the one channel a scanner hears: G ≈ 0.66, loss ≈ 1 - e^-2G ≈ 73 %.
        XCTAssertGreaterThan(two, 30, "about one PDU per 20-30 ms event reaches a one-channel scanner")
        XCTAssertLessThan(fifty, two * 0.5, "reports per pair per second fall with 50 advertisers: \(two) -> \(fifty)")
        XCTAssertGreaterThan(fifty, two * 0.1)
    }

    func testCaptureLetsTheStrongerSurvive() {
        let without = crowding { $0.collisions = true; $0.scanWindow = 0.01125 }
        let with = crowding { $0.collisions = true; $0.scanWindow = 0.01125; $0.capture = 0 }
        let (lost, _, _) = reportRate(advertisers: 30, parameters: without, seconds: 10)
        let (captured, _, _) = reportRate(advertisers: 30, parameters: with, seconds: 10)
        XCTAssertGreaterThan(captured, lost, "with capture the stronger PDU of a collision survives")
    }

    func testAirTimeFollowsThePDULength() {
        // Herald's advert: flags, the 16-bit service, 0x05F1 + 6 bytes: 33 bytes on air, 264 µs.
        XCTAssertEqual(CrowdingParameters.airTime(advert), 264e-6, accuracy: 1e-9)
        let long = Advertisement(serviceUUIDs: [BluetoothUUID("428132af-4746-42d3-801e-4572d65bfd9b")!], manufacturerData: [0x05F1: Data(count: 6)], includeTxPower: true)
        XCTAssertEqual(CrowdingParameters.airTime(long), Double(16 + 31) * 8e-6, accuracy: 1e-9, "at most 31 AD bytes")
    }

    func testReportRateCapsReports() {
        let p = crowding { $0.reportRate = 100 }
        let (perPair, medium, listener) = reportRate(advertisers: 20, parameters: p, seconds: 10)
        XCTAssertLessThanOrEqual(listener.reports.count, 100 * 10 + 10, "100 per second and a burst of a tenth of a second")
        XCTAssertGreaterThan(listener.reports.count, 100 * 10 * 9 / 10)
        XCTAssertGreaterThan(medium.reportsDropped, 0)
        XCTAssertEqual(perPair, 5, accuracy: 0.5, "100 reports a second shared by 20 advertisers")
        let (uncapped, free, _) = reportRate(advertisers: 20, parameters: crowding { _ in }, seconds: 10)
        XCTAssertEqual(free.reportsDropped, 0)
        XCTAssertGreaterThan(uncapped, 35, "an event every 20-30 ms")
    }

    /// A medium with `count` nodes around the origin, powered on.
    func medium(_ parameters: RadioParameters, count: Int) -> (VirtualScheduler, SimMedium, [SimTransport]) {
        let scheduler = VirtualScheduler(start: start)
        let medium = SimMedium(scheduler: scheduler, parameters: parameters, seed: 3)
        let nodes = (0..<count).map { medium.addNode(name: "n\($0)", x: Double($0 % 10), y: Double($0 / 10)) }
        for t in nodes { t.powerOn { _ in } }
        scheduler.run(until: start)
        for t in nodes { t.startAdvertising(advert) { _ in } }
        scheduler.run(until: start.addingTimeInterval(0.1))
        return (scheduler, medium, nodes)
    }

    func testConnectionLimitCapsConcurrentConnections() {
        let p = crowding { $0.maxConnections = 3 }
        let (scheduler, medium, nodes) = self.medium(p, count: 12)
        // Node 0 connects to ten peers at once: three get through, the others are refused at once.
        var results = [Result<Void, TransportError>]()
        for k in 1...10 { nodes[0].connect(nodes[k].address, timeout: 8) { results.append($0) } }
        scheduler.run(until: scheduler.now.addingTimeInterval(1))
        XCTAssertEqual(results.count, 10)
        XCTAssertEqual(results.filter { if case .success = $0 { return true } else { return false } }.count, 3)
        XCTAssertTrue(results.contains { if case .failure(.connectionFailed(let why)) = $0 { return why == "connection-limit-exceeded" } else { return false } })
        XCTAssertEqual(medium.connections(of: 0), 3)
        XCTAssertLessThanOrEqual(medium.peakConnections, 3)
        // A peripheral at its limit is not connectable: a fourth central waits for its timeout.
        let (s2, m2, n2) = self.medium(p, count: 6)
        var outcomes = [Result<Void, TransportError>]()
        for k in 1...3 { n2[k].connect(n2[0].address, timeout: 8) { outcomes.append($0) } }
        s2.run(until: s2.now.addingTimeInterval(1))
        XCTAssertEqual(outcomes.count, 3)
        XCTAssertEqual(m2.connections(of: 0), 3)
        n2[4].connect(n2[0].address, timeout: 8) { outcomes.append($0) }
        s2.run(until: s2.now.addingTimeInterval(7.9))
        XCTAssertEqual(outcomes.count, 3, "the fourth waits")
        s2.run(until: s2.now.addingTimeInterval(0.2))
        XCTAssertEqual(outcomes.count, 4)
        if case .failure(.timeout) = outcomes[3] {} else { XCTFail("a full peripheral times the attempt out: \(outcomes[3])") }
        // Disconnecting frees the slots of both ends.
        n2[1].disconnect(n2[0].address) { _ in }
        s2.run(until: s2.now.addingTimeInterval(0.1))
        XCTAssertEqual(m2.connections(of: 0), 2)
        XCTAssertEqual(m2.connections(of: 1), 0)
    }

    func testConnectionFailuresRiseWithLoad() {
        let p = crowding { $0.connectLoad = 0.02; $0.collisions = true }
        func successRate(links: Int) -> Double {
            let (_, medium, _) = self.medium(p, count: 100)
            for k in 0..<links { medium.link(2 + 2 * k, 3 + 2 * k) }
            var ok = 0
            for _ in 0..<2000 where medium.connectionAttempt(central: 0, target: 1).0 { ok += 1 }
            return Double(ok) / 2000
        }
        let idle = successRate(links: 0), busy = successRate(links: 40)
        // 99 advertisers of 264 µs every 20 ms around the target: e^-2G ≈ e^-2.6.
        XCTAssertGreaterThan(idle, 0.03)
        XCTAssertLessThan(busy, idle * 0.6, "40 links nearby: (0.98)^40 ≈ 0.45 of the idle rate: \(idle) -> \(busy)")
        XCTAssertGreaterThan(busy, idle * 0.3)
        // Without advertisers nearby and no links the attempt succeeds as connectSuccess says.
        let quiet = crowding { $0.connectLoad = 0.02 }
        let (_, m, _) = self.medium(quiet, count: 2)
        XCTAssertTrue((0..<200).allSatisfy { _ in m.connectionAttempt(central: 0, target: 1).0 })
    }

    func testSwitchedOffIsTheIdealisedRadio() {
        var ideal = RadioParameters()
        ideal.reportLoss = 0.1
        var off = ideal
        off.crowding = .off
        func run(_ p: RadioParameters) -> ([Int], [String]) {
            let scheduler = VirtualScheduler(start: start)
            let medium = SimMedium(scheduler: scheduler, parameters: p, seed: 11)
            let nodes = (0..<6).map { medium.addNode(name: "n\($0)", x: Double($0), y: 0) }
            let listener = Listener()
            nodes[0].delegate = listener
            for t in nodes { t.powerOn { _ in } }
            scheduler.run(until: start)
            for t in nodes.dropFirst() { t.startAdvertising(advert) { _ in } }
            nodes[0].startScanning(filter: ScanFilter()) { _ in }
            var outcomes = [String]()
            for k in 1..<6 { nodes[0].connect(nodes[k].address, timeout: 8) { outcomes.append("\($0)") } }
            scheduler.run(until: start.addingTimeInterval(30))
            return (listener.reports.map(\.rssi), outcomes)
        }
        let a = run(ideal), b = run(off)
        XCTAssertFalse(a.0.isEmpty)
        XCTAssertEqual(a.0, b.0, "every part off: the same reports, RSSI for RSSI")
        XCTAssertEqual(a.1, b.1)
    }

    func testSameSeedSameCrowdedRun() {
        var p = RadioParameters()
        p.crowding = CrowdingParameters()
        let a = reportRate(advertisers: 30, parameters: p, seconds: 5).2.reports.map(\.rssi)
        let b = reportRate(advertisers: 30, parameters: p, seconds: 5).2.reports.map(\.rssi)
        XCTAssertEqual(a, b)
        XCTAssertFalse(a.isEmpty)
    }
}

/// The scan-window phase's remainder is fmod's, bit for bit (the logs of a seed depend on it).
final class RemainderTests: XCTestCase {
    func testTheRemainderIsFmodsBitForBit() {
        var g = SeededGenerator(seed: 42, stream: "remainder")
        var checked = 0
        func check(_ x: Double, _ y: Double) {
            let want = x.truncatingRemainder(dividingBy: y), got = SimMedium.remainder(x, y)
            XCTAssertEqual(got.bitPattern, want.bitPattern, "remainder(\(x), \(y)): \(got) against fmod's \(want)")
            checked += 1
        }
        let intervals = [0.03, 0.1, 0.25, 1.0 / 3, 0.5, 1.28, 5.12, 10.24, 0.0125]
        for y0 in intervals {
            let y = 3 * y0
            for _ in 0..<20_000 {
                // Times of a run (up to a day), their negatives (before a scanner's phase), and
                // points right at and around whole multiples of the cycle.
                let x = (g.nextUnit() * 2 - 1) * 86_400
                check(x, y)
                let m = (x / y).rounded()
                let at = m * y
                check(at, y)
                check(at.nextUp, y)
                check(at.nextDown, y)
                check(-at, y)
            }
        }
        for (x, y) in [(0.0, 0.3), (-0.0, 0.3), (1e300, 0.3), (-1e300, 0.3), (.infinity, 0.3), (5.0, .infinity), (0.3, 0.3), (0.29999999999999993, 0.3), (1e-310, 0.3)] {
            let want = x.truncatingRemainder(dividingBy: y), got = SimMedium.remainder(x, y)
            XCTAssertTrue(got.bitPattern == want.bitPattern || (got.isNaN && want.isNaN), "remainder(\(x), \(y))")
        }
        XCTAssertEqual(checked, intervals.count * 100_000)
    }
}
