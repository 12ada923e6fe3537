import Foundation
import XCTest
import LabAgent
import LabHTTP
import LabNet
import LabTestSupport
import RadioAir
#if canImport(Glibc)
import Glibc
#endif

/// The air's and an agent's log (issue 22): one line per event from the Logger handed in, its
/// level, its label, the node, run or agent as metadata, and a peer's text on one line.
final class ServiceLogTests: XCTestCase {
    /// Sends one line to the air and returns its answer.
    func ask(_ port: UInt16, _ line: String) throws -> String {
        let fd = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        defer { close(fd) }
        Sockets.setTimeouts(fd, seconds: 10)
        let bytes = Array((line + "\n").utf8)
        XCTAssertEqual(bytes.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }, bytes.count)
        var buf = [UInt8](repeating: 0, count: 4096)
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
        return String(decoding: buf[0..<max(0, n)], as: UTF8.self)
    }

    func testTheAirLogsAttachmentsWithTheNodeAndRefusalsOnOneLine() throws {
        let log = LogCapture()
        let air = AirServer(token: "secret", logger: log.logger("herald-lab.air"))
        let port = try air.start(host: "127.0.0.1", port: 0)
        defer { air.stop() }
        XCTAssertTrue(try ask(port, #"{"t":"hello","id":1,"node":"n1","token":"secret"}"#).contains("\"ok\":true"))
        XCTAssertTrue(try ask(port, #"{"t":"hello","id":1,"node":"x\n2026-01-01T00:00:00.000Z info herald-lab.air: forged\u001B[2J"}"#).contains("\"ok\":false"))
        let deadline = Date().addingTimeInterval(10)
        while log.all.count < 3 && Date() < deadline { usleep(20_000) }
        let attached = try XCTUnwrap(log.all.first { $0.message.hasPrefix("n1 attached at") }, "\(log.lines)")
        XCTAssertEqual(attached.level, .info)
        XCTAssertEqual(attached.label, "herald-lab.air")
        XCTAssertEqual(attached.metadata["node"], "n1")
        let refused = try XCTUnwrap(log.all.first { $0.message.hasPrefix("refused a hello") }, "\(log.lines)")
        XCTAssertEqual(refused.level, .warning)
        XCTAssertNotNil(refused.metadata["connection"])
        XCTAssertTrue(refused.line.contains(#"as x\x0A2026-01-01T00:00:00.000Z info herald-lab.air: forged\x1B[2J: "#), refused.line)
        for line in log.lines {
            XCTAssertFalse(line.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, line)
        }
    }

    func testAnAgentLogsWithItsNameAndItsHTTPRefusalsUnderHTTP() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("servicelog-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        var config = Agent.Config(name: "a1", dataDirectory: dir)
        config.token = "agent-token-0123456789"
        let log = LogCapture()
        let agent = Agent(config: config, logger: log.logger("herald-lab.agent", level: .info), httpLogger: log.logger("herald-lab.http"))
        let port = try await agent.start()
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: "wrong-token-0123456789", timeout: 5)
        do {
            _ = try await client.call("GET", "/v1/status", as: Empty.self)
            XCTFail("a wrong token is refused")
        } catch let f as LabClient.Failure {
            XCTAssertEqual(f.status, 401)
        }
        await agent.stop()
        let listening = try XCTUnwrap(log.all.first { $0.message.hasPrefix("listening on 127.0.0.1:\(port)") }, "\(log.lines)")
        XCTAssertEqual(listening.level, .notice)
        XCTAssertEqual(listening.label, "herald-lab.agent")
        XCTAssertEqual(listening.metadata["agent"], "a1")
        XCTAssertTrue(listening.line.hasSuffix(" agent=a1"), listening.line)
        // A wrong token is counted per address and logged once per interval with the count.
        let refused = try XCTUnwrap(log.all.first { $0.message.hasPrefix("refused 1 wrong bearer token credential(s) from 127.0.0.1") }, "\(log.lines)")
        XCTAssertEqual(refused.level, .warning)
        XCTAssertEqual(refused.label, "herald-lab.http")
        XCTAssertEqual(refused.metadata["agent"], "a1")
        XCTAssertEqual(refused.metadata["service"], "agent a1")
        XCTAssertTrue(refused.line.contains(#" service="agent a1""#), refused.line)
        XCTAssertFalse(log.all.contains { $0.level < .info && $0.label == "herald-lab.agent" }, "the agent's level holds: \(log.lines)")
    }
}
