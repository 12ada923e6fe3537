import Foundation
import HeraldCore
import HeraldRadio

/// The sensors of one device behind one interface, as in the Herald reference APIs. A Linux
/// node has one: the BLE sensor. The array reports its own state as `ARRAY`.
public final class SensorArray: Sensor {
    public let sensors: [any Sensor]
    public let payloadData: PayloadData?
    private var delegates: [any SensorDelegate] = []

    public init(ble: BLESensor) {
        sensors = [ble]
        payloadData = ble.payloadDataSupplier.payload(ble.transport.scheduler.now)
    }

    public func add(delegate: any SensorDelegate) {
        delegates.append(delegate)
        for s in sensors { s.add(delegate: delegate) }
    }

    public func start() {
        for s in sensors { s.start() }
        for d in delegates { d.sensor(.ARRAY, didUpdateState: .on) }
    }

    public func stop() {
        for s in sensors { s.stop() }
        for d in delegates { d.sensor(.ARRAY, didUpdateState: .off) }
    }
}
