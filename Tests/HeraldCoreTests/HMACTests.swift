import Foundation
import HeraldCore
import XCTest

final class HMACTests: XCTestCase {
    /// RFC 4231 test cases 1 and 6 (a key longer than the block).
    func testHMACMatchesRFC4231() {
        XCTAssertEqual(SHA256.hmac(key: Data(repeating: 0x0b, count: 20), message: Data("Hi There".utf8)),
                       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        XCTAssertEqual(SHA256.hmac(key: Data(repeating: 0xaa, count: 131), message: Data("Test Using Larger Than Block-Size Key - Hash Key First".utf8)),
                       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    }
}
