"""An outside BlueZ client (bleak) reads the Herald payload characteristic of every node it finds.

    python3 bleak_read.py ADAPTER_ADDRESS OUT.json

Scans on the adapter with that address for devices advertising the Herald service (0xFCF6),
connects to each, reads the payload characteristic and writes {address: payload hex} to OUT.json.
"""
import asyncio, json, sys
from bleak import BleakClient, BleakScanner
from dbus_fast.aio import MessageBus
from dbus_fast import BusType, Message

HERALD = '0000fcf6-0000-1000-8000-00805f9b34fb'
PAYLOAD = '3e98c0f8-8f05-4829-a121-43e38f8933e7'


async def adapter_named(address):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    reply = await bus.call(Message(destination='org.bluez', path='/', interface='org.freedesktop.DBus.ObjectManager',
                                   member='GetManagedObjects'))
    for path, ifaces in reply.body[0].items():
        a = ifaces.get('org.bluez.Adapter1')
        if a and a['Address'].value.upper() == address.upper():
            return path.rsplit('/', 1)[1]
    raise SystemExit(f'no adapter with address {address}')


async def main(address, out):
    adapter = await adapter_named(address)
    found = {}
    for attempt in range(6):
        devices = await BleakScanner.discover(timeout=5, adapter=adapter, return_adv=True)
        for d, adv in devices.values():
            if HERALD in [u.lower() for u in adv.service_uuids]:
                found[d.address] = d
        if len(found) >= 3:
            break
    print(f'bleak: {len(found)} Herald devices seen on {adapter}', flush=True)
    payloads = {}
    for addr, d in sorted(found.items()):
        for attempt in range(3):
            try:
                async with BleakClient(d, adapter=adapter, timeout=20) as client:
                    data = await client.read_gatt_char(PAYLOAD)
                    payloads[addr] = bytes(data).hex()
                    print(f'bleak: read {len(data)} bytes from {addr}', flush=True)
                    break
            except Exception as e:
                print(f'bleak: {addr} attempt {attempt + 1}: {e!r}', flush=True)
                await asyncio.sleep(2)
    json.dump(payloads, open(out, 'w'), indent=1)


asyncio.run(main(sys.argv[1], sys.argv[2]))
