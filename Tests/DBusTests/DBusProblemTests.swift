// What a connection cannot do and has no caller to tell is reported (DBusConnection.onProblem),
// never dropped: a signal whose body cannot be read is not delivered with an empty argument list,
// and a signal its exported objects cannot emit is said. Neither failure is one a daemon provokes
// (libdbus validates every body, and the binding reads every D-Bus type), so the tests inject it.
@testable import DBus
import DBusTestSupport
import Foundation
import XCTest

final class DBusProblemTests: DBusTestCase, @unchecked Sendable {
    func testASignalWhoseBodyCannotBeReadIsReportedAndNotDeliveredEmpty() async throws {
        let problems = Locked<[DBusProblem]>([])
        await client.onProblem { p in problems.mutate { $0.append(p) } }
        await client.inject(DBusConnection.Faults(readingSignal: { $0 == "Garbled" ? DBusMarshalError.unsupportedType(109) : nil }))
        let stream = try await client.signals(matching: DBusMatchRule(interface: "org.heraldlab.P"))
        try await server.emitSignal(path: "/p", interface: "org.heraldlab.P", member: "Garbled", arguments: ["x", .uint32(1)])
        try await server.emitSignal(path: "/p", interface: "org.heraldlab.P", member: "Fine", arguments: ["y"])
        // Signals from one sender arrive in order: the first one delivered proves the other was read and refused.
        let s = try await next(stream, "the readable signal")
        XCTAssertEqual(s.member, "Fine", "the unreadable signal was not delivered, with no arguments or any")
        XCTAssertEqual(s.arguments, ["y"])
        XCTAssertEqual(problems.value, [.unreadableSignal(sender: server.uniqueName, path: "/p", interface: "org.heraldlab.P",
                                                          member: "Garbled", reason: "unsupported D-Bus type code 109")])
        let said = "\(problems.value.first!)"
        XCTAssertTrue(said.contains("org.heraldlab.P.Garbled") && said.contains("not delivered") && said.contains("type code 109"), said)
    }

    func testASignalAnExportedObjectCannotEmitIsReported() async throws {
        let problems = Locked<[DBusProblem]>([])
        await server.onProblem { p in problems.mutate { $0.append(p) } }
        let manager = try await client.signals(matching: DBusMatchRule(interface: DBusStandardInterface.objectManager, pathNamespace: "/app"))
        try await server.exportObjectManager(at: "/app")
        await server.inject(DBusConnection.Faults(buildingSignal: { $0 == "InterfacesAdded" ? DBusMarshalError.outOfMemory : nil }))
        try await server.export(path: "/app/ad0", interfaces: [DBusInterface("org.bluez.LEAdvertisement1", properties: ["Type": DBusProperty("peripheral")])])
        XCTAssertEqual(problems.value, [.signalNotEmitted(path: "/app", interface: DBusStandardInterface.objectManager,
                                                          member: "InterfacesAdded", reason: "libdbus out of memory")])
        // The object is exported all the same; the next signal goes out and is the first to arrive.
        await server.unexport(path: "/app/ad0")
        let s = try await next(manager, "InterfacesRemoved")
        XCTAssertEqual(s.member, "InterfacesRemoved")
        XCTAssertEqual(problems.value.count, 1)
    }
}
