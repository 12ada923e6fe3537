// DongleCheck: a dongle's pre-flight check through bluetoothd. In order: the adapter is present
// (bluetoothd lists it, by name or address), it powers on, it can advertise (a beacon: the
// manufacturer data it is given), and, while it advertises, its scan reports which of the other
// dongles' beacons it hears, when first and how loud. The coordinator runs the same check on
// every dongle of a run at once and reads who heard whom.
import Foundation
import HeraldCore
import HeraldRadio

/// Not Sendable: used on its scheduler's queue only (the `Scheduler` seam); the calls to
/// bluetoothd that run as tasks carry it in the seam's box (`UncheckedBox`) and hop back onto
/// the queue before touching it.
public final class DongleCheck: BLETransportDelegate {
    public struct Sighting: Sendable, Equatable {
        /// Seconds after the check began, and the RSSI of that first report.
        public var after: Double
        public var rssi: Int
    }

    /// What the check found so far.
    public struct Findings: Sendable, Equatable {
        public var present = false
        /// The adapter's name (hciN) when present.
        public var adapter: String?
        public var powered = false
        public var advertising = false
        public var scanning = false
        public var problem: String?
        public var poweredAfter: Double?
        public var advertisingAfter: Double?
        /// Beacons heard (the manufacturer data bytes of `company`), each when first heard.
        public var heard: [Data: Sighting] = [:]
        public var elapsed: Double = 0
        public var finished = false
    }

    public let company: UInt16
    public let beacon: Data
    /// The other dongles' beacons: once all are heard, the check stops scanning (and keeps
    /// advertising for the others), which spares bluetoothd a flood of reports.
    public var expected: Set<Data> = []
    /// Advertising interval of the beacon (seconds).
    public var interval: TimeInterval = 0.5
    private let transport: BlueZTransport
    private let scheduler: DispatchScheduler
    private let selector: String
    private let busAddress: String?
    private let started = Date()
    private var findings = Findings()
    private var scanStopped = false
    /// Called on the scheduler with every report whose manufacturer data carries `company`.
    public var log: ((String) -> Void)?

    /// `objectRoot`: where the check exports its advertisement (not the node's).
    public init(adapter: String, busAddress: String?, company: UInt16, beacon: Data, scheduler: DispatchScheduler, callTimeout: TimeInterval = 10) {
        self.company = company
        self.beacon = beacon
        self.scheduler = scheduler
        self.selector = adapter
        self.busAddress = busAddress
        transport = BlueZTransport(options: .init(adapter: adapter, busAddress: busAddress, objectRoot: "/org/heraldlab/preflight",
                                                  callTimeout: callTimeout, recoveryInterval: 3600), scheduler: scheduler)
    }

    /// What was found so far (call on the scheduler).
    public var current: Findings {
        var f = findings
        f.elapsed = Date().timeIntervalSince(started)
        return f
    }

    private var since: Double { Date().timeIntervalSince(started) }

    /// Runs the stages; `done` is called on the scheduler once the check is scanning, or has
    /// failed a stage (its problem set).
    public func start(_ done: @escaping (Findings) -> Void) {
        let selector = self.selector, busAddress = self.busAddress
        let box = UncheckedBox(done), me = UncheckedBox(self), scheduler = self.scheduler
        Task {
            let listed = await BlueZAdapters.list(busAddress: busAddress)
            scheduler.execute { me.value.afterListing(listed, selector, box.value) }
        }
    }

    private func afterListing(_ listed: Result<[BlueZAdapter], BlueZVersionError>, _ selector: String, _ done: @escaping (Findings) -> Void) {
        switch listed {
        case .failure(let e):
            return fail("present", "\(e)", done)
        case .success(let adapters):
            let address = SysfsBluetooth.address(selector)
            guard let a = adapters.first(where: { address != nil ? $0.address == address : $0.name == selector }) else {
                let have = adapters.map { "\($0.name)\($0.address.map { " (\($0))" } ?? "")" }
                return fail("present", "adapter \(selector) is not there; bluetoothd has \(have.isEmpty ? "no adapter" : have.joined(separator: ", "))", done)
            }
            findings.present = true
            findings.adapter = a.name
            if a.powered {
                // Every check starts from a freshly powered adapter: bluetoothd's idea of the
                // adapter's discovery and advertising is reset with it (BlueZ 5.66 can be left
                // believing it discovers after a StopDiscovery the kernel refused).
                let path = a.path, busAddress = self.busAddress
                let box = UncheckedBox(done), me = UncheckedBox(self), scheduler = self.scheduler
                Task {
                    let off = await BlueZAdapters.setPowered(path, false, busAddress: busAddress)
                    scheduler.execute {
                        if case .failure(let e) = off { me.value.log?("could not power \(path) off before the check: \(e)") }
                        me.value.powerAndListen(box.value)
                    }
                }
                return
            }
        }
        powerAndListen(done)
    }

    private func powerAndListen(_ done: @escaping (Findings) -> Void) {
        transport.delegate = self
        transport.powerOn { [self] result in
            if case .failure(let e) = result { return fail("powered", "\(e)", done) }
            findings.powered = true
            findings.poweredAfter = since
            let ad = Advertisement(serviceUUIDs: [], manufacturerData: [company: beacon], interval: interval)
            transport.startAdvertising(ad) { [self] result in
                if case .failure(let e) = result { return fail("advertising", "\(e)", done) }
                findings.advertising = true
                findings.advertisingAfter = since
                // Every advert reported (DuplicateData), as the sensor scans: with DuplicateData
                // false, BlueZ 5.82 adds a found device with neither RSSI nor ManufacturerData and
                // sends no change after, so no beacon is ever heard (seen in the trixie guest).
                transport.startScanning(filter: ScanFilter()) { [self] result in
                    if case .failure(let e) = result { return fail("scanning", "\(e)", done) }
                    findings.scanning = true
                    done(current)
                }
            }
        }
    }

    private func fail(_ stage: String, _ why: String, _ done: (Findings) -> Void) {
        findings.problem = "\(stage == "present" ? "not present" : stage == "powered" ? "cannot power on" : stage == "advertising" ? "cannot advertise" : "cannot scan"): \(why)"
        done(current)
    }

    /// Stops advertising and scanning and lets go of bluetoothd; `done` gets the final findings.
    public func stop(_ done: @escaping (Findings) -> Void) {
        let t = transport
        let finish = { [self] in
            t.close()
            findings.finished = true
            let final = current
            guard let adapter = findings.adapter, findings.powered else { return done(final) }
            // Left as it was found, powered, and freshly so (see above): what runs next on it
            // does not inherit the check's discovery.
            let path = "/org/bluez/" + adapter, busAddress = self.busAddress
            let box = UncheckedBox(done), scheduler = self.scheduler
            Task {
                _ = await BlueZAdapters.setPowered(path, false, busAddress: busAddress)
                _ = await BlueZAdapters.setPowered(path, true, busAddress: busAddress)
                scheduler.execute { box.value(final) }
            }
        }
        guard findings.powered, t.state == .poweredOn else { return finish() }
        let scanning = findings.scanning && !scanStopped
        scanStopped = true
        let unadvertise = { t.stopAdvertising { _ in finish() } }
        if scanning { t.stopScanning { _ in unadvertise() } } else { unadvertise() }
    }

    // MARK: BLETransportDelegate

    public func transport(didUpdateState state: RadioState) {
        if state != .poweredOn, findings.problem == nil, findings.scanning {
            findings.problem = "the adapter went away during the check"
        }
    }

    public func transport(didReceive report: ScanReport) {
        guard let data = report.manufacturerData[company], data != beacon, findings.heard[data] == nil else { return }
        findings.heard[data] = Sighting(after: since, rssi: report.rssi)
        log?("heard \(report.address) after \(String(format: "%.1f", since)) s (RSSI \(report.rssi))")
        if !expected.isEmpty, !scanStopped, expected.isSubset(of: Set(findings.heard.keys)) {
            scanStopped = true
            transport.stopScanning { _ in }
        }
    }

    public func transport(didDisconnect address: RadioAddress) {}
}
