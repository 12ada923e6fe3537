// DBusConnection: a private libdbus connection driven by Dispatch, with async/await calls.
//
// Threading invariant (why the unchecked Sendable conformance is sound): every libdbus call and every access
// to mutable state of this class happens on `queue`, one serial DispatchQueue. Public async
// methods hop onto the queue; libdbus callbacks (watches, timeouts, dispatch status, filter,
// pending-call notify) are only ever invoked from libdbus functions that we call on the queue,
// or from Dispatch sources targeting the queue. Method handlers of exported objects run as Swift
// tasks off the queue and come back to it to reply, so a handler may await other calls on this
// connection (even calls to the peer that is waiting for its reply) without deadlock.
//
// Lifetime: an open connection keeps itself alive (libdbus holds an unretained pointer to it as
// callback user data) until `close()` is called.
import CDBus
import Dispatch
import Foundation
import Synchronization

/// Holder for a C pointer crossing a Sendable boundary (a continuation, a hop onto `queue`).
/// Invariant (why unchecked): the pointer is only dereferenced, and the libdbus object it points
/// to only used, on the connection's `queue` (`openRaw` too runs there); the holder itself is
/// an immutable value.
struct UncheckedPointer: @unchecked Sendable, Hashable {
    let raw: OpaquePointer
}

/// Invariant (why unchecked): see the threading invariant at the top of this file; the mutable
/// state below is confined to `queue`, and `lastID` is a Mutex.
public final class DBusConnection: @unchecked Sendable {
    /// The address of the system bus: `DBUS_SYSTEM_BUS_ADDRESS` if set, else the standard socket.
    public static var systemBusAddress: String {
        if let env = ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"], !env.isEmpty { return env }
        return "unix:path=/var/run/dbus/system_bus_socket"
    }

    /// The unique bus name of this connection (e.g. ":1.42").
    public let uniqueName: String

    let queue: DispatchQueue

    // MARK: queue-confined state
    private var conn: OpaquePointer?
    private var connected = true
    private var selfRetain: DBusConnection?
    private var drainScheduled = false
    private var readSources: [OpaquePointer: DispatchSourceRead] = [:]
    private var writeSources: [OpaquePointer: DispatchSourceWrite] = [:]
    private var timers: [OpaquePointer: DispatchSourceTimer] = [:]
    private var pending: [UInt64: PendingCall] = [:]
    private var incoming: [UInt64: OpaquePointer] = [:]
    private var cancelledBeforeStart: Set<UInt64> = []
    private var subscriptions: [UInt64: Subscription] = [:]
    private var trackedNames: [String: Int] = [:]        // well-known sender name -> subscriptions using it
    private var nameOwners: [String: String] = [:]       // well-known sender name -> current unique owner
    private var objects: [String: [String: DBusInterface]] = [:]   // path -> interface name -> interface
    private var managers: Set<String> = []
    private var problemHandler: (@Sendable (DBusProblem) -> Void)?
    /// Failures no daemon provokes (a body libdbus validated that this binding cannot read, a
    /// signal it cannot build), by member name: only the tests of how they are reported set them.
    struct Faults: Sendable {
        var readingSignal: (@Sendable (_ member: String) -> Error?)?
        var buildingSignal: (@Sendable (_ member: String) -> Error?)?
    }
    private(set) var faults = Faults()

    // Id counter shared by tasks (lock, not queue, so ids exist before hopping onto the queue).
    private let lastID = Mutex<UInt64>(0)

    private struct PendingCall {
        let call: OpaquePointer
        let continuation: CheckedContinuation<[DBusValue], Error>
        let timer: DispatchSourceTimer?
    }

    private struct Subscription {
        let rule: DBusMatchRule
        let continuation: AsyncStream<DBusSignal>.Continuation
    }

    /// Box passed as user data of a pending call's notify function.
    private final class PendingBox {
        let id: UInt64
        let connection: DBusConnection
        init(id: UInt64, connection: DBusConnection) {
            self.id = id
            self.connection = connection
        }
    }

    private init(queue: DispatchQueue, conn: OpaquePointer, uniqueName: String) {
        self.queue = queue
        self.conn = conn
        self.uniqueName = uniqueName
    }

    func nextID() -> UInt64 {
        lastID.withLock { id in
            id += 1
            return id
        }
    }

    // MARK: - Opening

    /// Opens a private connection to the bus at `address` (default: the system bus, honouring
    /// `DBUS_SYSTEM_BUS_ADDRESS`) and registers on it (Hello). Registration is the only blocking
    /// libdbus call and happens before the main loop runs, on the connection's own queue.
    public static func connect(address: String? = nil) async throws -> DBusConnection {
        let address = address ?? systemBusAddress
        let queue = DispatchQueue(label: "DBusConnection")
        let (pointer, name): (UncheckedPointer, String) = try await withCheckedThrowingContinuation { cont in
            queue.async {
                cont.resume(with: Result { try openRaw(address) })
            }
        }
        let connection = DBusConnection(queue: queue, conn: pointer.raw, uniqueName: name)
        await withCheckedContinuation { (cont: CheckedContinuation<Void, Never>) in
            queue.async {
                connection.startLoop()
                cont.resume()
            }
        }
        return connection
    }

    private static func openRaw(_ address: String) throws -> (UncheckedPointer, String) {
        _ = dbus_threads_init_default()
        var err = CDBus.DBusError()
        dbus_error_init(&err)
        defer { dbus_error_free(&err) }
        guard let c = dbus_connection_open_private(address, &err) else {
            throw Self.connectError(err)
        }
        dbus_connection_set_exit_on_disconnect(c, 0)
        guard dbus_bus_register(c, &err) != 0 else {
            let e = Self.connectError(err)
            dbus_connection_close(c)
            dbus_connection_unref(c)
            throw e
        }
        let name = dbus_bus_get_unique_name(c).map { String(cString: $0) } ?? ""
        return (UncheckedPointer(raw: c), name)
    }

    private static func connectError(_ err: CDBus.DBusError) -> DBusConnectionError {
        .connectFailed(name: err.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed",
                       message: err.message.map { String(cString: $0) } ?? "")
    }

    // MARK: - Main loop (libdbus watches and timeouts on Dispatch sources)

    private static func from(_ userData: UnsafeMutableRawPointer?) -> DBusConnection {
        Unmanaged<DBusConnection>.fromOpaque(userData!).takeUnretainedValue()
    }

    private func startLoop() {
        guard let conn else { return }
        selfRetain = self
        let userData = Unmanaged.passUnretained(self).toOpaque()
        _ = dbus_connection_set_watch_functions(conn, { watch, ud in
            DBusConnection.from(ud).updateWatch(watch!)
            return 1
        }, { watch, ud in
            DBusConnection.from(ud).removeWatch(watch!)
        }, { watch, ud in
            DBusConnection.from(ud).updateWatch(watch!)
        }, userData, nil)
        _ = dbus_connection_set_timeout_functions(conn, { timeout, ud in
            DBusConnection.from(ud).updateTimeout(timeout!)
            return 1
        }, { timeout, ud in
            DBusConnection.from(ud).removeTimeout(timeout!)
        }, { timeout, ud in
            DBusConnection.from(ud).updateTimeout(timeout!)
        }, userData, nil)
        // Never dispatch from inside this callback: only schedule a drain.
        dbus_connection_set_dispatch_status_function(conn, { _, status, ud in
            if status == DBUS_DISPATCH_DATA_REMAINS { DBusConnection.from(ud).scheduleDrain() }
        }, userData, nil)
        dbus_connection_set_wakeup_main_function(conn, { ud in
            DBusConnection.from(ud).scheduleDrain()
        }, userData, nil)
        _ = dbus_connection_add_filter(conn, Self.filterFunction, userData, nil)
        scheduleDrain()
    }

    /// One C function for add_filter and remove_filter (they compare function pointers).
    /// Invariant (why unsafe): an immutable C function pointer, set once when first read; it
    /// captures nothing, and it is marked unsafe only because Swift does not count a
    /// `@convention(c)` pointer as Sendable.
    nonisolated(unsafe) private static let filterFunction: DBusHandleMessageFunction = { _, message, ud in
        DBusConnection.from(ud).filter(message!)
    }

    /// The descriptor a Dispatch source of the watch uses: a duplicate of libdbus's, which the
    /// source owns and closes in its cancel handler (`closeOnCancel`). libdispatch's rule: a
    /// descriptor must stay open until its source's cancellation has run, and cancel() only asks
    /// for it. libdbus closes the socket as soon as it has removed the watch
    /// (dbus_connection_close), so a source on libdbus's own descriptor was still in libdispatch's
    /// epoll set while the number was closed and reused by the next open (busctl's pipes in the
    /// D-Bus tests): the manager thread then crashed in _dispatch_event_loop_drain (once in a
    /// make test run). When no descriptor is left to duplicate, libdbus's own is used (as before)
    /// rather than losing the watch.
    private static func sourceDescriptor(_ fd: Int32) -> (fd: Int32, owned: Bool) {
        let own = dup(fd)
        return own >= 0 ? (own, true) : (fd, false)
    }

    private static func closeOnCancel(_ source: DispatchSourceProtocol, _ d: (fd: Int32, owned: Bool)) {
        guard d.owned else { return }
        let fd = d.fd
        source.setCancelHandler { _ = Foundation.close(fd) }
    }

    private func updateWatch(_ watch: OpaquePointer) {
        readSources.removeValue(forKey: watch)?.cancel()
        writeSources.removeValue(forKey: watch)?.cancel()
        guard dbus_watch_get_enabled(watch) != 0 else { return }
        let fd = dbus_watch_get_unix_fd(watch)
        guard fd >= 0 else { return }
        let flags = dbus_watch_get_flags(watch)
        let w = UncheckedPointer(raw: watch)
        if flags & DBUS_WATCH_READABLE.rawValue != 0 {
            let d = Self.sourceDescriptor(fd)
            let source = DispatchSource.makeReadSource(fileDescriptor: d.fd, queue: queue)
            Self.closeOnCancel(source, d)
            source.setEventHandler { [self] in
                guard readSources[w.raw] != nil else { return }
                _ = dbus_watch_handle(w.raw, DBUS_WATCH_READABLE.rawValue)
                scheduleDrain()
            }
            readSources[watch] = source
            source.resume()
        }
        if flags & DBUS_WATCH_WRITABLE.rawValue != 0 {
            let d = Self.sourceDescriptor(fd)
            let source = DispatchSource.makeWriteSource(fileDescriptor: d.fd, queue: queue)
            Self.closeOnCancel(source, d)
            source.setEventHandler { [self] in
                guard writeSources[w.raw] != nil else { return }
                _ = dbus_watch_handle(w.raw, DBUS_WATCH_WRITABLE.rawValue)
                scheduleDrain()
            }
            writeSources[watch] = source
            source.resume()
        }
    }

    private func removeWatch(_ watch: OpaquePointer) {
        readSources.removeValue(forKey: watch)?.cancel()
        writeSources.removeValue(forKey: watch)?.cancel()
    }

    private func updateTimeout(_ timeout: OpaquePointer) {
        timers.removeValue(forKey: timeout)?.cancel()
        guard dbus_timeout_get_enabled(timeout) != 0 else { return }
        let ms = max(1, Int(dbus_timeout_get_interval(timeout)))
        let t = UncheckedPointer(raw: timeout)
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .milliseconds(ms), repeating: .milliseconds(ms))
        timer.setEventHandler { [self] in
            guard timers[t.raw] != nil else { return }
            _ = dbus_timeout_handle(t.raw)
            scheduleDrain()
        }
        timers[timeout] = timer
        timer.resume()
    }

    private func removeTimeout(_ timeout: OpaquePointer) {
        timers.removeValue(forKey: timeout)?.cancel()
    }

    private func scheduleDrain() {
        guard !drainScheduled else { return }
        drainScheduled = true
        queue.async { [self] in
            drainScheduled = false
            guard let conn else { return }
            while dbus_connection_dispatch(conn) == DBUS_DISPATCH_DATA_REMAINS {}
        }
    }

    // MARK: - Incoming messages

    private static func string(_ p: UnsafePointer<CChar>?) -> String? {
        p.map { String(cString: $0) }
    }

    private func filter(_ message: OpaquePointer) -> DBusHandlerResult {
        switch dbus_message_get_type(message) {
        case DBUS_MESSAGE_TYPE_SIGNAL:
            let interface = Self.string(dbus_message_get_interface(message)) ?? ""
            let member = Self.string(dbus_message_get_member(message)) ?? ""
            let path = Self.string(dbus_message_get_path(message)) ?? ""
            if interface == "org.freedesktop.DBus.Local", member == "Disconnected" {
                connectionLost()
                return DBUS_HANDLER_RESULT_HANDLED
            }
            guard !subscriptions.isEmpty else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
            let sender = Self.string(dbus_message_get_sender(message))
            let args: [DBusValue]
            do {
                if let fault = faults.readingSignal?(member) { throw fault }
                args = try DBusReader.readAll(message)
            } catch {
                report(.unreadableSignal(sender: sender, path: path, interface: interface, member: member, reason: "\(error)"))
                return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
            }
            let signal = DBusSignal(sender: sender, path: path, interface: interface, member: member, arguments: args)
            if signal.sender == Self.bus, interface == Self.bus, member == "NameOwnerChanged", args.count == 3,
               case .string(let name) = args[0], trackedNames[name] != nil, case .string(let owner) = args[2] {
                nameOwners[name] = owner.isEmpty ? nil : owner
            }
            for sub in subscriptions.values
            where sub.rule.matches(signal, senderOwner: sub.rule.sender.flatMap { nameOwners[$0] }) {
                sub.continuation.yield(signal)
            }
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        case DBUS_MESSAGE_TYPE_METHOD_CALL:
            return handleMethodCall(message)
        default:
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
    }

    private func connectionLost() {
        connected = false
        for (_, p) in pending {
            p.timer?.cancel()
            dbus_pending_call_cancel(p.call)
            dbus_pending_call_unref(p.call)
            p.continuation.resume(throwing: DBusConnectionError.disconnected)
        }
        pending.removeAll()
        for (_, s) in subscriptions { s.continuation.finish() }
        subscriptions.removeAll()
    }

    private func handleMethodCall(_ message: OpaquePointer) -> DBusHandlerResult {
        guard let path = Self.string(dbus_message_get_path(message)),
              let member = Self.string(dbus_message_get_member(message)) else {
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
        let interface = Self.string(dbus_message_get_interface(message))
        let signature = Self.string(dbus_message_get_signature(message)) ?? ""
        let arguments: [DBusValue]
        do {
            arguments = try DBusReader.readAll(message)
        } catch {
            replyNow(message, .failure(DBusMethodError.invalidArgs("\(error)")))
            return DBUS_HANDLER_RESULT_HANDLED
        }
        let call = DBusMethodCall(sender: Self.string(dbus_message_get_sender(message)),
                                  destination: Self.string(dbus_message_get_destination(message)),
                                  path: path, interface: interface, member: member,
                                  signature: signature, arguments: arguments)

        switch (interface, member) {
        case (DBusStandardInterface.introspectable?, "Introspect"), (nil, "Introspect"):
            guard let xml = introspectionXML(path) else { break }
            replyNow(message, .success([.string(xml)]))
            return DBUS_HANDLER_RESULT_HANDLED
        case (DBusStandardInterface.objectManager?, "GetManagedObjects"), (nil, "GetManagedObjects"):
            guard managers.contains(path) else { break }
            replyNow(message, .success([managedObjects(under: path)]))
            return DBUS_HANDLER_RESULT_HANDLED
        case (DBusStandardInterface.properties?, _):
            guard objects[path] != nil else { break }
            handleProperties(message, call)
            return DBUS_HANDLER_RESULT_HANDLED
        default:
            break
        }

        guard let interfaces = objects[path] else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        let method: DBusMethod?
        if let interface {
            method = interfaces[interface]?.methods[member]
        } else {
            method = interfaces.keys.sorted().lazy.compactMap { interfaces[$0]!.methods[member] }.first
        }
        guard let method else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        if let expected = method.inSignature, expected != signature {
            replyNow(message, .failure(DBusMethodError.invalidArgs(
                "expected signature '\(expected)', got '\(signature)'")))
            return DBUS_HANDLER_RESULT_HANDLED
        }
        let id = keep(message)
        let outSignature = method.outSignature
        let handler = method.handler
        Task { [self] in
            let result: Result<[DBusValue], Error>
            do {
                let out = try await handler(call)
                if let outSignature, dbusSignature(of: out) != outSignature {
                    result = .failure(DBusMethodError.failed(
                        "handler returned '\(dbusSignature(of: out))', declared '\(outSignature)'"))
                } else {
                    result = .success(out)
                }
            } catch {
                result = .failure(error)
            }
            queue.async { [self] in reply(id, result) }
        }
        return DBUS_HANDLER_RESULT_HANDLED
    }

    /// Keeps a reference to an incoming method call until it is answered.
    private func keep(_ message: OpaquePointer) -> UInt64 {
        let id = nextID()
        dbus_message_ref(message)
        incoming[id] = message
        return id
    }

    private func reply(_ id: UInt64, _ result: Result<[DBusValue], Error>) {
        guard let message = incoming.removeValue(forKey: id) else { return }
        defer { dbus_message_unref(message) }
        replyNow(message, result)
    }

    private func replyNow(_ message: OpaquePointer, _ result: Result<[DBusValue], Error>) {
        guard let conn, connected, dbus_message_get_no_reply(message) == 0 else { return }
        var reply: OpaquePointer?
        switch result {
        case .success(let values):
            reply = dbus_message_new_method_return(message)
            if let r = reply {
                do {
                    try DBusWriter.append(values, to: r)
                } catch {
                    dbus_message_unref(r)
                    reply = Self.errorReply(message, DBusMethodError.failed("cannot marshal reply: \(error)"))
                }
            }
        case .failure(let error):
            reply = Self.errorReply(message, error)
        }
        guard let reply else { return }
        _ = dbus_connection_send(conn, reply, nil)
        dbus_message_unref(reply)
    }

    private static func errorReply(_ message: OpaquePointer, _ error: Error) -> OpaquePointer? {
        var e = (error as? DBusMethodError) ?? DBusMethodError.failed(String(describing: error))
        if !DBusValidate.errorName(e.name) { e = .failed("\(e.name): \(e.message)") }
        if e.message.utf8.contains(0) { e.message = e.message.replacingOccurrences(of: "\0", with: "") }
        return dbus_message_new_error(message, e.name, e.message)
    }

    // MARK: - Outgoing method calls

    /// Calls a method and awaits its reply. Never blocks a thread: the call is sent with
    /// `dbus_connection_send_with_reply` and completed from the pending call's notify function.
    /// Throws `DBusMethodError` for an error reply, `DBusConnectionError.timeout` when no reply
    /// arrives in time, `DBusConnectionError.disconnected`, or `CancellationError`.
    public func call(destination: String?, path: String, interface: String?, member: String,
                     arguments: [DBusValue] = [], timeout: Duration = .seconds(25)) async throws -> [DBusValue] {
        let id = nextID()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (cont: CheckedContinuation<[DBusValue], Error>) in
                queue.async { [self] in
                    let message: UncheckedPointer
                    do {
                        message = try Self.makeMethodCall(destination: destination, path: path, interface: interface,
                                                          member: member, arguments: arguments)
                    } catch {
                        cancelledBeforeStart.remove(id)
                        return cont.resume(throwing: error)
                    }
                    start(id: id, message: message.raw, timeout: timeout, continuation: cont)
                }
            }
        } onCancel: {
            queue.async { [self] in
                // Cancellation may overtake the start of the call on the queue: remember it.
                if pending[id] == nil { cancelledBeforeStart.insert(id) }
                finishPending(id, error: CancellationError())
            }
        }
    }

    /// Sends a method call without waiting for (or wanting) a reply.
    public func send(destination: String?, path: String, interface: String?, member: String,
                     arguments: [DBusValue] = []) async throws {
        try await onQueueThrowing { [self] in
            let message = try Self.makeMethodCall(destination: destination, path: path, interface: interface,
                                                  member: member, arguments: arguments)
            dbus_message_set_no_reply(message.raw, 1)
            try sendNow(message.raw)
        }
    }

    private static func makeMethodCall(destination: String?, path: String, interface: String?, member: String,
                                       arguments: [DBusValue]) throws -> UncheckedPointer {
        if let destination, !DBusValidate.busName(destination) {
            throw DBusConnectionError.invalidArgument("bus name '\(destination)'")
        }
        guard DBusValidate.objectPath(path) else { throw DBusConnectionError.invalidArgument("object path '\(path)'") }
        if let interface, !DBusValidate.interfaceName(interface) {
            throw DBusConnectionError.invalidArgument("interface '\(interface)'")
        }
        guard DBusValidate.memberName(member) else { throw DBusConnectionError.invalidArgument("member '\(member)'") }
        guard let m = dbus_message_new_method_call(destination, path, interface, member) else {
            throw DBusMarshalError.outOfMemory
        }
        do {
            try DBusWriter.append(arguments, to: m)
        } catch {
            dbus_message_unref(m)
            throw error
        }
        return UncheckedPointer(raw: m)
    }

    /// Sends (and releases) a message that expects no reply. On the queue.
    private func sendNow(_ message: OpaquePointer) throws {
        defer { dbus_message_unref(message) }
        guard let conn, connected else { throw DBusConnectionError.disconnected }
        guard dbus_connection_send(conn, message, nil) != 0 else { throw DBusMarshalError.outOfMemory }
    }

    /// A call's timeout as the timer's whole milliseconds: at least 1, at most a year. The seconds
    /// are held to ±a year before they are multiplied (`.seconds(Int64.min)` would overflow).
    static func milliseconds(_ timeout: Duration) -> Int {
        let (seconds, attoseconds) = timeout.components
        let year = 86_400 * 365
        return min(year * 1000, max(1, Int(max(-Int64(year), min(seconds, Int64(year)))) * 1000 + Int(attoseconds / 1_000_000_000_000_000)))
    }

    private func start(id: UInt64, message: OpaquePointer, timeout: Duration,
                       continuation: CheckedContinuation<[DBusValue], Error>) {
        defer { dbus_message_unref(message) }
        if cancelledBeforeStart.remove(id) != nil { return continuation.resume(throwing: CancellationError()) }
        guard let conn, connected else { return continuation.resume(throwing: DBusConnectionError.disconnected) }
        var pendingCall: OpaquePointer?
        // Infinite libdbus timeout: our own timer gives a typed timeout error.
        guard dbus_connection_send_with_reply(conn, message, &pendingCall, DBUS_TIMEOUT_INFINITE) != 0 else {
            return continuation.resume(throwing: DBusMarshalError.outOfMemory)
        }
        guard let pendingCall else { return continuation.resume(throwing: DBusConnectionError.disconnected) }
        let ms = Self.milliseconds(timeout)
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .milliseconds(ms))
        timer.setEventHandler { [self] in finishPending(id, error: DBusConnectionError.timeout) }
        pending[id] = PendingCall(call: pendingCall, continuation: continuation, timer: timer)
        timer.resume()
        let box = Unmanaged.passRetained(PendingBox(id: id, connection: self)).toOpaque()
        let set = dbus_pending_call_set_notify(pendingCall, { _, ud in
            let box = Unmanaged<PendingBox>.fromOpaque(ud!).takeUnretainedValue()
            box.connection.completePending(box.id)
        }, box, { ud in
            Unmanaged<PendingBox>.fromOpaque(ud!).release()
        })
        if set == 0 {
            Unmanaged<PendingBox>.fromOpaque(box).release()
            finishPending(id, error: DBusMarshalError.outOfMemory)
            return
        }
        if dbus_pending_call_get_completed(pendingCall) != 0 { completePending(id) }
    }

    /// Ends a pending call without a reply (timeout, cancellation).
    private func finishPending(_ id: UInt64, error: Error) {
        guard let p = pending.removeValue(forKey: id) else { return }
        p.timer?.cancel()
        dbus_pending_call_cancel(p.call)
        dbus_pending_call_unref(p.call)
        p.continuation.resume(throwing: error)
    }

    private func completePending(_ id: UInt64) {
        guard let p = pending.removeValue(forKey: id) else { return }
        p.timer?.cancel()
        let reply = dbus_pending_call_steal_reply(p.call)
        dbus_pending_call_unref(p.call)
        guard let reply else { return p.continuation.resume(throwing: DBusConnectionError.disconnected) }
        defer { dbus_message_unref(reply) }
        let values: [DBusValue]
        do {
            values = try DBusReader.readAll(reply)
        } catch {
            return p.continuation.resume(throwing: error)
        }
        if dbus_message_get_type(reply) == DBUS_MESSAGE_TYPE_ERROR {
            let name = Self.string(dbus_message_get_error_name(reply)) ?? DBusMethodError.failedName
            if name == DBusMethodError.noReplyName, let conn, dbus_connection_get_is_connected(conn) == 0 {
                return p.continuation.resume(throwing: DBusConnectionError.disconnected)
            }
            let text = values.first?.stringValue ?? ""
            return p.continuation.resume(throwing: DBusMethodError(name, text))
        }
        p.continuation.resume(returning: values)
    }

    // MARK: - Bus methods

    private static let bus = "org.freedesktop.DBus"
    private static let busPath = "/org/freedesktop/DBus"

    /// Requests a well-known name.
    public func requestName(_ name: String, flags: DBusNameFlags = [.doNotQueue]) async throws -> DBusRequestNameReply {
        let out = try await call(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                                 member: "RequestName", arguments: [.string(name), .uint32(flags.rawValue)])
        guard let code = out.first?.intValue, let reply = DBusRequestNameReply(rawValue: UInt32(code)) else {
            throw DBusConnectionError.unexpectedReply("RequestName returned \(out)")
        }
        return reply
    }

    /// Releases a well-known name (returns the bus's code: 1 released, 2 non-existent, 3 not owner).
    @discardableResult
    public func releaseName(_ name: String) async throws -> UInt32 {
        let out = try await call(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                                 member: "ReleaseName", arguments: [.string(name)])
        return UInt32(out.first?.intValue ?? 0)
    }

    /// The unique name owning `name`, or nil if nobody owns it.
    public func nameOwner(_ name: String) async throws -> String? {
        do {
            let out = try await call(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                                     member: "GetNameOwner", arguments: [.string(name)])
            return out.first?.stringValue
        } catch let e as DBusMethodError where e.name == "org.freedesktop.DBus.Error.NameHasNoOwner" {
            return nil
        }
    }

    /// Adds a match rule on the bus (awaits the bus's acknowledgement).
    public func addMatch(_ rule: DBusMatchRule) async throws {
        _ = try await call(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                           member: "AddMatch", arguments: [.string(rule.ruleString)])
    }

    /// Removes a match rule from the bus.
    public func removeMatch(_ rule: DBusMatchRule) async throws {
        _ = try await call(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                           member: "RemoveMatch", arguments: [.string(rule.ruleString)])
    }

    // MARK: - Signals

    /// Adds `rule` on the bus and returns the stream of matching signals. Signals are buffered
    /// from before the bus acknowledges the rule, so nothing emitted after this returns is
    /// missed. Ending the stream (the consumer stops iterating or is cancelled) removes the rule.
    /// The stream finishes when the connection closes.
    public func signals(matching rule: DBusMatchRule) async throws -> AsyncStream<DBusSignal> {
        let id = nextID()
        let (stream, continuation) = AsyncStream<DBusSignal>.makeStream()
        let trackedName = rule.sender.flatMap { $0.hasPrefix(":") || $0 == Self.bus ? nil : $0 }
        do {
            // Owner first, so signals of a well-known sender are recognised from the start.
            if let trackedName { try await trackOwner(of: trackedName) }
            await onQueue { [self] in subscriptions[id] = Subscription(rule: rule, continuation: continuation) }
            try await addMatch(rule)
        } catch {
            await onQueue { [self] in
                subscriptions.removeValue(forKey: id)
                if let trackedName { untrackOwner(of: trackedName) }
            }
            continuation.finish()
            throw error
        }
        continuation.onTermination = { [self] _ in
            queue.async { [self] in
                guard subscriptions.removeValue(forKey: id) != nil else { return }
                if let trackedName { untrackOwner(of: trackedName) }
                guard connected else { return }
                // Best effort: a rule left on the bus only brings signals no subscription takes.
                Task { try? await self.send(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                                            member: "RemoveMatch", arguments: [.string(rule.ruleString)]) }
            }
        }
        return stream
    }

    private static func ownerRule(_ name: String) -> DBusMatchRule {
        DBusMatchRule(sender: bus, interface: bus, member: "NameOwnerChanged", path: busPath, args: [0: name])
    }

    /// Follows the unique owner of a well-known name (NameOwnerChanged, then GetNameOwner: the
    /// reply reflects every change signalled before it, later changes arrive after it).
    private func trackOwner(of name: String) async throws {
        let first = await onQueue { [self] in
            trackedNames[name, default: 0] += 1
            return trackedNames[name] == 1
        }
        guard first else { return }
        try await addMatch(Self.ownerRule(name))
        let owner = try await nameOwner(name)
        await onQueue { [self] in
            guard trackedNames[name] != nil else { return }
            nameOwners[name] = owner
        }
    }

    private func untrackOwner(of name: String) {
        guard let count = trackedNames[name] else { return }
        if count > 1 { trackedNames[name] = count - 1; return }
        trackedNames.removeValue(forKey: name)
        nameOwners.removeValue(forKey: name)
        guard connected else { return }
        // Best effort, as for a subscription's rule.
        Task { try? await self.send(destination: Self.bus, path: Self.busPath, interface: Self.bus,
                                    member: "RemoveMatch", arguments: [.string(Self.ownerRule(name).ruleString)]) }
    }

    /// Emits a signal (optionally unicast to `destination`).
    public func emitSignal(path: String, interface: String, member: String, arguments: [DBusValue] = [],
                           destination: String? = nil) async throws {
        try await onQueueThrowing { [self] in
            let message = try Self.makeSignal(path: path, interface: interface, member: member,
                                              arguments: arguments, destination: destination)
            try sendNow(message.raw)
        }
    }

    private static func makeSignal(path: String, interface: String, member: String, arguments: [DBusValue],
                                   destination: String?) throws -> UncheckedPointer {
        guard DBusValidate.objectPath(path) else { throw DBusConnectionError.invalidArgument("object path '\(path)'") }
        guard DBusValidate.interfaceName(interface) else { throw DBusConnectionError.invalidArgument("interface '\(interface)'") }
        guard DBusValidate.memberName(member) else { throw DBusConnectionError.invalidArgument("member '\(member)'") }
        if let destination, !DBusValidate.busName(destination) {
            throw DBusConnectionError.invalidArgument("bus name '\(destination)'")
        }
        guard let m = dbus_message_new_signal(path, interface, member) else { throw DBusMarshalError.outOfMemory }
        if let destination { _ = dbus_message_set_destination(m, destination) }
        do {
            try DBusWriter.append(arguments, to: m)
        } catch {
            dbus_message_unref(m)
            throw error
        }
        return UncheckedPointer(raw: m)
    }

    /// Emits a signal from the queue (used by the exported-object machinery, which has no caller
    /// to throw to: a signal that cannot be built or queued is reported through `onProblem`).
    /// Nothing is emitted once the connection is closed or lost: there is no bus to emit on.
    private func emitNow(path: String, interface: String, member: String, arguments: [DBusValue]) {
        guard let conn, connected else { return }
        let m: UncheckedPointer
        do {
            if let fault = faults.buildingSignal?(member) { throw fault }
            m = try Self.makeSignal(path: path, interface: interface, member: member, arguments: arguments, destination: nil)
        } catch {
            report(.signalNotEmitted(path: path, interface: interface, member: member, reason: "\(error)"))
            return
        }
        if dbus_connection_send(conn, m.raw, nil) == 0 {
            report(.signalNotEmitted(path: path, interface: interface, member: member, reason: "libdbus could not queue it (out of memory)"))
        }
        dbus_message_unref(m.raw)
    }

    // MARK: - Problems

    /// Hands every later problem (`DBusProblem`) to `handler`, on the connection's queue (it must
    /// not block). Until a handler is set, each is written to stderr as one line.
    public func onProblem(_ handler: @escaping @Sendable (DBusProblem) -> Void) async {
        await onQueue { [self] in problemHandler = handler }
    }

    private func report(_ problem: DBusProblem) {
        if let problemHandler { problemHandler(problem); return }
        FileHandle.standardError.write(Data("herald-lab D-Bus (\(uniqueName)): \(problem)\n".utf8))
    }

    /// Sets `faults` on the queue (tests).
    func inject(_ faults: Faults) async {
        await onQueue { [self] in self.faults = faults }
    }

    // MARK: - Exported objects

    /// Exports an object at `path` with `interfaces` (added to those already exported there).
    /// If an object manager is exported at an ancestor, it emits InterfacesAdded.
    public func export(path: String, interfaces: [DBusInterface]) async throws {
        try await onQueueThrowing { [self] in try exportNow(path: path, interfaces: interfaces) }
    }

    private func exportNow(path: String, interfaces: [DBusInterface]) throws {
        guard DBusValidate.objectPath(path) else { throw DBusConnectionError.invalidArgument("object path '\(path)'") }
        for i in interfaces {
            guard DBusValidate.interfaceName(i.name) else { throw DBusConnectionError.invalidArgument("interface '\(i.name)'") }
            for (name, p) in i.properties {
                guard DBusValidate.memberName(name) else { throw DBusConnectionError.invalidArgument("property '\(name)'") }
                try DBusValidate.value(p.value)
            }
            for name in i.methods.keys where !DBusValidate.memberName(name) {
                throw DBusConnectionError.invalidArgument("method '\(name)'")
            }
        }
        var existing = objects[path] ?? [:]
        for i in interfaces { existing[i.name] = i }
        objects[path] = existing
        if let manager = managerPath(for: path) {
            let added = DBusValue.dictionary(keySignature: "s", valueSignature: "a{sv}",
                                             interfaces.sorted { $0.name < $1.name }.map {
                                                 DBusDictEntry(.string($0.name), $0.propertiesDictionary)
                                             })
            emitNow(path: manager, interface: DBusStandardInterface.objectManager, member: "InterfacesAdded",
                    arguments: [.objectPath(path), added])
        }
    }

    /// Removes interfaces (all of them if nil) from the object at `path`; emits InterfacesRemoved
    /// from the managing ancestor, if any.
    public func unexport(path: String, interfaces names: [String]? = nil) async {
        await onQueue { [self] in
            guard var existing = objects[path] else { return }
            let removed = (names ?? Array(existing.keys)).filter { existing[$0] != nil }.sorted()
            for n in removed { existing.removeValue(forKey: n) }
            objects[path] = existing.isEmpty ? nil : existing
            if let manager = managerPath(for: path), !removed.isEmpty {
                emitNow(path: manager, interface: DBusStandardInterface.objectManager, member: "InterfacesRemoved",
                        arguments: [.objectPath(path), .stringArray(removed)])
            }
        }
    }

    /// Serves org.freedesktop.DBus.ObjectManager at `path` over the objects exported below it.
    public func exportObjectManager(at path: String) async throws {
        try await onQueueThrowing { [self] in
            guard DBusValidate.objectPath(path) else { throw DBusConnectionError.invalidArgument("object path '\(path)'") }
            managers.insert(path)
        }
    }

    /// Updates a property of an exported object and emits PropertiesChanged.
    public func setProperty(path: String, interface: String, name: String, value: DBusValue,
                            emitChanged: Bool = true) async throws {
        try await onQueueThrowing { [self] in
            try DBusValidate.value(value)
            guard var prop = objects[path]?[interface]?.properties[name] else {
                throw DBusConnectionError.invalidArgument("no property \(interface).\(name) at \(path)")
            }
            guard prop.value.signature == value.signature else {
                throw DBusConnectionError.invalidArgument("property \(name) has type \(prop.value.signature), not \(value.signature)")
            }
            prop.value = value
            objects[path]![interface]!.properties[name] = prop
            if emitChanged { emitPropertiesChanged(path: path, interface: interface, name: name, value: value) }
        }
    }

    /// The current value of a property of an exported object.
    public func property(path: String, interface: String, name: String) async -> DBusValue? {
        await onQueue { [self] in objects[path]?[interface]?.properties[name]?.value }
    }

    private func emitPropertiesChanged(path: String, interface: String, name: String, value: DBusValue) {
        emitNow(path: path, interface: DBusStandardInterface.properties, member: "PropertiesChanged",
                arguments: [.string(interface),
                            .dictionary(keySignature: "s", valueSignature: "v", [DBusDictEntry(.string(name), .variant(value))]),
                            .stringArray([])])
    }

    /// The nearest strict ancestor of `path` that serves an ObjectManager.
    private func managerPath(for path: String) -> String? {
        var p = path
        while p != "/" {
            if let slash = p.lastIndex(of: "/") {
                p = slash == p.startIndex ? "/" : String(p[..<slash])
            } else {
                return nil
            }
            if managers.contains(p) { return p }
        }
        return nil
    }

    private func managedObjects(under root: String) -> DBusValue {
        let prefix = root == "/" ? "/" : root + "/"
        let entries = objects.keys.filter { $0 != root && $0.hasPrefix(prefix) }.sorted().map { path in
            let interfaces = objects[path]!
            return DBusDictEntry(.objectPath(path), .dictionary(
                keySignature: "s", valueSignature: "a{sv}",
                interfaces.keys.sorted().map { DBusDictEntry(.string($0), interfaces[$0]!.propertiesDictionary) }))
        }
        return .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", entries)
    }

    private func handleProperties(_ message: OpaquePointer, _ call: DBusMethodCall) {
        let interfaces = objects[call.path] ?? [:]
        let args = call.arguments
        func lookup(_ iface: String, _ name: String) -> Result<DBusProperty, DBusMethodError> {
            guard let i = interfaces[iface] else {
                return .failure(DBusMethodError(DBusMethodError.unknownInterfaceName, "no interface \(iface) at \(call.path)"))
            }
            guard let p = i.properties[name] else {
                return .failure(.init(DBusMethodError.unknownPropertyName, "no property \(iface).\(name)"))
            }
            return .success(p)
        }
        switch call.member {
        case "Get":
            guard call.signature == "ss", case .string(let iface) = args[0], case .string(let name) = args[1] else {
                return replyNow(message, .failure(DBusMethodError.invalidArgs("Get expects (ss)")))
            }
            switch lookup(iface, name) {
            case .failure(let e): replyNow(message, .failure(e))
            case .success(let p) where p.access == .write:
                replyNow(message, .failure(DBusMethodError("org.freedesktop.DBus.Error.AccessDenied", "\(name) is write-only")))
            case .success(let p): replyNow(message, .success([.variant(p.value)]))
            }
        case "GetAll":
            guard call.signature == "s", case .string(let iface) = args[0] else {
                return replyNow(message, .failure(DBusMethodError.invalidArgs("GetAll expects (s)")))
            }
            guard let i = interfaces[iface] else {
                return replyNow(message, .failure(DBusMethodError(DBusMethodError.unknownInterfaceName, "no interface \(iface) at \(call.path)")))
            }
            replyNow(message, .success([i.propertiesDictionary]))
        case "Set":
            guard call.signature == "ssv", case .string(let iface) = args[0], case .string(let name) = args[1],
                  case .variant(let value) = args[2] else {
                return replyNow(message, .failure(DBusMethodError.invalidArgs("Set expects (ssv)")))
            }
            let p: DBusProperty
            switch lookup(iface, name) {
            case .failure(let e): return replyNow(message, .failure(e))
            case .success(let found): p = found
            }
            guard p.access != .read else {
                return replyNow(message, .failure(DBusMethodError(DBusMethodError.propertyReadOnlyName, "\(name) is read-only")))
            }
            guard value.signature == p.signature else {
                return replyNow(message, .failure(DBusMethodError.invalidArgs("\(name) has type \(p.signature), not \(value.signature)")))
            }
            let id = keep(message)
            let setter = p.setter
            let path = call.path
            Task { [self] in
                let failure: Error?
                do { try await setter?(value); failure = nil } catch { failure = error }
                queue.async { [self] in
                    if let failure { return reply(id, .failure(failure)) }
                    if objects[path]?[iface]?.properties[name] != nil {
                        objects[path]![iface]!.properties[name]!.value = value
                        emitPropertiesChanged(path: path, interface: iface, name: name, value: value)
                    }
                    reply(id, .success([]))
                }
            }
        default:
            replyNow(message, .failure(DBusMethodError(DBusMethodError.unknownMethodName,
                                                       "no method \(call.member) in \(DBusStandardInterface.properties)")))
        }
    }

    // MARK: - Introspection

    private func introspectionXML(_ path: String) -> String? {
        let prefix = path == "/" ? "/" : path + "/"
        var children = Set<String>()
        for p in Set(objects.keys).union(managers) where p != path && p.hasPrefix(prefix) {
            if let first = p.dropFirst(prefix.count).split(separator: "/").first { children.insert(String(first)) }
        }
        let interfaces = objects[path]
        let isManager = managers.contains(path)
        guard interfaces != nil || isManager || !children.isEmpty else { return nil }
        var xml = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect"><arg name="xml" type="s" direction="out"/></method>
          </interface>
          <interface name="org.freedesktop.DBus.Peer">
            <method name="Ping"/>
            <method name="GetMachineId"><arg name="machine_uuid" type="s" direction="out"/></method>
          </interface>

        """
        if interfaces != nil {
            xml += """
              <interface name="org.freedesktop.DBus.Properties">
                <method name="Get"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="out"/></method>
                <method name="GetAll"><arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/></method>
                <method name="Set"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="in"/></method>
                <signal name="PropertiesChanged"><arg name="interface" type="s"/><arg name="changed" type="a{sv}"/><arg name="invalidated" type="as"/></signal>
              </interface>

            """
        }
        if isManager {
            xml += """
              <interface name="org.freedesktop.DBus.ObjectManager">
                <method name="GetManagedObjects"><arg name="objects" type="a{oa{sa{sv}}}" direction="out"/></method>
                <signal name="InterfacesAdded"><arg name="object" type="o"/><arg name="interfaces" type="a{sa{sv}}"/></signal>
                <signal name="InterfacesRemoved"><arg name="object" type="o"/><arg name="interfaces" type="as"/></signal>
              </interface>

            """
        }
        for (name, iface) in (interfaces ?? [:]).sorted(by: { $0.key < $1.key }) {
            xml += "  <interface name=\"\(name)\">\n"
            for (mname, m) in iface.methods.sorted(by: { $0.key < $1.key }) {
                xml += "    <method name=\"\(mname)\">"
                for (n, t) in (DBusSignature.split(m.inSignature ?? "") ?? []).enumerated() {
                    let argName = n < m.inNames.count ? m.inNames[n] : "arg\(n)"
                    xml += "<arg name=\"\(Self.escape(argName))\" type=\"\(Self.escape(t))\" direction=\"in\"/>"
                }
                for (n, t) in (DBusSignature.split(m.outSignature ?? "") ?? []).enumerated() {
                    let argName = n < m.outNames.count ? m.outNames[n] : "out\(n)"
                    xml += "<arg name=\"\(Self.escape(argName))\" type=\"\(Self.escape(t))\" direction=\"out\"/>"
                }
                xml += "</method>\n"
            }
            for (pname, p) in iface.properties.sorted(by: { $0.key < $1.key }) {
                xml += "    <property name=\"\(pname)\" type=\"\(Self.escape(p.signature))\" access=\"\(p.access.rawValue)\"/>\n"
            }
            for (sname, sig) in iface.signals.sorted(by: { $0.key < $1.key }) {
                xml += "    <signal name=\"\(sname)\">"
                for (n, t) in (DBusSignature.split(sig) ?? []).enumerated() {
                    xml += "<arg name=\"arg\(n)\" type=\"\(Self.escape(t))\"/>"
                }
                xml += "</signal>\n"
            }
            xml += "  </interface>\n"
        }
        for child in children.sorted() { xml += "  <node name=\"\(Self.escape(child))\"/>\n" }
        xml += "</node>\n"
        return xml
    }

    private static func escape(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    // MARK: - Closing

    /// Whether the connection is open and connected.
    public var isConnected: Bool {
        get async { await onQueue { [self] in conn != nil && connected } }
    }

    /// Flushes queued messages (so replies and signals are not lost), closes the connection,
    /// fails pending calls with `.disconnected` and finishes signal streams.
    public func close() async {
        await onQueue { [self] in
            guard let c = conn else { return }
            if connected { dbus_connection_flush(c) }
            connectionLost()
            for (_, m) in incoming { dbus_message_unref(m) }
            incoming.removeAll()
            let userData = Unmanaged.passUnretained(self).toOpaque()
            dbus_connection_remove_filter(c, Self.filterFunction, userData)
            dbus_connection_close(c)
            _ = dbus_connection_set_watch_functions(c, nil, nil, nil, nil, nil)
            _ = dbus_connection_set_timeout_functions(c, nil, nil, nil, nil, nil)
            dbus_connection_set_dispatch_status_function(c, nil, nil, nil)
            dbus_connection_set_wakeup_main_function(c, nil, nil, nil)
            for s in readSources.values { s.cancel() }
            for s in writeSources.values { s.cancel() }
            for t in timers.values { t.cancel() }
            readSources.removeAll()
            writeSources.removeAll()
            timers.removeAll()
            dbus_connection_unref(c)
            conn = nil
            selfRetain = nil
        }
    }

    // MARK: - Queue helpers

    private func onQueue<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { cont in
            queue.async { cont.resume(returning: body()) }
        }
    }

    private func onQueueThrowing<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { cont in
            queue.async { cont.resume(with: Result { try body() }) }
        }
    }
}
