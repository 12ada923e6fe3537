import Foundation
import XCTest
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// What the air's socket tests share: a lab CA and the air's certificate (for 127.0.0.1) in a
/// folder of their own, and a way to see that the air closed a connection.
class AirTestCase: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("air-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        try LabCA.create(commonName: "test CA", days: 1, certificate: path("ca.pem"), key: path("ca-key.pem"))
        try LabCA.issue(caCertificate: path("ca.pem"), caKey: path("ca-key.pem"), commonName: "air",
                        names: ["127.0.0.1"], days: 1, certificate: path("cert.pem"), key: path("key.pem"))
    }

    override func tearDownWithError() throws { try FileManager.default.removeItem(at: dir) }

    func path(_ name: String) -> String { dir.appendingPathComponent(name).path }

    /// The air's server context and a node's trust in the lab CA.
    func serverTLS() throws -> TLSContext { try TLSContext(certificate: path("cert.pem"), key: path("key.pem")) }
    func clientTLS() throws -> TLSContext { try TLSContext(trusting: path("ca.pem")) }

    /// Whether the air ends the connection (EOF or reset) within `seconds` (a bound, not a timing).
    static func closedByAir(_ fd: Int32, within seconds: Double) -> Bool {
        Sockets.setTimeouts(fd, seconds: seconds)
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n > 0 { continue }
            if n == 0 { return true }
            return errno == ECONNRESET
        }
    }
}
