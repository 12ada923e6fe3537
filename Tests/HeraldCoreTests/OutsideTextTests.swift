import Foundation
import HeraldCore
import XCTest

/// Outside text shown, never obeyed (issue 19, item 4).
final class OutsideTextTests: XCTestCase {
    func testControlCharactersAndDirectionMarksAreShownAsEscapes() {
        let hostile = "a\u{1B}[2Jb\rc\nd\u{7F}e\u{9B}f\u{200E}\u{200F}\u{202A}\u{202E}\u{2066}\u{2069}\u{2028}g\\h\"i é 😀"
        let e = OutsideText.escaped(hostile)
        XCTAssertEqual(e, "a\\x1B[2Jb\\x0Dc\\x0Ad\\x7Fe\\u{009B}f\\u{200E}\\u{200F}\\u{202A}\\u{202E}\\u{2066}\\u{2069}\\u{2028}g\\\\h\"i é 😀")
        XCTAssertFalse(e.unicodeScalars.contains { OutsideText.isEscaped($0) })
        XCTAssertEqual(OutsideText.escaped("\"x\"", quotes: true), "\\\"x\\\"")
        XCTAssertEqual(OutsideText.escaped("abcdef", limit: 3), "abc...")
        XCTAssertEqual(OutsideText.line("a\\x0A\nb"), "a\\x0A\\x0Ab", "a whole line keeps its backslashes")
    }
}
