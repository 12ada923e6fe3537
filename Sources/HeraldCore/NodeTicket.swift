import Foundation

/// A node's permission to attach to the air under its name until a time, signed by the
/// coordinator with the lab's air key (HMAC-SHA256): "name|expires|mac". The air checks it
/// with the same key and needs no list of agents; a node holding one cannot attach as another.
public enum NodeTicket {
    public static func issue(node: String, expires: Double, key: Data) -> String {
        let body = "\(node)|\(Int64(clamping: Int64(expires.isFinite ? expires : 0)))"
        return "\(body)|\(SHA256.hmac(key: key, message: Data(body.utf8)))"
    }

    /// Why `ticket` does not let `node` attach at `now` (nil: it does).
    public static func problem(_ ticket: String, node: String, now: Double, key: Data) -> String? {
        let parts = ticket.split(separator: "|", omittingEmptySubsequences: false)
        guard parts.count == 3, ticket.utf8.count <= 256, let expires = Int64(parts[1]) else { return "malformed ticket" }
        let body = "\(parts[0])|\(parts[1])"
        let want = Array(SHA256.hmac(key: key, message: Data(body.utf8)).utf8), given = Array(parts[2].utf8)
        var diff = UInt8(want.count == given.count ? 0 : 1)
        for (a, b) in zip(want, given) { diff |= a ^ b }
        guard diff == 0 else { return "ticket not signed by this lab's air key" }
        guard parts[0] == node else { return "ticket is for node \(parts[0]), not \(node)" }
        guard Double(expires) > now else { return "ticket expired" }
        return nil
    }
}
