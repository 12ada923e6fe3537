"""An outside BlueZ client (bleak) reads the Herald payload characteristic of every node it finds.

    python3 bleak_read.py ADAPTER_ADDRESS OUT.json [CONTROLLERS.json]

Scans on the adapter with that address for devices advertising the Herald service (0xFCF6),
connects to each, reads the payload characteristic and writes {address: payload hex} to OUT.json,
going round until every node is read or about two minutes have passed. Phone personas listed in
CONTROLLERS.json (entries with a "kind") advertise the service too; they are left alone.
"""
import asyncio, json, sys, time
from bleak import BleakClient, BleakScanner
from dbus_fast.aio import MessageBus
from dbus_fast import BusType, Message, MessageType

HERALD = '0000fcf6-0000-1000-8000-00805f9b34fb'
PAYLOAD = '3e98c0f8-8f05-4829-a121-43e38f8933e7'


async def adapter_named(address, wait=60):
    """The hciN of the adapter with that address, asking bluetoothd again every 2 s for up to
    `wait` s while it is away (6.1's kernel BUG in hci_chan_del kills it, and the tier restarts it
    as systemd would: a loop run's bleak asked just then, got the bus's error reply and ended in a
    traceback)."""
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        reply = await bus.call(Message(destination='org.bluez', path='/', interface='org.freedesktop.DBus.ObjectManager',
                                       member='GetManagedObjects'))
        if reply.message_type == MessageType.ERROR:
            why = f'{reply.error_name}: {reply.body[0] if reply.body else ""}'
        else:
            for path, ifaces in reply.body[0].items():
                a = ifaces.get('org.bluez.Adapter1')
                if a and a['Address'].value.upper() == address.upper():
                    return path.rsplit('/', 1)[1]
            why = f'no adapter with address {address}'
        if loop.time() > deadline:
            raise SystemExit(f'bleak: {why} (asked bluetoothd for {wait} s)')
        print(f'bleak: {why}; asking bluetoothd again in 2 s', flush=True)
        await asyncio.sleep(2)


def stamp():
    return time.strftime('%H:%M:%S')


async def read_one(address, adapter):
    """Finds `address` again just before connecting (bluetoothd drops a device it has not heard
    for 30 s once discovery stops: a BLEDevice kept from an earlier scan then names a D-Bus object
    that is gone, "device ... not found"), then connects and reads the payload characteristic."""
    d = await BleakScanner.find_device_by_address(address, timeout=8, bluez={'adapter': adapter, 'filters': {'DuplicateData': True}})
    if d is None:
        raise LookupError('not heard in 8 s')
    async with BleakClient(d, bluez={'adapter': adapter}, timeout=15) as client:
        return await client.read_gatt_char(PAYLOAD)


async def main(address, out, controllers=None):
    adapter = await adapter_named(address)
    personas = {m['address'].upper() for m in json.load(open(controllers)).values() if 'kind' in m} if controllers else set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 110
    payloads, seen, attempts = {}, set(), {}
    # Scan until the three nodes are known, then read each in turn (found again just before its
    # connection), going round until every node is read or time is up.
    while loop.time() < deadline and len(payloads) < 3:
        if len(seen) < 3:
            # Every advert reported (DuplicateData): with bleak's default (false), BlueZ 5.82 gives
            # the devices it finds neither UUIDs nor manufacturer data, and bleak saw no Herald node.
            try:
                devices = await BleakScanner.discover(timeout=4, return_adv=True,
                                                      bluez={'adapter': adapter, 'filters': {'DuplicateData': True}})
            except Exception as e:
                # bluetoothd gone (6.1's kernel BUG kills it; it is restarted as systemd would): an
                # application scans again once it is back, within the same time budget.
                print(f'{stamp()} bleak: scan failed ({e!r}); scanning again in 2 s', flush=True)
                await asyncio.sleep(2)
                continue
            found = {d.address for d, adv in devices.values()
                     if HERALD in [u.lower() for u in adv.service_uuids] and d.address.upper() not in personas}
            if found - seen:
                seen |= found
                print(f'{stamp()} bleak: Herald devices seen on {adapter}: {sorted(seen)}', flush=True)
        # The node tried least often first, so one that keeps failing does not starve the others.
        for a in sorted(seen - payloads.keys(), key=lambda a: (attempts.get(a, 0), a)):
            if loop.time() > deadline:
                break
            attempts[a] = attempts.get(a, 0) + 1
            try:
                data = await read_one(a, adapter)
                payloads[a] = bytes(data).hex()
                print(f'{stamp()} bleak: read {len(data)} bytes from {a} (attempt {attempts[a]})', flush=True)
                json.dump(payloads, open(out, 'w'), indent=1)
            except Exception as e:
                print(f'{stamp()} bleak: {a} (attempt {attempts[a]}): {e!r}', flush=True)
                await asyncio.sleep(1)
    json.dump(payloads, open(out, 'w'), indent=1)
    print(f'bleak: read {len(payloads)} of {len(seen)} Herald devices', flush=True)


asyncio.run(main(*sys.argv[1:4]))
