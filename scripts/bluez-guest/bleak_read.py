"""An outside BlueZ client (bleak) reads the Herald payload characteristic of every node it finds.

    python3 bleak_read.py ADAPTER_ADDRESS OUT.json [CONTROLLERS.json]

Scans on the adapter with that address for devices advertising the Herald service (0xFCF6),
connects to each, reads the payload characteristic and writes {address: payload hex} to OUT.json,
going round until every node is read or about two minutes have passed. Phone personas listed in
CONTROLLERS.json (entries with a "kind") advertise the service too; they are left alone.
"""
import asyncio, json, sys
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


async def main(address, out, controllers=None):
    adapter = await adapter_named(address)
    personas = {m['address'].upper() for m in json.load(open(controllers)).values() if 'kind' in m} if controllers else set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 110
    payloads, seen = {}, set()
    # Scan, then connect at once to what was just seen (bluetoothd forgets devices it no longer
    # hears), and go round again until every node is read or time is up.
    while loop.time() < deadline and len(payloads) < 3:
        # Every advert reported (DuplicateData): with bleak's default (false), BlueZ 5.82 gives
        # the devices it finds neither UUIDs nor manufacturer data, and bleak saw no Herald node.
        try:
            devices = await BleakScanner.discover(timeout=4, adapter=adapter, return_adv=True,
                                                  bluez={'filters': {'DuplicateData': True}})
        except Exception as e:
            # bluetoothd gone (6.1's kernel BUG kills it; it is restarted as systemd would): an
            # application scans again once it is back, within the same time budget.
            print(f'bleak: scan failed ({e!r}); scanning again in 2 s', flush=True)
            await asyncio.sleep(2)
            continue
        found = [d for d, adv in devices.values()
                 if HERALD in [u.lower() for u in adv.service_uuids] and d.address.upper() not in personas]
        new = {d.address for d in found} - seen
        if new:
            seen |= new
            print(f'bleak: Herald devices seen on {adapter}: {sorted(seen)}', flush=True)
        for d in found:
            if d.address in payloads or loop.time() > deadline:
                continue
            try:
                async with BleakClient(d, adapter=adapter, timeout=15) as client:
                    data = await client.read_gatt_char(PAYLOAD)
                payloads[d.address] = bytes(data).hex()
                print(f'bleak: read {len(data)} bytes from {d.address}', flush=True)
                json.dump(payloads, open(out, 'w'), indent=1)
            except Exception as e:
                print(f'bleak: {d.address}: {e!r}', flush=True)
    json.dump(payloads, open(out, 'w'), indent=1)
    print(f'bleak: read {len(payloads)} of {len(seen)} Herald devices', flush=True)


asyncio.run(main(*sys.argv[1:4]))
