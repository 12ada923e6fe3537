import Foundation
import Hummingbird
import XCTest
import LabNet
import LabTestSupport
@testable import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// The HTTP server over real sockets: routing, authentication before routing, roles, one
/// percent-decoding, keep-alive, ranges, stop. Limits are in `LimitTests`.
final class HTTPServiceTests: XCTestCase {
    var services: [HTTPService] = []

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
    }

    func start(_ service: HTTPService) async throws -> UInt16 {
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        return port
    }

    func testRoutesParametersQueryAndBody() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().post("/v1/things/:id/echo") { request, context in
                let body = try await request.collectData(upTo: 100)
                return Response.json(["id": context.parameter("id"), "q": context.query["q"] ?? "", "body": String(decoding: body, as: UTF8.self),
                                      "path": context.path, "remote": context.remote, "peer": context.peerHost ?? ""])
            }
        }
        let port = try await start(service)
        let c = try RawClient(port: port)
        c.send("POST /v1/things/a%20b/echo?q=x%2By&z HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        let a = try XCTUnwrap(c.answer())
        XCTAssertEqual(a.status, 200)
        let json = try JSONDecoder().decode([String: String].self, from: a.body)
        XCTAssertEqual(json["id"], "a b")
        XCTAssertEqual(json["q"], "x+y")
        XCTAssertEqual(json["body"], "hello")
        XCTAssertEqual(json["path"], "/v1/things/a b/echo")
        XCTAssertEqual(json["peer"], "127.0.0.1")
        XCTAssertTrue(json["remote"]?.hasPrefix("127.0.0.1:") == true, "\(json)")

        c.send(get("/v1/things/a/other"))
        XCTAssertEqual(c.answer()?.status, 404)
        c.send(get("/v1/things/a/echo"))
        XCTAssertEqual(c.answer()?.status, 404, "GET is not POST")
        c.send("HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n")
        let head = try XCTUnwrap(c.answer(head: true))
        XCTAssertEqual(head.status, 200)
        XCTAssertGreaterThan(Int(head.headers["content-length"] ?? "") ?? 0, 0)
        c.send(get("/health"))
        XCTAssertEqual(c.answer()?.status, 200, "HEAD sent no body, so the next answer starts clean")
    }

    /// Without a valid token every route but the public ones is 401, known or not: nobody
    /// learns which routes exist. With the token an unknown route is 404.
    func testAuthenticationComesBeforeRouting() async throws {
        let log = LogCapture()
        let token = "0123456789abcdef0123"
        let service = HTTPService(name: "t", token: token, logger: log.logger("herald-lab.http"))
        service.serve { r in
            r.routes().get("/v1/secret") { _, _ in Response.json(["secret": "yes"]) }
        }
        let port = try await start(service)
        let c = try RawClient(port: port)
        c.send(get("/v1/secret"))
        XCTAssertEqual(c.answer()?.status, 401)
        c.send(get("/v1/no-such-route"))
        XCTAssertEqual(c.answer()?.status, 401, "an unknown route without a token is 401, not 404")
        c.send(get("/v1/no-such-route", token: "wrong-wrong-wrong-wrong"))
        XCTAssertEqual(c.answer()?.status, 401)
        c.send(get("/v1/secret", extra: "Authorization: Basic \(token)\r\n"))
        XCTAssertEqual(c.answer()?.status, 401)
        c.send(get("/health"))
        XCTAssertEqual(c.answer()?.status, 200)
        c.send(get("/v1/no-such-route", token: token))
        XCTAssertEqual(c.answer()?.status, 404)
        c.send(get("/v1/secret", token: token))
        XCTAssertEqual(c.answer()?.text, "{\"secret\":\"yes\"}")
        let refusals = log.lines.filter { $0.contains("refused") }
        XCTAssertEqual(refusals.count, 4, "\(refusals)")
        XCTAssertTrue(refusals.contains { $0.contains("/v1/no-such-route") && $0.contains("missing token") }, "\(refusals)")
        // A wrong token is counted per address and logged once per interval with the count (AuthThrottle).
        XCTAssertTrue(refusals.contains { $0.contains("refused 1 wrong bearer token credential(s) from 127.0.0.1") }, "\(refusals)")
        // Each refusal a warning of herald-lab.http, with the service and the peer as metadata.
        let refused = log.all.filter { $0.message.hasPrefix("refused") }
        XCTAssertEqual(refused.count, 4)
        XCTAssertTrue(refused.allSatisfy { $0.level == .warning && $0.label == "herald-lab.http" && $0.metadata["service"] == "t" && $0.metadata["peer"]?.hasPrefix("127.0.0.1") == true },
                      "\(log.lines)")
        // Text from the request is escaped in log lines: no forged lines.
        c.send(get("/v1/x%0D%0At:%20forged"))
        XCTAssertEqual(c.answer()?.status, 401)
        let forged = try XCTUnwrap(log.lines.last)
        XCTAssertTrue(forged.contains("/v1/x\\x0D\\x0At: forged"), forged)
        XCTAssertFalse(log.lines.contains { $0.contains("\n") || $0.contains("\r") })
    }

    func testRolesAreCheckedAfterAuthentication() async throws {
        let service = HTTPService(name: "t", authenticate: { bearer in
            switch bearer {
            case "agent-credential-0001": return .init(role: .agent, name: "a1")
            case "operator-credential-01": return .init(role: .operator, name: "alice")
            default: return nil
            }
        }, logger: LogCapture.quiet())
        service.serve { r in
            r.routes(allow: [.operator]).post("/v1/runs") { _, context in Response.json(["by": context.principal?.name ?? ""]) }
            r.routes(allow: [.agent]).post("/v1/agents/:name/heartbeat") { _, context in Response.json(["by": context.principal?.name ?? ""]) }
            r.routes().get("/v1/anyone") { _, context in Response.json(["role": context.principal?.role.rawValue ?? ""]) }
        }
        let port = try await start(service)
        // A refusal before the body is read closes the connection: one connection per request.
        func post(_ path: String, _ token: String?) -> RawClient.Answer? {
            guard let c = try? RawClient(port: port) else { return nil }
            c.send("POST \(path) HTTP/1.1\r\nHost: t\r\n" + (token.map { "Authorization: Bearer \($0)\r\n" } ?? "") + "Content-Length: 2\r\n\r\n{}")
            return c.answer()
        }
        XCTAssertEqual(post("/v1/runs", "agent-credential-0001")?.status, 403)
        XCTAssertEqual(post("/v1/runs", nil)?.status, 401)
        XCTAssertEqual(post("/v1/runs", "operator-credential-01")?.text, "{\"by\":\"alice\"}")
        XCTAssertEqual(post("/v1/agents/a1/heartbeat", "operator-credential-01")?.status, 403)
        XCTAssertEqual(post("/v1/agents/a1/heartbeat", "agent-credential-0001")?.text, "{\"by\":\"a1\"}")
        let c = try RawClient(port: port)
        c.send(get("/v1/anyone", token: "agent-credential-0001"))
        XCTAssertEqual(c.answer()?.text, "{\"role\":\"agent\"}")
    }

    /// Each path segment is percent-decoded once, after splitting on "/": a double-encoded dot
    /// stays literal; an encoded "..", "/" or NUL is refused.
    func testPathIsDecodedOnce() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/v1/runs/:id") { _, context in Response.json(["id": context.parameter("id")]) }
        }
        let port = try await start(service)
        func status(_ path: String) throws -> (Int, String) {
            let c = try RawClient(port: port)
            c.send(get(path))
            let a = try XCTUnwrap(c.answer(), path)
            return (a.status, a.status == 200 ? (try JSONDecoder().decode([String: String].self, from: a.body))["id"] ?? "" : "")
        }
        XCTAssertEqual(try status("/v1/runs/%252e%252e").0, 200)
        XCTAssertEqual(try status("/v1/runs/%252e%252e").1, "%2e%2e")
        XCTAssertEqual(try status("/v1/runs/caf%C3%A9").1, "café")
        XCTAssertEqual(try status("/v1/runs/a%0Ab").1, "a\nb", "the handler judges names; log lines escape them")
        for bad in ["/v1/runs/%2e%2e", "/v1/runs/..", "/v1/runs/.", "/v1/runs/%2E", "/v1/runs/..%2f..%2fetc", "/v1/runs/a%2Fb", "/v1/runs/a%00b",
                    "/v1/runs/%zz", "/v1/runs/%4", "/v1/runs/%C3", "/v1/runs/x?q=%00", "/v1/runs/x#frag", "v1/runs/x"] {
            XCTAssertEqual(try status(bad).0, 400, bad)
        }
    }

    func testKeepAliveServesManyRequestsOnOneConnection() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        let port = try await start(service)
        let c = try RawClient(port: port)
        c.send(get("/health"))
        XCTAssertEqual(c.answer()?.status, 200)
        c.send(get("/health"))
        let second = try XCTUnwrap(c.answer())
        XCTAssertEqual(second.status, 200)
        XCTAssertNil(second.headers["connection"])
        // Two pipelined requests in one segment.
        c.send(get("/health") + get("/health"))
        XCTAssertEqual(c.answer()?.status, 200)
        XCTAssertEqual(c.answer()?.status, 200)
        c.send(get("/health", extra: "Connection: close\r\n"))
        let last = try XCTUnwrap(c.answer())
        XCTAssertEqual(last.headers["connection"], "close")
        XCTAssertTrue(c.closedByServer())

        let old = try RawClient(port: port)
        old.send("GET /health HTTP/1.0\r\n\r\n")
        XCTAssertEqual(old.answer()?.status, 200)
        XCTAssertTrue(old.closedByServer(), "HTTP/1.0 closes unless asked to keep alive")
        let kept = try RawClient(port: port)
        kept.send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        XCTAssertEqual(kept.answer()?.headers["connection"], "keep-alive")
        kept.send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        XCTAssertEqual(kept.answer()?.status, 200)
    }

    /// Thousands of pipelined requests answered without their handlers (401) are served one
    /// after the other, not by a worker calling itself.
    func testManyPipelinedRefusalsOnOneConnection() async throws {
        let service = HTTPService(name: "t", token: "0123456789abcdef0123", logger: LogCapture.quiet())
        let port = try await start(service)
        let c = try RawClient(port: port)
        let count = 5000
        let done = DispatchSemaphore(value: 0)
        let sender = Thread {
            c.send(String(repeating: get("/v1/unknown"), count: count))
            done.signal()
        }
        sender.start()
        var statuses = [Int: Int]()
        for _ in 0..<count {
            guard let a = c.answer() else { break }
            statuses[a.status, default: 0] += 1
        }
        done.wait()
        XCTAssertEqual(statuses, [401: count])
    }

    func testFilesAreStreamedWithRanges() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("labhttp-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("log.csv")
        let content = Data((0..<(700 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 9) })
        try content.write(to: file)
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/files/:name") { request, context in
                try Response.file(dir.appendingPathComponent(context.parameter("name")), contentType: "text/csv", range: request.headers[.range], missing: "no such file")
            }
        }
        let port = try await start(service)
        let c = try RawClient(port: port)
        c.send(get("/files/log.csv", extra: "Range: bytes=1000-1999\r\n"))
        let part = try XCTUnwrap(c.answer())
        XCTAssertEqual(part.status, 206)
        XCTAssertEqual(part.headers["content-range"], "bytes 1000-1999/\(content.count)")
        XCTAssertEqual(part.body, content[1000..<2000])
        c.send(get("/files/log.csv", extra: "Range: bytes=300000-\r\n"))
        let tail = try XCTUnwrap(c.answer())
        XCTAssertEqual(tail.status, 206)
        XCTAssertEqual(tail.body, content[300_000...])
        c.send(get("/files/log.csv"))
        let whole = try XCTUnwrap(c.answer())
        XCTAssertEqual(whole.status, 200)
        XCTAssertEqual(whole.headers["content-type"], "text/csv")
        XCTAssertEqual(whole.body, content)
        c.send("HEAD /files/log.csv HTTP/1.1\r\nHost: t\r\n\r\n")
        let head = try XCTUnwrap(c.answer(head: true))
        XCTAssertEqual(head.headers["content-length"], "\(content.count)")
        c.send(get("/files/missing.csv"))
        XCTAssertEqual(c.answer()?.status, 404)
        // A FIFO is not opened for reading (it would block until a writer came).
        XCTAssertEqual(mkfifo(dir.appendingPathComponent("fifo").path, 0o600), 0)
        c.send(get("/files/fifo"))
        XCTAssertEqual(c.answer()?.status, 404)
    }

    /// A handler that takes its time holds no thread and no loop: other requests are answered.
    func testSlowHandlerDoesNotHoldOthers() async throws {
        let gate = Gate()
        let service = HTTPService(name: "t", token: nil, limits: .init(maxConnectionsPerAddress: 100), logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/slow") { _, _ in
                await gate.wait()
                return Response.json(["slow": "done"])
            }
        }
        let port = try await start(service)
        var slow = [RawClient]()
        for _ in 0..<80 {
            let c = try RawClient(port: port)
            c.send(get("/slow"))
            slow.append(c)
        }
        let other = try RawClient(port: port)
        other.send(get("/health"))
        XCTAssertEqual(other.answer()?.status, 200)
        await gate.open()
        for c in slow { XCTAssertEqual(c.answer()?.status, 200) }
    }

    /// stop() closes the listening socket and every connection, idle or mid-request.
    func testStopClosesThePortAndConnections() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        let port = try await service.start(host: "127.0.0.1", port: 0)
        let idle = try RawClient(port: port)
        idle.send(get("/health"))
        XCTAssertEqual(idle.answer()?.status, 200)
        let halfway = try RawClient(port: port)
        halfway.send("GET /health HTTP/1.1\r\nHost: t\r\n")
        await service.stop()
        XCTAssertTrue(idle.closedByServer())
        XCTAssertTrue(halfway.closedByServer())
        XCTAssertThrowsError(try RawClient(port: port)) { error in
            XCTAssertTrue("\(error)".contains("Connection refused"), "\(error)")
        }
        XCTAssertEqual(service.openConnections(), 0)
    }

    func testStartReportsABusyPort() async throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        do {
            _ = try await service.start(host: "127.0.0.1", port: port)
            XCTFail("started on a busy port")
        } catch {
            XCTAssertTrue("\(error)".hasSuffix("t: cannot listen on 127.0.0.1:\(port): Address already in use"), "\(error)")
        }
    }
}

/// Opens once; waiters resume then.
actor Gate {
    private var isOpen = false
    private var waiters: [CheckedContinuation<Void, Never>] = []
    func wait() async {
        if isOpen { return }
        await withCheckedContinuation { waiters.append($0) }
    }
    func open() {
        isOpen = true
        for w in waiters { w.resume() }
        waiters = []
    }
}
