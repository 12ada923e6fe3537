// DBus binding tests against a private dbus-daemon, with independent peers:
// busctl (sd-bus) and gdbus (GLib) call objects exported by our binding; a Python dbus-fast
// service is called by our binding. Every signature BlueZ uses is round-tripped both ways.
import DBus
import DBusTestSupport
import Foundation
import XCTest

/// The values of every signature BlueZ uses, identical to FIXED_BODY of the Python peer.
let everySignature: [DBusValue] = [
    .byte(200), .bool(true), .int16(-300), .uint16(60000), .int32(-70000), .uint32(4_000_000_000),
    .int64(-9_000_000_000_000), .uint64(18_000_000_000_000_000_000), .double(2.5),
    .string("h\u{e9}llo"), .objectPath("/org/heraldlab/x"), .signature("a{sv}"),
    .variant(.variant(.string("deep"))), .bytes([1, 2, 255]), .stringArray([]), .objectPathArray([]),
    .dictionary(keySignature: "s", valueSignature: "v", [
        DBusDictEntry("Transport", .variant("le")), DBusDictEntry("RSSI", .variant(.int16(-60))),
    ]),
    .manufacturerData([1521: [1, 2, 3, 4, 5, 6]]),
    .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", [
        DBusDictEntry(.objectPath("/org/bluez/hci0"), .dictionary(keySignature: "s", valueSignature: "a{sv}", [
            DBusDictEntry("org.bluez.Adapter1", .dictionary(keySignature: "s", valueSignature: "v", [
                DBusDictEntry("Powered", .variant(true)),
                DBusDictEntry("Roles", .variant(.stringArray(["central", "peripheral"]))),
            ])),
        ])),
    ]),
    .structure([.byte(7), "st", false]),
    .array(elementSignature: "ai", [.array(elementSignature: "i", [.int32(1), .int32(2)]),
                                    .array(elementSignature: "i", [])]),
]

/// What busctl prints for `everySignature`.
let everySignatureBusctl = #"ybnqiuxtdsogvayasaoa{sv}a{qv}a{oa{sa{sv}}}(ysb)aai 200 true -300 60000 -70000 4000000000 -9000000000000 18000000000000000000 2.5 "h\303\251llo" "/org/heraldlab/x" "a{sv}" v s "deep" 3 1 2 255 0 0 2 "Transport" s "le" "RSSI" n -60 1 1521 ay 6 1 2 3 4 5 6 1 "/org/bluez/hci0" 1 "org.bluez.Adapter1" 2 "Powered" b true "Roles" as 2 "central" "peripheral" 7 "st" false 2 2 1 2 0"#

/// busctl argument lists (signature then values) for Echo round trips, one per BlueZ signature.
let busctlEchoCases: [[String]] = [
    ["y", "7"], ["b", "false"], ["n", "-5"], ["q", "65535"], ["i", "-2147483648"], ["u", "4294967295"],
    ["x", "-9223372036854775808"], ["t", "18446744073709551615"], ["d", "-0.125"], ["s", "a 'q' \"z\""],
    ["o", "/"], ["g", "a{oa{sa{sv}}}"], ["v", "v", "v", "i", "3"], ["ay", "0"], ["ay", "3", "0", "128", "255"],
    ["as", "0"], ["ao", "0"], ["ao", "2", "/a", "/a/b"], ["a{sv}", "0"],
    ["a{sv}", "2", "Powered", "b", "true", "Name", "s", "x"],
    ["a{qv}", "1", "1521", "ay", "6", "1", "2", "3", "4", "5", "6"],
    ["a{oa{sa{sv}}}", "1", "/a", "1", "i.f", "1", "P", "ay", "1", "9"],
    ["(yb(ss))", "1", "true", "s", "t"], ["aay", "2", "1", "1", "0"],
    ["sa{sv}as", "org.bluez.Device1", "1", "RSSI", "n", "-70", "0"],
]

class DBusTestCase: XCTestCase, @unchecked Sendable {
    var bus: PrivateBus!
    var client: DBusConnection!
    var server: DBusConnection!
    var peer: PythonPeer?

    override func setUp() async throws {
        bus = try await PrivateBus.start()
        client = try await DBusConnection.connect(address: bus.address)
        server = try await DBusConnection.connect(address: bus.address)
    }

    override func tearDown() async throws {
        peer?.stop()
        await client?.close()
        await server?.close()
        bus?.stop()
    }

    func startPeer() async throws {
        guard PythonPeer.available else {
            throw XCTSkip("python3 -m pip install dbus-fast (the independent D-Bus peer) is not installed")
        }
        peer = try await PythonPeer.start(bus: bus, watcher: client)
    }

    func busctl(_ args: [String]) async throws -> ProcessResult {
        try await runProcess("/usr/bin/busctl", ["--address=\(bus.address)"] + args)
    }

    func busctlCall(_ dest: String, _ path: String, _ iface: String, _ member: String, _ args: [String] = []) async throws -> String {
        let r = try await busctl(["call", dest, path, iface, member, "--"] + args)
        XCTAssertEqual(r.status, 0, "busctl \(member) \(args): \(r.stderr)")
        return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func callPeer(_ member: String, _ args: [DBusValue] = [], timeout: Duration = .seconds(10)) async throws -> [DBusValue] {
        try await client.call(destination: PythonPeer.name, path: PythonPeer.path, interface: PythonPeer.interface,
                              member: member, arguments: args, timeout: timeout)
    }

    func next(_ stream: AsyncStream<DBusSignal>, _ what: String) async throws -> DBusSignal {
        try await withTimeout(15, what) {
            for await s in stream { return s }
            throw TestTimeout(what: "\(what): stream finished")
        }
    }

    /// An echo object exported by `server` at /org/heraldlab/test.
    func exportTestObject() async throws {
        let iface = DBusInterface("org.heraldlab.Test", methods: [
            "Echo": DBusMethod(in: nil, out: nil) { call in call.arguments },
            "Values": DBusMethod(in: "", out: dbusSignature(of: everySignature)) { _ in everySignature },
            "Fail": DBusMethod { _ in throw DBusMethodError("org.heraldlab.Error.Nope", "refused politely") },
            "Crash": DBusMethod { _ in throw CocoaError(.fileNoSuchFile) },
            "Add": DBusMethod(in: "ii", out: "i", inNames: ["a", "b"], outNames: ["sum"]) { call in
                [.int32(Int32(call.arguments[0].intValue! + call.arguments[1].intValue!))]
            },
        ], properties: [
            "Name": DBusProperty("herald"),
            "Level": DBusProperty(.int16(-60), access: .readwrite),
            "Uuids": DBusProperty(.stringArray([])),
            "Data": DBusProperty(.manufacturerData([1521: [9, 8, 7]])),
        ], signals: ["Tick": "u"])
        try await server.export(path: "/org/heraldlab/test", interfaces: [iface])
    }
}

final class DBusValueTests: XCTestCase {
    func testSignatures() {
        XCTAssertEqual(dbusSignature(of: everySignature), "ybnqiuxtdsogvayasaoa{sv}a{qv}a{oa{sa{sv}}}(ysb)aai")
        XCTAssertEqual(DBusValue.stringArray([]).signature, "as")
        XCTAssertEqual(DBusValue.variantDictionary([:]).signature, "a{sv}")
        XCTAssertEqual(DBusSignature.split("a{oa{sa{sv}}}(ysb)vas"), ["a{oa{sa{sv}}}", "(ysb)", "v", "as"])
        XCTAssertNil(DBusSignature.split("a{vs}"))
        XCTAssertNil(DBusSignature.split("()"))
        XCTAssertNil(DBusSignature.split("a"))
    }

    func testAccessors() {
        let dict = DBusValue.variantDictionary(["RSSI": .int16(-60), "Name": "x", "UUIDs": .stringArray(["fcf6"])])
        XCTAssertEqual(dict["RSSI"]?.intValue, -60)
        XCTAssertEqual(dict["Name"]?.stringValue, "x")
        XCTAssertEqual(dict["UUIDs"]?.stringArrayValue, ["fcf6"])
        XCTAssertEqual(dict.stringKeyedDictionary?.keys.sorted(), ["Name", "RSSI", "UUIDs"])
        let md = DBusValue.manufacturerData([1521: [1, 2]])
        XCTAssertEqual(md.dictionaryEntries?.first?.key, .uint16(1521))
        XCTAssertEqual(md.dictionaryEntries?.first?.value.bytesValue, [1, 2])
        XCTAssertEqual(DBusValue.variant(.variant(true)).boolValue, true)
        XCTAssertEqual(DBusValue.structure([.byte(1), "a"]).structFields?.count, 2)
        XCTAssertEqual(DBusValue.array(elementSignature: "y", [.byte(3)]).bytesValue, [3])
    }
}

final class DBusConnectionTests: DBusTestCase, @unchecked Sendable {
    func testConnectHonoursSystemBusAddress() async throws {
        setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address, 1)
        defer { unsetenv("DBUS_SYSTEM_BUS_ADDRESS") }
        XCTAssertEqual(DBusConnection.systemBusAddress, bus.address)
        let c = try await DBusConnection.connect()
        XCTAssertTrue(c.uniqueName.hasPrefix(":"))
        XCTAssertNotEqual(c.uniqueName, client.uniqueName)
        let owner = try await c.nameOwner(c.uniqueName)
        XCTAssertEqual(owner, c.uniqueName)
        await c.close()
    }

    func testConnectFailureIsAnError() async throws {
        do {
            _ = try await DBusConnection.connect(address: "unix:path=\(bus.directory.path)/nothing.sock")
            XCTFail("connected to nothing")
        } catch DBusConnectionError.connectFailed(let name, _) {
            XCTAssertTrue(name.hasPrefix("org.freedesktop.DBus.Error."), name)
        }
    }

    // Our exported object, called by busctl (sd-bus): our writer and reader against another implementation.
    func testExportedValuesReadByBusctl() async throws {
        try await exportTestObject()
        let out = try await busctlCall(server.uniqueName, "/org/heraldlab/test", "org.heraldlab.Test", "Values")
        XCTAssertEqual(out, everySignatureBusctl)
    }

    func testBusctlEchoThroughOurObjectEverySignature() async throws {
        try await exportTestObject()
        for args in busctlEchoCases {
            let out = try await busctlCall(server.uniqueName, "/org/heraldlab/test", "org.heraldlab.Test", "Echo", args)
            // busctl parsed and marshalled the arguments, our object read and wrote them back, busctl
            // unmarshalled and printed the reply: it must print its own canonical form of the input.
            XCTAssertEqual(out, Self.canonical(args), "\(args)")
        }
    }

    /// busctl's canonical output for an argument list: strings, paths and signatures quoted.
    static func canonical(_ args: [String]) -> String {
        var i = 1
        var out: [String] = [args[0]]
        func typeLength(_ t: Substring) -> Int {
            var n = 0
            var idx = t.startIndex
            while t[idx] == "a" { idx = t.index(after: idx); n += 1 }
            guard t[idx] == "(" || t[idx] == "{" else { return n + 1 }
            var depth = 0
            for ch in t[idx...] {
                n += 1
                if ch == "(" || ch == "{" { depth += 1 }
                if ch == ")" || ch == "}" { depth -= 1; if depth == 0 { break } }
            }
            return n
        }
        func emitAll(_ types: Substring) {
            var rest = types
            while !rest.isEmpty {
                let l = typeLength(rest)
                emit(rest.prefix(l))
                rest = rest.dropFirst(l)
            }
        }
        func emit(_ type: Substring) {
            switch type.first! {
            case "s", "o", "g":
                let s = args[i]; i += 1
                out.append("\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                           .replacingOccurrences(of: "'", with: "\\'") + "\"")
            case "v":
                let sig = args[i]; i += 1
                out.append(sig)
                emitAll(Substring(sig))
            case "a":
                let n = Int(args[i])!; i += 1
                out.append(String(n))
                for _ in 0..<n { emit(type.dropFirst()) }
            case "{", "(":
                emitAll(type.dropFirst().dropLast())
            default:
                out.append(args[i]); i += 1
            }
        }
        emitAll(Substring(args[0]))
        return out.joined(separator: " ")
    }

    // gdbus (GLib) reads our values too.
    func testExportedValuesReadByGdbus() async throws {
        try await exportTestObject()
        let r = try await runProcess("/usr/bin/gdbus", ["call", "--address", bus.address, "--dest", server.uniqueName,
                                                        "--object-path", "/org/heraldlab/test",
                                                        "--method", "org.heraldlab.Test.Values"])
        XCTAssertEqual(r.status, 0, r.stderr)
        XCTAssertEqual(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines), #"(byte 0xc8, true, int16 -300, uint16 60000, -70000, uint32 4000000000, int64 -9000000000000, uint64 18000000000000000000, 2.5, 'héllo', objectpath '/org/heraldlab/x', signature 'a{sv}', <<'deep'>>, [byte 0x01, 0x02, 0xff], @as [], @ao [], {'Transport': <'le'>, 'RSSI': <int16 -60>}, {uint16 1521: <[byte 0x01, 0x02, 0x03, 0x04, 0x05, 0x06]>}, {objectpath '/org/bluez/hci0': {'org.bluez.Adapter1': {'Powered': <true>, 'Roles': <['central', 'peripheral']>}}}, (byte 0x07, 'st', false), [[1, 2], []])"#)
        let add = try await runProcess("/usr/bin/gdbus", ["call", "--address", bus.address, "--dest", server.uniqueName,
                                                          "--object-path", "/org/heraldlab/test",
                                                          "--method", "org.heraldlab.Test.Add", "40", "2"])
        XCTAssertEqual(add.stdout.trimmingCharacters(in: .whitespacesAndNewlines), "(42,)", add.stderr)
    }

    // Our client calling the independent Python peer.
    func testPeerValuesReadByOurClient() async throws {
        try await startPeer()
        let values = try await callPeer("Fixed")
        XCTAssertEqual(values, everySignature)
        XCTAssertEqual(values[18]["/org/bluez/hci0"]?["org.bluez.Adapter1"]?["Roles"]?.stringArrayValue,
                       ["central", "peripheral"])
    }

    func testEchoEverySignatureThroughPeer() async throws {
        try await startPeer()
        for value in everySignature {
            let echoed = try await callPeer("Echo", [value])
            XCTAssertEqual(echoed, [value], value.signature)
        }
        let all = try await callPeer("Echo", everySignature)
        XCTAssertEqual(all, everySignature)
        let extra: [DBusValue] = [
            .int16(.min), .uint16(.max), .int32(.min), .uint32(.max), .int64(.min), .uint64(.max), .double(-0.0),
            .string(""), .objectPath("/"), .signature(""), .bytes([]), .array(elementSignature: "y", [.byte(1)]),
            .variant(.bytes([0, 1])), .variantDictionary([:]), .manufacturerData([:]),
            .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", []),
            .dictionary(keySignature: "u", valueSignature: "s", [DBusDictEntry(.uint32(1), "one")]),
            .array(elementSignature: "(oa{sv})", [.structure([.objectPath("/a"), .variantDictionary(["k": .uint64(1)])])]),
            .array(elementSignature: "v", [.variant(.int32(1)), .variant("two")]),
        ]
        let echoed = try await callPeer("Echo", extra)
        // An `ay` always comes back as the `.bytes` fast path.
        var expected = extra
        expected[11] = .bytes([1])
        XCTAssertEqual(echoed, expected)
        XCTAssertEqual(echoed[6], .double(-0.0))
        XCTAssertEqual(echoed[6].doubleValue?.sign, .minus)
    }

    func testUnixFileDescriptorThroughPeer() async throws {
        try await startPeer()
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(pipe(&fds), 0)
        defer { close(fds[0]); close(fds[1]) }
        let echoed = try await callPeer("Echo", [.unixFD(fds[1])])
        guard case .unixFD(let received)? = echoed.first else { return XCTFail("no fd: \(echoed)") }
        XCTAssertNotEqual(received, fds[1])
        var byte: UInt8 = 42
        XCTAssertEqual(write(received, &byte, 1), 1)
        close(received)
        var got: UInt8 = 0
        XCTAssertEqual(read(fds[0], &got, 1), 1)
        XCTAssertEqual(got, 42)
    }

    func testManyConcurrentCalls() async throws {
        try await exportTestObject()
        let server = self.server!
        let client = self.client!
        try await withThrowingTaskGroup(of: Void.self) { group in
            // dbus-daemon allows 128 pending replies per connection by default.
            for n in 0..<100 {
                group.addTask {
                    let out = try await client.call(destination: server.uniqueName, path: "/org/heraldlab/test",
                                                    interface: "org.heraldlab.Test", member: "Add",
                                                    arguments: [.int32(Int32(n)), .int32(1)], timeout: .seconds(20))
                    XCTAssertEqual(out, [.int32(Int32(n + 1))])
                }
            }
            try await group.waitForAll()
        }
    }

    func testMethodErrors() async throws {
        try await exportTestObject()
        let dest = server.uniqueName
        // A DBusMethodError thrown by our handler reaches busctl with its name and message.
        let r = try await busctl(["call", dest, "/org/heraldlab/test", "org.heraldlab.Test", "Fail"])
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("refused politely"), r.stderr)
        // ... and our client with both.
        do {
            _ = try await client.call(destination: dest, path: "/org/heraldlab/test", interface: "org.heraldlab.Test", member: "Fail")
            XCTFail("no error")
        } catch let e as DBusMethodError {
            XCTAssertEqual(e, DBusMethodError("org.heraldlab.Error.Nope", "refused politely"))
        }
        // Other Swift errors become org.freedesktop.DBus.Error.Failed.
        await assertError(DBusMethodError.failedName) {
            try await self.client.call(destination: dest, path: "/org/heraldlab/test", interface: "org.heraldlab.Test", member: "Crash")
        }
        // Unknown methods, unknown objects: libdbus answers UnknownMethod (NOT_YET_HANDLED).
        await assertError(DBusMethodError.unknownMethodName) {
            try await self.client.call(destination: dest, path: "/org/heraldlab/test", interface: "org.heraldlab.Test", member: "Nope")
        }
        await assertError(DBusMethodError.unknownMethodName) {
            try await self.client.call(destination: dest, path: "/elsewhere", interface: "org.heraldlab.Test", member: "Echo")
        }
        // Wrong argument types are refused before the handler runs.
        await assertError(DBusMethodError.invalidArgsName) {
            try await self.client.call(destination: dest, path: "/org/heraldlab/test", interface: "org.heraldlab.Test",
                                       member: "Add", arguments: ["1", "2"])
        }
        // The Python peer's error reply.
        try await startPeer()
        do {
            _ = try await callPeer("Fail")
            XCTFail("no error")
        } catch let e as DBusMethodError {
            XCTAssertEqual(e.name, "org.heraldlab.Error.Boom")
            XCTAssertEqual(e.message, "it failed")
        }
        // Calls to nobody.
        await assertError("org.freedesktop.DBus.Error.ServiceUnknown") {
            try await self.client.call(destination: "org.heraldlab.Nobody", path: "/", interface: nil, member: "X")
        }
    }

    func assertError(_ name: String, _ body: @escaping @Sendable () async throws -> [DBusValue],
                     file: StaticString = #filePath, line: UInt = #line) async {
        do {
            let out = try await body()
            XCTFail("expected \(name), got \(out)", file: file, line: line)
        } catch let e as DBusMethodError {
            XCTAssertEqual(e.name, name, e.message, file: file, line: line)
        } catch {
            XCTFail("expected \(name), got \(error)", file: file, line: line)
        }
    }

    func testInvalidValuesAreErrorsNotAborts() async throws {
        let bad: [[DBusValue]] = [
            [.array(elementSignature: "s", [.int32(1)])],
            [.objectPath("not/a/path")],
            [.objectPath("/trailing/")],
            [.signature("a{")],
            [.string("nul\0inside")],
            [.structure([])],
            [.dictionary(keySignature: "v", valueSignature: "s", [])],
            [.dictionary(keySignature: "s", valueSignature: "v", [DBusDictEntry("k", "not a variant")])],
        ]
        for args in bad {
            do {
                _ = try await client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                          interface: "org.freedesktop.DBus", member: "GetId", arguments: args)
                XCTFail("accepted \(args)")
            } catch is DBusMarshalError {
            }
        }
        do {
            _ = try await client.call(destination: nil, path: "bad", interface: nil, member: "X")
            XCTFail("accepted bad path")
        } catch DBusConnectionError.invalidArgument {
        }
        // Still alive afterwards.
        let id = try await client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                       interface: "org.freedesktop.DBus", member: "GetId")
        XCTAssertEqual(id.first?.stringValue?.count, 32)
    }

    func testCallTimeoutIsTypedAndConnectionSurvives() async throws {
        try await startPeer()
        let start = ContinuousClock.now
        do {
            _ = try await callPeer("Never", timeout: .milliseconds(300))
            XCTFail("no timeout")
        } catch DBusConnectionError.timeout {
        }
        XCTAssertGreaterThanOrEqual(ContinuousClock.now - start, .milliseconds(300))
        // Our own handler that never answers in time.
        let gate = AsyncStream<Void>.makeStream()
        try await server.export(path: "/slow", interfaces: [DBusInterface("org.heraldlab.Slow", methods: [
            "Wait": DBusMethod { _ in for await _ in gate.stream { break }; return [] },
        ])])
        do {
            _ = try await client.call(destination: server.uniqueName, path: "/slow", interface: "org.heraldlab.Slow",
                                      member: "Wait", timeout: .milliseconds(200))
            XCTFail("no timeout")
        } catch DBusConnectionError.timeout {
        }
        gate.continuation.finish()   // the late reply is dropped by libdbus (cancelled pending call)
        let out = try await callPeer("Echo", ["still here"])
        XCTAssertEqual(out, ["still here"])
    }

    func testCancellationEndsPendingCall() async throws {
        try await startPeer()
        let client = self.client!
        let task = Task {
            try await client.call(destination: PythonPeer.name, path: PythonPeer.path, interface: PythonPeer.interface,
                                  member: "Never", timeout: .seconds(60))
        }
        task.cancel()
        do {
            _ = try await withTimeout(10, "cancel") { try await task.value }
            XCTFail("not cancelled")
        } catch is CancellationError {
        }
    }

    // The bluetoothd pattern: the callee calls back into the caller before it replies.
    func testPeerCallsBackBeforeReplying() async throws {
        try await startPeer()
        try await client.exportObjectManager(at: "/app")
        try await client.export(path: "/app/service0", interfaces: [DBusInterface("org.bluez.GattService1", properties: [
            "UUID": DBusProperty("0000fcf6-0000-1000-8000-00805f9b34fb"), "Primary": DBusProperty(true),
        ])])
        try await client.export(path: "/app/service0/char0", interfaces: [DBusInterface("org.bluez.GattCharacteristic1", properties: [
            "UUID": DBusProperty("3e98c0f8-8f05-4829-a121-43e38f8933e7"), "Service": DBusProperty(.objectPath("/app/service0")),
            "Flags": DBusProperty(.stringArray(["read"])),
        ])])
        let out = try await callPeer("Register", [.objectPath("/app")])
        XCTAssertEqual(out, [.stringArray(["/app/service0", "/app/service0/char0"])])
    }

    func testOurHandlerCallsBackTheCallerBeforeReplying() async throws {
        let client = self.client!
        let server = self.server!
        try await client.export(path: "/app", interfaces: [DBusInterface("org.heraldlab.App", methods: [
            "Secret": DBusMethod(in: "", out: "s") { _ in ["s3cret"] },
        ])])
        try await server.export(path: "/manager", interfaces: [DBusInterface("org.heraldlab.Manager", methods: [
            "Register": DBusMethod(in: "o", out: "s") { call in
                let back = try await server.call(destination: call.sender, path: call.arguments[0].stringValue!,
                                                 interface: "org.heraldlab.App", member: "Secret", timeout: .seconds(10))
                return [.string("registered with " + back[0].stringValue!)]
            },
        ])])
        let out = try await client.call(destination: server.uniqueName, path: "/manager", interface: "org.heraldlab.Manager",
                                        member: "Register", arguments: [.objectPath("/app")], timeout: .seconds(10))
        XCTAssertEqual(out, ["registered with s3cret"])
    }

    func testSignalsWithMatchRules() async throws {
        try await startPeer()
        let ping = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.Sig", member: "Ping"))
        let underA = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.Sig", pathNamespace: "/a"))
        let arg0 = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.Sig", args: [0: "hit"]))
        let arg0path = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.Sig", argPaths: [0: "/org/bluez/"]))
        func emit(_ path: String, _ member: String, _ payload: DBusValue) async throws {
            _ = try await callPeer("Emit", [.string(path), .string("org.heraldlab.Sig"), .string(member), .variant(payload)])
        }
        // Signals from one sender arrive in order: each stream's first signal proves the earlier ones were filtered.
        try await emit("/b", "Pong", "miss")
        try await emit("/ab", "Pong", .objectPath("/org/bluez"))
        try await emit("/a/x", "Pong", .objectPath("/org/bluez/hci0"))
        try await emit("/b", "Ping", "hit")
        let p = try await next(ping, "ping")
        XCTAssertEqual(p.member, "Ping")
        XCTAssertEqual(p.path, "/b")
        XCTAssertEqual(p.arguments, ["hit"])
        let peerOwner = try await client.nameOwner(PythonPeer.name)
        XCTAssertEqual(p.sender, peerOwner)
        let a = try await next(underA, "path_namespace")
        XCTAssertEqual(a.path, "/a/x")
        let h = try await next(arg0, "arg0")
        XCTAssertEqual(h.member, "Ping")
        let ap = try await next(arg0path, "arg0path")
        XCTAssertEqual(ap.path, "/a/x")
        XCTAssertEqual(ap.arguments, [.objectPath("/org/bluez/hci0")])
        // Every signature survives a signal too.
        let all = try await client.signals(matching: DBusMatchRule(member: "All"))
        try await emit("/all", "All", .structure(everySignature))
        let s = try await next(all, "all")
        XCTAssertEqual(s.arguments, [.structure(everySignature)])
    }

    func testAddAndRemoveMatch() async throws {
        let rule = DBusMatchRule(sender: server.uniqueName, interface: "org.heraldlab.X", member: "Y", path: "/p",
                                 args: [0: "it's"])
        XCTAssertEqual(rule.ruleString, "type='signal',sender='\(server.uniqueName)',interface='org.heraldlab.X',member='Y',path='/p',arg0='it'\\''s'")
        try await client.addMatch(rule)
        try await client.removeMatch(rule)
        await assertError("org.freedesktop.DBus.Error.MatchRuleNotFound") {
            try await self.client.removeMatch(rule)
            return []
        }
        // Our own signals between our own connections, with a quoted argument in the rule.
        let stream = try await client.signals(matching: rule)
        try await server.emitSignal(path: "/p", interface: "org.heraldlab.X", member: "Y", arguments: ["nope"])
        try await server.emitSignal(path: "/p", interface: "org.heraldlab.X", member: "Y", arguments: ["it's", .uint32(5)])
        let s = try await next(stream, "quoted arg0")
        XCTAssertEqual(s.arguments, ["it's", .uint32(5)])
        XCTAssertEqual(s.sender, server.uniqueName)
    }

    func testWellKnownSenderFollowsTheNameOwner() async throws {
        let third = try await DBusConnection.connect(address: bus.address)
        defer { Task { await third.close() } }
        _ = try await server.requestName("org.heraldlab.Src", flags: [.allowReplacement])
        // A broad subscription makes every org.heraldlab.W signal reach this connection, so the
        // sender-restricted stream must filter locally.
        let broad = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.W"))
        let fromName = try await client.signals(matching: DBusMatchRule(sender: "org.heraldlab.Src", interface: "org.heraldlab.W"))
        try await third.emitSignal(path: "/", interface: "org.heraldlab.W", member: "Impostor")
        try await server.emitSignal(path: "/", interface: "org.heraldlab.W", member: "Owner")
        let b = try await next(broad, "broad")
        XCTAssertEqual(b.member, "Impostor")
        let s1 = try await next(fromName, "from owner")
        XCTAssertEqual(s1.member, "Owner")
        XCTAssertEqual(s1.sender, server.uniqueName)
        // The name moves to `third`: its signals now match, the old owner's do not.
        let moved = try await third.requestName("org.heraldlab.Src", flags: [.replaceExisting])
        XCTAssertEqual(moved, .primaryOwner)
        try await server.emitSignal(path: "/", interface: "org.heraldlab.W", member: "FormerOwner")
        try await third.emitSignal(path: "/", interface: "org.heraldlab.W", member: "NewOwner")
        let s2 = try await next(fromName, "from new owner")
        XCTAssertEqual(s2.member, "NewOwner")
        XCTAssertEqual(s2.sender, third.uniqueName)
    }

    func testPropertiesGetGetAllSetAndChanged() async throws {
        try await exportTestObject()
        let dest = server.uniqueName
        let path = "/org/heraldlab/test"
        let changes = try await client.signals(matching: DBusMatchRule(
            interface: DBusStandardInterface.properties, member: "PropertiesChanged", pathNamespace: "/org/heraldlab"))
        // busctl get-property / GetAll / set-property
        let name = try await busctl(["get-property", dest, path, "org.heraldlab.Test", "Name"])
        XCTAssertEqual(name.stdout.trimmingCharacters(in: .whitespacesAndNewlines), #"s "herald""#)
        let uuids = try await busctl(["get-property", dest, path, "org.heraldlab.Test", "Uuids"])
        XCTAssertEqual(uuids.stdout.trimmingCharacters(in: .whitespacesAndNewlines), "as 0")
        let all = try await busctlCall(dest, path, DBusStandardInterface.properties, "GetAll", ["s", "org.heraldlab.Test"])
        XCTAssertEqual(all, #"a{sv} 4 "Data" a{qv} 1 1521 ay 3 9 8 7 "Level" n -60 "Name" s "herald" "Uuids" as 0"#)
        let set = try await busctl(["set-property", dest, path, "org.heraldlab.Test", "Level", "--", "n", "-42"])
        XCTAssertEqual(set.status, 0, set.stderr)
        let c1 = try await next(changes, "PropertiesChanged after Set")
        XCTAssertEqual(c1.path, path)
        XCTAssertEqual(c1.arguments, ["org.heraldlab.Test", .variantDictionary(["Level": .int16(-42)]), .stringArray([])])
        let level = await server.property(path: path, interface: "org.heraldlab.Test", name: "Level")
        XCTAssertEqual(level, .int16(-42))
        // Our client's Get/GetAll.
        let got = try await client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                        member: "Get", arguments: ["org.heraldlab.Test", "Level"])
        XCTAssertEqual(got, [.variant(.int16(-42))])
        let gotAll = try await client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                           member: "GetAll", arguments: ["org.heraldlab.Test"])
        XCTAssertEqual(gotAll.first?["Data"], .variant(.manufacturerData([1521: [9, 8, 7]])))
        // Read-only, unknown, wrong type.
        let ro = try await busctl(["set-property", dest, path, "org.heraldlab.Test", "Name", "s", "x"])
        XCTAssertNotEqual(ro.status, 0)
        await assertError(DBusMethodError.propertyReadOnlyName) {
            try await self.client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                       member: "Set", arguments: ["org.heraldlab.Test", "Name", .variant("x")])
        }
        await assertError(DBusMethodError.unknownPropertyName) {
            try await self.client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                       member: "Get", arguments: ["org.heraldlab.Test", "Nope"])
        }
        await assertError(DBusMethodError.unknownInterfaceName) {
            try await self.client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                       member: "GetAll", arguments: ["org.heraldlab.Nope"])
        }
        await assertError(DBusMethodError.invalidArgsName) {
            try await self.client.call(destination: dest, path: path, interface: DBusStandardInterface.properties,
                                       member: "Set", arguments: ["org.heraldlab.Test", "Level", .variant("loud")])
        }
        // App-side update emits PropertiesChanged.
        try await server.setProperty(path: path, interface: "org.heraldlab.Test", name: "Uuids",
                                     value: .stringArray(["fcf6"]))
        let c2 = try await next(changes, "PropertiesChanged after setProperty")
        XCTAssertEqual(c2.arguments[1], .variantDictionary(["Uuids": .stringArray(["fcf6"])]))
    }

    func testPropertySetterCanRefuse() async throws {
        try await server.export(path: "/o", interfaces: [DBusInterface("org.heraldlab.P", properties: [
            "Mode": DBusProperty("a", access: .readwrite) { value in
                if value == "forbidden" { throw DBusMethodError("org.bluez.Error.NotPermitted", "no") }
            },
        ])])
        await assertError("org.bluez.Error.NotPermitted") {
            try await self.client.call(destination: self.server.uniqueName, path: "/o", interface: DBusStandardInterface.properties,
                                       member: "Set", arguments: ["org.heraldlab.P", "Mode", .variant("forbidden")])
        }
        _ = try await client.call(destination: server.uniqueName, path: "/o", interface: DBusStandardInterface.properties,
                                  member: "Set", arguments: ["org.heraldlab.P", "Mode", .variant("b")])
        let mode = await server.property(path: "/o", interface: "org.heraldlab.P", name: "Mode")
        XCTAssertEqual(mode, "b")
    }

    func testObjectManager() async throws {
        let dest = server.uniqueName
        let added = try await client.signals(matching: DBusMatchRule(
            interface: DBusStandardInterface.objectManager, member: "InterfacesAdded", argPaths: [0: "/app/"]))
        let removed = try await client.signals(matching: DBusMatchRule(
            interface: DBusStandardInterface.objectManager, member: "InterfacesRemoved", argPaths: [0: "/app/"]))
        try await server.exportObjectManager(at: "/app")
        let empty = try await client.call(destination: dest, path: "/app", interface: DBusStandardInterface.objectManager,
                                          member: "GetManagedObjects")
        XCTAssertEqual(empty, [.dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", [])])
        try await server.export(path: "/app/ad0", interfaces: [DBusInterface("org.bluez.LEAdvertisement1", properties: [
            "Type": DBusProperty("peripheral"),
            "ServiceUUIDs": DBusProperty(.stringArray(["fcf6"])),
            "ManufacturerData": DBusProperty(.manufacturerData([1521: [1, 2, 3, 4, 5, 6]])),
            "Includes": DBusProperty(.stringArray([])),
        ])])
        let a = try await next(added, "InterfacesAdded")
        XCTAssertEqual(a.path, "/app")
        XCTAssertEqual(a.arguments.first, .objectPath("/app/ad0"))
        XCTAssertEqual(a.arguments.last?["org.bluez.LEAdvertisement1"]?["Type"], .variant("peripheral"))
        try await server.export(path: "/app/service0/char0001", interfaces: [DBusInterface("org.bluez.GattCharacteristic1", properties: [
            "Flags": DBusProperty(.stringArray(["read", "write"])),
        ])])
        _ = try await next(added, "InterfacesAdded 2")
        let objects = try await busctlCall(dest, "/app", DBusStandardInterface.objectManager, "GetManagedObjects")
        XCTAssertEqual(objects, #"a{oa{sa{sv}}} 2 "/app/ad0" 1 "org.bluez.LEAdvertisement1" 4 "Includes" as 0 "ManufacturerData" a{qv} 1 1521 ay 6 1 2 3 4 5 6 "ServiceUUIDs" as 1 "fcf6" "Type" s "peripheral" "/app/service0/char0001" 1 "org.bluez.GattCharacteristic1" 1 "Flags" as 2 "read" "write""#)
        await server.unexport(path: "/app/ad0")
        let r = try await next(removed, "InterfacesRemoved")
        XCTAssertEqual(r.arguments, [.objectPath("/app/ad0"), .stringArray(["org.bluez.LEAdvertisement1"])])
        let after = try await client.call(destination: dest, path: "/app", interface: DBusStandardInterface.objectManager,
                                          member: "GetManagedObjects")
        XCTAssertEqual(after.first?.dictionaryEntries?.map(\.key), [.objectPath("/app/service0/char0001")])
    }

    func testIntrospectionParsedByGdbusAndBusctl() async throws {
        try await exportTestObject()
        try await server.exportObjectManager(at: "/org/heraldlab")
        let dest = server.uniqueName
        let r = try await runProcess("/usr/bin/gdbus", ["introspect", "--address", bus.address, "--dest", dest,
                                                        "--object-path", "/org/heraldlab/test"])
        XCTAssertEqual(r.status, 0, r.stderr)
        for needle in ["interface org.heraldlab.Test {", "Add(in  i a,", "in  i b,", "out i sum);", "Echo();",
                       "readonly s Name = 'herald';", "readwrite n Level = -60;", "readonly as Uuids = [];",
                       "Tick(u arg0);", "interface org.freedesktop.DBus.Properties {"] {
            XCTAssertTrue(r.stdout.contains(needle), "missing \(needle) in\n\(r.stdout)")
        }
        // Intermediate paths list their children; busctl walks the tree.
        let tree = try await busctl(["tree", dest])
        XCTAssertEqual(tree.status, 0, tree.stderr)
        XCTAssertTrue(tree.stdout.contains("/org/heraldlab/test"), tree.stdout)
        let root = try await client.call(destination: dest, path: "/", interface: DBusStandardInterface.introspectable,
                                         member: "Introspect")
        XCTAssertTrue(root.first?.stringValue?.contains(#"<node name="org"/>"#) ?? false)
        let manager = try await client.call(destination: dest, path: "/org/heraldlab", interface: DBusStandardInterface.introspectable,
                                            member: "Introspect")
        XCTAssertTrue(manager.first?.stringValue?.contains("org.freedesktop.DBus.ObjectManager") ?? false)
        XCTAssertTrue(manager.first?.stringValue?.contains(#"<node name="test"/>"#) ?? false)
    }

    func testPeerPingNoReplySendAndPartialUnexport() async throws {
        let dest = server.uniqueName
        // org.freedesktop.DBus.Peer is answered by libdbus itself.
        let ping = try await runProcess("/usr/bin/gdbus", ["call", "--address", bus.address, "--dest", dest,
                                                           "--object-path", "/", "--method", "org.freedesktop.DBus.Peer.Ping"])
        XCTAssertEqual(ping.status, 0, ping.stderr)
        // A no-reply-expected call runs its handler and gets no reply.
        let received = AsyncStream<DBusValue>.makeStream()
        try await server.export(path: "/n", interfaces: [
            DBusInterface("org.heraldlab.A", methods: ["Note": DBusMethod(in: "s", out: "") { call in
                received.continuation.yield(call.arguments[0])
                return []
            }]),
            DBusInterface("org.heraldlab.B", properties: ["X": DBusProperty(.byte(1))]),
        ])
        try await client.send(destination: dest, path: "/n", interface: "org.heraldlab.A", member: "Note", arguments: ["hi"])
        let note: DBusValue = try await withTimeout(10, "no-reply call") {
            for await v in received.stream { return v }
            throw TestTimeout(what: "stream ended")
        }
        XCTAssertEqual(note, "hi")
        // Removing one interface keeps the other.
        await server.unexport(path: "/n", interfaces: ["org.heraldlab.A"])
        await assertError(DBusMethodError.unknownMethodName) {
            try await self.client.call(destination: dest, path: "/n", interface: "org.heraldlab.A", member: "Note", arguments: ["x"])
        }
        let x = try await client.call(destination: dest, path: "/n", interface: DBusStandardInterface.properties,
                                      member: "Get", arguments: ["org.heraldlab.B", "X"])
        XCTAssertEqual(x, [.variant(.byte(1))])
    }

    func testRequestName() async throws {
        let first = try await server.requestName("org.heraldlab.Test")
        XCTAssertEqual(first, .primaryOwner)
        let again = try await server.requestName("org.heraldlab.Test")
        XCTAssertEqual(again, .alreadyOwner)
        let other = try await client.requestName("org.heraldlab.Test")
        XCTAssertEqual(other, .exists)
        let owner = try await client.nameOwner("org.heraldlab.Test")
        XCTAssertEqual(owner, server.uniqueName)
        let nobody = try await client.nameOwner("org.heraldlab.Nobody")
        XCTAssertNil(nobody)
        try await exportTestObject()
        let out = try await client.call(destination: "org.heraldlab.Test", path: "/org/heraldlab/test",
                                        interface: "org.heraldlab.Test", member: "Add", arguments: [.int32(1), .int32(2)])
        XCTAssertEqual(out, [.int32(3)])
        let released = try await server.releaseName("org.heraldlab.Test")
        XCTAssertEqual(released, 1)
    }

    func testCloseFlushesQueuedMessagesAndFailsPendingCalls() async throws {
        let stream = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.Bye"))
        // Emitted and immediately closed: the flush delivers it.
        try await server.emitSignal(path: "/", interface: "org.heraldlab.Bye", member: "Last", arguments: [.uint32(1)])
        await server.close()
        let s = try await next(stream, "signal sent before close")
        XCTAssertEqual(s.member, "Last")
        let closedServer = server!
        do {
            _ = try await closedServer.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                            interface: "org.freedesktop.DBus", member: "GetId")
            XCTFail("call on closed connection")
        } catch DBusConnectionError.disconnected {
        }
        // A pending call fails with .disconnected when its connection closes; streams finish.
        let started = AsyncStream<Void>.makeStream()
        let gate = AsyncStream<Void>.makeStream()
        defer { gate.continuation.finish() }
        try await client.export(path: "/hang", interfaces: [DBusInterface("org.heraldlab.Hang", methods: [
            "Forever": DBusMethod { _ in
                started.continuation.yield()
                for await _ in gate.stream {}
                return []
            },
        ])])
        let third = try await DBusConnection.connect(address: bus.address)
        let clientName = client.uniqueName
        let call = Task {
            try await third.call(destination: clientName, path: "/hang", interface: "org.heraldlab.Hang",
                                 member: "Forever", timeout: .seconds(60))
        }
        let thirdStream = try await third.signals(matching: DBusMatchRule(member: "Nothing"))
        try await withTimeout(10, "handler started") { for await _ in started.stream { return } }
        await third.close()
        do {
            _ = try await withTimeout(10, "pending call on close") { try await call.value }
            XCTFail("no error")
        } catch DBusConnectionError.disconnected {
        }
        let ended: Bool = try await withTimeout(10, "stream finish") {
            for await _ in thirdStream {}
            return true
        }
        XCTAssertTrue(ended)
        let stillConnected = await third.isConnected
        XCTAssertFalse(stillConnected)
    }

    func testBusDisappearingFailsCallsAndFinishesStreams() async throws {
        let stream = try await client.signals(matching: DBusMatchRule(member: "Never"))
        bus.stop()
        let ended: Bool = try await withTimeout(10, "stream finish on disconnect") {
            for await _ in stream {}
            return true
        }
        XCTAssertTrue(ended)
        let connected = await client.isConnected
        XCTAssertFalse(connected)
        do {
            _ = try await client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                      interface: "org.freedesktop.DBus", member: "GetId")
            XCTFail("call after disconnect")
        } catch DBusConnectionError.disconnected {
        }
    }
}
