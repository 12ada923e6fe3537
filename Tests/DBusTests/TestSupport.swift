// The independent Python dbus-fast peer of the binding tests.
import DBus
import DBusTestSupport
import Foundation

/// The independent peer: a Python dbus-fast service (see peerScript).
final class PythonPeer: @unchecked Sendable {
    static let name = "org.heraldlab.PyPeer"
    static let path = "/org/heraldlab/peer"
    static let interface = "org.heraldlab.Peer"
    let process: Process

    static var available: Bool { pythonHasModule("dbus_fast") }

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
