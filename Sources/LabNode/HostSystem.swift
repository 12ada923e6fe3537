import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Facts about the machine a node runs on.
public enum HostSystem {
    /// The running kernel's release, as `uname -r` prints it (`6.1.0-18-arm64`); nil if uname fails.
    public static func kernelRelease() -> String? {
        var u = utsname()
        guard uname(&u) == 0 else { return nil }
        let release = withUnsafeBytes(of: &u.release) { raw in String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self) }
        return release.isEmpty ? nil : release
    }
}
