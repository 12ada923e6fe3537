import Foundation
import Hummingbird
import XCTest
import LabTestSupport
@testable import LabHTTP

/// Credential guessing slowed per address (issue 36): the rule on an injected clock, then over a
/// real socket, guesses per second before and after.
final class AuthThrottleTests: XCTestCase {
    final class ManualClock: @unchecked Sendable {
        private let lock = NSLock()
        private var t = 1000.0
        var now: Double { lock.withLock { t } }
        func advance(_ s: Double) { lock.withLock { t += s } }
    }

    func testFreeFailuresThenADoublingWaitUpToTheCapAndAKnownCredentialPasses() {
        let clock = ManualClock()
        let log = LogCapture()
        let t = AuthThrottle(rules: .init(free: 3, base: 1, cap: 8, logInterval: 10), logger: log.logger("herald-lab.http"), now: { clock.now })
        for _ in 0..<3 { XCTAssertNil(t.retryAfter("10.0.0.9")); t.failed("10.0.0.9", "bearer token") }
        XCTAssertNil(t.retryAfter("10.0.0.9"), "three failures are free")
        var waits = [Double]()
        for _ in 0..<6 {
            t.failed("10.0.0.9", "bearer token")
            let w = t.retryAfter("10.0.0.9") ?? 0
            waits.append(w)
            clock.advance(w)
            XCTAssertNil(t.retryAfter("10.0.0.9"), "free again once the wait is over")
        }
        XCTAssertEqual(waits, [1, 2, 4, 8, 8, 8], "doubling, capped")
        XCTAssertNil(t.retryAfter("10.0.0.10"), "another address is not held")
        t.failed("10.0.0.9", "bearer token")
        XCTAssertNotNil(t.retryAfter("10.0.0.9"))
        XCTAssertFalse(t.isKnown("10.0.0.9", "operator token"))
        t.succeeded("10.0.0.9", "operator token")
        XCTAssertNotNil(t.retryAfter("10.0.0.9"), "a success elsewhere from the address does not lift the wait")
        XCTAssertTrue(t.isKnown("10.0.0.9", "operator token"), "the credential is known there")
        XCTAssertFalse(t.isKnown("10.0.0.10", "operator token"), "only there")
        clock.advance(3601)
        XCTAssertFalse(t.isKnown("10.0.0.9", "operator token"), "for an hour")
        XCTAssertNil(t.retryAfter("10.0.0.9"))
        t.failed("10.0.0.9", "bearer token")
        XCTAssertNil(t.retryAfter("10.0.0.9"), "failures are forgotten after twice the cap without one")
        XCTAssertEqual(AuthThrottle.retryAfterHeader(0.2), "1")
        XCTAssertEqual(AuthThrottle.retryAfterHeader(7.01), "8")
        XCTAssertEqual(AuthThrottle.retryAfterHeader(.infinity), String(Int64.max))
    }

    func testFailuresAreLoggedOncePerIntervalWithTheirCount() {
        let clock = ManualClock()
        let log = LogCapture()
        let t = AuthThrottle(rules: .init(free: 1000, logInterval: 10), logger: log.logger("herald-lab.http"), now: { clock.now })
        for _ in 0..<500 { t.failed("10.0.0.9", "bearer token"); clock.advance(0.01) }
        // 5 s of guessing: the first failure's line, then the rest wait for the interval.
        XCTAssertEqual(log.lines.count, 1, "\(log.lines)")
        clock.advance(6)
        t.failed("10.0.0.9", "bearer token")
        XCTAssertEqual(log.lines.count, 2)
        XCTAssertTrue(log.lines[0].contains("refused 1 wrong bearer token credential(s) from 10.0.0.9"), log.lines[0])
        XCTAssertTrue(log.lines[1].contains("refused 500 wrong bearer token credential(s) from 10.0.0.9"), log.lines[1])
        XCTAssertTrue(log.lines[1].contains("501 in a row"), log.lines[1])
        t.failed("10.0.0.7\n2026-01-01 forged line", "dashboard sign-in")
        XCTAssertFalse(log.lines.last!.contains("\n2026"), "the address is escaped: \(log.lines.last!)")
    }

    func testManyAddressesCostBoundedMemory() {
        let clock = ManualClock()
        let t = AuthThrottle(rules: .init(free: 0, maxPeers: 100), logger: LogCapture.quiet(), now: { clock.now })
        for i in 0..<1000 { t.failed("10.0.\(i / 256).\(i % 256)", "bearer token"); clock.advance(0.001) }
        XCTAssertNotNil(t.retryAfter("10.0.3.231"), "the newest is held")
        XCTAssertNil(t.retryAfter("10.0.0.1"), "the quietest were forgotten")
    }

    /// Wrong bearer tokens over a socket on one address, on an injected clock: with the throttle
    /// off every guess is checked; with it on, 5 in the first instant, then one a wait that doubles.
    /// The figures are printed (guesses checked per second of the clock).
    func testGuessesPerSecondBeforeAndAfter() async throws {
        func checked(_ rules: AuthThrottle.Rules, guesses: Int, seconds: Int) async throws -> (checked: Int, refused: Int, retryAfter: String?) {
            let clock = ManualClock()
            let key = String(repeating: "k", count: 64)
            let service = HTTPService(name: "t", authenticate: { HTTPService.constantTimeEqual($0, key) ? HTTPService.Principal(role: .operator, name: "token") : nil },
                                      logger: LogCapture.quiet(),
                                      throttle: rules, now: { clock.now })
            service.serve { r in
                r.routes().get("/v1/x") { _, _ in Response.json(["ok": "yes"]) }
            }
            let port = try await service.start(host: "127.0.0.1", port: 0)
            defer { Task { await service.stop() } }
            let c = try RawClient(port: port)
            var n401 = 0, n429 = 0, retry: String?
            for s in 0..<seconds {
                for g in 0..<guesses {
                    c.send(get("/v1/x", token: "guess-\(s)-\(g)-" + String(repeating: "x", count: 40)))
                    let a = try XCTUnwrap(c.answer())
                    if a.status == 401 { n401 += 1 } else if a.status == 429 { n429 += 1; retry = a.headers["retry-after"] } else { XCTFail("status \(a.status)") }
                }
                clock.advance(1)
            }
            // The right credential from that address waits too (the address is held, not the
            // guess), until it has once succeeded there: then it passes while the address waits.
            c.send(get("/v1/x", token: String(repeating: "k", count: 64)))
            XCTAssertEqual(c.answer()?.status, n429 > 0 ? 429 : 200)
            if n429 > 0 {
                service.throttle.succeeded("127.0.0.1", "operator token")
                c.send(get("/v1/x", token: String(repeating: "k", count: 64)))
                XCTAssertEqual(c.answer()?.status, 200, "a credential known at this address")
                c.send(get("/v1/x", token: "guess-after-" + String(repeating: "x", count: 40)))
                XCTAssertEqual(c.answer()?.status, 429, "guesses still wait")
            }
            return (n401, n429, retry)
        }
        let before = try await checked(.init(free: .max), guesses: 100, seconds: 10)
        let after = try await checked(.init(), guesses: 100, seconds: 10)
        print("AuthThrottleTests: wrong bearer tokens checked, 100 a second for 10 s of the clock: \(before.checked) without the throttle (\(before.checked / 10)/s), \(after.checked) with it (\(String(format: "%.1f", Double(after.checked) / 10))/s); \(after.refused) answered 429, Retry-After \(after.retryAfter ?? "-")")
        XCTAssertEqual(before.checked, 1000)
        // 5 free, then checks at 1, 2 (+1), 4 (+2), 8 (+4) s: 1 + 1 + 1 + 1 over the 10 s.
        XCTAssertLessThanOrEqual(after.checked, 9)
        XCTAssertGreaterThanOrEqual(after.checked, 5)
        XCTAssertNotNil(after.retryAfter)
    }

    /// A credential shorter than 32 characters is refused where it is loaded, with the reason.
    func testShortCredentialsAreRefusedWithTheReason() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("short-token-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        try "ab\n".write(to: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try LabToken.load(file: file.path)) { XCTAssertTrue("\($0)".contains("shorter than 32 characters (2)"), "\($0)") }
        try (String(repeating: "z", count: 31) + "\n").write(to: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try LabToken.load(file: file.path))
        try (String(repeating: "z", count: 32) + "\n").write(to: file, atomically: true, encoding: .utf8)
        XCTAssertEqual(try LabToken.load(file: file.path), String(repeating: "z", count: 32))
        setenv("HERALDLAB_TOKEN", "ab", 1)
        defer { unsetenv("HERALDLAB_TOKEN") }
        XCTAssertThrowsError(try LabToken.load(file: nil)) { XCTAssertTrue("\($0)".contains("HERALDLAB_TOKEN is shorter than 32 characters"), "\($0)") }
        XCTAssertEqual(LabToken.generate().count, 64)
    }
}
