import Foundation
import Hummingbird
import XCTest
import LabNet
import LabTestSupport
@testable import LabHTTP

/// The gate at accept (issue 22, "no lockout by strangers"): a stranger's address holds at most
/// `maxConnectionsPerAddress` connections, strangers together leave `reservedForKnown` places to
/// addresses that have authenticated, and those are answered while strangers hold the rest.
final class GateTests: XCTestCase {
    var services: [HTTPService] = []
    let token = "operator-token-0123456789"

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
    }

    /// The rules alone, on an injected clock.
    func testTheGatesRules() {
        final class Clock: @unchecked Sendable { var now = 1000.0 }
        let clock = Clock()
        let gate = ConnectionGate(total: 10, perAddress: 2, reserved: 4, rememberSeconds: 60, now: { clock.now })
        XCTAssertEqual(gate.enter("a", nil), .admitted)
        XCTAssertEqual(gate.enter("a", nil), .admitted)
        guard case .refused(let why) = gate.enter("a", nil) else { return XCTFail("a third from a stranger") }
        XCTAssertTrue(why.contains("2 connections are open from this address"), why)
        // Strangers together: 10 - 4 = 6 places.
        for b in ["b", "b", "c", "c"] { XCTAssertEqual(gate.enter(b, nil), .admitted) }
        guard case .refused(let kept) = gate.enter("d", nil) else { return XCTFail("a seventh stranger") }
        XCTAssertTrue(kept.contains("kept for agents and operators"), kept)
        // An address that authenticated takes the kept places, past the per-address cap too.
        gate.vouch(for: "a")
        for _ in 0..<4 { XCTAssertEqual(gate.enter("a", nil), .admitted) }
        XCTAssertEqual(gate.count(), 10)
        XCTAssertEqual(gate.count("a"), 6)
        guard case .refused = gate.enter("a", nil) else { return XCTFail("past the total") }
        // Leaving gives places back.
        gate.leave("b", nil)
        XCTAssertEqual(gate.count("b"), 1)
        XCTAssertEqual(gate.enter("a", nil), .admitted)
        // A vouch is forgotten after `rememberSeconds`.
        gate.leave("a", nil); gate.leave("a", nil); gate.leave("a", nil)
        clock.now += 61
        guard case .refused = gate.enter("a", nil) else { return XCTFail("a is a stranger again, over its cap") }
    }

    func start(_ limits: HTTPService.Limits) async throws -> (HTTPService, UInt16) {
        let service = HTTPService(name: "t", token: token, limits: limits, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/v1/agents") { _, _ in Response.json(["agents": "a1,a2"]) }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        return (service, port)
    }

    func operatorCall(_ port: UInt16, from source: String = "127.0.0.1") throws -> Int? {
        let c = try RawClient(port: port, from: source)
        defer { c.close() }
        c.send("GET /v1/agents HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer \(token)\r\nConnection: close\r\n\r\n")
        return c.answer()?.status
    }

    /// 300 idle connections from one stranger's address: 32 are held, the rest are answered 503
    /// at accept; the operator, from another address, is answered at once.
    func testOneStrangerHoldsAtMostItsShare() async throws {
        let (service, port) = try await start(.init())
        var held = [RawClient]()
        defer { for c in held { c.close() } }
        for _ in 0..<300 { held.append(try RawClient(port: port, from: "127.0.0.2")) }
        // The last one over the cap reads the 503 and the end.
        let over = try RawClient(port: port, from: "127.0.0.2")
        XCTAssertEqual(over.answer()?.status, 503)
        XCTAssertTrue(over.closedByServer())
        XCTAssertEqual(service.openConnections(from: "127.0.0.2"), 32)
        XCTAssertEqual(try operatorCall(port), 200)
        // A stranger's connection that was held is still served.
        held[0].send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(held[0].answer()?.status, 200)
    }

    /// Strangers from many addresses fill every place they may: an address that has
    /// authenticated is still let in (the kept places); a new stranger is not.
    func testPlacesAreKeptForAddressesThatAuthenticated() async throws {
        let (service, port) = try await start(.init(maxConnections: 48, maxConnectionsPerAddress: 8, reservedForKnown: 8))
        XCTAssertEqual(try operatorCall(port), 200, "the operator authenticates once")
        var held = [RawClient]()
        defer { for c in held { c.close() } }
        for host in 2...7 {
            for _ in 0..<8 { held.append(try RawClient(port: port, from: "127.0.0.\(host)")) }
        }
        // 40 strangers' places taken (48 - 8): a ninth address is refused at accept.
        let deadline = Date().addingTimeInterval(10)
        while service.openConnections() < 40 && Date() < deadline { try await Task.sleep(nanoseconds: 10_000_000) }
        let late = try RawClient(port: port, from: "127.0.0.9")
        XCTAssertEqual(late.answer()?.status, 503)
        for _ in 0..<3 { XCTAssertEqual(try operatorCall(port), 200, "the operator's address uses a kept place") }
        // A bad credential does not vouch: from a new address it gets 401 only while there is room.
        for c in held.prefix(8) { c.close() }
        // Once the server has seen those 8 leave (bounded wait), a new stranger has room.
        let left = Date().addingTimeInterval(10)
        while service.openConnections() > 32 && Date() < left { try await Task.sleep(nanoseconds: 10_000_000) }
        let liar = try RawClient(port: port, from: "127.0.0.10")
        liar.send("GET /v1/agents HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong-token-0123456789\r\n\r\n")
        XCTAssertEqual(liar.answer()?.status, 401)
        XCTAssertEqual(try operatorCall(port, from: "127.0.0.10"), 200)
    }
}
