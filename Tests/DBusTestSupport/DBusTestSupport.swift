// Shared by the D-Bus and BlueZ tests: a private dbus-daemon per test, a process runner and
// timeouts (no fixed sleeps anywhere: everything awaits a condition with a deadline).
import Foundation

public struct TestTimeout: Error, CustomStringConvertible {
    public let what: String
    public init(what: String) { self.what = what }
    public var description: String { "timed out: \(what)" }
}

/// Runs `body` and fails with TestTimeout if it takes longer than `seconds`.
public func withTimeout<T: Sendable>(_ seconds: Double, _ what: String = "operation",
                              _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(nanoseconds: UInt64(seconds * 1_000_000_000))
            throw TestTimeout(what: what)
        }
        let result = try await group.next()!
        group.cancelAll()
        return result
    }
}

public struct ProcessResult: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
}

/// Runs a program to completion without blocking a cooperative thread.
public func runProcess(_ executable: String, _ arguments: [String], timeout: Double = 30) async throws -> ProcessResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    // Each pipe is read to its end on a thread of its own, from before the start: a readability
    // handler cleared after the exit could still hold bytes it had read but not yet appended, and
    // the output came back empty (busctl's "n -5" echo, CI of 15cebbe).
    let stdout = PipeReader(out.fileHandleForReading)
    let stderr = PipeReader(err.fileHandleForReading)
    let status: Int32 = try await withTimeout(timeout, "\(executable) \(arguments)") {
        try await withCheckedThrowingContinuation { (cont: CheckedContinuation<Int32, Error>) in
            process.terminationHandler = { p in cont.resume(returning: p.terminationStatus) }
            do { try process.run() } catch { cont.resume(throwing: error) }
        }
    }
    return ProcessResult(status: status, stdout: await stdout.text(), stderr: await stderr.text())
}

/// Reads a pipe to its end on a GCD thread (not the cooperative pool, which a blocking read would
/// hold); `text()` waits for the end.
final class PipeReader: Sendable {
    private let result = Locked<Data?>(nil)
    private let done = DispatchGroup()
    init(_ handle: FileHandle) {
        done.enter()
        DispatchQueue.global().async { [result, done] in
            let data = handle.readDataToEndOfFile()
            result.mutate { $0 = data }
            done.leave()
        }
    }
    func text() async -> String {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            done.notify(queue: .global()) { c.resume() }
        }
        return String(decoding: result.value ?? Data(), as: UTF8.self)
    }
}

/// A value shared between a test and call-backs on other threads.
public final class Locked<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T
    public init(_ value: T) { stored = value }
    public var value: T { lock.lock(); defer { lock.unlock() }; return stored }
    public func mutate(_ body: (inout T) -> Void) { lock.lock(); body(&stored); lock.unlock() }
}

/// A private system-type dbus-daemon with a permissive policy on a unix socket in a temp dir.
public final class PrivateBus: @unchecked Sendable {
    public let directory: URL
    public let address: String
    public let pid: Int32

    public static func start() async throws -> PrivateBus {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("dbustest-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let config = """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>system</type>
          <listen>unix:path=\(dir.path)/bus.sock</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow user="*"/>
            <allow own="*"/>
            <allow send_destination="*"/>
            <allow receive_sender="*"/>
          </policy>
        </busconfig>
        """
        let configURL = dir.appendingPathComponent("bus.conf")
        try config.write(to: configURL, atomically: true, encoding: .utf8)
        // posix_spawn rather than Foundation's Process: the forked daemon would inherit Process's
        // child-exit socket and keep it open, so Process would never see the parent exit. Every
        // descriptor above stderr is closed in the child; stdout goes to a file.
        let outURL = dir.appendingPathComponent("daemon.out")
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outURL.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        for fd in Int32(3)..<Int32(4096) where fcntl(fd, F_GETFD) != -1 {
            posix_spawn_file_actions_addclose(&actions, fd)
        }
        let argv = ["/usr/bin/dbus-daemon", "--config-file=\(configURL.path)", "--fork", "--print-address=1", "--print-pid=1"]
        var cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for a in cArgs { free(a) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, argv[0], &actions, nil, &cArgs, environ)
        guard rc == 0 else { throw TestTimeout(what: "posix_spawn dbus-daemon: \(rc)") }
        // The parent exits as soon as the daemon is listening and has printed its address.
        var waitStatus: Int32 = 0
        while waitpid(child, &waitStatus, 0) == -1 && errno == EINTR {}
        let status = waitStatus
        let output = (try? String(contentsOf: outURL, encoding: .utf8)) ?? ""
        let lines = output.split(separator: "\n").map(String.init)
        guard status == 0, lines.count >= 2, let pid = Int32(lines[1].trimmingCharacters(in: .whitespaces)) else {
            try? FileManager.default.removeItem(at: dir)
            throw TestTimeout(what: "dbus-daemon failed (\(status)): \(output)")
        }
        return PrivateBus(directory: dir, address: lines[0], pid: pid)
    }

    private init(directory: URL, address: String, pid: Int32) {
        self.directory = directory
        self.address = address
        self.pid = pid
    }

    public func stop() {
        kill(pid, SIGKILL)
        try? FileManager.default.removeItem(at: directory)
    }
}


/// Whether `python3` can import `module` (the Python test peers need dbus-fast).
public func pythonHasModule(_ module: String) -> Bool {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    p.arguments = ["python3", "-c", "import \(module)"]
    p.standardError = FileHandle.nullDevice
    p.standardOutput = FileHandle.nullDevice
    guard (try? p.run()) != nil else { return false }
    p.waitUntilExit()
    return p.terminationStatus == 0
}
