import Foundation
import XCTest
import LabNet

final class HostPortTests: XCTestCase {
    func testParsesNamesIPv4AndBracketedIPv6() throws {
        XCTAssertEqual(try HostPort(parsing: "coord.lab:8702"), HostPort(host: "coord.lab", port: 8702))
        XCTAssertEqual(try HostPort(parsing: "10.9.0.2:8701"), HostPort(host: "10.9.0.2", port: 8701))
        XCTAssertEqual(try HostPort(parsing: "[::1]:8702"), HostPort(host: "::1", port: 8702))
        XCTAssertEqual(try HostPort(parsing: "[fd00::2]:0"), HostPort(host: "fd00::2", port: 0))
        XCTAssertEqual(try HostPort(parsing: " n1-a_b.lab:65535 "), HostPort(host: "n1-a_b.lab", port: 65535))
    }

    func testFormatsWithBracketsForIPv6() {
        XCTAssertEqual(HostPort(host: "::1", port: 80).description, "[::1]:80")
        XCTAssertEqual(HostPort(host: "[fd00::2]", port: 80).description, "[fd00::2]:80")
        XCTAssertEqual(HostPort(host: "coord.lab", port: 8702).description, "coord.lab:8702")
        XCTAssertEqual(HostPort(host: "10.0.0.1", port: 1).description, "10.0.0.1:1")
        for text in ["coord.lab:8702", "[::1]:8702", "10.9.0.2:1"] {
            XCTAssertEqual(try HostPort(parsing: text).description, text)
        }
    }

    func testBadFormsNameTheTextAndTheProblem() {
        let cases: [(String, String)] = [
            ("coord.lab", "the port is missing"),
            ("coord.lab:", "the port is missing"),
            (":8702", "the host is missing"),
            ("", "it is empty"),
            ("coord.lab:http", "\"http\" is not a port"),
            ("coord.lab:70000", "\"70000\" is not a port"),
            ("coord.lab:-1", "\"-1\" is not a port"),
            ("::1:8702", "an IPv6 address needs brackets"),
            ("[::1]", "the port is missing"),
            ("[::1:8702", "has no \"]\""),
            ("[coord.lab]:8702", "\"coord.lab\" is not an IPv6 address"),
            ("http://coord.lab:8702", "a URL is not a host and port"),
            ("coord lab:8702", "\"coord lab\" is not a host name"),
        ]
        for (text, problem) in cases {
            XCTAssertThrowsError(try HostPort(parsing: text), text) { error in
                let e = error as? NetError
                XCTAssertEqual(e?.kind, .badAddress, text)
                let message = "\(error)"
                XCTAssertTrue(message.contains("\"\(text)\""), "\(text): \(message)")
                XCTAssertTrue(message.contains(problem), "\(text): \(message)")
            }
        }
    }

    func testWildcardsAndURLHosts() {
        for w in ["0.0.0.0", "::", "", "*"] { XCTAssertTrue(HostPort.isWildcard(w), w) }
        for h in ["127.0.0.1", "::1", "localhost"] { XCTAssertFalse(HostPort.isWildcard(h), h) }
        XCTAssertEqual(HostPort.urlHost("::1"), "[::1]")
        XCTAssertEqual(HostPort.urlHost("[::1]"), "[::1]")
        XCTAssertEqual(HostPort.urlHost("n1.lab"), "n1.lab")
        XCTAssertEqual(HostPort.urlHost("127.0.0.1"), "127.0.0.1")
        XCTAssertTrue(HostPort.isIPv6("fe80::1%eth0"))
        XCTAssertFalse(HostPort.isIPv6("n1.lab"))
    }

    func testTakesHostAndPortFromURLs() throws {
        XCTAssertEqual(try HostPort(url: URL(string: "http://[::1]:8700/v1/clock")!), HostPort(host: "::1", port: 8700))
        XCTAssertEqual(try HostPort(url: URL(string: "http://coord.lab:8700")!), HostPort(host: "coord.lab", port: 8700))
        XCTAssertEqual(try HostPort(url: URL(string: "http://10.0.0.1/")!), HostPort(host: "10.0.0.1", port: 80))
        XCTAssertEqual(try HostPort(url: URL(string: "https://coord.lab")!).port, 443)
        XCTAssertThrowsError(try HostPort(url: URL(string: "file:///tmp/x")!)) { XCTAssertTrue("\($0)".contains("file:///tmp/x"), "\($0)") }
    }
}
