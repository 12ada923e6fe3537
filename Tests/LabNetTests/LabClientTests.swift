import Foundation
import Hummingbird
import XCTest
import LabHTTP
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

final class LabClientTests: XCTestCase {
    /// CPU time of this process so far, seconds.
    func cpuTime() -> Double {
        var u = rusage()
        getrusage(RUSAGE_SELF.rawValue, &u)
        return Double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + Double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6
    }

    /// A server that accepts connections (the kernel does) but never answers, like a stopped
    /// coordinator: the client waits out its timeout without spinning (URLSession on Linux kept
    /// a core busy for the whole wait).
    func testWaitingOnASilentServerUsesNoCPU() async throws {
        let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(listener) }
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: "t", timeout: 1)
        let before = cpuTime()
        do {
            _ = try await client.request("POST", "/v1/agents/a1/heartbeat", body: Data("{}".utf8))
            XCTFail("a silent server answered")
        } catch let f as LabClient.Failure {
            XCTAssertNil(f.status)
            XCTAssertEqual(f.message, "POST http://127.0.0.1:\(port)/v1/agents/a1/heartbeat: no answer within 1 s")
        }
        XCTAssertLessThan(cpuTime() - before, 0.2, "CPU seconds spent waiting 1 s for an answer")
    }

    func testRefusedConnectionHasNoStatus() async throws {
        let port = try closedPort()
        do {
            _ = try await LabClient(base: URL(string: "http://localhost:\(port)")!, token: nil).request("GET", "/health")
            XCTFail("connected to a closed port")
        } catch let f as LabClient.Failure {
            XCTAssertNil(f.status)
            XCTAssertTrue(f.message.hasPrefix("GET http://localhost:\(port)/health: cannot connect to localhost:\(port)"), f.message)
        }
    }

    /// A service started after another was stopped in the same process answers (the shared
    /// socket loop re-registers a reused descriptor number).
    func testServiceStartsAgainAfterAnotherStopped() async throws {
        for round in 0..<3 {
            let service = HTTPService(name: "round\(round)", token: "0123456789abcdef", logger: LogCapture.quiet())
            service.serve { r in
                r.routes().post("/echo") { request, context in Response.json(["got": String(decoding: try await request.collectData(upTo: 1 << 20), as: UTF8.self), "q": context.query["q"] ?? ""]) }
            }
            let port = try await service.start(host: "localhost", port: 0)
            let client = LabClient(base: URL(string: "http://localhost:\(port)")!, token: "0123456789abcdef", timeout: 5)
            let health: [String: String] = try await client.call("GET", "/health")
            XCTAssertEqual(health["service"], "round\(round)")
            let echo: [String: String] = try await client.call("POST", "/echo?q=a%20b", ["x": round])
            XCTAssertEqual(echo["got"], "{\"x\":\(round)}")
            XCTAssertEqual(echo["q"], "a b")
            let (status, _, _) = try await LabClient(base: client.base, token: "wrong-wrong-wrong").request("POST", "/echo", body: Data("{}".utf8))
            XCTAssertEqual(status, 401)
            await service.stop()
        }
    }
    /// A redirect is answered to the caller, never followed: the bearer credential goes only to
    /// the host it was meant for (a server that answers 302 to elsewhere gets nothing sent there).
    func testARedirectIsNotFollowedAndTheCredentialStaysHome() async throws {
        let elsewhere = HTTPService(name: "elsewhere", token: nil, logger: LogCapture.quiet())
        let reached = LockedCount()
        elsewhere.serve { r in
            r.routes().get("/take") { _, _ in
                reached.add()
                return Response.json(Empty())
            }
        }
        let otherPort = try await elsewhere.start(host: "127.0.0.1", port: 0)
        let home = HTTPService(name: "home", token: "0123456789abcdef", logger: LogCapture.quiet())
        home.serve { r in
            r.routes().get("/go") { _, _ in Response(.found, headers: ["Location": "http://127.0.0.1:\(otherPort)/take"]) }
        }
        let port = try await home.start(host: "127.0.0.1", port: 0)
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: "0123456789abcdef", timeout: 5)
        let (status, _, headers) = try await client.request("GET", "/go")
        XCTAssertEqual(status, 302)
        XCTAssertEqual(headers["location"], "http://127.0.0.1:\(otherPort)/take")
        do {
            let _: Empty = try await client.call("GET", "/go")
            XCTFail("a redirect was taken as an answer")
        } catch let f as LabClient.Failure {
            XCTAssertEqual(f.status, 302)
        }
        XCTAssertEqual(reached.value, 0, "requests that reached the other host")
        await home.stop()
        await elsewhere.stop()
    }

    /// https without the lab CA is refused before any connection, naming what is missing.
    func testHTTPSWithoutTheLabCAIsAClearError() async throws {
        if LabTrust.caFile != nil { throw XCTSkip("this test process trusts a lab CA already") }
        do {
            _ = try await LabClient(base: URL(string: "https://127.0.0.1:1")!, token: nil).request("GET", "/health")
            XCTFail("https without a CA")
        } catch let f as LabClient.Failure {
            XCTAssertNil(f.status)
            XCTAssertTrue(f.message.contains("https needs the lab CA"), f.message)
        }
    }
}

final class LockedCount: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.withLock { n += 1 } }
    var value: Int { lock.withLock { n } }
}
