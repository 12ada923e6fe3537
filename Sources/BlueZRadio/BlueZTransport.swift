// BlueZTransport: the Herald sensor's radio on Linux, through bluetoothd's D-Bus API.
//
// State lives on the sensor's DispatchScheduler queue, like the sensor itself; D-Bus calls run
// as Swift tasks on the connection (never blocking) and hop back onto that queue to update state
// and complete. Signals from org.bluez arrive in order on one subscription and are applied on the
// queue. When bluetoothd goes away (name owner lost, adapter removed or powered off, the bus
// connection closed) the transport reports `.unavailable`, forgets everything bluetoothd held
// (the GATT application, the advertisement, connections) and tries to come back every few
// seconds; once back it reports `.poweredOn` and the sensor registers, advertises and scans again.
import DBus
import Foundation
import HeraldCore
import HeraldRadio
import Synchronization

public final class BlueZTransport: BLETransport, Sendable {
    public struct Options: Sendable {
        /// Adapter by name (`hci0`), object path or address; empty: the first adapter.
        public var adapter: String
        /// Bus address; nil: the system bus (honours DBUS_SYSTEM_BUS_ADDRESS).
        public var busAddress: String?
        /// Where this process exports its GATT application and advertisements.
        public var objectRoot: String
        /// Timeout of GATT reads and writes and of other calls to bluetoothd while it answers
        /// promptly; a slow bluetoothd is allowed more (CallLatency).
        public var callTimeout: TimeInterval
        /// Pause between attempts to come back after bluetoothd or the adapter went away.
        public var recoveryInterval: TimeInterval
        /// Calls to the adapter (discovery, advertising, the GATT application) that fail or time
        /// out in a row before the dongle counts as no longer answering and is recovered:
        /// power-cycled through bluetoothd, then reset at USB level.
        public var unresponsiveAfter: Int = 3
        /// Where sysfs is (tests give a fake tree), and whether a USB reset (`authorized` 0/1)
        /// may be tried; it needs write access to the attribute.
        public var sysfsRoot: String = "/sys"
        public var usbReset: Bool = true
        public var usbResetPause: TimeInterval = 1
        /// How long a recovery may take before it counts as failed (the adapter not back).
        public var recoveryDeadline: TimeInterval = 60
        /// Outgoing connections that fail or time out in a row, to at least `connectStallPeers`
        /// different peers, before the adapter counts as no longer initiating and is recovered
        /// like one that stopped answering (Linux 6.1 can stop initiating for good after a
        /// connection collision, see BlueZTransport+Recovery).
        public var connectStallAfter: Int = 3
        public var connectStallPeers: Int = 2
        /// Failed outgoing connections in a row, before bluetoothd left the bus, that have the
        /// adapter power-cycled as soon as bluetoothd is back: the kernel keeps its connection
        /// state across a bluetoothd restart, so a stall goes on after it (healthy nodes of the
        /// guest tier had at most 1 failure in a row; a stuck one 2 before the restart).
        public var connectStallAcrossRestart: Int = 2

        public init(adapter: String = "hci0", busAddress: String? = nil, objectRoot: String = "/org/heraldlab/sensor",
                    callTimeout: TimeInterval = 10, recoveryInterval: TimeInterval = 3) {
            self.adapter = adapter
            self.busAddress = busAddress
            self.objectRoot = objectRoot
            self.callTimeout = callTimeout
            self.recoveryInterval = recoveryInterval
        }
    }

    /// What only the scheduler's queue touches (the state below, forwarded to it).
    final class OnQueue {
        weak var delegate: (any BLETransportDelegate)?
        var state: RadioState = .unavailable
        var log: ((String) -> Void)?
        var onGap: ((_ from: Double, _ to: Double, _ reason: String) -> Void)?
        var onRecovery: ((DongleRecovery) -> Void)?
        var lostSince: (at: Double, reason: String)?
        var recoveries: [DongleRecovery] = []
        var bus: DBusConnection?
        var objects: BlueZObjects = BlueZObjects()
        var adapterPath: String?
        var establishing: Bool = false
        var powerWaiters: [(Result<Void, TransportError>) -> Void] = []
        var recoveryTask: ScheduledTask?
        var wasReady: Bool = false
        var scanning: Bool = false
        var server: (any GATTServerDelegate)?
        var applicationRegistered: Bool = false
        var advertisementRegistered: Bool = false
        var advertisementCount: Int = 0
        var resolveWaiters: [String: [(Bool) -> Void]] = [:]
        var outgoing: Set<RadioAddress> = []
        var borrowedLinks: [RadioAddress: TimeInterval] = [:]
        var connectionAttempts: Int = 0
        var deferredScan: ScanFilter?
        var centrals: Set<RadioAddress> = []
        var warnedAdvertisingControl: Bool = false
        var adapterFailures: Int = 0
        var firstFailureAt: Double?
        var notAnswering: (at: Double, reason: String)?
        var ladder: Int = 0
        var pendingRecovery: PendingRecovery?
        var connectFailures: [RadioAddress] = []
        var connectEpoch: Int = 0
        var establishFailuresDuringRecovery: Int = 0
        var discoveryFailures: Int = 0
        var discoveryRetry: ScheduledTask?
        var discoveryPending: ((Result<Void, TransportError>) -> Void)?
        var discoveryLastError: TransportError?
        var discoveryToken: Int = 0
        var latencyLogged: [String: TimeInterval] = [:]
    }
    /// Invariant: only used on `dispatch.queue` (see the top of this file); `q` checks that
    /// (dispatchPrecondition) on every access, so this box (HeraldRadio's carrier for the seam)
    /// is never read elsewhere. Off the queue, D-Bus calls use only `options`, `dispatch`, the
    /// latency table (a Mutex) and what they were handed, and hop back with `onScheduler`.
    private let confined = UncheckedBox(OnQueue())
    private var q: OnQueue {
        dispatchPrecondition(condition: .onQueue(dispatch.queue))
        return confined.value
    }

    public var delegate: (any BLETransportDelegate)? { get { q.delegate } set { q.delegate = newValue } _modify { yield &q.delegate } }
    public private(set) var state: RadioState { get { q.state } set { q.state = newValue } _modify { yield &q.state } }
    public var scheduler: any Scheduler { dispatch }
    public let dispatch: DispatchScheduler
    public let options: Options
    /// Diagnostic lines (log.txt), called on the scheduler.
    public var log: ((String) -> Void)? { get { q.log } set { q.log = newValue } _modify { yield &q.log } }
    /// Called on the scheduler once the radio is back, with the period it was lost (seconds since
    /// 1970) and why: the node logged nothing it could vouch for in between.
    public var onGap: ((_ from: Double, _ to: Double, _ reason: String) -> Void)? { get { q.onGap } set { q.onGap = newValue } _modify { yield &q.onGap } }
    /// Called on the scheduler when a recovery of the dongle ends (BlueZTransport+Recovery).
    public var onRecovery: ((DongleRecovery) -> Void)? { get { q.onRecovery } set { q.onRecovery = newValue } _modify { yield &q.onRecovery } }
    var lostSince: (at: Double, reason: String)? { get { q.lostSince } set { q.lostSince = newValue } _modify { yield &q.lostSince } }

    /// Since when, and why, the radio has not been usable, while it is not (never powered since
    /// it was asked to be, or lost and not back).
    public var outage: (since: Double, reason: String)? {
        if state == .poweredOn {
            // Powered, but not answering: no more working than a radio that is gone.
            return notAnswering.map { ($0.at, "dongle not answering: \($0.reason)") }
        }
        guard let l = lostSince else { return nil }
        return (l.at, l.reason)
    }
    /// Whether the adapter was ever powered and ready.
    public var everReady: Bool { wasReady }
    /// Every recovery tried so far, in order.
    public internal(set) var recoveries: [DongleRecovery] { get { q.recoveries } set { q.recoveries = newValue } _modify { yield &q.recoveries } }

    // MARK: scheduler-confined state
    var bus: DBusConnection? { get { q.bus } set { q.bus = newValue } _modify { yield &q.bus } }
    var objects: BlueZObjects { get { q.objects } set { q.objects = newValue } _modify { yield &q.objects } }
    public private(set) var adapterPath: String? { get { q.adapterPath } set { q.adapterPath = newValue } _modify { yield &q.adapterPath } }
    var establishing: Bool { get { q.establishing } set { q.establishing = newValue } _modify { yield &q.establishing } }
    var powerWaiters: [(Result<Void, TransportError>) -> Void] { get { q.powerWaiters } set { q.powerWaiters = newValue } _modify { yield &q.powerWaiters } }
    var recoveryTask: ScheduledTask? { get { q.recoveryTask } set { q.recoveryTask = newValue } _modify { yield &q.recoveryTask } }
    var wasReady: Bool { get { q.wasReady } set { q.wasReady = newValue } _modify { yield &q.wasReady } }
    var scanning: Bool { get { q.scanning } set { q.scanning = newValue } _modify { yield &q.scanning } }
    var server: (any GATTServerDelegate)? { get { q.server } set { q.server = newValue } _modify { yield &q.server } }
    var applicationRegistered: Bool { get { q.applicationRegistered } set { q.applicationRegistered = newValue } _modify { yield &q.applicationRegistered } }
    var advertisementRegistered: Bool { get { q.advertisementRegistered } set { q.advertisementRegistered = newValue } _modify { yield &q.advertisementRegistered } }
    var advertisementCount: Int { get { q.advertisementCount } set { q.advertisementCount = newValue } _modify { yield &q.advertisementCount } }
    var resolveWaiters: [String: [(Bool) -> Void]] { get { q.resolveWaiters } set { q.resolveWaiters = newValue } _modify { yield &q.resolveWaiters } }
    var outgoing: Set<RadioAddress> { get { q.outgoing } set { q.outgoing = newValue } _modify { yield &q.outgoing } }
    /// Links a peer opened to us that a `connect` reused (with the timeout it was given): the peer
    /// may close them under our GATT calls, and a read that fails so connects on our own.
    var borrowedLinks: [RadioAddress: TimeInterval] { get { q.borrowedLinks } set { q.borrowedLinks = newValue } _modify { yield &q.borrowedLinks } }
    /// Outgoing connection attempts in progress, and a discovery waiting for them to end.
    var connectionAttempts: Int { get { q.connectionAttempts } set { q.connectionAttempts = newValue } _modify { yield &q.connectionAttempts } }
    var deferredScan: ScanFilter? { get { q.deferredScan } set { q.deferredScan = newValue } _modify { yield &q.deferredScan } }
    var centrals: Set<RadioAddress> { get { q.centrals } set { q.centrals = newValue } _modify { yield &q.centrals } }
    var warnedAdvertisingControl: Bool { get { q.warnedAdvertisingControl } set { q.warnedAdvertisingControl = newValue } _modify { yield &q.warnedAdvertisingControl } }
    // Recovery (BlueZTransport+Recovery): failed adapter calls in a row, the step reached on the
    // ladder (0 none, 1 power-cycled, 2 USB reset), the recovery under way.
    var adapterFailures: Int { get { q.adapterFailures } set { q.adapterFailures = newValue } _modify { yield &q.adapterFailures } }
    /// When the current run of failed adapter calls began, and since when (and why) the dongle
    /// counts as not answering (until a call succeeds, or the adapter is lost).
    var firstFailureAt: Double? { get { q.firstFailureAt } set { q.firstFailureAt = newValue } _modify { yield &q.firstFailureAt } }
    var notAnswering: (at: Double, reason: String)? { get { q.notAnswering } set { q.notAnswering = newValue } _modify { yield &q.notAnswering } }
    var ladder: Int { get { q.ladder } set { q.ladder = newValue } _modify { yield &q.ladder } }
    var pendingRecovery: PendingRecovery? { get { q.pendingRecovery } set { q.pendingRecovery = newValue } _modify { yield &q.pendingRecovery } }
    /// Peers of the outgoing connections that failed in a row since the last one that worked,
    /// and a token that a lost radio changes (an attempt from before does not count).
    var connectFailures: [RadioAddress] { get { q.connectFailures } set { q.connectFailures = newValue } _modify { yield &q.connectFailures } }
    var connectEpoch: Int { get { q.connectEpoch } set { q.connectEpoch = newValue } _modify { yield &q.connectEpoch } }
    var establishFailuresDuringRecovery: Int { get { q.establishFailuresDuringRecovery } set { q.establishFailuresDuringRecovery = newValue } _modify { yield &q.establishFailuresDuringRecovery } }
    // Discovery attempts (BlueZTransport+Central): failed starts in a row, the retry waiting, the
    // completion of the start it retries, and a token that a stop or a new start changes.
    var discoveryFailures: Int { get { q.discoveryFailures } set { q.discoveryFailures = newValue } _modify { yield &q.discoveryFailures } }
    var discoveryRetry: ScheduledTask? { get { q.discoveryRetry } set { q.discoveryRetry = newValue } _modify { yield &q.discoveryRetry } }
    var discoveryPending: ((Result<Void, TransportError>) -> Void)? { get { q.discoveryPending } set { q.discoveryPending = newValue } _modify { yield &q.discoveryPending } }
    var discoveryLastError: TransportError? { get { q.discoveryLastError } set { q.discoveryLastError = newValue } _modify { yield &q.discoveryLastError } }
    var discoveryToken: Int { get { q.discoveryToken } set { q.discoveryToken = newValue } _modify { yield &q.discoveryToken } }
    /// How slow bluetoothd answers each kind of call (CallLatency, by D-Bus member); calls run
    /// off the scheduler, so it is locked.
    private let latencyState = Mutex<[String: CallLatency]>([:])
    /// The allowance last written to log.txt for each kind of call, to log changes only.
    var latencyLogged: [String: TimeInterval] { get { q.latencyLogged } set { q.latencyLogged = newValue } _modify { yield &q.latencyLogged } }

    public init(options: Options = Options(), scheduler: DispatchScheduler) {
        self.options = options
        self.dispatch = scheduler
    }

    /// How slow bluetoothd has been seen to answer `member`, and what such a call is allowed now.
    public func latency(of member: String) -> CallLatency {
        latencyState.withLock { $0[member] } ?? CallLatency(base: options.callTimeout)
    }

    /// The kind of call bluetoothd is slowest to answer now, and its latency.
    public var slowest: (call: String, latency: CallLatency)? {
        latencyState.withLock { state in
            state.max { a, b in (a.value.timeout, b.key) < (b.value.timeout, a.key) }.map { ($0.key, $0.value) }
        }
    }

    /// Time allowed beyond the sensor's own deadlines while bluetoothd answers slowly.
    public var callAllowance: TimeInterval { slowest?.latency.extraTime ?? 0 }

    /// What the radio is coping with, for the node's status; nil when all is well.
    public var condition: String? {
        var parts: [String] = []
        if let s = slowest, let slow = s.latency.summary(of: s.call) { parts.append(slow) }
        if discoveryFailures > 0 {
            parts.append("discovery failed to start \(discoveryFailures) time(s) in a row" + (discoveryRetry != nil ? ", retrying" : ""))
        }
        if connectFailures.count >= 2 { parts.append("\(connectFailures.count) outgoing connections failed in a row") }
        if let o = outage { parts.append(o.reason) }
        return parts.isEmpty ? nil : parts.joined(separator: "; ")
    }

    private func updateLatency(_ member: String, _ change: (inout CallLatency) -> Void) {
        let base = options.callTimeout
        let l = latencyState.withLock { state in
            var l = state[member] ?? CallLatency(base: base)
            change(&l)
            state[member] = l
            return l
        }
        // log.txt says when what a kind of call is allowed changes by a quarter or more.
        dispatch.execute { [weak self] in
            guard let self else { return }
            let allowed = l.timeout, before = self.latencyLogged[member] ?? self.options.callTimeout
            guard abs(allowed - before) >= 0.25 * before else { return }
            self.latencyLogged[member] = allowed
            self.note(l.summary(of: member) ?? String(format: "bluetoothd answers %@ promptly again: allowed %.0f s", member, allowed))
        }
    }

    /// Closes the bus connection (exported objects vanish, bluetoothd drops the registrations).
    public func close() {
        let bus = self.bus
        self.bus = nil
        recoveryTask?.cancel()
        state = .unavailable
        Task { await bus?.close() }
    }

    // MARK: - Plumbing

    func note(_ message: String) { log?("BlueZ: " + message) }

    /// Runs `body` on the scheduler's queue from async code.
    func onScheduler<T>(_ body: @escaping () -> T) async -> T {
        let work = UncheckedBox(body)
        return await withCheckedContinuation { (c: CheckedContinuation<UncheckedBox<T>, Never>) in
            dispatch.queue.async { c.resume(returning: UncheckedBox(work.value())) }
        }.value
    }

    /// Runs an async operation against bluetoothd and completes on the scheduler.
    /// `adapterCall`: whether the call tells if the dongle still answers (see AdapterCall).
    func perform<T: Sendable>(_ operation: String, connecting: Bool = false, adapterCall: AdapterCall = .none,
                              _ completion: @escaping (Result<T, TransportError>) -> Void,
                              _ body: @escaping @Sendable (DBusConnection) async throws -> T) {
        guard let bus, state == .poweredOn else {
            completion(.failure(.adapterUnavailable("bluetoothd adapter \(options.adapter) is not ready")))
            return
        }
        let done = UncheckedBox(completion)
        Task {
            let result: Result<T, TransportError>
            do { result = .success(try await body(bus)) } catch {
                result = .failure(BlueZError.transportError(error, operation: operation, connecting: connecting))
            }
            self.dispatch.execute {
                if case .failure(let e) = result { self.adapterCall(adapterCall, operation, failed: e) } else { self.adapterCall(adapterCall, operation, failed: nil) }
                done.value(result)
            }
        }
    }

    /// A call to bluetoothd. Without an explicit `timeout` it is allowed what bluetoothd's
    /// measured answers say (CallLatency), and its own answer time is measured.
    func call(_ bus: DBusConnection, _ path: String, _ interface: String, _ member: String, _ arguments: [DBusValue] = [],
              timeout: TimeInterval? = nil) async throws -> [DBusValue] {
        let allowed = timeout ?? latency(of: member).timeout
        let started = ContinuousClock.now
        let seconds = { let d = ContinuousClock.now - started; return Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18 }
        do {
            let reply = try await bus.call(destination: BlueZ.service, path: path, interface: interface, member: member, arguments: arguments,
                                           timeout: BlueZ.callTimeout(allowed))
            if timeout == nil { let s = seconds(); updateLatency(member) { $0.answered(after: s) } }
            return reply
        } catch {
            if timeout == nil {
                if case .timeout = BlueZError.transportError(error, operation: member) { updateLatency(member) { $0.timedOut() } } else if error is DBusMethodError {
                    let s = seconds()
                    updateLatency(member) { $0.answered(after: s) }  // an error reply is an answer too
                }
            }
            throw error
        }
    }

    // MARK: - Power and recovery

    public func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) {
        if state == .poweredOn { completion(.success(())); return }
        powerWaiters.append(completion)
        establish()
    }

    /// Connects to the bus, subscribes, loads bluetoothd's objects, chooses and powers the adapter.
    func establish() {
        guard !establishing else { return }
        establishing = true
        Task {
            let result = await self.establishAsync()
            await self.onScheduler { self.established(result) }
        }
    }

    private func established(_ result: Result<String, TransportError>) {
        establishing = false
        let waiters = powerWaiters
        powerWaiters.removeAll()
        switch result {
        case .success(let adapter):
            adapterPath = adapter
            let recovered = wasReady && state != .poweredOn
            state = .poweredOn
            wasReady = true
            adapterFailures = 0
            recoveryTask?.cancel()
            recoveryTask = nil
            note("adapter \(adapter) powered (\(describeAdapter(adapter)))")
            for w in waiters { w(.success(())) }
            // A period without a radio (lost, or not there when first asked for) is a gap.
            if let lostSince {
                onGap?(lostSince.at, Date().timeIntervalSince1970, recovered ? "radio lost: \(lostSince.reason)" : "radio unavailable: \(lostSince.reason)")
                self.lostSince = nil
            }
            adapterBack(adapter)
            if recovered { delegate?.transport(didUpdateState: .poweredOn) }
            if recovered { stalledAcrossRestart() }
        case .failure(let error):
            if !waiters.isEmpty { note("adapter \(options.adapter) unavailable: \(error)") }
            if lostSince == nil, !waiters.isEmpty || wasReady { lostSince = (Date().timeIntervalSince1970, "\(error)") }
            for w in waiters { w(.failure(error)) }
            adapterStillAway(error)
            if wasReady { scheduleRecovery() }
        }
    }

    private func describeAdapter(_ path: String) -> String {
        let p = objects[path, BlueZ.adapter] ?? [:]
        return "address \(p["Address"]?.stringValue ?? "?"), roles \((p["Roles"]?.stringArrayValue ?? []).joined(separator: "+"))"
    }

    private func establishAsync() async -> Result<String, TransportError> {
        do {
            let bus = try await connection()
            let reply = try await call(bus, "/", DBusStandardInterface.objectManager, "GetManagedObjects")
            guard let tree = reply.first else { throw TransportError.failed("GetManagedObjects returned nothing") }
            let chosen: Result<String, TransportError> = await onScheduler {
                self.objects.load(tree)
                return self.objects.adapter(matching: self.options.adapter)
            }
            let adapter = try chosen.get()
            let powered = await onScheduler { self.objects[adapter, BlueZ.adapter]?["Powered"]?.boolValue ?? false }
            if !powered {
                _ = try await call(bus, adapter, DBusStandardInterface.properties, "Set",
                                   [.string(BlueZ.adapter), .string("Powered"), .variant(.bool(true))])
                // bluetoothd replies once the controller answered; confirm the property.
                let value = try await call(bus, adapter, DBusStandardInterface.properties, "Get",
                                           [.string(BlueZ.adapter), .string("Powered")])
                guard value.first?.boolValue == true else {
                    throw TransportError.adapterUnavailable("\(adapter) did not power on (rfkill? `rfkill unblock bluetooth`)")
                }
                await onScheduler { self.note("powered \(adapter) on") }
            }
            return .success(adapter)
        } catch {
            return .failure(BlueZError.transportError(error, operation: "adapter set-up"))
        }
    }

    /// The bus connection, opened and subscribed on first use.
    private func connection() async throws -> DBusConnection {
        if let bus = await onScheduler({ self.bus }), await bus.isConnected { return bus }
        let bus = try await DBusConnection.connect(address: options.busAddress)
        // A signal of bluetoothd's that cannot be read, or one of ours not emitted, goes to log.txt.
        await bus.onProblem { [weak self] problem in
            guard let self else { return }
            self.dispatch.queue.async { self.note("D-Bus: \(problem)") }
        }
        // Subscribe before GetManagedObjects, so no change between the two is missed.
        let events = try await bus.signals(matching: DBusMatchRule(sender: BlueZ.service))
        let owners = try await bus.signals(matching: DBusMatchRule(sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus",
                                                                   member: "NameOwnerChanged", args: [0: BlueZ.service]))
        await onScheduler { self.bus = bus }
        Task {
            for await signal in events { await self.onScheduler { self.handle(signal) } }
            // The stream ends when the connection closes.
            await self.onScheduler {
                guard self.bus === bus else { return }
                self.bus = nil
                self.lost("the D-Bus connection closed", kernelKeepsState: true)
            }
        }
        Task {
            for await signal in owners {
                let newOwner = signal.arguments.count > 2 ? signal.arguments[2].stringValue ?? "" : ""
                await self.onScheduler {
                    guard self.bus === bus else { return }
                    if newOwner.isEmpty { self.lost("bluetoothd left the bus", kernelKeepsState: true) } else if self.wasReady, self.state != .poweredOn {
                        self.note("bluetoothd is back on the bus")
                        self.establish()
                    }
                }
            }
        }
        return bus
    }

    /// bluetoothd, the adapter or the bus went away: everything registered with bluetoothd is gone.
    /// `kernelKeepsState`: bluetoothd or the bus went, but not the adapter: the kernel's connection
    /// state, and so the count of failed outgoing connections, carries over to its return.
    func lost(_ reason: String, kernelKeepsState: Bool = false) {
        let wasOn = state == .poweredOn
        state = .unavailable
        adapterFailures = 0
        firstFailureAt = nil
        // A dongle that had stopped answering was already without a radio since then.
        let silent = notAnswering
        notAnswering = nil
        scanning = false
        deferredScan = nil
        endDiscoveryAttempts(.adapterUnavailable(reason))
        connectionAttempts = 0
        connectEpoch &+= 1
        if !kernelKeepsState { connectFailures.removeAll() }
        borrowedLinks.removeAll()
        applicationRegistered = false
        advertisementRegistered = false
        for (_, waiters) in resolveWaiters { for w in waiters { w(false) } }
        resolveWaiters.removeAll()
        let links = outgoing
        outgoing.removeAll()
        let remotes = centrals
        centrals.removeAll()
        if wasOn {
            lostSince = silent.map { ($0.at, "dongle not answering (\($0.reason)), then \(reason)") } ?? (Date().timeIntervalSince1970, reason)
            note("radio lost: \(reason); retrying every \(Saturating.int(options.recoveryInterval)) s")
            for a in links.sorted(by: { $0.value < $1.value }) { delegate?.transport(didDisconnect: a) }
            if let server { for a in remotes.sorted(by: { $0.value < $1.value }) { server.gattCentralDisconnected(a) } }
            delegate?.transport(didUpdateState: .unavailable)
        }
        scheduleRecovery()
    }

    func scheduleRecovery() {
        guard wasReady, recoveryTask == nil else { return }
        recoveryTask = dispatch.schedule(after: options.recoveryInterval) { [weak self] in
            guard let self else { return }
            self.recoveryTask = nil
            guard self.state != .poweredOn else { return }
            self.establish()
        }
    }

    // MARK: - Signals

    func handle(_ signal: DBusSignal) {
        switch (signal.interface, signal.member) {
        case (DBusStandardInterface.objectManager, "InterfacesAdded"):
            guard signal.arguments.count >= 2, let path = signal.arguments[0].stringValue else { return }
            objects.add(path: path, interfaces: signal.arguments[1])
            if path == adapterPath || (adapterPath == nil && state != .poweredOn) {
                if wasReady, state != .poweredOn { establish() }
            } else if scanning, isOurDevice(path), objects[path, BlueZ.device] != nil, let report = objects.report(device: path) {
                delegate?.transport(didReceive: report)
            }
        case (DBusStandardInterface.objectManager, "InterfacesRemoved"):
            guard signal.arguments.count >= 2, let path = signal.arguments[0].stringValue else { return }
            let removed = objects.remove(path: path, interfaces: signal.arguments[1].stringArrayValue ?? [])
            if path == adapterPath, removed.contains(BlueZ.adapter), state == .poweredOn {
                lost("adapter \(path) removed")
            } else if removed.contains(BlueZ.device), isOurDevice(path), let address = BlueZ.address(inPath: path) {
                linkDown(address, path: path)
            }
        case (DBusStandardInterface.properties, "PropertiesChanged"):
            guard signal.arguments.count >= 2, let interface = signal.arguments[0].stringValue else { return }
            let invalidated = signal.arguments.count > 2 ? signal.arguments[2].stringArrayValue ?? [] : []
            let changed = objects.update(path: signal.path, interface: interface, changed: signal.arguments[1], invalidated: invalidated)
            guard !changed.isEmpty else { return }
            if interface == BlueZ.device, isOurDevice(signal.path) {
                deviceChanged(signal.path, changed)
            } else if interface == BlueZ.adapter, signal.path == adapterPath, changed.contains("Powered"),
                      objects[signal.path, BlueZ.adapter]?["Powered"]?.boolValue == false, state == .poweredOn {
                lost(pendingRecovery?.action == .powerCycle ? "adapter \(signal.path) power-cycled to recover it" : "adapter \(signal.path) was powered off")
            }
        default:
            break
        }
    }

    private func isOurDevice(_ path: String) -> Bool {
        guard let adapterPath else { return false }
        return path.hasPrefix(adapterPath + "/dev_")
    }

    private static let reportProperties: Set<String> = ["RSSI", "ManufacturerData", "ServiceData", "TxPower", "UUIDs"]

    private func deviceChanged(_ path: String, _ changed: Set<String>) {
        let props = objects[path, BlueZ.device] ?? [:]
        // With DuplicateData every advert re-sends ManufacturerData/ServiceData: each is a sighting.
        if scanning, !changed.isDisjoint(with: Self.reportProperties), let report = objects.report(device: path) {
            delegate?.transport(didReceive: report)
        }
        if changed.contains("ServicesResolved"), props["ServicesResolved"]?.boolValue == true,
           let waiters = resolveWaiters.removeValue(forKey: path) {
            for w in waiters { w(true) }
        }
        if changed.contains("Connected"), props["Connected"]?.boolValue == false, let address = BlueZ.address(inPath: path) {
            linkDown(address, path: path)
        }
    }

    private func linkDown(_ address: RadioAddress, path: String) {
        if let waiters = resolveWaiters.removeValue(forKey: path) { for w in waiters { w(false) } }
        if outgoing.remove(address) != nil { delegate?.transport(didDisconnect: address) }
        if centrals.remove(address) != nil { server?.gattCentralDisconnected(address) }
    }
}
