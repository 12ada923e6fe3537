/// What a node's radio did to recover its dongle, as the wire, the manifest and log.txt name it.
public enum DongleRecoveryAction: String, Codable, Sendable, CaseIterable, CustomStringConvertible {
    /// Adapter1.Powered off, then on, through bluetoothd.
    case powerCycle = "power-cycle"
    /// sysfs `authorized` 0 then 1 of the adapter's USB device, as unplugging does.
    case usbReset = "usb-reset"

    public var description: String { rawValue }
}
