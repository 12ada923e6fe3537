import XCTest
@testable import LabPlan

/// What a plan's author is told when a field or a unit is wrong: the nearest known field, and a
/// unit that puts a bare number in range.
final class PlanHintTests: XCTestCase {
    func problems(_ yaml: String) -> [String] { planProblems(yaml) }

    func testAFieldTypoGetsTheNearestKnownField() {
        let typo = problems("name: p\nduration: 1m\nnodes: [a, b]\nradio: {reportLos: 0.1}")
        XCTAssertEqual(typo.count, 1)
        XCTAssertTrue(typo[0].hasPrefix("radio.reportLos: unknown field (did you mean reportLoss? known: kind,"), typo[0])
        let caseOnly = problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertinterval: 100ms}")
        XCTAssertTrue(caseOnly[0].contains("did you mean advertInterval?"), caseOnly[0])
        let top = problems("name: p\nduraton: 1m\nnodes: [a, b]")
        XCTAssertTrue(top.contains { $0.hasPrefix("duraton: unknown field (did you mean duration?") }, "\(top)")
        let far = problems("name: p\nduration: 1m\nnodes: [a, b]\nradio: {banana: 1}")
        XCTAssertTrue(far[0].hasPrefix("radio.banana: unknown field (known:"), "nothing near: no guess: \(far[0])")
    }

    func testABareNumberIsToldTheUnitThatPutsItInRange() {
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertInterval: 100}"),
                       ["sensor.advertInterval: \"100\" has no unit; write a duration with one, such as 100ms (units ms, s, m, h, d)"],
                       "100s is out of range for an advertising interval; 100ms is in it")
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertInterval: 2}"),
                       ["sensor.advertInterval: \"2\" has no unit; write a duration with one, such as 2s (units ms, s, m, h, d)"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertInterval: 100s}"),
                       ["sensor.advertInterval: \"100s\" is too long; at most 10.24s"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertInterval: 5ms}"),
                       ["sensor.advertInterval: \"5ms\" is too short; at least 20ms"])
        let nowhere = problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {advertInterval: 100000}")
        XCTAssertTrue(nowhere[0].contains("no unit puts it between 20ms and 10.24s"), nowhere[0])
    }

    func testFlagDurationsTakeUnitsAndRefuseBareNumbers() throws {
        XCTAssertEqual(try Plan.duration("2m", min: 1, max: 86_400), 120)
        XCTAssertEqual(try Plan.duration("30d", min: 3600, max: 36_500 * 86_400), 30 * 86_400)
        XCTAssertThrowsError(try Plan.duration("60", min: 1, max: 86_400)) { error in
            XCTAssertEqual("\(error)", "\"60\" has no unit; write a duration with one, such as 60s (units ms, s, m, h, d)")
        }
        XCTAssertThrowsError(try Plan.duration("0s", min: 1, max: 86_400, allowZero: false))
        XCTAssertThrowsError(try Plan.duration("2d", min: 1, max: 86_400)) { error in
            XCTAssertEqual("\(error)", "\"2d\" is too long; at most 1 days (24h)")
        }
    }
}
