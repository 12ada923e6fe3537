import Foundation
import HeraldCore
import HeraldRadio
import HeraldLogs
import LabPlan

/// A simulated iPhone running Herald, as Herald's iOS sensor behaves toward the nodes around it,
/// with the Herald log files an iPhone writes. It is a device on the radio, not a `BLESensor`:
///
/// - It serves the Herald service with the payload (read) and the iOS-style signal
///   characteristic (write, notify), and acts on what centrals write: a payload (didDetect, then
///   didRead), an RSSI (didMeasure), a payload-sharing bundle (didShare; the sharer's RSSI is
///   measured, and every shared payload becomes a device of its own, created once with a
///   generated UUID and read, and measured at the sharer's RSSI), an immediate send (didReceive).
/// - In the foreground it advertises the Herald service UUID. In the background iOS moves
///   service UUIDs out of the advert into Apple's overflow area: the advert carries only Apple
///   manufacturer data (message 0x01 with a service bit set), so a scanner finds the Herald
///   service only by connecting and discovering services.
/// - It scans for the Herald service, as CoreBluetooth scans by service UUID: in the foreground
///   that also finds background iPhones through the service's bit in their overflow area; in the
///   background it does not, so two background iPhones learn of each other only through payload
///   sharing. It measures each advert in the foreground and at most one every
///   `backgroundMeasureInterval` in the background (iOS coalesces duplicate discoveries there),
///   and reads each new peripheral's payload once (connect, discover, read, disconnect).
///   It writes nothing to peripherals: since Herald 2.2 Android-like nodes write to iPhones.
///
/// Identifiers are UUIDs, one per peripheral address and one per central address, as iOS gives
/// CBPeripheral and CBCentral their own identifiers. Use only on the transport's scheduler.
public final class IOSPersona {
    public enum Mode: Sendable { case foreground, background }

    public let mode: Mode
    public let assignment: NodeAssignment
    public let directory: URL
    public let payload: FixedPayloadSupplier
    public let logs: NodeLogs
    public let os = "iOS"
    public let osVersion: String
    public let transport: any BLETransport
    private let scheduler: any Scheduler
    private var random: SeededGenerator
    private var delegates: [any SensorDelegate] = []

    /// Measurements of one peripheral at most this often in the background, seconds.
    public var backgroundMeasureInterval: TimeInterval = 4
    /// In the background, whether the scan still finds other background iPhones through their
    /// overflow area: so with `radio.phones` on and location on (Herald's published test 2: two
    /// background iPhones with location on, no Android, 100 % continuity over 20 hours, which they
    /// could not reach through payload sharing alone). Off: the scan of a background app that
    /// iOS keeps to service UUIDs in adverts (the default, and location off).
    public var findsOverflowInBackground = false
    /// A peripheral whose read failed is tried again after this, seconds.
    public var retryInterval: TimeInterval = 10
    /// Advertising intervals iOS uses: foreground and background.
    public static let foregroundAdvertInterval: TimeInterval = 0.1525
    public static let backgroundAdvertInterval: TimeInterval = 1.0225

    public static let service = GATTService(uuid: HeraldUUIDs.service, characteristics: [
        GATTCharacteristic(uuid: HeraldUUIDs.payloadCharacteristic, properties: [.read]),
        GATTCharacteristic(uuid: HeraldUUIDs.iosSignalCharacteristic, properties: [.write, .notify]),
    ])

    /// Apple manufacturer data of a background advert: the overflow area (0x01) and a 16-byte
    /// bitmask with one service bit set (Herald's scanners look only for a set bit).
    public static let backgroundAppleData = Data([0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                                  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80])

    final class Device {
        let identifier: TargetIdentifier
        let address: RadioAddress?
        var payload: PayloadData?
        var lastMeasuredAt: Date?
        var lastHeardAt: Date
        var nextAttemptAt: Date
        init(identifier: TargetIdentifier, address: RadioAddress?, now: Date) {
            self.identifier = identifier
            self.address = address
            lastHeardAt = now
            nextAttemptAt = now
        }
    }

    /// Peripherals seen in adverts, centrals that wrote, and devices known through sharing: a
    /// list for deterministic iteration, maps for lookup.
    private var devices: [Device] = []
    private var peripherals: [RadioAddress: Device] = [:]
    private var centrals: [RadioAddress: Device] = [:]
    private var reassembler = SignalReassembler<RadioAddress>()
    private var running = false
    private var busy = false
    private var token: UInt64 = 0

    public init(mode: Mode, assignment: NodeAssignment, transport: any BLETransport, directory: URL,
                osVersion: String = "16.0", power: any PowerSource = MainsPower()) {
        self.mode = mode
        self.assignment = assignment
        self.transport = transport
        self.directory = directory
        self.osVersion = osVersion
        scheduler = transport.scheduler
        random = SeededGenerator(seed: assignment.seed, stream: "persona/\(assignment.node.name)")
        payload = FixedPayloadSupplier(identifier: assignment.node.identifier)
        logs = NodeLogs(directory: directory, deviceName: assignment.node.name, os: os, osVersion: osVersion,
                        ownShortName: payload.shortName, scheduler: scheduler,
                        logLevel: SensorLogger.Level(name: assignment.sensor.logLevel.rawValue) ?? .info, power: power)
        delegates = logs.delegates
    }

    /// The advert this iPhone sends.
    public var advertisement: Advertisement {
        switch mode {
        case .foreground:
            return Advertisement(serviceUUIDs: [HeraldUUIDs.service], txPower: assignment.sensor.txPower, interval: Self.foregroundAdvertInterval)
        case .background:
            return Advertisement(serviceUUIDs: [], manufacturerData: [ManufacturerID.apple: Self.backgroundAppleData],
                                 txPower: assignment.sensor.txPower, interval: Self.backgroundAdvertInterval)
        }
    }

    public func start() {
        guard !running else { return }
        running = true
        transport.delegate = self
        log(.info, "iPhone \(assignment.node.name) starts (\(mode == .foreground ? "foreground" : "background"), payload \(payload.shortName))")
        transport.powerOn { [weak self] result in
            guard let self, self.running else { return }
            if case .success = result { self.radioReady() }
        }
    }

    public func stop() {
        guard running else { return }
        running = false
        token &+= 1
        busy = false
        transport.stopScanning { _ in }
        transport.stopAdvertising { _ in }
        notify { $0.sensor(.BLE, didUpdateState: .off) }
        log(.info, "iPhone \(assignment.node.name) stopped")
        logs.close()
    }

    private func radioReady() {
        notify { $0.sensor(.BLE, didUpdateState: .on) }
        transport.register(service: Self.service, server: self) { [weak self] _ in
            guard let self, self.running else { return }
            self.transport.startAdvertising(self.advertisement) { _ in }
        }
        transport.startScanning(filter: ScanFilter(duplicateData: mode == .foreground)) { _ in }
    }

    // MARK: Scanning and reading

    /// Whether a scan for the Herald service reports this advert.
    func scanFinds(_ report: ScanReport) -> Bool {
        if report.serviceUUIDs.contains(HeraldUUIDs.service) || report.serviceUUIDs.contains(HeraldUUIDs.legacyService) { return true }
        return (mode == .foreground || findsOverflowInBackground) && report.manufacturerData[ManufacturerID.apple] == Self.backgroundAppleData
    }

    private func handle(_ report: ScanReport) {
        guard running, scanFinds(report) else { return }
        let now = scheduler.now
        let device: Device
        if let known = peripherals[report.address] {
            device = known
        } else {
            device = Device(identifier: TargetIdentifier(randomUsing: &random), address: report.address, now: now)
            devices.append(device)
            peripherals[report.address] = device
            notify { $0.sensor(.BLE, didDetect: device.identifier) }
        }
        device.lastHeardAt = now
        if mode == .foreground || device.lastMeasuredAt.map({ now.timeIntervalSince($0) >= backgroundMeasureInterval }) ?? true {
            device.lastMeasuredAt = now
            measure(device, Proximity.rssi(report.rssi, txPower: report.txPower))
        }
        if device.payload == nil { readNext() }
    }

    private func readNext() {
        guard running, !busy, transport.state == .poweredOn else { return }
        let now = scheduler.now
        guard let device = devices.first(where: {
            $0.payload == nil && $0.address != nil && $0.nextAttemptAt <= now && now.timeIntervalSince($0.lastHeardAt) <= retryInterval
        }), let address = device.address else { return }
        busy = true
        token &+= 1
        let token = self.token
        device.nextAttemptAt = now.addingTimeInterval(retryInterval)
        let timeout = assignment.sensor.connectionTimeout
        let deadline = scheduler.schedule(after: timeout) { [weak self] in self?.finish(address, token: token, "timed out") }
        func done(_ failure: String?) {
            deadline.cancel()
            finish(address, token: token, failure)
        }
        transport.connect(address, timeout: timeout) { [weak self] result in
            guard let self, self.token == token else { return }
            if case .failure(let e) = result { done("\(e)"); return }
            self.transport.discoverServices(address) { [weak self] result in
                guard let self, self.token == token else { return }
                guard case .success(let services) = result,
                      let herald = services.first(where: { $0.uuid == HeraldUUIDs.service || $0.uuid == HeraldUUIDs.legacyService }),
                      herald.characteristics.contains(where: { $0.uuid == HeraldUUIDs.payloadCharacteristic }) else {
                    done("no Herald payload characteristic"); return
                }
                self.transport.read(address, service: herald.uuid, characteristic: HeraldUUIDs.payloadCharacteristic) { [weak self] result in
                    guard let self, self.token == token else { return }
                    switch result {
                    case .success(let data) where !data.isEmpty:
                        self.didRead(PayloadData(data), device)
                        done(nil)
                    case .success: done("empty payload")
                    case .failure(let e): done("\(e)")
                    }
                }
            }
        }
    }

    private func finish(_ address: RadioAddress, token: UInt64, _ failure: String?) {
        guard self.token == token else { return }
        self.token &+= 1
        if let failure { log(.debug, "read \(address) failed: \(failure)") }
        transport.disconnect(address) { _ in }
        busy = false
        scheduler.execute { [weak self] in self?.readNext() }
    }

    // MARK: Events

    private func measure(_ d: Device, _ proximity: Proximity) {
        let id = d.identifier
        notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id) }
        if let p = d.payload { notify { $0.sensor(.BLE, didMeasure: proximity, fromTarget: id, withPayload: p) } }
    }

    private func didRead(_ payload: PayloadData, _ d: Device) {
        d.payload = payload
        let id = d.identifier
        notify { $0.sensor(.BLE, available: true, didDeleteOrDetect: id) }
        notify { $0.sensor(.BLE, didRead: payload, fromTarget: id) }
    }

    private func central(_ address: RadioAddress) -> Device {
        if let d = centrals[address] { return d }
        let d = Device(identifier: TargetIdentifier(randomUsing: &random), address: nil, now: scheduler.now)
        devices.append(d)
        centrals[address] = d
        return d
    }

    private func act(on bundle: SignalBundle, from address: RadioAddress) {
        let d = central(address)
        d.lastHeardAt = scheduler.now
        let id = d.identifier
        switch bundle {
        case .writePayload(let p):
            // iOS reports a detection on every payload write, then the read.
            notify { $0.sensor(.BLE, didDetect: id) }
            didRead(p, d)
        case .writeRSSI(let rssi):
            measure(d, .rssi(Int(rssi)))
        case .payloadSharing(let rssi, let data):
            let shared = payload.payload(data)
            notify { $0.sensor(.BLE, didShare: shared, fromTarget: id) }
            // 127: the sharer had no RSSI to give.
            let proximity: Proximity? = rssi == 127 ? nil : .rssi(Int(rssi))
            if let proximity { measure(d, proximity) }
            for p in shared where p != payload.payloadData {
                if let known = devices.first(where: { $0.payload == p }) {
                    if let proximity { measure(known, proximity) }
                } else {
                    let s = Device(identifier: TargetIdentifier(randomUsing: &random), address: nil, now: scheduler.now)
                    devices.append(s)
                    notify { $0.sensor(.BLE, didDetect: s.identifier) }
                    didRead(p, s)
                    if let proximity { measure(s, proximity) }
                }
            }
        case .immediateSend(let data):
            notify { $0.sensor(.BLE, didReceive: data, fromTarget: id) }
        }
    }

    private func notify(_ body: (any SensorDelegate) -> Void) {
        for d in delegates { body(d) }
    }

    private func log(_ level: SensorLogger.Level, _ message: String) {
        logs.logger.log(level, subsystem: "Sensor", category: "iOSPersona", message)
    }
}

extension IOSPersona: BLETransportDelegate {
    public func transport(didUpdateState state: RadioState) {
        guard running else { return }
        switch state {
        case .poweredOn:
            radioReady()
        case .poweredOff, .unavailable:
            token &+= 1
            busy = false
            notify { $0.sensor(.BLE, didUpdateState: .unavailable) }
        }
    }
    public func transport(didReceive report: ScanReport) { handle(report) }
    public func transport(didDisconnect address: RadioAddress) {}
}

extension IOSPersona: GATTServerDelegate {
    public func gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress) -> Result<Data, ATTError> {
        guard characteristic == HeraldUUIDs.payloadCharacteristic else { return .failure(.notSupported) }
        let data = payload.payloadData.data
        guard offset >= 0, offset <= data.count else { return .failure(.invalidOffset) }
        return .success(Data(data.dropFirst(offset)))
    }

    public func gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress) -> Result<Void, ATTError> {
        guard characteristic == HeraldUUIDs.iosSignalCharacteristic else { return .failure(.notSupported) }
        switch reassembler.append(value, from: central) {
        case .bundle(let bundle): act(on: bundle, from: central)
        case .waiting: break
        case .rejected(let error): log(.info, "signal write from \(central) rejected: \(error)")
        }
        return .success(())
    }

    public func gattCentralDisconnected(_ central: RadioAddress) {
        reassembler.clear(central)
    }
}
