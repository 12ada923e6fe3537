import Foundation
import HeraldCore
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LabPlan
import LabTestSupport
import NIOCore
import XCTest
@testable import LabHTTP

/// The routes as Hummingbird's router answers them, without a socket (HummingbirdTesting's
/// router mode): authentication and roles as middleware on route groups, bodies collected within
/// their route's limit, errors answered as `{"error": message}`.
final class RouterModeTests: XCTestCase {
    static let operatorToken = "operator-0123456789abcdef0123456789"
    static let agentToken = "agent-0123456789abcdef0123456789abcd"
    static let scrapeToken = "scrape-0123456789abcdef0123456789abc"

    struct Echo: Codable, Sendable, Equatable { var text: String; var count: Int }
    static let echo = Endpoint<Echo, Echo>("POST", "/v1/echo/:name")

    /// A service with the three kinds of route: public, any principal but the scraper, the operator only, the scraper's /metrics.
    func service(log: LogCapture? = nil) -> HTTPService {
        let base: HTTPService.Authenticate = { bearer in
            if HTTPService.constantTimeEqual(bearer, Self.operatorToken) { return HTTPService.Principal(role: .operator, name: "op") }
            if HTTPService.constantTimeEqual(bearer, Self.agentToken) { return HTTPService.Principal(role: .agent, name: "a1") }
            return nil
        }
        let service = HTTPService(name: "t", authenticate: HTTPService.withScraper(Self.scrapeToken, base), logger: log?.logger("herald-lab.http") ?? LogCapture.quiet())
        service.serve { r in
            r.router.get("/page") { _, _ in Response(.ok, headers: ["Content-Type": "text/html"], body: Data("<p>public</p>".utf8)) }
            let any = r.routes()
            any.on(Self.echo, bodyLimit: 64) { echo, _, context in Echo(text: "\(context.parameter("name")): \(echo.text)", count: echo.count + 1) }
            any.get("/v1/refused") { _, _ -> Response in throw LabRefusal(.conflict, "run r1 is running") }
            r.routes(allow: [.operator]).post("/v1/operator") { _, context in Response.json(["by": context.principal?.name ?? ""]) }
            r.routes(allow: [.operator, .scraper]).get("/metrics") { _, _ in Response(.ok, headers: ["Content-Type": "text/plain"], body: Data("m 1\n".utf8)) }
        }
        return service
    }

    static func bearer(_ token: String) -> HTTPFields { [.authorization: "Bearer \(token)"] }

    static func error(_ r: TestResponse) throws -> String {
        XCTAssertEqual(r.headers[.contentType], "application/json")
        return try XCTUnwrap(JSONDecoder().decode([String: String].self, from: Data(r.body.readableBytesView))["error"])
    }

    func testWithoutAValidCredentialEveryRouteButThePublicOnesIs401() async throws {
        let log = LogCapture()
        let app = Application(responder: service(log: log).responder())
        try await app.test(.router) { client in
            let health = try await client.execute(uri: "/health", method: .get)
            XCTAssertEqual(health.status, .ok)
            XCTAssertEqual(String(buffer: health.body), #"{"service":"t","status":"ok"}"#)
            let r1 = try await client.execute(uri: "/page", method: .get)
            XCTAssertEqual(r1.status, .ok, "a public page needs no credential")
            let unknown = try await client.execute(uri: "/v1/no-such-route", method: .get)
            XCTAssertEqual(unknown.status, .unauthorized, "an unknown route without a credential is 401, never 404")
            XCTAssertEqual(try Self.error(unknown), "a valid token is required (Authorization: Bearer <token>)")
            let r2 = try await client.execute(uri: "/v1/echo/x", method: .post)
            XCTAssertEqual(r2.status, .unauthorized)
            let r3 = try await client.execute(uri: "/v1/echo/x", method: .post, headers: Self.bearer("wrong-wrong-wrong-wrong-wrong-wrong"))
            XCTAssertEqual(r3.status, .unauthorized)
            let r4 = try await client.execute(uri: "/v1/no-such-route", method: .get, headers: Self.bearer(Self.operatorToken))
            XCTAssertEqual(r4.status, .notFound,
                           "with a valid credential an unknown route is 404")
            let head = try await client.execute(uri: "/v1/no-such-route", method: .head)
            XCTAssertEqual(head.status, .unauthorized)
            XCTAssertEqual(head.body.readableBytes, 0, "HEAD has no body")
        }
        XCTAssertTrue(log.lines.contains { $0.contains("refused") && $0.contains("missing token") }, log.lines.joined(separator: "\n"))
    }

    func testRolesAreCheckedOnTheirGroup() async throws {
        let app = Application(responder: service().responder())
        try await app.test(.router) { client in
            let mine = try await client.execute(uri: "/v1/operator", method: .post, headers: Self.bearer(Self.operatorToken))
            XCTAssertEqual(String(buffer: mine.body), #"{"by":"op"}"#)
            let agent = try await client.execute(uri: "/v1/operator", method: .post, headers: Self.bearer(Self.agentToken))
            XCTAssertEqual(agent.status, .forbidden)
            XCTAssertEqual(try Self.error(agent), "not allowed for role agent")
            // The scrape credential opens GET /metrics and nothing else, not even routes any principal may call.
            let r5 = try await client.execute(uri: "/metrics", method: .get, headers: Self.bearer(Self.scrapeToken))
            XCTAssertEqual(r5.status, .ok)
            let r6 = try await client.execute(uri: "/metrics", method: .get, headers: Self.bearer(Self.agentToken))
            XCTAssertEqual(r6.status, .forbidden)
            let scraperEcho = try await client.execute(uri: "/v1/echo/x", method: .post, headers: Self.bearer(Self.scrapeToken),
                                                       body: ByteBuffer(string: #"{"text":"a","count":1}"#))
            XCTAssertEqual(scraperEcho.status, .forbidden)
            let r7 = try await client.execute(uri: "/v1/operator", method: .post, headers: Self.bearer(Self.scrapeToken))
            XCTAssertEqual(r7.status, .forbidden)
        }
    }

    func testAnEndpointDecodesItsBodyAndAnswersJSON() async throws {
        let app = Application(responder: service().responder())
        try await app.test(.router) { client in
            let r = try await client.execute(uri: "/v1/echo/caf%C3%A9", method: .post, headers: Self.bearer(Self.agentToken),
                                             body: ByteBuffer(string: #"{"text":"hi","count":41}"#))
            XCTAssertEqual(r.status, .ok)
            XCTAssertEqual(r.headers[.contentType], "application/json")
            XCTAssertEqual(try JSONDecoder().decode(Echo.self, from: Data(r.body.readableBytesView)), Echo(text: "café: hi", count: 42), "the parameter decoded once")
            let bad = try await client.execute(uri: "/v1/echo/x", method: .post, headers: Self.bearer(Self.agentToken), body: ByteBuffer(string: #"{"text":"hi"}"#))
            XCTAssertEqual(bad.status, .badRequest)
            XCTAssertEqual(try Self.error(bad), "request body is not a valid Echo: missing field count")
            let big = try await client.execute(uri: "/v1/echo/x", method: .post, headers: Self.bearer(Self.agentToken),
                                               body: ByteBuffer(string: #"{"text":""# + String(repeating: "a", count: 100) + #"","count":1}"#))
            XCTAssertEqual(big.status, .contentTooLarge)
            XCTAssertEqual(big.headers[.connection], "close", "the rest of the body is not read: the connection ends")
            XCTAssertEqual(try Self.error(big), "the body is larger than 64 bytes")
            let dotted = try await client.execute(uri: "/v1/echo/%2e%2e", method: .post, headers: Self.bearer(Self.agentToken))
            XCTAssertEqual(dotted.status, .badRequest)
        }
    }

    func testARefusalIsAnsweredWithItsKindsStatus() async throws {
        let app = Application(responder: service().responder())
        try await app.test(.router) { client in
            let r = try await client.execute(uri: "/v1/refused", method: .get, headers: Self.bearer(Self.operatorToken))
            XCTAssertEqual(r.status, .conflict)
            XCTAssertEqual(try Self.error(r), "run r1 is running")
            XCTAssertEqual(String(buffer: r.body), #"{"error":"run r1 is running"}"#)
        }
    }
}
