import XCTest
@testable import LabNode

final class HostSystemTests: XCTestCase {
    /// Linux 6.1, as Debian 12 and an upstream build name it, is named with what to do; 6.12
    /// (Debian 13's, bookworm-backports'), 6.10 and 5.x are not, nor a release that is no version.
    func testOnlyLinux61IsNamedForItsBluetoothBug() throws {
        for release in ["6.1.0-56-amd64", "6.1.0-18-arm64", "6.1.192", "6.1"] {
            let problem = try XCTUnwrap(HostSystem.bluetoothProblem(kernelRelease: release), release)
            XCTAssertTrue(problem.hasPrefix("kernel \(release): Linux 6.1's Bluetooth stack has a BUG"), problem)
            XCTAssertTrue(problem.contains("bookworm-backports"), problem)
        }
        for release in ["6.12.95+deb12-amd64", "6.12.38+deb13-amd64", "6.10.3", "6.11", "5.10.0-30-amd64", "6", "", "six.1", "16.1.0"] {
            XCTAssertNil(HostSystem.bluetoothProblem(kernelRelease: release), release)
        }
    }
}
