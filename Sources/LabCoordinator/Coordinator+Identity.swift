import Foundation
import HeraldCore
import LabHTTP
import LabNet
import RadioAir
import LabPlan
import Logging

/// The coordinator's side of identities (IdentityService owns them): the authenticator its HTTP
/// service asks, revoking (the credential, the agent's record, the air's notice), and the air
/// tickets of armed nodes.
extension Coordinator {
    /// The service's authenticator: the operator's credential, or an enrolled agent's.
    static func authenticator(operatorToken: String?, identities: IdentityService) -> HTTPService.Authenticate {
        IdentityService.authenticator(operatorToken: operatorToken, identities: identities)
    }

    /// The credential to call `agent` with (`IdentityService.credentialForCalling`).
    func credentialForCalling(_ agent: String, chosenAt: Double? = nil) throws -> String? {
        try identities.credentialForCalling(agent, chosenAt: chosenAt)
    }

    /// Why `agent` is not called for a run that chose it at `chosenAt` (nil: it is).
    func notCalled(_ agent: String, chosenAt: Double) -> String? { identities.notCalled(agent, chosenAt: chosenAt) }

    /// Enrols an agent (`IdentityService.enrol`).
    func enrol(_ request: LabWire.EnrolRequest) throws -> Enrolment { try identities.enrol(request) }

    /// Revokes `name`: its credential is refused from now on, it leaves the list of agents and is
    /// never selected again until enrolled anew; the air is told, so its tickets attach nothing.
    func revoke(_ name: String) throws {
        try identities.revoke(name)
        try registry.forget(name)
        logger.notice("agent \(name) revoked; its credential is refused from now on", metadata: ["agent": .string(name)])
        let at = now
        // Sent by the run driver in a child task of its own (tellAir logs a failure).
        runs.notify(.revoked(agent: name, at: at))
    }
}
