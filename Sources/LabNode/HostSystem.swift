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

    /// What a lab node's operator must know about its kernel's Bluetooth stack, as one sentence;
    /// nil when nothing is known. Linux 6.1 (Debian 12's own kernel) has a BUG: list corruption in
    /// `hci_chan_del` when bluetoothd closes an L2CAP socket. It kills bluetoothd, and in guest runs
    /// it left a node unable to connect to a peer for the rest of the run, bluetoothd's restarts
    /// included (ARCHITECTURE.md). 6.12 has the fix; bookworm-backports ships 6.12 for Debian 12.
    /// Only 6.1 is named: it is the kernel where the BUG was seen.
    public static func bluetoothProblem(kernelRelease release: String) -> String? {
        let version = release.prefix { $0.isNumber || $0 == "." }.split(separator: ".").prefix(2).compactMap { Int($0) }
        guard version == [6, 1] else { return nil }
        return "kernel \(release): Linux 6.1's Bluetooth stack has a BUG (list corruption in hci_chan_del, fixed in 6.12) "
            + "that kills bluetoothd and can leave this dongle unable to connect to a peer for the rest of a run; "
            + "on Debian 12, install the kernel from bookworm-backports (apt install -t bookworm-backports linux-image-amd64) and reboot"
    }
}
