import XCTest
import HeraldCore
import LabHTTP
import LabNet
@testable import LabCoordinator

/// The coordinator's services' rules as functions, without HTTP or a coordinator (issue 39
/// item 3): the start barrier, and the one rule refusing a revoked agent.
final class ServiceRulesTests: XCTestCase {
    // MARK: The start barrier

    func testTheStartMarginIsTheConfiguredLeastWhenArmingWasQuick() {
        let b = StartBarrier.compute(startMargin: 1.0, maxStartMargin: 120, armTime: 0.1, worstRoundTrip: 0.001, nodes: 2)
        // 1.5 * 0.1 + 10 * 0.001 + 0.5 = 0.66 < 1.0: the least margin, plus 2 ms a node.
        XCTAssertEqual(b.margin, 1.004, accuracy: 1e-12)
        XCTAssertTrue(b.bounded)
    }

    func testTheStartMarginGrowsWithArmingTimeRoundTripAndNodes() {
        let b = StartBarrier.compute(startMargin: 1.0, maxStartMargin: 120, armTime: 2.0, worstRoundTrip: 0.05, nodes: 1000)
        // 1.5 * 2 + 10 * 0.05 + 0.5 = 4.0, plus 0.002 * 1000 = 2.
        XCTAssertEqual(b.margin, 6.0, accuracy: 1e-12)
        XCTAssertTrue(b.bounded)
        let slower = StartBarrier.compute(startMargin: 1.0, maxStartMargin: 120, armTime: 2.0, worstRoundTrip: 0.5, nodes: 1000)
        XCTAssertEqual(slower.margin - b.margin, 4.5, accuracy: 1e-12, "ten round trips of the slowest clock")
    }

    func testAStartFurtherThanTheMostMarginOrNotFiniteIsNotBounded() {
        let far = StartBarrier.compute(startMargin: 1.0, maxStartMargin: 120, armTime: 1.0, worstRoundTrip: 12, nodes: 2)
        XCTAssertEqual(far.margin, 1.5 + 120 + 0.5 + 0.004, accuracy: 1e-9)
        XCTAssertFalse(far.bounded)
        let atTheBound = StartBarrier.compute(startMargin: 120, maxStartMargin: 120, armTime: 0, worstRoundTrip: 0, nodes: 0)
        XCTAssertTrue(atTheBound.bounded, "a margin of exactly the most is allowed")
        XCTAssertFalse(StartBarrier.compute(startMargin: 1, maxStartMargin: 120, armTime: .infinity, worstRoundTrip: 0, nodes: 1).bounded)
    }

    // MARK: Refusing a revoked agent

    func credential(issued: Double, revoked: Double? = nil) -> IdentityStore.Credential {
        IdentityStore.Credential(name: "a1", tokenHash: CredentialHash.of("t-\(issued)"), coordinatorToken: "c-\(issued)", issuedAt: issued, revokedAt: revoked, hosts: [])
    }

    func testAnEnrolledAgentNotRevokedIsNotRefused() {
        XCTAssertNil(IdentityService.refusal(of: credential(issued: 100), chosenAt: nil))
        XCTAssertNil(IdentityService.refusal(of: credential(issued: 100), chosenAt: 100), "chosen at the instant it was enrolled")
        XCTAssertNil(IdentityService.refusal(of: credential(issued: 100), chosenAt: 150))
    }

    func testARevokedAgentIsRefusedWhenEverTheRunChoseIt() {
        let revoked = credential(issued: 100, revoked: 200)
        for chosen in [nil, 50, 150, 250] as [Double?] {
            XCTAssertEqual(IdentityService.refusal(of: revoked, chosenAt: chosen), .revoked(at: 200), "chosen at \(String(describing: chosen))")
        }
    }

    func testAnAgentEnrolledAgainAfterTheRunChoseItIsRefusedForThatRunOnly() {
        let again = credential(issued: 300)
        XCTAssertEqual(IdentityService.refusal(of: again, chosenAt: 250), .enrolledAgain(issuedAt: 300))
        XCTAssertNil(IdentityService.refusal(of: again, chosenAt: 350), "a later run calls the new enrolment")
        XCTAssertNil(IdentityService.refusal(of: again, chosenAt: nil), "registering and heartbeating: the new enrolment acts")
    }

    func testTheIdentityTableAuthenticatesOnlyCredentialsTheRuleDoesNotRefuse() {
        var table = IdentityService.Identities([credential(issued: 100)])
        XCTAssertEqual(table.byHash[CredentialHash.of("t-100.0")], "a1")
        table.add(credential(issued: 100, revoked: 200))
        XCTAssertNil(table.byHash[CredentialHash.of("t-100.0")], "revoked: its credential opens nothing")
        XCTAssertNotNil(table.byName["a1"]?.revokedAt, "but it is still known, so it is refused as revoked, not as a stranger")
    }
}
