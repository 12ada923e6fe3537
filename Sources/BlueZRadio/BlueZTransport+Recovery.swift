// Recovering a dongle that stops answering. Calls to the adapter (discovery, advertising, the
// GATT application) that fail or time out `unresponsiveAfter` times in a row mean the controller
// no longer answers bluetoothd. The transport then climbs a ladder, one rung per episode:
//   1. power-cycle through bluetoothd's management API: Adapter1.Powered off, then on (the
//      radio is lost for that time: the sensor stops, and starts again once it is back);
//   2. if the adapter fails again before any call succeeded: a USB reset, as unplugging would:
//      sysfs `authorized` 0 then 1 of its USB device (where permitted: root, or install.sh's
//      udev rule); the kernel unbinds and probes the device, the adapter comes back (found again
//      by its address, whatever hciN it gets) and the sensor carries on.
// Each recovery is reported (`onRecovery`, log.txt) with its reason and outcome; the next rung
// after a USB reset is a power-cycle again. A call that succeeds puts the ladder back at 0.
//
// An adapter can also answer every call and still never initiate a connection: Linux 6.1 takes
// a peripheral-role LE Connection Complete for the outgoing attempt it has pending, and after
// that (seen in the guest tier: a node's first attempt collided with its peer connecting to it)
// it never sent LE Create Connection again, not even after bluetoothd restarted; bluetoothd
// passed on each Connect and waited. Outgoing connections that fail or time out
// `connectStallAfter` (3) times in a row, to `connectStallPeers` (2) different peers or more, are
// therefore the same signal: the same ladder, starting with a power-cycle, which flushes the
// kernel's connections and pending LE actions for that adapter. The count survives bluetoothd
// leaving the bus (the kernel's state does): `connectStallAcrossRestart` (2) failures in a row
// before it left have the adapter power-cycled as soon as it is back.
import DBus
import Foundation
import HeraldCore
import HeraldRadio

/// One recovery of a dongle: what was done, why, and whether the adapter came back.
public struct DongleRecovery: Sendable, Equatable, Codable {
    /// Seconds since 1970, when it began.
    public var at: Double
    public var action: DongleRecoveryAction
    public var ok: Bool
    public var reason: String
    public var detail: String
}

extension BlueZTransport {
    /// Whether a call says something of the dongle's health: `probe` calls (StartDiscovery,
    /// RegisterAdvertisement, RegisterApplication) count a failure and clear the count when they
    /// succeed; `teardown` calls (StopDiscovery, UnregisterAdvertisement) only count failures
    /// (their success may be "nothing to stop").
    enum AdapterCall { case none, probe, teardown }

    struct PendingRecovery {
        var action: DongleRecoveryAction
        var reason: String
        var started: Double
        var deadline: ScheduledTask?
    }

    func adapterCall(_ kind: AdapterCall, _ operation: String, failed error: TransportError?) {
        guard kind != .none else { return }
        guard let error else {
            if kind == .probe {
                adapterFailures = 0
                firstFailureAt = nil
                if let silent = notAnswering {
                    // The time it did not answer is a gap: nothing was scanned or served then.
                    notAnswering = nil
                    onGap?(silent.at, Date().timeIntervalSince1970, "dongle not answering: \(silent.reason)")
                }
                if ladder > 0, pendingRecovery == nil { note("recovery: the dongle answers again (\(operation))"); ladder = 0 }
            }
            return
        }
        switch error {
        case .timeout, .failed, .connectionFailed: break
        default: return // InProgress, not supported, not permitted, not ready: not a dead dongle
        }
        if adapterFailures == 0 { firstFailureAt = Date().timeIntervalSince1970 }
        adapterFailures += 1
        guard adapterFailures >= max(1, options.unresponsiveAfter) else { return }
        let reason = "\(adapterFailures) calls to the adapter failed in a row, the last \(operation): \(error)"
        if notAnswering == nil { notAnswering = (firstFailureAt ?? Date().timeIntervalSince1970, reason) }
        unresponsive(reason)
    }

    /// An outgoing connection attempt ended: one that worked clears the count; failed ones in a
    /// row to several peers mean the adapter no longer initiates (see the top of this file).
    func outgoingConnectEnded(_ address: RadioAddress, _ result: Result<Void, TransportError>) {
        switch result {
        case .success:
            connectFailures.removeAll()
        case .failure(let error):
            switch error {
            case .timeout, .connectionFailed: break
            default: return  // no device, no adapter, not permitted: says nothing of the initiator
            }
            connectFailures.append(address)
            let peers = Set(connectFailures).count
            guard connectFailures.count >= max(1, options.connectStallAfter), peers >= max(1, options.connectStallPeers) else { return }
            let reason = "\(connectFailures.count) outgoing connections in a row, to \(peers) peer(s), failed; the last to \(address): \(error)"
            connectFailures.removeAll()
            note("the adapter makes no outgoing connection (\(reason)); its controller or kernel no longer initiates")
            unresponsive(reason)
        }
    }

    /// bluetoothd is back (the adapter never went): outgoing connections that failed in a row
    /// before it left still say the kernel no longer initiates, since a bluetoothd restart does not
    /// clear that (a guest node measured nothing for 70 s after one, each Connect hanging while
    /// discovery waited for it). The adapter is power-cycled now, rather than after
    /// `connectStallAfter` more failures.
    func stalledAcrossRestart() {
        guard pendingRecovery == nil, connectFailures.count >= max(1, options.connectStallAcrossRestart) else { return }
        let peers = Set(connectFailures).count
        let reason = "\(connectFailures.count) outgoing connections in a row, to \(peers) peer(s), failed before bluetoothd left the bus; a bluetoothd restart does not clear a kernel that no longer initiates"
        connectFailures.removeAll()
        note("the adapter made no outgoing connection before bluetoothd restarted (\(reason))")
        unresponsive(reason)
    }

    /// The dongle no longer answers: the next rung of the ladder.
    func unresponsive(_ reason: String) {
        guard state == .poweredOn, pendingRecovery == nil, let bus, let adapter = adapterPath else { return }
        adapterFailures = 0
        if ladder == 1 { usbReset(adapter, reason) } else { powerCycle(bus, adapter, reason) }
    }

    private func begin(_ action: DongleRecoveryAction, _ reason: String) {
        let started = Date().timeIntervalSince1970
        let deadline = dispatch.schedule(after: options.recoveryDeadline) { [weak self] in
            guard let self, self.pendingRecovery?.started == started else { return }
            self.endRecovery(ok: false, "the adapter was not back within \(Saturating.int(self.options.recoveryDeadline)) s")
        }
        pendingRecovery = PendingRecovery(action: action, reason: reason, started: started, deadline: deadline)
    }

    /// Rung 1: Powered off, then on again by the transport's own re-establishing.
    private func powerCycle(_ bus: DBusConnection, _ adapter: String, _ reason: String) {
        ladder = 1
        connectFailures.removeAll()
        begin(.powerCycle, reason)
        establishFailuresDuringRecovery = 0
        note("recovery: dongle \(adapter) stopped answering (\(reason)); power-cycling it through bluetoothd (Adapter1.Powered off, then on)")
        Task {
            do {
                _ = try await self.call(bus, adapter, DBusStandardInterface.properties, "Set",
                                        [.string(BlueZ.adapter), .string("Powered"), .variant(.bool(false))])
                await self.onScheduler {
                    // bluetoothd's PropertiesChanged may come before or after its reply.
                    if self.state == .poweredOn { self.lost("adapter \(adapter) power-cycled to recover it") }
                }
            } catch {
                let e = BlueZError.transportError(error, operation: "Powered off")
                await self.onScheduler {
                    self.endRecovery(ok: false, "bluetoothd could not power it off (\(e))")
                    // Straight to the next rung: bluetoothd itself cannot reach the controller.
                    if self.state == .poweredOn { self.usbReset(adapter, "power-off failed: \(e)") }
                }
            }
        }
    }

    /// Rung 2: `authorized` 0 then 1 of the adapter's USB device.
    private func usbReset(_ adapter: String, _ reason: String) {
        ladder = 2
        let name = String(adapter.split(separator: "/").last ?? "")
        guard options.usbReset else {
            record(DongleRecovery(at: Date().timeIntervalSince1970, action: .usbReset, ok: false, reason: reason, detail: "USB resets are off for this agent"))
            return
        }
        let path: String
        do { path = try SysfsBluetooth(root: options.sysfsRoot).authorizedPath(of: name) } catch {
            record(DongleRecovery(at: Date().timeIntervalSince1970, action: .usbReset, ok: false, reason: reason, detail: "\(error)"))
            return
        }
        begin(.usbReset, reason)
        connectFailures.removeAll()
        note("recovery: dongle \(adapter) still not answering (\(reason)); resetting its USB device (\(path): 0, then 1)")
        let pause = options.usbResetPause
        DispatchQueue.global().async { [weak self] in
            var outcome: SysfsBluetooth.ResetError?
            do throws(SysfsBluetooth.ResetError) { try SysfsBluetooth.resetUSB(authorized: path, pause: pause) } catch { outcome = error }
            self?.dispatch.execute {
                guard let self else { return }
                if let outcome { self.endRecovery(ok: false, "\(outcome)") } else {
                    self.note("recovery: USB device re-authorised; waiting for the adapter to come back")
                }
            }
        }
    }

    /// The adapter is powered and chosen again: a recovery under way has worked.
    func adapterBack(_ adapter: String) {
        guard let p = pendingRecovery else { return }
        let took = Date().timeIntervalSince1970 - p.started
        endRecovery(ok: true, String(format: "adapter %@ powered and ready again after %.1f s", adapter, took))
    }

    /// Re-establishing failed during a power-cycle: after three tries, the USB rung.
    func adapterStillAway(_ error: TransportError) {
        guard let p = pendingRecovery, p.action == .powerCycle else { return }
        establishFailuresDuringRecovery += 1
        guard establishFailuresDuringRecovery >= 3 else { return }
        endRecovery(ok: false, "the adapter did not power on again (\(error))")
        if let adapter = adapterPath { usbReset(adapter, "power-cycle did not bring it back: \(error)") }
    }

    func endRecovery(ok: Bool, _ detail: String) {
        guard let p = pendingRecovery else { return }
        p.deadline?.cancel()
        pendingRecovery = nil
        record(DongleRecovery(at: p.started, action: p.action, ok: ok, reason: p.reason, detail: detail))
    }

    private func record(_ r: DongleRecovery) {
        recoveries.append(r)
        note("recovery: \(r.action) \(r.ok ? "succeeded" : "failed"): \(r.detail)")
        onRecovery?(r)
    }
}
