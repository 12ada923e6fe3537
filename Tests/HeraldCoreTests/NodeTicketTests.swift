import Foundation
import HeraldCore
import XCTest

/// Air tickets bound to run, node, agent and expiry; notices for what a ticket cannot know (issue 19, item 3).
final class NodeTicketTests: XCTestCase {
    let key = Data("the lab's air key".utf8)
    let now = 1_800_000_000.0

    func testATicketAttachesItsNodeOfItsRunUntilTheRunEnds() {
        let gate = NodeTicket.Gate(key: key)
        let t = NodeTicket.issue(run: "r1", node: "alpha", agent: "a1", issued: now, expires: now + 60, key: key)
        guard case .success(let c) = gate.admit(t, node: "alpha", now: now + 1) else { return XCTFail("a valid ticket") }
        XCTAssertEqual(c, NodeTicket.Claims(run: "r1", node: "alpha", agent: "a1", issued: now, expires: now + 60))
        XCTAssertTrue(reason(gate.admit(t, node: "beta", now: now + 1)).contains("for node alpha"))
        XCTAssertTrue(reason(gate.admit(t, node: "alpha", now: now + 61)).contains("expired"))
        let forged = NodeTicket.issue(run: "r1", node: "alpha", agent: "a1", issued: now, expires: now + 60, key: Data("another key".utf8))
        XCTAssertTrue(reason(gate.admit(forged, node: "alpha", now: now)).contains("not signed"))
        let tampered = t.replacingOccurrences(of: "|a1|", with: "|a2|")
        XCTAssertTrue(reason(gate.admit(tampered, node: "alpha", now: now)).contains("not signed"))
        XCTAssertTrue(reason(gate.admit("alpha|9999999999|abc", node: "alpha", now: now)).contains("malformed"), "the old format")
    }

    func testTicketsAreRefusedOnceTheirRunEndedOrTheirAgentWasRevoked() {
        var gate = NodeTicket.Gate(key: key)
        let r1 = NodeTicket.issue(run: "r1", node: "alpha", agent: "a1", issued: now, expires: now + 600, key: key)
        let r2 = NodeTicket.issue(run: "r2", node: "beta", agent: "a2", issued: now, expires: now + 600, key: key)
        XCTAssertNil(gate.take(NodeTicket.Notice.ended(run: "r1", at: now + 5).signed(key: Data("forged".utf8))), "a forged notice is not taken")
        XCTAssertEqual(gate.take(NodeTicket.Notice.ended(run: "r1", at: now + 5).signed(key: key)), .ended(run: "r1", at: now + 5))
        XCTAssertTrue(reason(gate.admit(r1, node: "alpha", now: now + 6)).contains("run r1 has ended"))
        XCTAssertNotNil(try? gate.admit(r2, node: "beta", now: now + 6).get())
        _ = gate.take(NodeTicket.Notice.revoked(agent: "a2", at: now + 10).signed(key: key))
        XCTAssertTrue(reason(gate.admit(r2, node: "beta", now: now + 11)).contains("agent a2 was revoked"))
        // Enrolled again and armed anew: its new tickets attach.
        let fresh = NodeTicket.issue(run: "r3", node: "beta", agent: "a2", issued: now + 20, expires: now + 600, key: key)
        XCTAssertNotNil(try? gate.admit(fresh, node: "beta", now: now + 21).get())
    }

    func testAnotherAgentsTicketNeverDropsTheAttachedNode() {
        var gate = NodeTicket.Gate(key: key)
        let held = NodeTicket.Claims(run: "r2", node: "alpha", agent: "a1", issued: now, expires: now + 600)
        XCTAssertTrue(gate.mayReplace(old: held, new: held, now: now + 1), "the node itself reattaching")
        XCTAssertFalse(gate.mayReplace(old: held, new: .init(run: "r2", node: "alpha", agent: "a9", issued: now, expires: now + 600), now: now + 1), "another agent")
        XCTAssertFalse(gate.mayReplace(old: held, new: .init(run: "r1", node: "alpha", agent: "a1", issued: now - 900, expires: now + 60), now: now + 1), "an earlier run")
        XCTAssertTrue(gate.mayReplace(old: held, new: .init(run: "r3", node: "alpha", agent: "a2", issued: now + 30, expires: now + 900), now: now + 31), "a later run")
        XCTAssertFalse(gate.mayReplace(old: held, new: nil, now: now + 1), "the lab token does not drop a ticketed node")
        XCTAssertTrue(gate.mayReplace(old: nil, new: held, now: now + 1))
        XCTAssertTrue(gate.mayReplace(old: held, new: .init(run: "r3", node: "alpha", agent: "a9", issued: now, expires: now + 900), now: now + 601), "a lapsed ticket holds nothing")
        _ = gate.take(NodeTicket.Notice.ended(run: "r2", at: now + 5).signed(key: key))
        XCTAssertTrue(gate.mayReplace(old: held, new: .init(run: "r3", node: "alpha", agent: "a9", issued: now, expires: now + 900), now: now + 6))
    }

    func reason(_ r: Result<NodeTicket.Claims, NodeTicket.Refusal>) -> String {
        if case .failure(let f) = r { return f.reason }
        return "admitted"
    }
}
