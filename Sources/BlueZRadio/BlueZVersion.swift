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
        // The running binary, as it is; then with the loader and libraries of its own root (a
        // bluetoothd chrooted into another release's root needs that release's libc); then the
        // installed binary (an agent that may not look into root's processes).
        var tried = [String]()
        switch version(ofExecutable: "/proc/\(pid)/exe") {
        case .success(let v): return .success(v)
        case .failure(let e): tried.append(e.description)
        }
        if let (loader, libraries) = foreignRoot(pid: pid) {
            switch version(ofExecutable: loader, arguments: ["--library-path", libraries, "/proc/\(pid)/exe", "--version"]) {
            case .success(let v): return .success(v)
            case .failure(let e): tried.append(e.description)
            }
        }
        switch version(ofExecutable: "/usr/libexec/bluetooth/bluetoothd") {
        case .success(let v): return .success(v + " (the installed bluetoothd; the running one could not be asked)")
        case .failure(let e): tried.append(e.description)
        }
        return .failure(BlueZVersionError(tried.joined(separator: "; ")))
    }

    /// The dynamic loader and library folders of process `pid`'s root, when that root is not ours.
    static func foreignRoot(pid: UInt32) -> (loader: String, libraries: String)? {
        let root = "/proc/\(pid)/root"
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: root), target != "/" else { return nil }
        let fm = FileManager.default
        var loader: String?
        for dir in ["lib64", "lib"] {
            let names = (try? fm.contentsOfDirectory(atPath: "\(root)/\(dir)")) ?? []
            if let n = names.sorted().first(where: { $0.hasPrefix("ld-linux") && $0.contains(".so") }) { loader = "\(root)/\(dir)/\(n)"; break }
        }
        guard let loader else { return nil }
        let libDirs = ((try? fm.contentsOfDirectory(atPath: "\(root)/usr/lib")) ?? []).sorted().filter { $0.hasSuffix("-linux-gnu") || $0.hasSuffix("-linux-gnueabihf") }
        let paths = libDirs.flatMap { ["\(root)/lib/\($0)", "\(root)/usr/lib/\($0)"] } + ["\(root)/lib", "\(root)/usr/lib"]
        return (loader, paths.joined(separator: ":"))
    }

    /// Runs `path --version` and takes its first line ("5.82"); the exit status is checked.
    static func version(ofExecutable path: String, arguments: [String] = ["--version"]) -> Result<String, BlueZVersionError> {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = arguments
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
