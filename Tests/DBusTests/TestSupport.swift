// Test support: a private dbus-daemon per test, process runner, the Python dbus-fast peer,
// and timeouts (no fixed sleeps anywhere: everything awaits a condition with a deadline).
import DBus
import Foundation
import XCTest

struct TestTimeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out: \(what)" }
}

/// Runs `body` and fails with TestTimeout if it takes longer than `seconds`.
func withTimeout<T: Sendable>(_ seconds: Double, _ what: String = "operation",
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

struct ProcessResult: Sendable {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs a program to completion without blocking a cooperative thread.
func runProcess(_ executable: String, _ arguments: [String], timeout: Double = 30) async throws -> ProcessResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    let outBuffer = LockedData()
    let errBuffer = LockedData()
    out.fileHandleForReading.readabilityHandler = { h in outBuffer.append(h.availableData) }
    err.fileHandleForReading.readabilityHandler = { h in errBuffer.append(h.availableData) }
    let status: Int32 = try await withTimeout(timeout, "\(executable) \(arguments)") {
        try await withCheckedThrowingContinuation { (cont: CheckedContinuation<Int32, Error>) in
            process.terminationHandler = { p in cont.resume(returning: p.terminationStatus) }
            do { try process.run() } catch { cont.resume(throwing: error) }
        }
    }
    out.fileHandleForReading.readabilityHandler = nil
    err.fileHandleForReading.readabilityHandler = nil
    outBuffer.append(out.fileHandleForReading.readDataToEndOfFile())
    errBuffer.append(err.fileHandleForReading.readDataToEndOfFile())
    return ProcessResult(status: status, stdout: outBuffer.string, stderr: errBuffer.string)
}

final class LockedData: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    func append(_ d: Data) { lock.lock(); data.append(d); lock.unlock() }
    var string: String { lock.lock(); defer { lock.unlock() }; return String(decoding: data, as: UTF8.self) }
}

/// A private system-type dbus-daemon with a permissive policy on a unix socket in a temp dir.
final class PrivateBus: @unchecked Sendable {
    let directory: URL
    let address: String
    let pid: Int32

    static func start() async throws -> PrivateBus {
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

    func stop() {
        kill(pid, SIGKILL)
        try? FileManager.default.removeItem(at: directory)
    }
}

/// The independent peer: a Python dbus-fast service (see peerScript).
final class PythonPeer: @unchecked Sendable {
    static let name = "org.heraldlab.PyPeer"
    static let path = "/org/heraldlab/peer"
    static let interface = "org.heraldlab.Peer"
    let process: Process

    static var available: Bool {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["python3", "-c", "import dbus_fast"]
        p.standardError = FileHandle.nullDevice
        p.standardOutput = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }

    /// Starts the peer and waits (through our own binding) until it owns its name.
    static func start(bus: PrivateBus, watcher: DBusConnection) async throws -> PythonPeer {
        let script = bus.directory.appendingPathComponent("peer.py")
        try peerScript.write(to: script, atomically: true, encoding: .utf8)
        let owner = try await watcher.signals(matching: DBusMatchRule(
            interface: "org.freedesktop.DBus", member: "NameOwnerChanged", args: [0: name]))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script.path, bus.address]
        try process.run()
        let peer = PythonPeer(process: process)
        try await withTimeout(30, "python peer start") {
            for await signal in owner where signal.arguments.count == 3 && signal.arguments[2] != .string("") {
                return
            }
            throw TestTimeout(what: "python peer: stream ended")
        }
        return peer
    }

    private init(process: Process) { self.process = process }

    func stop() {
        if process.isRunning { process.terminate() }
    }
}

/// The Python peer (dbus-fast). Methods of org.heraldlab.Peer at /org/heraldlab/peer:
/// Echo(any) -> same values; Fixed() -> known values of every signature; Fail() -> error;
/// Never() -> no reply; Register(o) -> calls back the caller's GetManagedObjects at that path
/// before replying with the sorted object paths (the bluetoothd RegisterApplication pattern);
/// Emit(s path, s iface, s member, v payload) -> emits a signal with the payload's value.
let peerScript = #"""
import asyncio, sys
from dbus_fast.aio import MessageBus
from dbus_fast import Message, MessageType, Variant

FIXED_SIG = 'ybnqiuxtdsogvayasaoa{sv}a{qv}a{oa{sa{sv}}}(ysb)aai'
FIXED_BODY = [200, True, -300, 60000, -70000, 4000000000, -9000000000000, 18000000000000000000, 2.5,
    'h\u00e9llo', '/org/heraldlab/x', 'a{sv}', Variant('v', Variant('s', 'deep')), b'\x01\x02\xff', [], [],
    {'Transport': Variant('s', 'le'), 'RSSI': Variant('n', -60)},
    {1521: Variant('ay', b'\x01\x02\x03\x04\x05\x06')},
    {'/org/bluez/hci0': {'org.bluez.Adapter1': {'Powered': Variant('b', True),
                                                'Roles': Variant('as', ['central', 'peripheral'])}}},
    [7, 'st', False], [[1, 2], []]]

async def main():
    bus = await MessageBus(bus_address=sys.argv[1], negotiate_unix_fd=True).connect()

    async def register(msg):
        cb = await bus.call(Message(destination=msg.sender, path=msg.body[0],
                                    interface='org.freedesktop.DBus.ObjectManager', member='GetManagedObjects'))
        if cb.message_type == MessageType.ERROR:
            bus.send(Message.new_error(msg, cb.error_name, str(cb.body)))
            return
        bus.send(Message.new_method_return(msg, 'as', [sorted(cb.body[0].keys())]))

    def handler(msg):
        if msg.message_type != MessageType.METHOD_CALL or msg.interface != 'org.heraldlab.Peer':
            return None
        m = msg.member
        if m == 'Echo':
            return Message.new_method_return(msg, msg.signature, msg.body, msg.unix_fds)
        if m == 'Fixed':
            return Message.new_method_return(msg, FIXED_SIG, FIXED_BODY)
        if m == 'Fail':
            return Message.new_error(msg, 'org.heraldlab.Error.Boom', 'it failed')
        if m == 'Never':
            return True
        if m == 'Register':
            asyncio.ensure_future(register(msg))
            return True
        if m == 'Emit':
            path, iface, member, payload = msg.body
            bus.send(Message(message_type=MessageType.SIGNAL, path=path, interface=iface, member=member,
                             signature=payload.signature, body=[payload.value]))
            return Message.new_method_return(msg, '', [])
        return None

    bus.add_message_handler(handler)
    await bus.request_name('org.heraldlab.PyPeer')
    await bus.wait_for_disconnect()

try:
    asyncio.run(main())
except Exception:
    pass  # the test's bus went away
"""#
