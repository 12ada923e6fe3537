import DBus
import Foundation

/// The version of the bluetoothd that answers on the system bus: the process that owns
/// `org.bluez` (its PID from the bus), asked with `--version` through /proc/PID/exe, so it is the
/// running binary's version even when bluetoothd runs from another root or was upgraded since.
public enum BlueZVersion {
    /// "5.66", or why it is unknown.
    public static func read(busAddress: String? = nil) async -> Result<String, BlueZVersionError> {
        let pid: UInt32
        do {
            let bus = try await DBusConnection.connect(address: busAddress)
            defer { Task { await bus.close() } }
            let reply = try await bus.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                           member: "GetConnectionUnixProcessID", arguments: [.string("org.bluez")], timeout: .seconds(5))
            guard case .uint32(let p)? = reply.first else { return .failure(BlueZVersionError("the bus gave no PID for org.bluez")) }
            pid = p
        } catch {
            return .failure(BlueZVersionError("bluetoothd is not on the system bus (\(error))"))
        }
        return version(ofExecutable: "/proc/\(pid)/exe")
    }

    /// Runs `path --version` and takes its first line ("5.82"); the exit status is checked.
    static func version(ofExecutable path: String) -> Result<String, BlueZVersionError> {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = ["--version"]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        do { try p.run() } catch { return .failure(BlueZVersionError("cannot run \(path) --version: \(error)")) }
        let data = out.fileHandleForReading.readDataToEndOfFile().prefix(200)
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { return .failure(BlueZVersionError("\(path) --version exited \(p.terminationStatus)")) }
        let text = String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
        guard !text.isEmpty, text.count <= 32, text.allSatisfy({ $0.isNumber || $0 == "." }) else {
            return .failure(BlueZVersionError("\(path) --version printed \"\(text.prefix(40))\", not a version"))
        }
        return .success(text)
    }
}

public struct BlueZVersionError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ d: String) { description = d }
}
