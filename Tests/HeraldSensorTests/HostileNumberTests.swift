import Foundation
import XCTest
import HeraldCore
import HeraldRadio
@testable import HeraldSensor

/// Issue 36: the sensor's settings (a plan's, so from outside) fed 1e300, -1e300, NaN, ±infinity
/// and a negative value where its log lines turn them into whole seconds: saturated, never a trap.
final class HostileNumberTests: XCTestCase {
    final class Lines: SensorLog {
        var lines: [String] = []
        func log(_ level: SensorLogLevel, subsystem: String, category: String, _ message: String) { lines.append(message) }
        func isEnabled(_ level: SensorLogLevel) -> Bool { true }
    }

    let start = Date(timeIntervalSince1970: 1_767_225_600)
    let A: RadioAddress = "C0:00:00:00:00:0A"

    func run(_ configure: (inout BLESensorSettings) -> Void, for seconds: TimeInterval, _ body: (ScriptedTransport) -> Void = { _ in }) -> [String] {
        let scheduler = VirtualScheduler(start: start)
        let transport = ScriptedTransport(scheduler: scheduler)
        var settings = BLESensorSettings()
        configure(&settings)
        let lines = Lines()
        let sensor = BLESensor(transport: transport, payloadDataSupplier: FixedPayloadSupplier(identifier: 1_253_053_828), settings: settings,
                               random: SeededGenerator(seed: 1), log: lines)
        sensor.start()
        scheduler.run(until: start.addingTimeInterval(1))
        body(transport)
        scheduler.run(until: start.addingTimeInterval(seconds))
        sensor.stop()
        return lines.lines
    }

    /// A device without the Herald service is ignored for min(ignoreMax, ignoreBase × …) seconds.
    func testIgnoreDurationsInTheLog() {
        let cases: [(base: Double, max: Double, words: String)] = [
            (1e300, .infinity, String(Int.max)), (-1e300, 180, String(Int.min)), (60, .nan, "0"),
            (.infinity, .infinity, String(Int.max)), (-.infinity, 180, String(Int.min)), (-5, 180, "-5"), (60, 180, "60"),
        ]
        for c in cases {
            let lines = run({ $0.ignoreBase = c.base; $0.ignoreMax = c.max }, for: 6) { transport in
                transport.peers[self.A] = ScriptedTransport.Peer(services: [GATTService(uuid: BluetoothUUID(0x180F), characteristics: [])])
                transport.advert(from: self.A, rssi: -40, herald: false, apple: true)
            }
            XCTAssertTrue(lines.contains { $0.hasPrefix("ignoring C0:00:00:00:00:0A for \(c.words)s: ") }, "base \(c.base), max \(c.max): \(lines)")
        }
    }

    /// The pseudo address is renewed after `pseudoAddressRenewal` idle seconds: at once for a
    /// negative one, and the line says how long.
    func testRenewalIntervalsInTheLog() {
        for (renewal, words) in [(-1e300, String(Int.min)), (-.infinity, String(Int.min)), (-5.0, "-5")] {
            let lines = run({ $0.pseudoAddressRenewal = renewal }, for: 120)
            XCTAssertTrue(lines.contains("renewing pseudo address (nothing connected for \(words)s)"), "\(renewal): \(lines)")
        }
        for renewal in [1e300, .nan, .infinity] {
            XCTAssertFalse(run({ $0.pseudoAddressRenewal = renewal }, for: 120).contains { $0.hasPrefix("renewing pseudo address") }, "\(renewal)")
        }
    }
}
