import Foundation
import Logging
import XCTest
import LabTestSupport
@testable import LabLog

final class LabLogHandlerTests: XCTestCase {
    final class Lines: @unchecked Sendable {
        private let lock = NSLock()
        private var lines: [String] = []
        func add(_ s: String) { lock.lock(); lines.append(s); lock.unlock() }
        var all: [String] { lock.lock(); defer { lock.unlock() }; return lines }
    }

    private func logger(_ label: String, _ level: Logger.Level, _ lines: Lines) -> Logger {
        Logger(label: label) { label in
            LabLogHandler(label: label, level: level, now: { Date(timeIntervalSince1970: 1_795_743_612.345) }, sink: lines.add)
        }
    }

    func testFormatIsTimestampLevelLabelMessageThenSortedMetadata() {
        let lines = Lines()
        var log = logger("herald-lab.coordinator", .info, lines)
        log[metadataKey: "run"] = "r7"
        log.info("run started", metadata: ["node": "n1", "agent": "pi-3"])
        XCTAssertEqual(lines.all, ["2026-11-27T01:40:12.345Z info herald-lab.coordinator: run started agent=pi-3 node=n1 run=r7"])
    }

    func testNewlineAndEscapeInMessageAndMetadataStayOnOneLine() {
        let lines = Lines()
        let log = logger("herald-lab.agent", .info, lines)
        log.warning("gap: \u{1B}[2Jevil\nFAKE info herald-lab.agent: forged",
                    metadata: ["node": "n1\n2026 critical x", "dongle": "hci0\u{1B}]0;t\u{07}", "reason": "a b=\"c\""])
        XCTAssertEqual(lines.all.count, 1)
        let line = lines.all[0]
        XCTAssertFalse(line.contains("\n"))
        XCTAssertFalse(line.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F })
        XCTAssertEqual(line, "2026-11-27T01:40:12.345Z warning herald-lab.agent: gap: \\x1B[2Jevil\\x0AFAKE info herald-lab.agent: forged"
                       + " dongle=hci0\\x1B]0;t\\x07 node=\"n1\\x0A2026 critical x\" reason=\"a b=\\\"c\\\"\"")
    }

    func testLevelFiltering() {
        let lines = Lines()
        let log = logger("herald-lab.air", .notice, lines)
        log.trace("t"); log.debug("d"); log.info("i")
        log.notice("n"); log.error("e")
        XCTAssertEqual(lines.all.map { $0.components(separatedBy: " ")[1] }, ["notice", "error"])
    }

    /// Other tests read the services' lines through LogCapture: its lines are this handler's.
    func testTheTestsCaptureKeepsTheHandlersLines() {
        let lines = Lines()
        var real = Logger(label: "herald-lab.agent") { LabLogHandler(label: $0, level: .trace, now: { Date(timeIntervalSince1970: 0) }, sink: lines.add) }
        let capture = LogCapture()
        var captured = capture.logger("herald-lab.agent")
        real[metadataKey: "agent"] = "a1"
        captured[metadataKey: "agent"] = "a1"
        for log in [real, captured] {
            log.warning("gap: \u{1B}[2J\nx", metadata: ["run": "r 1"])
            log.debug("radio: d")
        }
        XCTAssertEqual(lines.all.count, 2)
        XCTAssertEqual(capture.lines, lines.all)
        XCTAssertEqual(capture.all.map(\.level), [.warning, .debug])
        XCTAssertEqual(capture.all[0].metadata, ["agent": "a1", "run": "r 1"])
        XCTAssertEqual(capture.all[0].message, "gap: \u{1B}[2J\nx")
    }

    func testLogLevelFlagValues() throws {
        XCTAssertEqual(try LabLogLevel.parse("trace"), .trace)
        XCTAssertEqual(try LabLogLevel.parse("critical"), .critical)
        XCTAssertThrowsError(try LabLogLevel.parse("verbose\n")) { error in
            XCTAssertEqual("\(error)", "--log-level: 'verbose\\x0A' is not a log level (one of trace|debug|info|notice|warning|error|critical)")
        }
    }
}
