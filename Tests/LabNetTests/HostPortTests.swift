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

/// `--insecure` listens on loopback only: the host is resolved and every address must be
/// loopback (issue 19, item 7); its text decides nothing.
final class LoopbackOnlyTests: XCTestCase {
    func testLoopbackAddressesAreRecognisedByValue() {
        for yes in ["127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"] {
            XCTAssertTrue(NetAddress.isLoopback(numericHost: yes), yes)
        }
        for no in ["0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "126.255.255.255", "::2", "::ffff:10.0.0.1", "fe80::1",
                   "localhost", "127.attacker.invalid", "127.0.0.1.nip.io", ""] {
            XCTAssertFalse(NetAddress.isLoopback(numericHost: no), no)
        }
    }

    func testANameIsJudgedByWhatItResolvesTo() throws {
        // A name that starts like a loopback address but resolves elsewhere (as DNS would answer
        // for 127.attacker.invalid) is refused, naming the address.
        let dns: [String: [String]] = ["127.attacker.invalid": ["203.0.113.7"], "mixed.test": ["127.0.0.1", "192.0.2.1"],
                                       "lo.test": ["127.0.0.1", "::1"]]
        func resolve(_ h: String) throws -> [String] {
            guard let a = dns[h] else { throw NetError(.resolve, "cannot resolve \(h)") }
            return a
        }
        XCTAssertThrowsError(try Listener.loopbackAddress(host: "127.attacker.invalid", resolve: resolve)) { e in
            XCTAssertEqual((e as? NetError)?.kind, .badAddress)
            XCTAssertTrue("\(e)".contains("203.0.113.7"), "\(e)")
        }
        XCTAssertThrowsError(try Listener.loopbackAddress(host: "mixed.test", resolve: resolve)) { e in
            XCTAssertTrue("\(e)".contains("192.0.2.1"), "\(e)")
        }
        XCTAssertThrowsError(try Listener.loopbackAddress(host: "nowhere.test", resolve: resolve))
        // The address checked is the one to bind.
        XCTAssertEqual(try Listener.loopbackAddress(host: "lo.test", resolve: resolve), "127.0.0.1")
    }

    func testRealResolutionOfLiteralsAndWildcards() throws {
        XCTAssertEqual(try Listener.loopbackAddress(host: "127.0.0.1"), "127.0.0.1")
        XCTAssertEqual(try Listener.loopbackAddress(host: "127.1"), "127.0.0.1")
        for wildcard in ["0.0.0.0", "::", "*", ""] {
            XCTAssertThrowsError(try Listener.loopbackAddress(host: wildcard), wildcard)
        }
        XCTAssertThrowsError(try Listener.loopbackAddress(host: "10.1.2.3"))
    }
}
