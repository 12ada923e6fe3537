"""Phones running Herald, as Bumble devices on the guest's link: the Linux nodes meet them as they
would meet real phones (no vhci, no BlueZ: a Bumble host on a Bumble controller in this process).

controllers.py creates them when MODEL.json lists them:
    "personas": {"android":   {"kind": "android",        "identifier": 2001},
                 "iphone-bg": {"kind": "ios-background", "identifier": 2002},
                 "iphone-fg": {"kind": "ios-foreground", "identifier": 2003}}

Each persona's controller joins the ScriptedLink under the persona's name, with the next public
address of the F0:00:00:00:00:0N scheme (after the nodes), so the model's RSSI applies to it as to a
node ("android>alpha", "alpha>iphone-bg", ...). Its payload is the fixed-identifier test payload
(check.py's `fixed_payload`). The kinds follow the simulator's personas (Sources/LabNode/
IOSPersona.swift, plans/personas.yaml) and PROTOCOL.md:

- android: advertises connectable with the Herald service (0xFCF6) and 0x05F1 manufacturer data
  carrying a 6-byte pseudo device address (drawn from the identifier, so runs repeat). Its GATT
  has the Herald service: the payload characteristic (read) and the Android signal characteristic
  (write with response).
- ios-foreground: advertises the Herald service UUID only (as the simulator's foreground iPhone);
  GATT: payload, and the iOS signal characteristic (write, notify), which is how a scanner learns
  that it is an iPhone.
- ios-background: advertises only Apple manufacturer data (0x004C): the overflow area (message
  0x01) with one service bit set, as iOS does for a backgrounded app's service UUIDs. No Herald
  service in the advert: a scanner finds it by connecting and discovering services. Same GATT as
  ios-foreground. HeraldLab's AdvertFilter admits this pattern (it refuses an overflow area with
  no bit set, and other Apple message kinds).

Optional per persona: "interval_ms" (advertising interval; by default the phones': 250 ms on
Android, 152.5 ms for iOS in the foreground, 1022.5 ms in the background) and "scan" ([seconds on,
seconds off], by default [4, 3]; false: no scanning); a slow guest can be spared with longer ones
or none (the guest's model.json does without: scanning costs the emulated guest most of a CPU).

Like a phone, every persona goes on advertising while a central is connected, and scans so that
it hears the nodes at the model's RSSI. It only serves: it never connects to anyone (the
simulator's iPhone reads peripherals too, and its Android persona is a whole Herald sensor; these
are not).

The model has two iPhones because a node shares with an iPhone only what it read from other
iPhones (and from receive-only devices), never Linux or Android payloads: BLESensor's
sharingContent. With one iPhone there would be nothing to share with it.

Each appends a JSON-lines log OUTDIR/persona-<name>.jsonl; every line has "t" (Unix time) and
"event":
    start       name, kind, address, identifier, shortName, pseudoAddress (android), advert (hex)
    connect     by (controller name on the link, else null), address
    disconnect  by, address, reason
    read        by, address: a read of the payload characteristic (an ATT Read Request; the
                Read Blob requests that continue a long read are not counted again)
    write       by, address, kind: writePayload (payload), writeRSSI (rssi), writePayloadSharing
                (rssi, shared: one entry per payload), immediateSend (bytes), or rejected (error,
                hex); a payload is {"shortName", "identifier"} (identifier null unless it is a
                fixed-identifier test payload)
    adverts     from, address, count, rssi (values seen), herald (service UUID in the advert):
                the first advert heard from each sender, then a summary every 10 s (count is of
                advertising reports: a Bumble controller reports each advert twice, as an advert
                and as its scan response)
"""
import asyncio, json, os, random, struct, time

from bumble import hci
from bumble.core import UUID
from bumble.device import Device
from bumble.gatt import Characteristic, CharacteristicValue, Service
from bumble.host import Host
from bumble.transport.common import AsyncPipeSink

from check import fixed_payload, short_name
from controllers import ScriptedController

# PROTOCOL.md: identifiers.
HERALD_SERVICE = 0xFCF6
PAYLOAD_CHARACTERISTIC = '3e98c0f8-8f05-4829-a121-43e38f8933e7'
ANDROID_SIGNAL_CHARACTERISTIC = 'f617b813-092e-437a-8324-e09a80821a11'
IOS_SIGNAL_CHARACTERISTIC = '0eb0d5f2-eae4-4a9a-8af3-a4adb02d4363'
HERALD_MANUFACTURER = 0x05F1
APPLE_MANUFACTURER = 0x004C

# An iPhone app in the background: Apple's overflow area (0x01) and a 16-byte bitmask with one
# service bit set (IOSPersona.backgroundAppleData; Herald's scanners only look for a set bit).
BACKGROUND_APPLE_DATA = bytes([0x01] + [0x00] * 15 + [0x80])

KINDS = ('android', 'ios-foreground', 'ios-background')
# Advertising intervals, ms: Herald's default on Android (BLESensorSettings.advertInterval), iOS
# in the foreground and in the background (IOSPersona).
ADVERT_INTERVAL = {'android': 250, 'ios-foreground': 152.5, 'ios-background': 1022.5}
SCAN_ON, SCAN_OFF = 4.0, 3.0
ADVERT_SUMMARY_INTERVAL = 10.0
# SignalBundle.maximumDataLength.
MAX_BUNDLE_DATA = 510


# ---------------------------------------------------------------------------------------------
# Adverts and signal bundles

def ad_structure(ad_type, data):
    return bytes([len(data) + 1, ad_type]) + data


def parse_advert(data):
    """The parts of an advert that matter to Herald: 16-bit service UUIDs and manufacturer data
    by company id."""
    services, manufacturer = [], {}
    i = 0
    while i + 1 < len(data) and data[i]:
        length, ad_type = data[i], data[i + 1]
        body = data[i + 2:i + 1 + length]
        if ad_type in (0x02, 0x03):
            services += [struct.unpack_from('<H', body, j)[0] for j in range(0, len(body) - 1, 2)]
        elif ad_type == 0xFF and len(body) >= 2:
            manufacturer[struct.unpack_from('<H', body)[0]] = bytes(body[2:])
        i += 1 + length
    return {'services': services, 'manufacturer': manufacturer}


def advert_for(kind, pseudo_address=None):
    flags = ad_structure(0x01, bytes([0x06]))  # LE general discoverable, no BR/EDR
    herald = ad_structure(0x03, struct.pack('<H', HERALD_SERVICE))
    if kind == 'android':
        return flags + herald + ad_structure(0xFF, struct.pack('<H', HERALD_MANUFACTURER) + pseudo_address)
    if kind == 'ios-foreground':
        return flags + herald
    return flags + ad_structure(0xFF, struct.pack('<H', APPLE_MANUFACTURER) + BACKGROUND_APPLE_DATA)


def identifier_of(payload):
    """The identifier of a fixed-identifier test payload, else None."""
    if len(payload) == 129 and payload[:3] == bytes(3) and not any(payload[7:]):
        return struct.unpack_from('<i', payload, 3)[0]
    return None


def text(address):
    """An address as the logs and controllers.json write it: F0:00:00:00:00:01, no type."""
    return address.to_string(False)


def describe(payload):
    return {'shortName': short_name(payload), 'identifier': identifier_of(payload)}


def decode_bundle(data):
    """A buffer of concatenated signal writes, as SignalBundle.status(of:) sees it:
    ('complete', bundle dict), ('incomplete', why) or ('invalid', why). Integers little-endian."""
    if not data:
        return 'incomplete', 'no bytes yet'
    code, body = data[0], data[1:]

    def int16(at):
        return struct.unpack_from('<h', body, at)[0] if len(body) >= at + 2 else None

    def sized(at):
        # (state, data or why) for a length-prefixed data part at `at`.
        n = int16(at)
        if n is None:
            return 'incomplete', 'length needs 2 bytes'
        if n < 0 or n > MAX_BUNDLE_DATA:
            return 'invalid', f'length {n}'
        rest = body[at + 2:]
        if len(rest) < n:
            return 'incomplete', f'have {len(rest)} of {n} data bytes'
        if len(rest) > n:
            return 'invalid', f'{len(rest)} data bytes after a length of {n}'
        return 'complete', bytes(rest)

    if code == 0x02:
        if len(body) < 2:
            return 'incomplete', 'RSSI needs 2 bytes'
        if len(body) > 2:
            return 'invalid', f'RSSI bundle is {len(data)} bytes, expected 3'
        return 'complete', {'kind': 'writeRSSI', 'rssi': int16(0)}
    if code in (0x01, 0x04):
        state, part = sized(0)
        if state != 'complete':
            return state, part
        return 'complete', ({'kind': 'writePayload', 'payload': part} if code == 0x01
                            else {'kind': 'immediateSend', 'data': part})
    if code == 0x03:
        if int16(0) is None:
            return 'incomplete', 'RSSI needs 2 bytes'
        state, part = sized(2)
        if state != 'complete':
            return state, part
        return 'complete', {'kind': 'writePayloadSharing', 'rssi': int16(0), 'data': part}
    return 'invalid', f'unknown action code 0x{code:02X}'


def split_shared(data, own_length):
    """Shared payloads, as PayloadDataSupplier.payload(Data) splits them: chunks the length of
    the receiver's own payload; trailing bytes that make no whole payload are dropped."""
    return [data[i:i + own_length] for i in range(0, len(data) - own_length + 1, own_length)]


# ---------------------------------------------------------------------------------------------
# The persona

class Persona:
    """One phone: a Bumble device with the Herald GATT service on a ScriptedController on `link`
    (which goes on advertising while connected as peripheral, as phones do),
    logging to OUT/persona-<name>.jsonl. `spec` is its entry in the model's "personas"."""

    def __init__(self, name, spec, address, link, out):
        self.name = name
        self.kind = spec['kind']
        if self.kind not in KINDS:
            raise ValueError(f'persona {name}: kind {self.kind!r} is not one of {KINDS}')
        self.identifier = int(spec['identifier'])
        self.address = address
        self.link = link
        self.payload = fixed_payload(self.identifier)
        # Android draws a random pseudo address; from the identifier here, so that runs repeat.
        self.pseudo_address = (random.Random(self.identifier).randbytes(6) if self.kind == 'android' else None)
        self.advert = advert_for(self.kind, self.pseudo_address)
        self.interval = float(spec.get('interval_ms', ADVERT_INTERVAL[self.kind]))
        scan = spec.get('scan', (SCAN_ON, SCAN_OFF))
        self.scan_on, self.scan_off = (float(v) for v in scan) if scan else (0.0, 0.0)
        self.log_file = open(os.path.join(out, f'persona-{name}.jsonl'), 'a')
        self.buffers = {}       # signal write fragments, by connection handle
        self.heard = {}         # adverts heard since the last summary, by sender address
        self.controller = ScriptedController(name, link=link,
                                            public_address=hci.Address(address, hci.Address.PUBLIC_DEVICE_ADDRESS))
        self.device = Device(name=name, address=hci.Address(address),
                             host=Host(self.controller, AsyncPipeSink(self.controller)))
        self.payload_characteristic = Characteristic(
            PAYLOAD_CHARACTERISTIC, Characteristic.Properties.READ, Characteristic.READABLE,
            CharacteristicValue(read=lambda connection: self.payload))
        if self.kind == 'android':
            signal = Characteristic(ANDROID_SIGNAL_CHARACTERISTIC, Characteristic.Properties.WRITE,
                                    Characteristic.WRITEABLE, CharacteristicValue(write=self.on_signal_write))
        else:
            signal = Characteristic(IOS_SIGNAL_CHARACTERISTIC,
                                    Characteristic.Properties.WRITE | Characteristic.Properties.NOTIFY,
                                    Characteristic.WRITEABLE, CharacteristicValue(write=self.on_signal_write))
        self.device.add_service(Service(UUID.from_16_bits(HERALD_SERVICE), [self.payload_characteristic, signal]))
        # A read is an ATT Read Request for the payload (the value callback above also answers
        # each Read Blob of a long read, which is not a new read).
        server = self.device.gatt_server
        read_request = server.on_att_read_request

        def on_att_read_request(bearer, request):
            if request.attribute_handle == self.payload_characteristic.handle:
                connection = getattr(bearer, 'connection', None) or bearer
                self.log('read', by=self.name_of(connection.peer_address), address=text(connection.peer_address))
            return read_request(bearer, request)
        server.on_att_read_request = on_att_read_request

    # --- helpers

    def log(self, event, **fields):
        self.log_file.write(json.dumps({'t': round(time.time(), 3), 'event': event, **fields}) + '\n')
        self.log_file.flush()

    def name_of(self, address):
        """The name of the controller on the link that owns `address` (a node or a persona)."""
        owner = self.link.owner_of(address)
        return owner.name if owner is not None else None

    # --- running

    async def start(self):
        await self.device.power_on()
        self.device.on('connection', self.on_connection)
        self.device.on('advertisement', self.on_advertisement)
        await self.device.start_advertising(own_address_type=hci.OwnAddressType.PUBLIC, auto_restart=True,
                                            advertising_data=self.advert, advertising_interval_min=self.interval,
                                            advertising_interval_max=self.interval)
        self.log('start', name=self.name, kind=self.kind, address=self.address, identifier=self.identifier,
                 shortName=short_name(self.payload), interval_ms=self.interval, scan=[self.scan_on, self.scan_off],
                 pseudoAddress=self.pseudo_address.hex() if self.pseudo_address else None, advert=self.advert.hex())
        self.tasks = [asyncio.create_task(self.scan_cycle()), asyncio.create_task(self.summarise_adverts())] if self.scan_on > 0 else []

    async def scan_cycle(self):
        while True:
            await self.device.start_scanning(active=False, filter_duplicates=False)
            await asyncio.sleep(self.scan_on)
            await self.device.stop_scanning()
            await asyncio.sleep(self.scan_off)

    # --- events

    def on_connection(self, connection):
        peer = connection.peer_address
        self.log('connect', by=self.name_of(peer), address=text(peer))

        def on_disconnection(reason):
            self.buffers.pop(connection.handle, None)
            self.log('disconnect', by=self.name_of(peer), address=text(peer), reason=int(reason))
        connection.on('disconnection', on_disconnection)

    def on_signal_write(self, connection, value):
        """Fragments are concatenated per connection until they make one complete bundle, which
        is logged; a buffer that can never become one is logged as rejected and dropped. Writes
        always succeed, as on the phones."""
        buffer = self.buffers.get(connection.handle, b'') + bytes(value)
        state, result = decode_bundle(buffer)
        fields = {'by': self.name_of(connection.peer_address), 'address': text(connection.peer_address)}
        if state == 'incomplete' and len(buffer) <= MAX_BUNDLE_DATA + 5:
            self.buffers[connection.handle] = buffer
            return
        self.buffers.pop(connection.handle, None)
        if state != 'complete':
            self.log('write', kind='rejected', error=result if state == 'invalid' else f'too large: {result}',
                     hex=buffer.hex(), **fields)
        elif result['kind'] == 'writePayload':
            self.log('write', kind='writePayload', payload=describe(result['payload']), **fields)
        elif result['kind'] == 'writeRSSI':
            self.log('write', kind='writeRSSI', rssi=result['rssi'], **fields)
        elif result['kind'] == 'writePayloadSharing':
            shared = [describe(p) for p in split_shared(result['data'], len(self.payload))]
            self.log('write', kind='writePayloadSharing', rssi=result['rssi'], shared=shared, **fields)
        else:
            self.log('write', kind='immediateSend', bytes=len(result['data']), **fields)

    def on_advertisement(self, advertisement):
        address = advertisement.address
        advert = parse_advert(advertisement.data_bytes)
        herald = HERALD_SERVICE in advert['services']
        entry = self.heard.get(text(address))
        if entry is None:
            # The first advert from a sender is logged at once.
            self.heard[text(address)] = {'address': address, 'count': 0, 'rssi': set(), 'herald': herald}
            self.log('adverts', **{'from': self.name_of(address)}, address=text(address), count=1,
                     rssi=[advertisement.rssi], herald=herald)
            return
        entry['count'] += 1
        entry['rssi'].add(advertisement.rssi)
        entry['herald'] = entry['herald'] or herald

    async def summarise_adverts(self):
        while True:
            await asyncio.sleep(ADVERT_SUMMARY_INTERVAL)
            for key, entry in self.heard.items():
                if entry['count']:
                    self.log('adverts', **{'from': self.name_of(entry['address'])}, address=key,
                             count=entry['count'], rssi=sorted(entry['rssi']), herald=entry['herald'])
                    entry['count'], entry['rssi'] = 0, set()

    def entry(self):
        """This persona's entry in controllers.json."""
        return {'address': self.address, 'kind': self.kind, 'identifier': self.identifier,
                'shortName': short_name(self.payload)}


async def start_personas(model, link, out, first_index):
    """Starts the personas MODEL lists, the first at address F0:00:00:00:00:<first_index + 1>,
    in the order listed; returns them (keep them: their tasks run as long as they are held)."""
    personas = []
    for i, (name, spec) in enumerate(model.get('personas', {}).items()):
        persona = Persona(name, spec, f'F0:00:00:00:00:{first_index + i + 1:02X}', link, out)
        await persona.start()
        personas.append(persona)
    return personas
