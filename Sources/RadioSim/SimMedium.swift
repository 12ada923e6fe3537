import Foundation
import HeraldCore
import HeraldRadio

/// A simulated BLE medium: nodes at fixed positions advertise, scan, connect and exchange GATT
/// operations through it. Everything runs on one scheduler and draws randomness from one seeded
/// generator, so a seed gives the same run. The hot path is one scheduled event per advertising
/// event of a node; delivering it to the scanners costs a table lookup, a Gaussian draw and a
/// loss draw per scanner, and the receiving sensors' handling of the reports, which a medium
/// made with `lanes` > 1 defers and runs on that many threads (`DeliveryLanes`).
public final class SimMedium {
    /// The clock and executor of the nodes on this medium. With lanes, a `NodeClock` over the
    /// scheduler the medium was made with (each node has its own: `clock(of:)`).
    public let scheduler: any Scheduler
    /// The scheduler the medium was made with: its own advertising events run on it directly.
    private let base: any Scheduler
    /// Reports queued for parallel hand-over (nil: each is handed over as it is decided).
    private let lanes: DeliveryLanes?
    private var nodeClocks: [NodeClock] = []
    public let model: PropagationModel
    public var parameters: RadioParameters { model.parameters }
    @exclusivity(unchecked) private var random: SeededGenerator
    private let seed: UInt64

    final class Node {
        let index: Int
        let name: String
        let position: (x: Double, y: Double)
        @exclusivity(unchecked) var address: RadioAddress
        @exclusivity(unchecked) var powered = true
        @exclusivity(unchecked) var scanning = false
        @exclusivity(unchecked) var advertisement: Advertisement?
        @exclusivity(unchecked) var advertisingTask: ScheduledTask?
        @exclusivity(unchecked) var services: [GATTService] = []
        weak var server: (any GATTServerDelegate)?
        weak var transport: SimTransport?
        /// Crowding: when this scanner's channel rotation starts (seconds), its report budget, its
        /// controller's connections in use (links and outgoing attempts).
        @exclusivity(unchecked) var scanPhase: Double = 0
        @exclusivity(unchecked) var tokens: Double = 0
        @exclusivity(unchecked) var tokenTime: Double = 0
        @exclusivity(unchecked) var connections = 0
        /// The device's drawn character (neutral with `radio.devices` off).
        let character: DeviceCharacter
        /// Its slowly varying attenuation now, dB (`radio.environment`; 0 when off).
        @exclusivity(unchecked) var field: Double = 0
        /// A phone (`radio.phones`): its Bluetooth stalled (hears, sends and connects nothing),
        /// its app suspended (hears nothing, starts no connection), its connections' success factor.
        @exclusivity(unchecked) var stalled = false
        @exclusivity(unchecked) var suspended = false
        @exclusivity(unchecked) var phoneConnect: Double = 1
        var deaf: Bool { stalled || suspended }
        init(index: Int, name: String, position: (x: Double, y: Double), address: RadioAddress, character: DeviceCharacter) {
            self.index = index
            self.name = name
            self.position = position
            self.address = address
            self.character = character
        }
    }

    struct Link: Hashable { let central: Int; let peripheral: Int }

    @exclusivity(unchecked) private(set) var nodes: [Node] = []
    @exclusivity(unchecked) private var byAddress: [RadioAddress: Int] = [:]
    // The medium's state is used from the simulation's thread only (lanes refuse anything
    // else), so its hot properties skip the run-time exclusivity checks (two per random draw).
    /// Mean RSSI of a 0 dBm transmitter, per (from, to), row-major: the distance's path loss,
    /// plus the devices' characters and the run's environment now.
    @exclusivity(unchecked) private var meanRSSI: [Double] = []
    /// The distance's path loss alone, per (from, to).
    @exclusivity(unchecked) private var distanceRSSI: [Double] = []
    /// Per receiver: its sensitivity (dBm), its report loss now (bursts included), its loss outside bursts.
    @exclusivity(unchecked) private var sensitivityOf: [Double] = []
    @exclusivity(unchecked) private var lossOf: [Double] = []
    @exclusivity(unchecked) private var calmLossOf: [Double] = []
    @exclusivity(unchecked) private var links = Set<Link>()
    /// Link order for deterministic teardown.
    @exclusivity(unchecked) private var linkList: [Link] = []
    /// Scanners, kept as a list of node indices for the hot loop.
    @exclusivity(unchecked) private var scanners: [Int] = []

    /// Counters, for benchmarks and tests.
    @exclusivity(unchecked) public private(set) var advertisingEvents = 0
    @exclusivity(unchecked) public private(set) var reportsDelivered = 0
    /// Crowding counters: PDUs lost to collisions at a receiver, reports a controller dropped
    /// beyond its report rate, connection attempts refused by a connection limit, the most
    /// connections any controller held at once.
    @exclusivity(unchecked) public private(set) var collisionsLost = 0
    @exclusivity(unchecked) public private(set) var reportsDropped = 0
    @exclusivity(unchecked) public internal(set) var connectionsRefused = 0
    @exclusivity(unchecked) public private(set) var peakConnections = 0

    /// The crowding model, nil when off.
    let crowding: CrowdingParameters?
    /// Runs that differ (nil: off): the run's draw of the room's path-loss offset, the
    /// environment's own generator, whether a burst is on, and counters for the manifest.
    let environment: RunEnvironment?
    public let roomOffset: Double
    @exclusivity(unchecked) private var environmentRandom: SeededGenerator
    @exclusivity(unchecked) private var burstOn = false
    @exclusivity(unchecked) public private(set) var bursts = 0
    /// Phones: Android stalls and iOS suspensions begun.
    @exclusivity(unchecked) public private(set) var stalls = 0
    @exclusivity(unchecked) public private(set) var suspensions = 0
    @exclusivity(unchecked) public private(set) var burstSeconds = 0.0
    /// Seconds since the medium was made: the channel model's clock.
    private let epoch: Date
    /// Transmissions per advertising channel (37, 38, 39), in start order, kept while they can
    /// still overlap a PDU not yet decided.
    private struct Transmission { let node: Int; let start: Double; let end: Double; let power: Double }
    @exclusivity(unchecked) private var channels: [[Transmission]] = [[], [], []]
    /// Advertising events whose PDUs are decided once every PDU that could overlap them is known.
    private struct PendingEvent { let node: Int; let start: Double; let airTime: Double; let spacing: Double; let due: Double; let report: ScanReport; let power: Double }
    @exclusivity(unchecked) private var pending: [PendingEvent] = []
    @exclusivity(unchecked) private var flushScheduled = false

    /// `lanes` > 1 hands reports to the sensors on that many threads (one of them the caller's);
    /// the caller must then call `flushDeliveries()` after each `run(until:)` of the scheduler and
    /// `finishDeliveries()` when done. The logs are the same for any number of lanes.
    public init(scheduler: any Scheduler, parameters: RadioParameters = RadioParameters(), seed: UInt64, lanes: Int = 1) {
        base = scheduler
        let clock = lanes > 1 ? NodeClock(base: scheduler, node: nil, medium: nil) : nil
        self.scheduler = clock ?? scheduler
        self.lanes = clock == nil ? nil : DeliveryLanes(threads: lanes)
        self.model = PropagationModel(parameters: parameters)
        self.seed = seed
        self.random = SeededGenerator(seed: seed, stream: "medium")
        self.crowding = parameters.crowding
        self.epoch = scheduler.now
        self.environment = parameters.environment
        var env = SeededGenerator(seed: seed, stream: "environment")
        self.roomOffset = parameters.environment.map { $0.pathLossSpread * min(3, max(-3, env.nextGaussian())) } ?? 0
        self.environmentRandom = env
        clock?.medium = self
        if let e = parameters.environment {
            if e.fieldSpread > 0 {
                scheduler.scheduleRepeating(every: RunEnvironment.fieldStep) { [weak self] in self?.moveField() }
            }
            if e.burstRate > 0 { scheduleBurst(e) }
        }
    }

    /// The character of the device known as `identity` under this medium's `radio.devices`.
    public func character(of identity: String) -> DeviceCharacter {
        parameters.devices?.character(of: identity) ?? DeviceCharacter(identity: identity)
    }

    /// Node `index`'s character.
    public func character(ofNode index: Int) -> DeviceCharacter { nodes[index].character }

    // MARK: The run's environment

    /// Moves every node's attenuation one step of an Ornstein-Uhlenbeck process (stationary
    /// spread `fieldSpread`, correlation time `fieldTime`).
    private func moveField() {
        guard let e = environment else { return }
        let rho = exp(-RunEnvironment.fieldStep / e.fieldTime)
        let kick = e.fieldSpread * (1 - rho * rho).squareRoot()
        for node in nodes { node.field = rho * node.field + kick * environmentRandom.nextGaussian() }
        rebuildPathLoss()
    }

    /// Interference bursts: exponential gaps (mean 1/burstRate) and lengths (mean burstLength).
    private func scheduleBurst(_ e: RunEnvironment) {
        let gap = -log(max(1e-12, 1 - environmentRandom.nextUnit())) * 3600 / e.burstRate
        let length = -log(max(1e-12, 1 - environmentRandom.nextUnit())) * e.burstLength
        scheduler.schedule(after: gap) { [weak self] in
            guard let self else { return }
            self.setBurst(true, e)
            self.bursts += 1
            self.burstSeconds += length
            self.scheduler.schedule(after: length) { [weak self] in
                self?.setBurst(false, e)
                self?.scheduleBurst(e)
            }
        }
    }

    private func setBurst(_ on: Bool, _ e: RunEnvironment) {
        burstOn = on
        for j in lossOf.indices { refreshLoss(j) }
    }

    /// A receiver's report loss now: all while it is deaf, more during a burst.
    private func refreshLoss(_ j: Int) {
        if nodes[j].deaf { lossOf[j] = 1; return }
        if burstOn, let e = environment { lossOf[j] = 1 - (1 - calmLossOf[j]) * (1 - e.burstLoss) } else { lossOf[j] = calmLossOf[j] }
    }

    // MARK: Phones

    /// Makes node `index` a phone of `kind` under `radio.phones` (nothing when that is off):
    /// Android stalls, iOS suspension (location off), address rotation, GATT failures. Each phone
    /// draws from its own stream of the run's seed.
    public func setPhone(_ index: Int, kind: PhoneKind) {
        guard let b = parameters.phones else { return }
        let node = nodes[index]
        var g = SeededGenerator(seed: seed, stream: "phone/\(node.name)")
        node.phoneConnect = 1 - b.gattFailure
        func exponential(_ mean: Double) -> Double { -log(max(1e-12, 1 - g.nextUnit())) * mean }
        let rotation: TimeInterval
        switch kind {
        case .android:
            rotation = b.androidRotation
            if b.androidStallRate > 0 { scheduleStall(index, b, first: exponential(3600 / b.androidStallRate)) }
        case .iPhone(let location):
            rotation = b.iosRotation
            if !location, b.iosSuspended > 0 { scheduleSuspension(index, b, awakeFor: exponential(b.iosAwake)) }
        }
        if rotation > 0, parameters.macRotation == 0 {
            let phase = g.nextUnit() * rotation
            scheduler.schedule(after: phase) { [weak self] in
                self?.rotateAddress(index)
                self?.scheduler.scheduleRepeating(every: rotation) { [weak self] in self?.rotateAddress(index) }
            }
        }
    }

    private func scheduleStall(_ index: Int, _ b: PhoneBehaviour, first: TimeInterval) {
        scheduler.schedule(after: first) { [weak self] in
            guard let self else { return }
            var g = SeededGenerator(seed: self.seed &+ UInt64(self.stalls), stream: "stall/\(self.nodes[index].name)")
            let length = -log(max(1e-12, 1 - g.nextUnit())) * b.androidStallLength
            let next = -log(max(1e-12, 1 - g.nextUnit())) * 3600 / b.androidStallRate
            self.stalls += 1
            self.setStalled(index, true)
            self.scheduler.schedule(after: length) { [weak self] in
                self?.setStalled(index, false)
                self?.scheduleStall(index, b, first: next)
            }
        }
    }

    private func setStalled(_ index: Int, _ on: Bool) {
        nodes[index].stalled = on
        if on { dropLinks(of: index) }
        refreshLoss(index)
    }

    private func scheduleSuspension(_ index: Int, _ b: PhoneBehaviour, awakeFor: TimeInterval) {
        scheduler.schedule(after: awakeFor) { [weak self] in
            guard let self else { return }
            var g = SeededGenerator(seed: self.seed &+ UInt64(self.suspensions), stream: "suspend/\(self.nodes[index].name)")
            let asleep = -log(max(1e-12, 1 - g.nextUnit())) * b.iosSuspended
            let awake = -log(max(1e-12, 1 - g.nextUnit())) * b.iosAwake
            self.suspensions += 1
            self.nodes[index].suspended = true
            self.refreshLoss(index)
            self.scheduler.schedule(after: asleep) { [weak self] in
                guard let self else { return }
                self.nodes[index].suspended = false
                self.refreshLoss(index)
                self.scheduleSuspension(index, b, awakeFor: awake)
            }
        }
    }

    /// Adds a node and returns its transport. The node starts powered on.
    /// `identity` keys the device's character (`radio.devices`): an agent's dongle label, or
    /// the node's name when nil.
    public func addNode(name: String, x: Double, y: Double, identity: String? = nil) -> SimTransport {
        var g = SeededGenerator(seed: seed, stream: "mac/\(name)")
        var address = RadioAddress(randomUsing: &g)
        while byAddress[address] != nil { address = RadioAddress(randomUsing: &g) }
        let node = Node(index: nodes.count, name: name, position: (x, y), address: address, character: character(of: identity ?? name))
        if let e = environment, e.fieldSpread > 0 {
            // The field starts at its stationary spread, each node from its own stream.
            var f = SeededGenerator(seed: seed, stream: "field/\(name)")
            node.field = e.fieldSpread * f.nextGaussian()
        }
        let c = node.character
        let loss = parameters.devices == nil ? parameters.reportLoss : min(0.95, max(0, parameters.reportLoss + c.reportLossOffset))
        calmLossOf.append(loss)
        lossOf.append(loss)
        if burstOn, let e = environment { lossOf[lossOf.count - 1] = 1 - (1 - loss) * (1 - e.burstLoss) }
        sensitivityOf.append(parameters.sensitivity + c.sensitivityOffset)
        if let c = crowding {
            var s = SeededGenerator(seed: seed, stream: "scan/\(name)")
            node.scanPhase = s.nextUnit() * 3 * c.scanInterval
            if let rate = c.reportRate { node.tokens = Self.reportBurst(rate) }
        }
        nodes.append(node)
        byAddress[address] = node.index
        rebuildPathLoss()
        let transport = SimTransport(medium: self, index: node.index)
        node.transport = transport
        if let lanes {
            lanes.setTarget(transport, node: node.index)
            nodeClocks.append(NodeClock(base: base, node: node.index, medium: self))
        }
        if parameters.macRotation > 0 {
            // Each node rotates on its own phase.
            let phase = g.nextUnit() * parameters.macRotation
            scheduler.schedule(after: phase) { [weak self] in self?.startRotation(node.index) }
        }
        return transport
    }

    /// Powers a node off at `off` seconds from now and on again at `on` (nil: stays off).
    public func schedulePower(node index: Int, off: TimeInterval, on: TimeInterval?) {
        scheduler.schedule(after: off) { [weak self] in self?.setPower(index, on: false) }
        if let on { scheduler.schedule(after: on) { [weak self] in self?.setPower(index, on: true) } }
    }

    /// The clock of node `index`'s sensor, transport and loggers: with lanes, the node's own
    /// (what it schedules first has the node's queued reports handed over); else `scheduler`.
    public func clock(of index: Int) -> any Scheduler { lanes == nil ? scheduler : nodeClocks[index] }

    /// Hands every report still queued to its sensor (nothing to do without lanes).
    public func flushDeliveries() { lanes?.drainAll() }

    /// Hands node `index` the reports queued for it.
    func flushDeliveries(to index: Int) { lanes?.drain(node: index) }

    /// Hands the last reports over and stops the lanes' threads: call it when the simulation is
    /// over (the lanes hold the nodes' transports until then).
    public func finishDeliveries() { lanes?.finish() }

    /// Refuses calls into the medium from a node handling a scan report in a lane.
    @inline(__always) private func sequentialOnly(_ what: @autoclosure () -> String) {
        if lanes != nil, DeliveryLanes.inLane { DeliveryLanes.refuse(what()) }
    }

    public func address(of index: Int) -> RadioAddress { nodes[index].address }
    public func isPowered(_ index: Int) -> Bool { nodes[index].powered }

    private func rebuildPathLoss() {
        let n = nodes.count
        if distanceRSSI.count != n * n {
            distanceRSSI = [Double](repeating: 0, count: n * n)
            for i in 0..<n {
                for j in 0..<n where i != j {
                    let dx = nodes[i].position.x - nodes[j].position.x, dy = nodes[i].position.y - nodes[j].position.y
                    distanceRSSI[i * n + j] = model.meanRSSI(distance: (dx * dx + dy * dy).squareRoot())
                }
            }
        }
        guard parameters.devices != nil || environment != nil else { meanRSSI = distanceRSSI; return }
        // What each device adds as a sender and as a receiver, and the room's offset now.
        let send = nodes.map { $0.character.txOffset - $0.character.orientationLoss - $0.field }
        let hear = nodes.map { $0.character.rxOffset - $0.character.orientationLoss - $0.field }
        if meanRSSI.count != n * n { meanRSSI = [Double](repeating: 0, count: n * n) }
        for i in 0..<n {
            for j in 0..<n where i != j { meanRSSI[i * n + j] = distanceRSSI[i * n + j] + send[i] + hear[j] + roomOffset }
        }
    }

    /// Mean RSSI node `to` hears from node `from` (advertised TX power included).
    public func meanRSSI(from: Int, to: Int) -> Double {
        meanRSSI[from * nodes.count + to] + Double(nodes[from].advertisement?.txPower ?? 0)
    }

    // MARK: Power and addresses

    func setPower(_ index: Int, on: Bool) {
        let node = nodes[index]
        guard node.powered != on else { return }
        node.powered = on
        if !on {
            dropLinks(of: index)
            node.advertisingTask?.cancel()
            node.advertisingTask = nil
            node.advertisement = nil
            setScanning(index, false)
            node.transport?.radioStateChanged(.poweredOff)
        } else {
            node.transport?.radioStateChanged(.poweredOn)
        }
    }

    private func startRotation(_ index: Int) {
        rotateAddress(index)
        scheduler.scheduleRepeating(every: parameters.macRotation) { [weak self] in self?.rotateAddress(index) }
    }

    /// Gives a node a new random MAC; links to the old one drop.
    public func rotateAddress(_ index: Int) {
        let node = nodes[index]
        dropLinks(of: index)
        byAddress[node.address] = nil
        var address = RadioAddress(randomUsing: &random)
        while byAddress[address] != nil { address = RadioAddress(randomUsing: &random) }
        node.address = address
        byAddress[address] = index
    }

    // MARK: Advertising and scanning

    func startAdvertising(_ index: Int, _ advertisement: Advertisement) {
        sequentialOnly("started advertising")
        let node = nodes[index]
        node.advertisement = advertisement
        guard node.advertisingTask == nil else { return }
        let interval = max(0.02, advertisement.interval ?? 0.1)
        // First event at a random point of the interval, so nodes do not advertise in lockstep.
        node.advertisingTask = scheduleAdvert(index, after: random.nextUnit() * interval)
    }

    func stopAdvertising(_ index: Int) {
        sequentialOnly("stopped advertising")
        nodes[index].advertisement = nil
        nodes[index].advertisingTask?.cancel()
        nodes[index].advertisingTask = nil
    }

    /// Advertising events run on the medium's own scheduler: they decide reports (and queue
    /// them in lanes) but touch no node's sensor, so they need no queued report handed over first.
    private func scheduleAdvert(_ index: Int, after delay: TimeInterval) -> ScheduledTask {
        base.schedule(after: delay) { [weak self] in self?.advertise(index) }
    }

    private func advertise(_ index: Int) {
        let node = nodes[index]
        guard node.powered, let ad = node.advertisement else { return }
        if node.stalled {
            // A stalled Bluetooth stack sends nothing; the advertising set resumes with it.
        } else if let c = crowding, c.channelModel {
            advertisingEvents += 1
            queueEvent(index, ad, c)
        } else if !scanners.isEmpty {
            advertisingEvents += 1
            let n = nodes.count
            let tx = Double(ad.txPower ?? 0)
            let sigma = parameters.shadowing
            var report: ScanReport?
            var queued: Int32 = -1
            for j in scanners where j != index {
                let loss = lossOf[j]
                if loss > 0, random.nextUnit() < loss { continue }
                var rssi = meanRSSI[index * n + j] + tx
                if sigma > 0 { rssi += sigma * random.nextGaussian() }
                if rssi < sensitivityOf[j] { continue }
                if report == nil {
                    report = ScanReport(address: node.address, rssi: 0, txPower: ad.includeTxPower ? ad.txPower : nil,
                                        manufacturerData: ad.manufacturerData, serviceUUIDs: ad.serviceUUIDs)
                }
                deliver(&report!, rssi: Saturating.int(rssi.rounded()), to: j, at: crowding?.reportRate == nil ? 0 : clock(), queued: &queued)
            }
            lanes?.advertDecided()
        } else {
            advertisingEvents += 1
        }
        let interval = max(0.02, ad.interval ?? 0.1) * node.character.intervalFactor
        node.advertisingTask = scheduleAdvert(index, after: interval + random.nextUnit() * parameters.maximumAdvertisingDelay)
    }

    /// Hands a report to node `j`'s host unless its controller's report budget is spent (with
    /// lanes: queues it; `queued` is the report's number in the lanes' batch, once queued).
    @inline(__always) private func deliver(_ report: inout ScanReport, rssi: Int, to j: Int, at time: Double, queued: inout Int32) {
        if let rate = crowding?.reportRate {
            let node = nodes[j]
            if time > node.tokenTime {
                node.tokens = min(Self.reportBurst(rate), node.tokens + (time - node.tokenTime) * rate)
                node.tokenTime = time
            }
            guard node.tokens >= 1 else { reportsDropped += 1; return }
            node.tokens -= 1
        }
        reportsDelivered += 1
        if let lanes {
            if queued < 0 { queued = lanes.add(report, at: base.now) }
            lanes.handoff(queued, rssi: rssi, to: j)
            return
        }
        report.rssi = rssi
        nodes[j].transport?.deliver(report)
    }

    /// A controller's report queue holds a tenth of a second of reports (at least one).
    static func reportBurst(_ rate: Double) -> Double { max(1, rate / 10) }

    private func clock() -> Double { base.now.timeIntervalSince(epoch) }

    // MARK: Channels: collisions and scanner duty

    /// Records an advertising event's three PDUs and decides them once nothing else can overlap them.
    private func queueEvent(_ index: Int, _ ad: Advertisement, _ c: CrowdingParameters) {
        let t = clock()
        let air = CrowdingParameters.airTime(ad)
        let spacing = air + c.channelGap
        let power = Double(ad.txPower ?? 0)
        for k in 0..<3 {
            let start = t + Double(k) * spacing
            channels[k].append(Transmission(node: index, start: start, end: start + air, power: power))
        }
        let node = nodes[index]
        let report = ScanReport(address: node.address, rssi: 0, txPower: ad.includeTxPower ? ad.txPower : nil,
                                manufacturerData: ad.manufacturerData, serviceUUIDs: ad.serviceUUIDs)
        // Every PDU that can overlap this event's last one starts before it ends.
        let due = t + 2 * spacing + air + 1e-6
        pending.append(PendingEvent(node: index, start: t, airTime: air, spacing: spacing, due: due, report: report, power: power))
        if !flushScheduled {
            flushScheduled = true
            base.schedule(after: due - t) { [weak self] in self?.flush() }
        }
    }

    private func flush() {
        guard let c = crowding else { return }
        let now = clock()
        var done = 0
        // Date has about 0.1 µs of resolution in this century: compare with a margin.
        while done < pending.count, pending[done].due <= now + 1e-6 {
            decide(pending[done], c)
            done += 1
        }
        pending.removeFirst(done)
        // Transmissions that ended before the oldest undecided PDU began can overlap nothing more.
        let bound = (pending.first?.start ?? now) - 0.001
        for k in 0..<3 {
            var drop = 0
            while drop < channels[k].count, channels[k][drop].end < bound { drop += 1 }
            if drop > 0 { channels[k].removeFirst(drop) }
        }
        if let next = pending.first {
            base.schedule(after: max(1e-5, next.due - now)) { [weak self] in self?.flush() }
        } else {
            flushScheduled = false
        }
        lanes?.advertDecided()
    }

    /// Which scanners hear an event, PDU by PDU.
    private func decide(_ e: PendingEvent, _ c: CrowdingParameters) {
        guard !scanners.isEmpty, nodes[e.node].powered else { return }
        let n = nodes.count
        let i = e.node
        let sigma = parameters.shadowing
        var report = e.report
        var queued: Int32 = -1
        for j in scanners where j != i {
            var heard = 0
            for k in 0..<3 {
                let start = e.start + Double(k) * e.spacing
                if let window = c.scanWindow, !listening(j, at: start, channel: k, window: window, interval: c.scanInterval) { continue }
                if c.collisions, collided(i, at: j, channel: k, start: start, end: start + e.airTime, power: e.power, c) {
                    collisionsLost += 1
                    continue
                }
                heard += 1
                // The idealised scanner hears all three channels and reports an event once.
                if c.scanWindow == nil { break }
            }
            let loss = lossOf[j]
            for _ in 0..<heard {
                if loss > 0, random.nextUnit() < loss { continue }
                var rssi = meanRSSI[i * n + j] + e.power
                if sigma > 0 { rssi += sigma * random.nextGaussian() }
                if rssi < sensitivityOf[j] { continue }
                deliver(&report, rssi: Saturating.int(rssi.rounded()), to: j, at: e.start, queued: &queued)
            }
        }
    }

    /// `x.truncatingRemainder(dividingBy: y)` for y > 0, bit for bit, without libm's fmod (a
    /// loop of its own, a twentieth of `simulate`'s main thread with a scan window): the quotient
    /// truncated, then one fused multiply-add. The remainder is exact: with q the true quotient
    /// truncated or one more (a rounded division never falls below an integer it reaches), the
    /// difference is a multiple of y's unit in the last place and at most y in size, so it is
    /// representable; one too many gives a remainder in [-y, 0), and adding y back is exact too.
    /// fmod is odd (the sign of x), so a negative x is the positive case negated. Anything else
    /// (a quotient of 2^50 or more, not finite) goes to fmod.
    @inline(__always) static func remainder(_ x: Double, _ y: Double) -> Double {
        let a = abs(x)
        guard y > 0, y.isFinite, a < y * 0x1p50 else { return x.truncatingRemainder(dividingBy: y) }
        let q = (a / y).rounded(.towardZero)
        var r = a.addingProduct(-q, y)
        if r < 0 { r += y }
        return x < 0 || (x == 0 && x.sign == .minus) ? -r : r
    }

    /// Whether scanner `j` listens on channel `k` (0 = 37) at `time`.
    @inline(__always) private func listening(_ j: Int, at time: Double, channel k: Int, window: Double, interval: Double) -> Bool {
        let cycle = 3 * interval
        var u = Self.remainder(time - nodes[j].scanPhase, cycle)
        if u < 0 { u += cycle }
        let slot = min(2, Saturating.int(u / interval))
        return slot == k && u - Double(slot) * interval < window
    }

    /// Whether another transmission on channel `k` overlapping [start, end] spoils the PDU of
    /// node `i` at receiver `j`: the receiver itself transmitting, or a transmitter it can hear
    /// that the wanted signal does not capture over.
    @inline(__always) private func collided(_ i: Int, at j: Int, channel k: Int, start: Double, end: Double, power: Double, _ c: CrowdingParameters) -> Bool {
        let n = nodes.count
        let wanted = meanRSSI[i * n + j] + power
        for t in channels[k] {
            if t.start >= end { break }
            guard t.end > start, t.node != i else { continue }
            if t.node == j { return true }
            let interferer = meanRSSI[t.node * n + j] + t.power
            if interferer < sensitivityOf[j] { continue }
            if let capture = c.capture, wanted - interferer >= capture { continue }
            return true
        }
        return false
    }

    func setScanning(_ index: Int, _ on: Bool) {
        sequentialOnly(on ? "started scanning" : "stopped scanning")
        nodes[index].scanning = on
        if on {
            if !scanners.contains(index) { scanners.append(index); scanners.sort() }
        } else {
            scanners.removeAll { $0 == index }
        }
    }

    // MARK: Connections and GATT

    func register(_ index: Int, service: GATTService, server: any GATTServerDelegate) {
        sequentialOnly("registered a service")
        nodes[index].services.removeAll { $0.uuid == service.uuid }
        nodes[index].services.append(service)
        nodes[index].server = server
    }

    func target(_ address: RadioAddress) -> Int? {
        sequentialOnly("looked up a peer")
        return byAddress[address]
    }

    func inRange(_ from: Int, _ to: Int) -> Bool {
        meanRSSI[from * nodes.count + to] + Double(nodes[from].advertisement?.txPower ?? 0) >= sensitivityOf[to]
    }

    /// Decides a connection attempt with success probability `p`: (succeeds, latency).
    private func connectionAttempt(_ p: Double) -> (Bool, TimeInterval) {
        sequentialOnly("attempted a connection")
        let ok = random.nextUnit() < p
        let latency = parameters.connectLatency * (0.5 + random.nextUnit())
        return (ok, latency)
    }

    /// Decides a connection attempt from `central` to `target` under load: each link near either
    /// end costs a factor (1 - connectLoad), and with collisions on the CONNECT_IND must survive
    /// the advertising traffic the target hears (pure ALOHA: e^-2G, G = the channel's occupancy).
    func connectionAttempt(central: Int, target: Int) -> (Bool, TimeInterval) {
        var p = parameters.connectSuccess
        if parameters.devices != nil { p *= nodes[central].character.connectFactor * nodes[target].character.connectFactor }
        if parameters.phones != nil {
            p *= nodes[central].phoneConnect * nodes[target].phoneConnect
            if nodes[central].deaf || nodes[target].stalled { p = 0 }
        }
        guard let c = crowding, c.connectLoad > 0 || c.collisions else { return connectionAttempt(p) }
        let n = nodes.count
        if c.connectLoad > 0 {
            func near(_ a: Int) -> Bool {
                a == central || a == target || meanRSSI[a * n + central] >= sensitivityOf[central] || meanRSSI[a * n + target] >= sensitivityOf[target]
            }
            let busy = linkList.reduce(0) { $0 + (near($1.central) || near($1.peripheral) ? 1 : 0) }
            p *= pow(1 - c.connectLoad, Double(busy))
        }
        if c.collisions {
            var occupancy = 0.0
            for m in nodes where m.index != target && m.index != central && m.powered {
                guard let ad = m.advertisement, meanRSSI[m.index * n + target] + Double(ad.txPower ?? 0) >= parameters.sensitivity else { continue }
                occupancy += CrowdingParameters.airTime(ad) / max(0.02, ad.interval ?? 0.1)
            }
            p *= exp(-2 * occupancy)
        }
        return connectionAttempt(p)
    }

    /// Connection slots, counted only with a connection limit.
    var connectionLimit: Int? { crowding?.maxConnections }
    func hasFreeSlot(_ index: Int) -> Bool { connectionLimit.map { nodes[index].connections < $0 } ?? true }
    /// Takes a slot of `index` for an outgoing attempt; false when the controller is at its limit.
    func takeSlot(_ index: Int) -> Bool {
        guard connectionLimit != nil else { return true }
        guard hasFreeSlot(index) else { return false }
        nodes[index].connections += 1
        peakConnections = max(peakConnections, nodes[index].connections)
        return true
    }
    func releaseSlot(_ index: Int) {
        guard connectionLimit != nil, nodes[index].connections > 0 else { return }
        nodes[index].connections -= 1
    }
    /// Connections a node's controller holds now (links and outgoing attempts; 0 without a limit).
    public func connections(of index: Int) -> Int { nodes[index].connections }

    func isLinked(_ central: Int, _ peripheral: Int) -> Bool { links.contains(Link(central: central, peripheral: peripheral)) }

    /// Links `central` to `peripheral`; false if they were linked already. With a connection
    /// limit the link holds the central's slot (taken for the attempt) and one of the peripheral's.
    @discardableResult
    func link(_ central: Int, _ peripheral: Int) -> Bool {
        sequentialOnly("linked")
        let l = Link(central: central, peripheral: peripheral)
        guard links.insert(l).inserted else { return false }
        linkList.append(l)
        if connectionLimit != nil {
            nodes[peripheral].connections += 1
            peakConnections = max(peakConnections, nodes[peripheral].connections)
        }
        return true
    }

    func unlink(_ central: Int, _ peripheral: Int, notifyCentral: Bool) {
        sequentialOnly("unlinked")
        // Both ends hear of it, and only they: their queued reports first.
        flushDeliveries(to: central)
        flushDeliveries(to: peripheral)
        let l = Link(central: central, peripheral: peripheral)
        guard links.remove(l) != nil else { return }
        linkList.removeAll { $0 == l }
        releaseSlot(central)
        releaseSlot(peripheral)
        let peripheralAddressSeenByCentral = nodes[peripheral].address
        let centralAddress = nodes[central].address
        nodes[peripheral].server?.gattCentralDisconnected(centralAddress)
        if notifyCentral { nodes[central].transport?.linkLost(peripheralAddressSeenByCentral) }
    }

    private func dropLinks(of index: Int) {
        for l in linkList where l.central == index || l.peripheral == index {
            unlink(l.central, l.peripheral, notifyCentral: true)
        }
    }

    func services(of index: Int) -> [GATTService] { nodes[index].services }
    /// The node's GATT server, for a peer's read or write: the node's own state, so its queued
    /// reports are handed over first (the caller's own were, before its event ran).
    func server(of index: Int) -> (any GATTServerDelegate)? {
        sequentialOnly("reached a peer's GATT server")
        flushDeliveries(to: index)
        return nodes[index].server
    }
}
