import Foundation

/// Receives every event of a sensor or sensor array, as in the Herald reference APIs.
/// All methods have empty default implementations.
public protocol SensorDelegate: AnyObject {
    /// A new device entered the device database (not a pseudo-address merge).
    func sensor(_ sensor: SensorType, didDetect: TargetIdentifier)
    /// The payload of a device became known.
    func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier)
    /// An immediate-send bundle arrived.
    func sensor(_ sensor: SensorType, didReceive: Data, fromTarget: TargetIdentifier)
    /// A payload-sharing bundle arrived: the payloads the target has seen recently.
    func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier)
    /// An RSSI measurement.
    func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier)
    /// An RSSI measurement of a device whose payload is known.
    func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier, withPayload: PayloadData)
    /// A location visit.
    func sensor(_ sensor: SensorType, didVisit: Location?)
    /// The sensor was switched on or off, or became unavailable.
    func sensor(_ sensor: SensorType, didUpdateState: SensorState)
    /// available true: confirmed Herald device (just before each didRead); false: device purged.
    func sensor(_ sensor: SensorType, available: Bool, didDeleteOrDetect: TargetIdentifier)
}

extension SensorDelegate {
    public func sensor(_ sensor: SensorType, didDetect: TargetIdentifier) {}
    public func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) {}
    public func sensor(_ sensor: SensorType, didReceive: Data, fromTarget: TargetIdentifier) {}
    public func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) {}
    public func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier) {}
    public func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier, withPayload: PayloadData) {}
    public func sensor(_ sensor: SensorType, didVisit: Location?) {}
    public func sensor(_ sensor: SensorType, didUpdateState: SensorState) {}
    public func sensor(_ sensor: SensorType, available: Bool, didDeleteOrDetect: TargetIdentifier) {}
}

/// A sensor (or a sensor array): start, stop, and delegates that see its events.
public protocol Sensor: AnyObject {
    func add(delegate: any SensorDelegate)
    func start()
    func stop()
}
