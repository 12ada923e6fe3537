import Foundation
import HeraldCore
import HeraldRadio
import LabHTTP
import LabPlan
import BlueZRadio
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A pre-flight check in progress or done on this agent's dongle (on the scheduler's queue).
final class DongleCheckSession {
    let request: LabWire.PreflightRequest
    let check: DongleCheck
    var started = false
    var stopping = false
    var final: LabWire.PreflightReport?
    var stopTask: ScheduledTask?
    init(request: LabWire.PreflightRequest, check: DongleCheck) { self.request = request; self.check = check }
}

/// The agent's dongle (radio bluez), as a service of its own (issue 39 item 3): who it is (sysfs,
/// the kernel, bluetoothd, HCI) as last looked at, and its pre-flight check for the coordinator
/// (POST /v1/preflight, GET, POST /v1/preflight/stop). What a running node's radio does to keep
/// it working is the run's (RunLifecycle).
///
/// Concurrency: the dongle as last looked at is in a `Mutex` (`stack`); the check is the
/// executor's (`scheduler`: `DongleCheck` runs there), checked on every access; looking at the
/// dongle again after a check is asked of `refreshes()`, the agent's background child task.
final class DongleService: Sendable {
    let config: Agent.Config
    let scheduler: any SerialScheduler
    let logger: Logger
    /// The Bluetooth controller's identity (BlueZ radio), read once at start.
    let controllerIdentity: ControllerIdentity?
    /// The bluetoothd version read at the last arming, and the dongle as last looked at.
    struct Stack {
        var bluezVersion: String?
        var dongleInfo: LabWire.DongleInfo?
    }
    let stack = Mutex(Stack())
    private let refresh: AsyncStream<Void>
    private let refreshRequests: AsyncStream<Void>.Continuation

    init(config: Agent.Config, scheduler: any SerialScheduler, logger: Logger, controllerIdentity: ControllerIdentity?) {
        self.config = config
        self.scheduler = scheduler
        self.logger = logger
        self.controllerIdentity = controllerIdentity
        (refresh, refreshRequests) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    final class OnExecutor {
        var check: DongleCheckSession?
    }
    /// Invariant: only used on the scheduler's executor; `check` checks that on every access.
    private let confined = UncheckedBox(OnExecutor())
    /// A pre-flight check of the dongle, on the executor.
    var check: DongleCheckSession? {
        get { scheduler.assertOnExecutor(); return confined.value.check }
        set { scheduler.assertOnExecutor(); confined.value.check = newValue }
    }
    /// On the executor: a check that has not ended (arming is refused meanwhile).
    var checkInProgress: DongleCheckSession? { check.flatMap { $0.final == nil ? $0 : nil } }

    /// Looks at the dongle again each time a check ends (`refreshRequests`), until cancelled.
    func refreshes() async {
        for await _ in refresh { await refreshDongle() }
    }

    /// Ends `refreshes()`.
    func finish() { refreshRequests.finish() }

    /// This machine's name, when it is a plain host name.
    static func hostName() -> String? {
        var buf = [CChar](repeating: 0, count: 256)
        guard gethostname(&buf, buf.count - 1) == 0 else { return nil }
        let name = String(cString: buf)
        return SafeName.isValid(name) ? name : nil
    }

    /// Looks at the dongle again (present, hciN, powered, USB identity).
    func refreshDongle() async {
        let selector = config.adapter ?? "hci0"
        let survey = await LocalDongles.survey(sysfsRoot: config.sysfsRoot, identities: false)
        let local = LocalDongles.find(selector, in: survey.dongles)
        var info = Self.dongleInfo(local, selector: selector, name: config.dongleName ?? config.name, host: config.hostName ?? Self.hostName(), agent: config.name,
                                   tags: config.tags, identity: controllerIdentity)
        if local == nil, !survey.problems.isEmpty { info.problem = [info.problem, survey.problems.joined(separator: "; ")].compactMap { $0 }.joined(separator: "; ") }
        stack.withLock { $0.dongleInfo = info }
    }

    /// A dongle as the lab describes it, from what this host knows of it.
    public static func dongleInfo(_ local: LocalDongle?, selector: String, name: String, host: String?, agent: String?, tags: [String],
                                  identity: ControllerIdentity?) -> LabWire.DongleInfo {
        let address = local?.address ?? LabWire.normalisedAddress(selector) ?? identity?.controller?.address
        var d = LabWire.DongleInfo(id: address, name: name, present: local != nil)
        d.host = host
        d.agent = agent
        d.adapter = local?.adapter
        d.powered = local?.powered
        if local == nil { d.problem = "adapter \(selector) is not on this host" }
        let known = local?.identity ?? identity
        if let c = known?.controller, address == nil || c.address == address {
            d.manufacturer = c.manufacturer
            d.manufacturerName = c.manufacturerName
            d.hciVersion = c.hciVersion
            d.hciRevision = c.hciRevision
            d.lmpVersion = c.lmpVersion
            d.lmpSubversion = c.lmpSubversion
        } else if let reason = known?.unavailableReason, local != nil {
            d.problem = "controller identity unavailable: \(reason)"
        }
        if let s = local?.sysfs {
            d.bus = s.bus
            d.driver = s.driver
            d.driverVersion = s.driverVersion
            d.firmware = s.firmware
            d.hardware = s.hardware
            if let u = s.usb {
                var usb = LabWire.USBInfo(vendor: u.vendor, product: u.product, port: u.port)
                usb.serial = u.serial
                usb.manufacturerString = u.manufacturer
                usb.productString = u.productName
                usb.release = u.release
                d.usb = usb
            }
            if let blocked = s.rfkillBlocked { d.problem = "rfkill blocks it (\(blocked)); rfkill unblock bluetooth" }
        }
        d.tags = tags.isEmpty ? nil : tags
        return d
    }

    // MARK: Pre-flight

    /// Starts a check (or answers for the one with this id): returns once the dongle is
    /// scanning, or failed a stage.
    /// `busyWith`, on the executor: the run the agent is busy with, if any (a check is refused then).
    func startPreflight(_ request: LabWire.PreflightRequest, busyWith: () -> String?) async throws -> LabWire.PreflightReport {
        guard SafeName.isValid(request.id) else { throw LabRefusal(.invalid, "check id \(SafeName.problem(with: request.id) ?? "is invalid")") }
        guard request.bound.isFinite, request.bound >= 1, request.bound <= 600 else { throw LabRefusal(.invalid, "bound must be 1 to 600 seconds") }
        guard request.peers.count <= 1000 else { throw LabRefusal(.invalid, "at most 1000 peers") }
        guard config.radio == .bluez else { throw LabRefusal(.unprocessable, "agent \(config.name) has no dongle (radio \(config.radio.rawValue))") }
        await refreshDongle()
        guard let dispatch = scheduler as? DispatchScheduler else {
            throw LabRefusal(.unprocessable, "agent \(config.name): its dongle check runs on a dispatch queue, not on the scheduler the agent was given")
        }
        let box: UncheckedBox<DongleCheckSession> = try scheduler.sync {
            if let r = busyWith() { throw LabRefusal(.conflict, "agent \(config.name) is busy with run \(r)") }
            if let c = check, c.request.id == request.id { return UncheckedBox(c) }
            if let c = check, c.final == nil { throw LabRefusal(.conflict, "agent \(config.name) is checking its dongle for \(c.request.id)") }
            // bluetoothd answers slowly while it sets up several adapters of one host at once.
            let dc = DongleCheck(adapter: config.adapter ?? "hci0", busAddress: nil, company: LabWire.preflightCompany,
                                 beacon: LabWire.preflightData(request.beacon), scheduler: dispatch, callTimeout: min(30, max(10, request.bound / 2)))
            dc.expected = Set(request.peers.map(LabWire.preflightData))
            // What the check sees, in the agent's log with the check's id (the agent's logger
            // carries dongle): each peer heard at debug level, anything else (a dongle it could
            // not power off first) as a warning.
            let logger = self.logger, checkId = request.id
            dc.log = { line in
                logger.log(level: line.hasPrefix("heard ") ? .debug : .warning, "check \(checkId): \(line)", metadata: ["check": .string(checkId)])
            }
            let s = DongleCheckSession(request: request, check: dc)
            check = s
            s.stopTask = scheduler.schedule(after: request.bound + 15) { [weak self, weak s] in
                guard let self, let s else { return }
                self.logger.warning("check \(s.request.id) ends on its own (its bound passed)", metadata: ["check": .string(s.request.id)])
                self.finishCheck(s) { _ in }
            }
            return UncheckedBox(s)
        }
        let session = box.value
        let first = scheduler.sync { () -> Bool in
            defer { session.started = true }
            return !session.started
        }
        if first {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                scheduler.execute { session.check.start { _ in c.resume() } }
            }
            let r = scheduler.sync { report(session, session.check.current) }
            let line: Logger.Message = "check \(request.id): \(r.problem ?? "present, powered, advertising, scanning")"
            logger.log(level: r.problem == nil ? .info : .warning, line, metadata: ["check": .string(request.id)])
            if r.problem != nil { _ = await stopPreflight() }
        }
        return scheduler.sync { session.final ?? report(session, session.check.current) }
    }

    /// The check's findings so far.
    func preflightStatus() throws -> LabWire.PreflightReport {
        try scheduler.sync {
            guard let s = check else { throw LabRefusal(.notFound, "agent \(config.name) has no dongle check") }
            return s.final ?? report(s, s.check.current)
        }
    }

    /// Ends the check (advertising and scanning stop) and returns its final findings.
    func stopPreflight() async -> LabWire.PreflightReport? {
        guard let box = scheduler.sync({ check.map(UncheckedBox.init) }) else { return nil }
        let s = box.value
        if let f = scheduler.sync({ s.final }) { return f }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            scheduler.execute { self.finishCheck(s) { _ in c.resume() } }
        }
        return scheduler.sync { s.final }
    }

    /// On the scheduler: stops the check once, keeps its final report.
    func finishCheck(_ s: DongleCheckSession, _ done: @escaping (LabWire.PreflightReport) -> Void) {
        if let f = s.final { return done(f) }
        if s.stopping {
            // Another caller is stopping it: wait for that.
            scheduler.schedule(after: 0.1) { [weak self] in self?.finishCheck(s, done) }
            return
        }
        s.stopping = true
        s.stopTask?.cancel()
        s.check.stop { [weak self] findings in
            guard let self else { return }
            let r = self.report(s, findings)
            s.final = r
            self.logger.info("check \(s.request.id) done: heard \(r.seen.count) of \(s.request.peers.count) other dongles in \(String(format: "%.1f", r.elapsed)) s",
                             metadata: ["check": .string(s.request.id)])
            done(r)
            self.refreshRequests.yield() // powered, hciN: as the check left it
        }
    }

    func report(_ s: DongleCheckSession, _ f: DongleCheck.Findings) -> LabWire.PreflightReport {
        var r = LabWire.PreflightReport(id: s.request.id, agent: config.name)
        var d = stack.withLock { $0.dongleInfo }
        if let adapter = f.adapter { d?.adapter = adapter; d?.present = true }
        if f.powered { d?.powered = true }
        r.dongle = d
        r.present = f.present
        r.powered = f.powered
        r.advertising = f.advertising
        r.scanning = f.scanning
        r.problem = f.problem
        r.poweredAfter = f.poweredAfter
        r.advertisingAfter = f.advertisingAfter
        r.elapsed = f.elapsed
        r.finished = f.finished
        let peers = Set(s.request.peers)
        r.seen = f.heard.compactMap { data, seen -> LabWire.PreflightReport.Sighting? in
            guard let b = LabWire.preflightBeacon(data), peers.contains(b) else { return nil }
            return LabWire.PreflightReport.Sighting(beacon: b, after: seen.after, rssi: seen.rssi)
        }.sorted { $0.beacon < $1.beacon }
        return r
    }
}
