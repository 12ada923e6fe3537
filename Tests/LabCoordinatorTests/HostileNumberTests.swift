import Foundation
import XCTest
import HeraldCore
import LabHTTP
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// Issue 36: no Double-to-integer conversion of the coordinator can trap. A session's expiry, a
/// check's bound and a stored run's duration fed 1e300, -1e300, NaN, ±infinity and a negative
/// value: the cookie's age, the verdicts' words and the live page saturate.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5]
    let imax = String(Int.max)

    func testCookieAgeOfHostileExpiries() {
        func age(_ expires: Double, now: Double = 1_767_225_600) -> String {
            let cookie = DashboardSessions.setCookie(DashboardSession(id: "s", csrf: "c", expires: expires), secure: false, now: now)
            return String(cookie.split(separator: ";")[2].dropFirst(" Max-Age=".count))
        }
        XCTAssertEqual(Self.hostile.map { age($0) }, [imax, "0", "0", imax, "0", "0"])
        XCTAssertEqual(Self.hostile.map { age(1_767_225_600, now: $0) }, ["0", imax, "0", "0", imax, "1767225605"])
        XCTAssertEqual(age(1_767_225_600 + 3600.5), "3600")
    }

    func testCheckBoundInTheVerdicts() {
        func entry(_ n: Int) -> DongleRules.Entry {
            var r = LabWire.PreflightReport(id: "c1", agent: "a\(n)")
            r.present = true; r.powered = true; r.advertising = true; r.scanning = true
            return DongleRules.Entry(name: "d\(n)", id: "F0:00:00:00:00:0\(n)", agent: "a\(n)", beacon: UInt32(100 + n), report: r, error: nil)
        }
        let reasons = Self.hostile.map { DongleRules.judge([entry(1), entry(2), entry(3)], bound: $0).first?.reason ?? "" }
        let within = [imax, String(Int.min), "0", imax, String(Int.min), "-5"]
        XCTAssertEqual(reasons, within.map { "no dongle heard any other within \($0) s: the room, bluetoothd or every dongle is at fault, not one of them" })
    }

    /// A run stored with a duration no plan can have (a store written before the bounds held it).
    func testLivePageOfAHostileDuration() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("hostile-live-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let c = try Coordinator(config: Coordinator.Config(results: dir), logger: LogCapture.quiet())
        let session = DashboardSession(id: "s", csrf: "c", expires: .infinity)
        for (d, words) in zip(Self.hostile, [imax, String(Int.min), "0", imax, String(Int.min), "-5"]) {
            var r = RunRecord(id: "hostile-run", plan: "p", planText: "name: p", state: .running, created: 1_767_225_600, duration: d, warmup: .nan, air: nil, nodes: [])
            r.startAt = 1_767_225_600
            c.withLock { s in s.runs[r.id] = r }
            let bytes = await (try c.pages.livePage(session, id: r.id)).data
            let page = String(decoding: try XCTUnwrap(bytes), as: UTF8.self)
            XCTAssertTrue(page.contains("0 nodes for \(words) s."), "\(d)")
        }
    }
}
