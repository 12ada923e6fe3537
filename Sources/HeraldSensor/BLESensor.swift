import Foundation
import HeraldCore
import HeraldRadio

/// The Herald BLE sensor, modelled on Herald's Android sensor: advertise the Herald service with
/// a pseudo device address, serve the payload and signal characteristics, scan in cycles, keep a
/// device database, read each new peer's payload once, measure RSSI from every advert.
///
/// It reaches the radio only through `BLETransport`, and time and randomness only through the
/// transport's scheduler and a seeded generator, so the same engine runs on BlueZ in real time and
/// on the simulated radio in virtual time. Everything runs on the scheduler's executor.
public final class BLESensor: Sensor {
    public let transport: any BLETransport
    public let settings: BLESensorSettings
    public let payloadDataSupplier: any PayloadDataSupplier
    private let scheduler: any Scheduler
    private var random: SeededGenerator
    private let log: (any SensorLog)?
    private var delegates: [any SensorDelegate] = []

    // Device database: a list for deterministic iteration, maps for lookup.
    private var deviceList: [BLEDevice] = []
    private var byAddress: [RadioAddress: BLEDevice] = [:]
    private var byPseudo: [PseudoDeviceAddress: BLEDevice] = [:]

    private var running = false
    private var scanning = false
    private var processing = false
    private var busy = false
    private var cycleTasks: [ScheduledTask] = []
    private var attemptedThisCycle = Set<TargetIdentifier>()
    private var operationToken: UInt64 = 0
    private var reassembler = SignalReassembler<RadioAddress>()

    public private(set) var pseudoDeviceAddress: PseudoDeviceAddress?
    public private(set) var isAdvertising = false
    private var canAdvertise = true
    private var serviceRegistered = false
    private var lastCentralActivity: Date
    private var ownPayload: PayloadData?
    /// The radio went off while a pseudo address was in use: draw a new one when it is back.
    private var pseudoRenewalDue = false

    public static let subsystem = "Sensor"

    public static let service = GATTService(uuid: HeraldUUIDs.service, characteristics: [
        GATTCharacteristic(uuid: HeraldUUIDs.payloadCharacteristic, properties: [.read]),
        GATTCharacteristic(uuid: HeraldUUIDs.androidSignalCharacteristic, properties: [.write, .writeWithoutResponse]),
    ])

    public init(transport: any BLETransport, payloadDataSupplier: any PayloadDataSupplier, settings: BLESensorSettings = BLESensorSettings(), random: SeededGenerator, log: (any SensorLog)? = nil) {
        self.transport = transport
        self.scheduler = transport.scheduler
        self.payloadDataSupplier = payloadDataSupplier
        self.settings = settings
        self.random = random
        self.log = log
        self.lastCentralActivity = transport.scheduler.now
    }

    // MARK: Sensor

    public func add(delegate: any SensorDelegate) { delegates.append(delegate) }

    /// The devices currently in the database, in the order they were created.
    public var devices: [BLEDevice] { deviceList }

    public func start() {
        guard !running else { return }
        running = true
        lastCentralActivity = scheduler.now
        ownPayload = payloadDataSupplier.payload(scheduler.now)
        transport.delegate = self
        info("start (payload \(ownPayload?.shortName ?? "none"))")
        transport.powerOn { [weak self] result in
            guard let self, self.running else { return }
            switch result {
            case .success: self.radioReady()
            case .failure(let error):
                self.fault("radio unavailable: \(error); retrying in 10s")
                self.notify { $0.sensor(.BLE, didUpdateState: .unavailable) }
                self.scheduler.schedule(after: 10) { [weak self] in
                    guard let self, self.running else { return }
                    self.running = false
                    self.start()
                }
            }
        }
    }

    public func stop() {
        guard running else { return }
        running = false
        for t in cycleTasks { t.cancel() }
        cycleTasks.removeAll()
        operationToken &+= 1
        if scanning { transport.stopScanning { _ in } }
        scanning = false
        processing = false
        busy = false
        if isAdvertising { transport.stopAdvertising { _ in } }
        isAdvertising = false
        info("stop")
        notify { $0.sensor(.BLE, didUpdateState: .off) }
    }

    // MARK: Start-up

    private func radioReady() {
        notify { $0.sensor(.BLE, didUpdateState: .on) }
        if pseudoRenewalDue {
            // Herald's Android transmitter renews its pseudo address when Bluetooth restarts.
            pseudoRenewalDue = false
            pseudoDeviceAddress = nil
            lastCentralActivity = scheduler.now
            info("renewing pseudo address (the radio was off)")
        }
        if !serviceRegistered {
            transport.register(service: Self.service, server: self) { [weak self] result in
                guard let self, self.running else { return }
                switch result {
                case .success:
                    self.serviceRegistered = true
                    self.debug("GATT service registered")
                case .failure(let error):
                    self.fault("GATT service registration failed: \(error); peers cannot read this node's payload")
                }
                self.startAdvertising()
            }
        } else {
            startAdvertising()
        }
        beginScan()
    }

    /// Seconds between attempts to advertise after a failure that may pass.
    var advertisingRetry: TimeInterval = 10

    private func startAdvertising() {
        if settings.pseudoAddress, pseudoDeviceAddress == nil {
            pseudoDeviceAddress = PseudoDeviceAddress(using: &random)
        }
        let ad = Advertisement(
            serviceUUIDs: [HeraldUUIDs.service],
            manufacturerData: pseudoDeviceAddress.map(HeraldManufacturerData.advertised) ?? [:],
            txPower: settings.txPower, includeTxPower: settings.includeTxPower, interval: settings.advertInterval)
        transport.startAdvertising(ad) { [weak self] result in
            guard let self, self.running else { return }
            switch result {
            case .success:
                self.isAdvertising = true
                self.canAdvertise = true
                self.info("advertising (pseudo address \(self.pseudoDeviceAddress?.description ?? "off"))")
            case .failure(let error):
                self.isAdvertising = false
                self.canAdvertise = false
                self.fault("advertising failed: \(error); writing payload to peers instead")
                // A radio that cannot advertise at all says so (notSupported); anything else may
                // be passing (bluetoothd back on the bus before its advertising manager), so the
                // advertisement is tried again while the radio stays on.
                if case .notSupported = error { return }
                self.scheduler.schedule(after: self.advertisingRetry) { [weak self] in
                    guard let self, self.running, !self.isAdvertising, self.transport.state == .poweredOn else { return }
                    self.info("advertising: trying again")
                    self.startAdvertising()
                }
            }
        }
    }

    private func renewPseudoAddressIfIdle() {
        guard settings.pseudoAddress, isAdvertising,
              scheduler.now.timeIntervalSince(lastCentralActivity) >= settings.pseudoAddressRenewal else { return }
        lastCentralActivity = scheduler.now
        pseudoDeviceAddress = PseudoDeviceAddress(using: &random)
        info("renewing pseudo address (nothing connected for \(Saturating.int(settings.pseudoAddressRenewal))s)")
        transport.stopAdvertising { [weak self] _ in
            guard let self, self.running else { return }
            self.isAdvertising = false
            self.startAdvertising()
        }
    }

    // MARK: Scan cycle

    private func beginScan() {
        guard running else { return }
        cycleTasks.removeAll { $0.isCancelled }
        scanning = true
        processing = false
        transport.startScanning(filter: ScanFilter()) { [weak self] result in
            if case .failure(let error) = result { self?.fault("scan failed to start: \(error)") }
        }
        cycleTasks.append(scheduler.schedule(after: settings.scanOn) { [weak self] in self?.endScan() })
    }

    private func endScan() {
        guard running else { return }
        scanning = false
        transport.stopScanning { [weak self] result in
            if case .failure(let error) = result { self?.debug("scan stop: \(error)") }
        }
        processing = true
        attemptedThisCycle.removeAll(keepingCapacity: true)
        if filteredThisCycle > 0 {
            debug("scan filter refused \(filteredThisCycle) report(s) from devices that are not Herald")
            filteredThisCycle = 0
        }
        purge()
        renewPseudoAddressIfIdle()
        processNext()
        cycleTasks = [scheduler.schedule(after: settings.scanRest + settings.scanOff) { [weak self] in self?.beginScan() }]
    }

    private func purge() {
        let now = scheduler.now
        var kept = [BLEDevice]()
        kept.reserveCapacity(deviceList.count)
        for d in deviceList {
            if now.timeIntervalSince(d.lastUpdatedAt) >= settings.purgeAfter {
                remove(d)
                info("purged \(d.identifier) (not seen for \(Saturating.int(now.timeIntervalSince(d.lastUpdatedAt)))s)")
                notify { $0.sensor(.BLE, available: false, didDeleteOrDetect: d.identifier) }
            } else {
                kept.append(d)
            }
        }
        deviceList = kept
    }

    private func remove(_ d: BLEDevice) {
        if let a = d.address, byAddress[a] === d { byAddress[a] = nil }
        if let p = d.pseudoAddress, byPseudo[p] === d { byPseudo[p] = nil }
    }

    // MARK: Advertising reports

    /// Advertising reports refused by the scan filter (`BLESensorSettings.advertFilter`) since start.
    public private(set) var reportsFiltered = 0
    private var filteredThisCycle = 0

    private func handle(_ report: ScanReport) {
        guard running else { return }
        let now = scheduler.now
        let filter = settings.advertFilter
        // One lookup by address; the pseudo address is looked up only where it can decide
        // (a device not known by its address, or a report that admits no new device).
        let knownByAddress = byAddress[report.address]
        // What the advert shows depends on its content alone: a known device's repeated advert
        // is not parsed again.
        let signs: AdvertFilter.Signs
        if let d = knownByAddress, let last = d.lastAdvert,
           last.serviceUUIDs == report.serviceUUIDs, last.manufacturerData == report.manufacturerData {
            signs = last.signs
        } else {
            signs = filter.signs(of: report)
            knownByAddress?.lastAdvert = (report.manufacturerData, report.serviceUUIDs, signs)
        }
        let knownByPseudo = knownByAddress == nil || !signs.admitsNewDevice ? signs.pseudoAddress.flatMap { byPseudo[$0] } : nil
        let known = knownByAddress ?? knownByPseudo
        // Herald's scan filter: nothing else enters the database (no detect row, no RSSI rows).
        guard signs.admitsNewDevice || knownByPseudo != nil else { refuse(); return }
        var ignoredApple: String?
        if signs.appleOnly, let apple = report.manufacturerData[ManufacturerID.apple], known?.os != .ios {
            ignoredApple = filter.ignoredApplePattern(apple)
            if ignoredApple != nil && known == nil { refuse(); return }
        }
        let device: BLEDevice
        if let known = knownByAddress {
            device = known
        } else if let known = knownByPseudo, let pseudo = signs.pseudoAddress {
            // The same device under a new MAC: follow it, keep its identity and payload.
            if let old = known.address, byAddress[old] === known { byAddress[old] = nil }
            known.address = report.address
            byAddress[report.address] = known
            device = known
            debug("\(known.identifier) now at \(report.address) (pseudo address \(pseudo))")
        } else {
            device = BLEDevice(identifier: TargetIdentifier(report.address.value), address: report.address, now: now)
            deviceList.append(device)
            byAddress[report.address] = device
            notify { $0.sensor(.BLE, didDetect: device.identifier) }
        }
        device.lastUpdatedAt = now
        device.rssi = report.rssi
        device.txPower = report.txPower
        if signs.heraldService {
            device.hasHeraldService = true
            if device.receiveOnly {
                // A node writes to peers only while it cannot advertise (bluetoothd back on the bus
                // before its advertising manager); advertising Herald again, it can be read again.
                device.receiveOnly = false
                info("\(device.identifier) advertises Herald again: no longer receive-only")
            }
        }
        if signs.appleData { device.hasAppleData = true }
        if let pseudo = signs.pseudoAddress, device.pseudoAddress != pseudo {
            if let old = device.pseudoAddress, byPseudo[old] === device { byPseudo[old] = nil }
            device.pseudoAddress = pseudo
            byPseudo[pseudo] = device
        }
        if device.os == .unknown || device.os == .iosProbable {
            if device.hasHeraldService { device.os = device.hasAppleData ? .ios : .android }
            else if device.hasAppleData { device.os = .iosProbable }
        }
        if let until = device.ignoreUntil, until > now { return }
        if let pattern = ignoredApple {
            ignore(device, because: "its Apple advert is of a kind that cannot host Herald (\(pattern))")
            return
        }
        if !device.mayBeHerald {
            ignore(device, because: "advertises neither the Herald service nor Apple data")
            return
        }
        let proximity = Proximity.rssi(report.rssi, txPower: report.txPower)
        let id = device.identifier
        notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id) }
        if let payload = device.payload {
            notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id, withPayload: payload) }
        }
    }

    private func refuse() {
        reportsFiltered += 1
        filteredThisCycle += 1
    }

    private func ignore(_ device: BLEDevice, because reason: String) {
        let duration = min(settings.ignoreMax, settings.ignoreBase * pow(settings.ignoreFactor, Double(device.ignoreCount)))
        device.ignoreCount += 1
        device.ignoreUntil = scheduler.now.addingTimeInterval(duration)
        device.os = device.os == .unknown ? .notHerald : device.os
        debug("ignoring \(device.identifier) for \(Saturating.int(duration))s: \(reason)")
    }

    // MARK: Per-device actions

    enum Action: Equatable {
        case readPayload
        case writePayload
        case writeRSSI
        case writePayloadSharing
    }

    func nextAction(for d: BLEDevice, now: Date) -> Action? {
        guard !d.receiveOnly, d.address != nil else { return nil }
        if let until = d.ignoreUntil, until > now { return nil }
        guard d.mayBeHerald else { return nil }
        // Only act on devices heard in the last cycle: others are probably gone.
        let cycle = settings.scanOn + settings.scanRest + settings.scanOff
        guard now.timeIntervalSince(d.lastUpdatedAt) <= cycle + 1 else { return nil }
        if d.payload == nil { return .readPayload }
        if !canAdvertise {
            if d.lastPayloadWriteAt.map({ now.timeIntervalSince($0) >= settings.receiveOnlyPayloadInterval }) ?? true { return .writePayload }
            if d.lastRSSIWriteAt.map({ now.timeIntervalSince($0) >= settings.receiveOnlyRSSIInterval }) ?? true, d.rssi != nil { return .writeRSSI }
        }
        if d.os == .ios {
            if !d.payloadWritten { return .writePayload }
            if settings.payloadSharing,
               d.lastPayloadSharingAt.map({ now.timeIntervalSince($0) >= settings.payloadSharingInterval }) ?? true,
               !sharingContent(for: d, now: now).isEmpty {
                return .writePayloadSharing
            }
        }
        return nil
    }

    private func processNext() {
        guard running, processing, !busy else { return }
        let now = scheduler.now
        // Reading a payload comes before any signal write, and among those a device whose last
        // attempts failed comes after the others: a peer that keeps failing (an iPhone that does
        // not answer) must not keep the devices behind it waiting cycle after cycle, its own
        // attempt taking the whole cycle (seen in the guest tier: a node never read another in
        // four minutes). Ties keep the device list's order.
        var next: (device: BLEDevice, action: Action, rank: (Int, Int))?
        for d in deviceList where !attemptedThisCycle.contains(d.identifier) {
            guard let action = nextAction(for: d, now: now) else { continue }
            let rank = (action == .readPayload ? 0 : 1, d.failedConnections)
            if next.map({ rank < $0.rank }) ?? true { next = (d, action, rank) }
            if rank == (0, 0) { break }
        }
        guard let next else { return }
        attemptedThisCycle.insert(next.device.identifier)
        guard settings.connectionSpread > 0 else { perform(next.action, on: next.device); return }
        // Nodes in step (BLESensorSettings.connectionSpread): the attempt starts a little later,
        // by a different amount on each node, so of two nodes that picked each other one is
        // still advertising when the other initiates.
        let token = beginOperation()
        let delay = Double.random(in: 0..<settings.connectionSpread, using: &random)
        scheduler.schedule(after: delay) { [weak self] in
            guard let self, self.operationToken == token else { return }
            self.busy = false
            guard self.running, self.processing else { return }
            self.perform(next.action, on: next.device)
        }
    }

    /// Marks the sensor busy with a new operation and returns its token: a callback of an
    /// earlier operation (a late answer, a deadline, a delayed start) finds another token and
    /// does nothing.
    private func beginOperation() -> UInt64 {
        busy = true
        operationToken &+= 1
        return operationToken
    }

    private func perform(_ action: Action, on device: BLEDevice) {
        guard let address = device.address else { return }
        let token = beginOperation()
        debug("\(action) \(device.identifier) at \(address)")
        // A radio that has been answering slowly (bluetoothd on a busy host) is given that much
        // longer: giving up on a read about to succeed only queues the next behind it.
        let allowed = settings.connectionTimeout + max(0, transport.callAllowance)
        let deadline = scheduler.schedule(after: allowed) { [weak self] in
            guard let self, self.operationToken == token else { return }
            self.finish(device, action, address: address, token: token, error: .timeout("\(action) within \(allowed)s"))
        }
        transport.connect(address, timeout: allowed) { [weak self] result in
            guard let self, self.operationToken == token else { return }
            if case .failure(let error) = result {
                deadline.cancel()
                self.finish(device, action, address: address, token: token, error: error)
                return
            }
            self.transport.discoverServices(address) { [weak self] result in
                guard let self, self.operationToken == token else { return }
                switch result {
                case .failure(let error):
                    deadline.cancel()
                    self.finish(device, action, address: address, token: token, error: error)
                case .success(let services):
                    guard let herald = services.first(where: { $0.uuid == HeraldUUIDs.service || $0.uuid == HeraldUUIDs.legacyService }) else {
                        deadline.cancel()
                        if device.hasHeraldService {
                            // It advertises the Herald service but does not serve it yet: a node
                            // whose GATT application is being registered (just started, or its
                            // bluetoothd just back). A failed attempt, tried again in a later
                            // cycle; ignored for a minute, it went unread for a whole guest run.
                            self.finish(device, action, address: address, token: token,
                                        error: .failed("no Herald service on connect, though it advertises one"))
                            return
                        }
                        self.ignore(device, because: "no Herald service on connect")
                        self.finish(device, action, address: address, token: token, error: nil)
                        return
                    }
                    let chars = Set(herald.characteristics.map(\.uuid))
                    if chars.contains(HeraldUUIDs.androidSignalCharacteristic) {
                        device.signalCharacteristic = HeraldUUIDs.androidSignalCharacteristic
                        if device.os != .linux { device.os = .android }
                    } else if chars.contains(HeraldUUIDs.iosSignalCharacteristic) {
                        device.signalCharacteristic = HeraldUUIDs.iosSignalCharacteristic
                        device.os = .ios
                    }
                    self.execute(action, on: device, service: herald.uuid, address: address, token: token) { error in
                        deadline.cancel()
                        self.finish(device, action, address: address, token: token, error: error)
                    }
                }
            }
        }
    }

    private func execute(_ action: Action, on device: BLEDevice, service: BluetoothUUID, address: RadioAddress, token: UInt64, done: @escaping (TransportError?) -> Void) {
        switch action {
        case .readPayload:
            transport.read(address, service: service, characteristic: HeraldUUIDs.payloadCharacteristic) { [weak self] result in
                guard let self, self.operationToken == token else { return }
                switch result {
                case .failure(let error): done(error)
                case .success(let data):
                    if data.isEmpty { done(.failed("empty payload")); return }
                    self.didRead(PayloadData(data), from: device)
                    done(nil)
                }
            }
        case .writePayload, .writeRSSI, .writePayloadSharing:
            guard let characteristic = device.signalCharacteristic else { done(.characteristicNotFound(HeraldUUIDs.androidSignalCharacteristic)); return }
            let now = scheduler.now
            let bundle: SignalBundle
            switch action {
            case .writePayload: bundle = .writePayload(ownPayload ?? PayloadData())
            case .writeRSSI: bundle = .writeRSSI(Int16(clamping: device.rssi ?? 127))
            default:
                let shared = sharingContent(for: device, now: now)
                bundle = .payloadSharing(rssi: Int16(clamping: device.rssi ?? 127), data: shared.reduce(into: Data()) { $0.append($1.data) })
                for p in shared { device.sharedPayloads.insert(p) }
            }
            let encoded: Data
            do { encoded = try bundle.encoded() } catch { done(.failed("cannot encode \(action): \(error)")); return }
            let fragments = SignalBundle.fragments(of: encoded, size: settings.writeFragmentSize)
            writeFragments(fragments[...], to: address, service: service, characteristic: characteristic, token: token) { error in
                if error == nil {
                    switch action {
                    case .writePayload: device.payloadWritten = true; device.lastPayloadWriteAt = now
                    case .writeRSSI: device.lastRSSIWriteAt = now
                    default: device.lastPayloadSharingAt = now
                    }
                }
                done(error)
            }
        }
    }

    private func writeFragments(_ fragments: ArraySlice<Data>, to address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, token: UInt64, done: @escaping (TransportError?) -> Void) {
        guard let first = fragments.first else { done(nil); return }
        transport.write(address, service: service, characteristic: characteristic, value: first, withResponse: true) { [weak self] result in
            guard let self, self.operationToken == token else { return }
            if case .failure(let error) = result { done(error); return }
            self.writeFragments(fragments.dropFirst(), to: address, service: service, characteristic: characteristic, token: token, done: done)
        }
    }

    private func finish(_ device: BLEDevice, _ action: Action, address: RadioAddress, token: UInt64, error: TransportError?) {
        guard operationToken == token else { return }
        operationToken &+= 1
        if let error {
            device.failedConnections += 1
            info("\(action) \(device.identifier) failed: \(error)")
        } else {
            device.failedConnections = 0
        }
        transport.disconnect(address) { _ in }
        busy = false
        scheduler.execute { [weak self] in self?.processNext() }
    }

    private func didRead(_ payload: PayloadData, from device: BLEDevice) {
        let first = device.payload == nil
        device.payload = payload
        device.payloadReadAt = scheduler.now
        if first { info("read \(payload.shortName) from \(device.identifier)") }
        let id = device.identifier
        notify { $0.sensor(.BLE, available: true, didDeleteOrDetect: id) }
        notify { $0.sensor(.BLE, didRead: payload, fromTarget: id) }
    }

    /// Payloads to share with `peer`, as Herald's Android sensor chooses them: devices seen in the
    /// sharing window whose payload is known and that are iOS (confirmed by their signal
    /// characteristic) or receive-only centrals; never the peer's own payload, never a device
    /// known only through sharing; unshared first, each group most recently seen first, capped at
    /// the bundle limit.
    func sharingContent(for peer: BLEDevice, now: Date) -> [PayloadData] {
        var unshared = [(BLEDevice, Int)](), shared = [(BLEDevice, Int)]()
        for (i, d) in deviceList.enumerated() where d !== peer {
            guard let p = d.payload, d.os != .shared, (d.os == .ios && d.signalCharacteristic != nil) || d.receiveOnly,
                  p != peer.payload,
                  now.timeIntervalSince(d.lastUpdatedAt) <= settings.payloadSharingWindow else { continue }
            if peer.sharedPayloads.contains(p) { shared.append((d, i)) } else { unshared.append((d, i)) }
        }
        // Most recent first; the list position breaks ties, so the order never depends on the sort.
        func recentFirst(_ a: (BLEDevice, Int), _ b: (BLEDevice, Int)) -> Bool {
            a.0.lastUpdatedAt != b.0.lastUpdatedAt ? a.0.lastUpdatedAt > b.0.lastUpdatedAt : a.1 < b.1
        }
        var out = [PayloadData]()
        var size = 0
        for (d, _) in unshared.sorted(by: recentFirst) + shared.sorted(by: recentFirst) {
            guard let p = d.payload, size + p.count <= SignalBundle.maximumDataLength else { continue }
            out.append(p)
            size += p.count
        }
        return out
    }

    // MARK: Incoming signal writes

    private func device(forCentral central: RadioAddress) -> BLEDevice {
        if let d = byAddress[central] { return d }
        let d = BLEDevice(identifier: TargetIdentifier(central.value), address: central, now: scheduler.now)
        d.hasHeraldService = true
        deviceList.append(d)
        byAddress[central] = d
        notify { $0.sensor(.BLE, didDetect: d.identifier) }
        return d
    }

    private func act(on bundle: SignalBundle, from central: RadioAddress) {
        let d = device(forCentral: central)
        d.lastUpdatedAt = scheduler.now
        let id = d.identifier
        switch bundle {
        case .writePayload(let payload):
            // Only a node that cannot be read writes its payload to a node that is not iOS: it is
            // receive-only (Herald's Android transmitter sets the same, and the OS to Android).
            markReceiveOnly(d)
            didRead(payload, from: d)
        case .writeRSSI(let rssi):
            markReceiveOnly(d)
            d.rssi = Int(rssi)
            let proximity = Proximity.rssi(Int(rssi))
            notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id) }
            if let p = d.payload { notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id, withPayload: p) } }
        case .payloadSharing(let rssi, let data):
            // Only Android-like nodes write sharing bundles.
            if d.os != .linux { d.os = .android }
            let own = ownPayload
            let payloads = payloadDataSupplier.payload(data).filter { $0 != own }
            if !payloads.isEmpty { notify { $0.sensor(.BLE, didShare: payloads, fromTarget: id) } }
            for p in payloads where !deviceList.contains(where: { $0.payload == p }) {
                let shared = BLEDevice(identifier: TargetIdentifier(randomUsing: &random), address: nil, now: scheduler.now)
                shared.os = .shared
                shared.payload = p
                deviceList.append(shared)
            }
            if rssi != 127 {
                let proximity = Proximity.rssi(Int(rssi))
                notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id) }
            }
        case .immediateSend(let data):
            notify { $0.sensor(.BLE, didReceive: data, fromTarget: id) }
        }
    }

    private func markReceiveOnly(_ d: BLEDevice) {
        if !d.receiveOnly { info("\(d.identifier) is receive-only (it writes to this node)") }
        d.receiveOnly = true
        if d.os != .linux { d.os = .android }
    }

    // MARK: Helpers

    private func notify(_ body: (any SensorDelegate) -> Void) {
        // A local copy: the delegates are borrowed from it, not retained one by one.
        let list = delegates
        list.withUnsafeBufferPointer { for d in $0 { body(d) } }
    }

    private func debug(_ message: @autoclosure () -> String) { emit(.debug, message) }
    private func info(_ message: @autoclosure () -> String) { emit(.info, message) }
    private func fault(_ message: @autoclosure () -> String) { emit(.fault, message) }
    private func emit(_ level: SensorLogLevel, _ message: () -> String) {
        guard let log, log.isEnabled(level) else { return }
        log.log(level, subsystem: Self.subsystem, category: "BLESensor", message())
    }
}

extension BLESensor: BLETransportDelegate {
    public func transport(didUpdateState state: RadioState) {
        guard running else { return }
        switch state {
        case .poweredOn:
            info("radio on")
            radioReady()
        case .poweredOff, .unavailable:
            fault("radio \(state.rawValue)")
            if pseudoDeviceAddress != nil { pseudoRenewalDue = true }
            isAdvertising = false
            serviceRegistered = false
            for t in cycleTasks { t.cancel() }
            cycleTasks.removeAll()
            scanning = false
            processing = false
            notify { $0.sensor(.BLE, didUpdateState: .unavailable) }
        }
    }

    public func transport(didReceive report: ScanReport) { handle(report) }

    public func transport(didDisconnect address: RadioAddress) {
        debug("link to \(address) closed")
    }
}

extension BLESensor: GATTServerDelegate {
    public func gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress) -> Result<Data, ATTError> {
        guard characteristic == HeraldUUIDs.payloadCharacteristic else { return .failure(.notSupported) }
        lastCentralActivity = scheduler.now
        guard let payload = payloadDataSupplier.payload(scheduler.now, device: TargetIdentifier(central.value)) else {
            return .failure(.failed("no payload"))
        }
        guard offset >= 0, offset <= payload.count else { return .failure(.invalidOffset) }
        return .success(Data(payload.data.dropFirst(offset)))
    }

    public func gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress) -> Result<Void, ATTError> {
        guard characteristic == HeraldUUIDs.androidSignalCharacteristic || characteristic == HeraldUUIDs.iosSignalCharacteristic else {
            return .failure(.notSupported)
        }
        lastCentralActivity = scheduler.now
        switch reassembler.append(value, from: central) {
        case .bundle(let bundle): act(on: bundle, from: central)
        case .waiting: break
        case .rejected(let error): info("signal write from \(central) rejected: \(error)")
        }
        return .success(())
    }

    public func gattCentralDisconnected(_ central: RadioAddress) {
        reassembler.clear(central)
    }
}
