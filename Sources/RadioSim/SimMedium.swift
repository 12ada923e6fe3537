import Foundation
import HeraldCore
import HeraldRadio

/// A simulated BLE medium: nodes at fixed positions advertise, scan, connect and exchange GATT
/// operations through it. Everything runs on one scheduler and draws randomness from one seeded
/// generator, so a seed gives the same run. The hot path is one scheduled event per advertising
/// event of a node; delivering it to the scanners costs a table lookup, a Gaussian draw and a
/// loss draw per scanner.
public final class SimMedium {
    public let scheduler: any Scheduler
    public let model: PropagationModel
    public var parameters: RadioParameters { model.parameters }
    private var random: SeededGenerator
    private let seed: UInt64

    final class Node {
        let index: Int
        let name: String
        let position: (x: Double, y: Double)
        var address: RadioAddress
        var powered = true
        var scanning = false
        var advertisement: Advertisement?
        var advertisingTask: ScheduledTask?
        var services: [GATTService] = []
        weak var server: (any GATTServerDelegate)?
        weak var transport: SimTransport?
        init(index: Int, name: String, position: (x: Double, y: Double), address: RadioAddress) {
            self.index = index
            self.name = name
            self.position = position
            self.address = address
        }
    }

    struct Link: Hashable { let central: Int; let peripheral: Int }

    private(set) var nodes: [Node] = []
    private var byAddress: [RadioAddress: Int] = [:]
    /// Mean RSSI of a 0 dBm transmitter, per (from, to), row-major.
    private var meanRSSI: [Double] = []
    private var links = Set<Link>()
    /// Link order for deterministic teardown.
    private var linkList: [Link] = []
    /// Scanners, kept as a list of node indices for the hot loop.
    private var scanners: [Int] = []

    /// Counters, for benchmarks and tests.
    public private(set) var advertisingEvents = 0
    public private(set) var reportsDelivered = 0

    public init(scheduler: any Scheduler, parameters: RadioParameters = RadioParameters(), seed: UInt64) {
        self.scheduler = scheduler
        self.model = PropagationModel(parameters: parameters)
        self.seed = seed
        self.random = SeededGenerator(seed: seed, stream: "medium")
    }

    /// Adds a node and returns its transport. The node starts powered on.
    public func addNode(name: String, x: Double, y: Double) -> SimTransport {
        var g = SeededGenerator(seed: seed, stream: "mac/\(name)")
        var address = RadioAddress(randomUsing: &g)
        while byAddress[address] != nil { address = RadioAddress(randomUsing: &g) }
        let node = Node(index: nodes.count, name: name, position: (x, y), address: address)
        nodes.append(node)
        byAddress[address] = node.index
        rebuildPathLoss()
        let transport = SimTransport(medium: self, index: node.index)
        node.transport = transport
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

    public func address(of index: Int) -> RadioAddress { nodes[index].address }
    public func isPowered(_ index: Int) -> Bool { nodes[index].powered }

    private func rebuildPathLoss() {
        let n = nodes.count
        meanRSSI = [Double](repeating: 0, count: n * n)
        for i in 0..<n {
            for j in 0..<n where i != j {
                let dx = nodes[i].position.x - nodes[j].position.x, dy = nodes[i].position.y - nodes[j].position.y
                meanRSSI[i * n + j] = model.meanRSSI(distance: (dx * dx + dy * dy).squareRoot())
            }
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
        let node = nodes[index]
        node.advertisement = advertisement
        guard node.advertisingTask == nil else { return }
        let interval = max(0.02, advertisement.interval ?? 0.1)
        // First event at a random point of the interval, so nodes do not advertise in lockstep.
        node.advertisingTask = scheduleAdvert(index, after: random.nextUnit() * interval)
    }

    func stopAdvertising(_ index: Int) {
        nodes[index].advertisement = nil
        nodes[index].advertisingTask?.cancel()
        nodes[index].advertisingTask = nil
    }

    private func scheduleAdvert(_ index: Int, after delay: TimeInterval) -> ScheduledTask {
        scheduler.schedule(after: delay) { [weak self] in self?.advertise(index) }
    }

    private func advertise(_ index: Int) {
        let node = nodes[index]
        guard node.powered, let ad = node.advertisement else { return }
        advertisingEvents += 1
        if !scanners.isEmpty {
            let n = nodes.count
            let tx = Double(ad.txPower ?? 0)
            let sigma = parameters.shadowing
            let loss = parameters.reportLoss
            let sensitivity = parameters.sensitivity
            var report: ScanReport?
            for j in scanners where j != index {
                if loss > 0, random.nextUnit() < loss { continue }
                var rssi = meanRSSI[index * n + j] + tx
                if sigma > 0 { rssi += sigma * random.nextGaussian() }
                if rssi < sensitivity { continue }
                if report == nil {
                    report = ScanReport(address: node.address, rssi: 0, txPower: ad.includeTxPower ? ad.txPower : nil,
                                        manufacturerData: ad.manufacturerData, serviceUUIDs: ad.serviceUUIDs)
                }
                report!.rssi = Int(rssi.rounded())
                reportsDelivered += 1
                nodes[j].transport?.deliver(report!)
            }
        }
        let interval = max(0.02, ad.interval ?? 0.1)
        node.advertisingTask = scheduleAdvert(index, after: interval + random.nextUnit() * parameters.maximumAdvertisingDelay)
    }

    func setScanning(_ index: Int, _ on: Bool) {
        nodes[index].scanning = on
        if on {
            if !scanners.contains(index) { scanners.append(index); scanners.sort() }
        } else {
            scanners.removeAll { $0 == index }
        }
    }

    // MARK: Connections and GATT

    func register(_ index: Int, service: GATTService, server: any GATTServerDelegate) {
        nodes[index].services.removeAll { $0.uuid == service.uuid }
        nodes[index].services.append(service)
        nodes[index].server = server
    }

    func target(_ address: RadioAddress) -> Int? { byAddress[address] }

    func inRange(_ from: Int, _ to: Int) -> Bool {
        meanRSSI[from * nodes.count + to] + Double(nodes[from].advertisement?.txPower ?? 0) >= parameters.sensitivity
    }

    /// Decides a connection attempt: (succeeds, latency).
    func connectionAttempt() -> (Bool, TimeInterval) {
        let ok = random.nextUnit() < parameters.connectSuccess
        let latency = parameters.connectLatency * (0.5 + random.nextUnit())
        return (ok, latency)
    }

    func isLinked(_ central: Int, _ peripheral: Int) -> Bool { links.contains(Link(central: central, peripheral: peripheral)) }

    func link(_ central: Int, _ peripheral: Int) {
        let l = Link(central: central, peripheral: peripheral)
        if links.insert(l).inserted { linkList.append(l) }
    }

    func unlink(_ central: Int, _ peripheral: Int, notifyCentral: Bool) {
        let l = Link(central: central, peripheral: peripheral)
        guard links.remove(l) != nil else { return }
        linkList.removeAll { $0 == l }
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
    func server(of index: Int) -> (any GATTServerDelegate)? { nodes[index].server }
}
