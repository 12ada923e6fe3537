"""Host-side self-test of the phone personas (personas.py) and the emulated link layer
(controllers.py), no QEMU, no BlueZ: about 6 s.

    python3 scripts/bluez-guest/test_personas.py

One ScriptedLink joins the three personas of a model (android, iphone-bg, iphone-fg) and a plain
Bumble device, "alpha", that acts as HeraldLab's Linux sensor does: it advertises the Herald
service, scans, checks each persona's advert (and that HeraldLab's advert filter would admit it)
and its RSSI against the model, connects to each, discovers the Herald service, reads the payload,
and writes to the iPhones the bundles the sensor writes to iOS peers: its payload (writePayload),
then a payload-sharing bundle carrying the other iPhone's payload, both in 20-byte fragments, as
the sensor sends them. Then it checks what the personas logged, and runs check.py's persona check
on a made-up bundle of alpha's. Then three centrals connect to one persona at the same moment (as
lab nodes in step do) and each reads it, a connection whose target never hears the CONNECT_IND
fails with 0x3E, and a node that paused its advertising to initiate accepts only its own target,
and a connection that arrives between the pause and the create-connection only once its own
attempt has failed; a controller reset ends its links. Exits 1 on the first failure.
"""
import asyncio, csv, json, os, struct, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from bumble import hci
from bumble.core import UUID
from bumble.device import Device, Peer
from bumble.host import Host
from bumble.transport.common import AsyncPipeSink

import check
from check import fixed_payload, short_name
from controllers import ScriptedController, ScriptedLink
import personas as P

MODEL = {
    'nodes': ['alpha'],
    'period': 3600,
    'rssi': {'android>alpha': [-55, -61], 'iphone-bg>alpha': [-64, -69], 'iphone-fg>alpha': [-58, -62],
             'alpha>android': [-56, -60], 'alpha>iphone-bg': [-65, -70], 'alpha>iphone-fg': [-59, -63]},
    'default': -80,
    'personas': {'android': {'kind': 'android', 'identifier': 2001},
                 'iphone-bg': {'kind': 'ios-background', 'identifier': 2002},
                 'iphone-fg': {'kind': 'ios-foreground', 'identifier': 2003}},
}
ALPHA = 'F0:00:00:00:00:01'
ALPHA_ID = 1001
# AdvertFilter.heraldAppleIgnorePatterns (Sources/HeraldSensor/AdvertFilter.swift).
APPLE_IGNORE = ["10....04", "10....14", "0100000000000000000000000000000000",
                "05", "07", "09", "00", "1002", "06", "08", "03", "0C", "0D", "0F", "0E", "0B"]


def apple_messages(data):
    """AdvertFilter.appleMessages: type, length, data; type 0x01 (overflow area) runs to the end."""
    out, i = [], 0
    while i < len(data):
        if data[i] == 0x01:
            out.append(data[i:])
            break
        if i + 1 >= len(data):
            out.append(data[i:i + 1])
            break
        n = min(data[i + 1], len(data) - i - 2)
        out.append(data[i:i + 2 + n])
        i += 2 + n
    return out


def admitted(advert):
    """Whether HeraldLab's AdvertFilter processes a report from a device it does not know yet."""
    service = P.HERALD_SERVICE in advert['services']
    apple = P.APPLE_MANUFACTURER in advert['manufacturer']
    pseudo = len(advert['manufacturer'].get(P.HERALD_MANUFACTURER, b'')) == 6
    if not (service or apple or pseudo):
        return False
    if apple and not service and not pseudo:
        for m in apple_messages(advert['manufacturer'][P.APPLE_MANUFACTURER]):
            h = m.hex().upper()
            if any(len(h) >= len(p) and all(c == '.' or c == d for c, d in zip(p, h)) for p in APPLE_IGNORE):
                return False
    return True


def expect(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f'ok   {what}')


def fragments(data, size=20):
    return [data[i:i + size] for i in range(0, len(data), size)]


def write_payload_bundle(payload):
    return bytes([0x01]) + struct.pack('<h', len(payload)) + payload


def sharing_bundle(rssi, payloads):
    data = b''.join(payloads)
    return bytes([0x03]) + struct.pack('<hh', rssi, len(data)) + data


async def alpha_visits(device, address, kind, other_iphone_payload):
    """Connect, discover, read, and for an iPhone write as the sensor does; disconnect."""
    connection = await asyncio.wait_for(
        device.connect(hci.Address(address, hci.Address.PUBLIC_DEVICE_ADDRESS),
                       own_address_type=hci.OwnAddressType.PUBLIC), 5)
    peer = Peer(connection)
    services = await peer.discover_service(UUID.from_16_bits(P.HERALD_SERVICE))
    expect(len(services) == 1, f'{kind}: Herald service found on connect')
    characteristics = {str(c.uuid).lower(): c for c in await peer.discover_characteristics(service=services[0])}
    signal = P.ANDROID_SIGNAL_CHARACTERISTIC if kind == 'android' else P.IOS_SIGNAL_CHARACTERISTIC
    expect(P.PAYLOAD_CHARACTERISTIC in characteristics and signal in characteristics
           and len(characteristics) == 2, f'{kind}: payload and {"Android" if kind == "android" else "iOS"} signal characteristics')
    payload = bytes(await peer.read_value(characteristics[P.PAYLOAD_CHARACTERISTIC]))
    if kind != 'android':
        for bundle in (write_payload_bundle(fixed_payload(ALPHA_ID)), sharing_bundle(-60, [other_iphone_payload])):
            for f in fragments(bundle):
                await peer.write_value(characteristics[signal], f, with_response=True)
        # A bundle that can never be whole is rejected, and the next write starts afresh.
        await peer.write_value(characteristics[signal], bytes([0x09, 0x00]), with_response=True)
        await peer.write_value(characteristics[signal], bytes([0x02, 0xC4, 0xFF]), with_response=True)
    await connection.disconnect()
    return payload


def events(out, name):
    return [json.loads(line) for line in open(os.path.join(out, f'persona-{name}.jsonl'))]


def node_device(link, name, address):
    """A Bumble host (in place of bluetoothd and the sensor) on a node controller of `link`."""
    controller = ScriptedController(name, link=link, public_address=hci.Address(address, hci.Address.PUBLIC_DEVICE_ADDRESS))
    return Device(name=name, address=hci.Address(address), host=Host(controller, AsyncPipeSink(controller)))


async def run(out):
    link = ScriptedLink(MODEL, out)
    # "alpha": a Bumble host in place of bluetoothd and HeraldLab's sensor, on a node controller.
    alpha = node_device(link, 'alpha', ALPHA)
    await alpha.power_on()
    personas = await P.start_personas(MODEL, link, out, len(MODEL['nodes']))
    addresses = {p.name: p.address for p in personas}
    expect([p.entry() for p in personas] == [
        {'address': 'F0:00:00:00:00:02', 'kind': 'android', 'identifier': 2001, 'shortName': short_name(fixed_payload(2001))},
        {'address': 'F0:00:00:00:00:03', 'kind': 'ios-background', 'identifier': 2002, 'shortName': short_name(fixed_payload(2002))},
        {'address': 'F0:00:00:00:00:04', 'kind': 'ios-foreground', 'identifier': 2003, 'shortName': short_name(fixed_payload(2003))}],
        'controllers.json entries: addresses after the nodes, kind, identifier, shortName')

    # alpha advertises as a node does (the personas must hear it at the model's RSSI) and scans.
    await alpha.start_advertising(own_address_type=hci.OwnAddressType.PUBLIC, advertising_interval_min=100,
                                  advertising_interval_max=100,
                                  advertising_data=P.advert_for('ios-foreground'))
    heard = {}
    alpha.on('advertisement', lambda a: heard.setdefault(P.text(a.address), []).append((a.rssi, a.data_bytes)))
    await alpha.start_scanning(active=False, filter_duplicates=False)
    await asyncio.sleep(2.2)  # the background iPhone advertises about once a second
    await alpha.stop_scanning()

    for name, address in addresses.items():
        reports = heard.get(address, [])
        expect(reports, f'{name}: alpha hears its adverts ({len(reports)})')
        expect({r for r, _ in reports} == {MODEL['rssi'][f'{name}>alpha'][0]},
               f'{name}: at the model RSSI {MODEL["rssi"][f"{name}>alpha"][0]}')
        advert = P.parse_advert(reports[0][1])
        expect(admitted(advert), f'{name}: HeraldLab\'s advert filter admits {reports[0][1].hex()}')
        kind = MODEL['personas'][name]['kind']
        if kind == 'android':
            expect(advert['services'] == [P.HERALD_SERVICE] and len(advert['manufacturer'].get(P.HERALD_MANUFACTURER, b'')) == 6
                   and P.APPLE_MANUFACTURER not in advert['manufacturer'],
                   f'{name}: Herald service and a 0x05F1 six-byte pseudo address')
        elif kind == 'ios-background':
            expect(advert['services'] == [] and list(advert['manufacturer']) == [P.APPLE_MANUFACTURER]
                   and advert['manufacturer'][P.APPLE_MANUFACTURER][0] == 0x01,
                   f'{name}: Apple overflow area only, no Herald service')
        else:
            expect(advert['services'] == [P.HERALD_SERVICE] and not advert['manufacturer'], f'{name}: Herald service only')
    # The refused pattern: an overflow area with no service bit (the filter port is not vacuous).
    expect(not admitted({'services': [], 'manufacturer': {P.APPLE_MANUFACTURER: bytes([0x01]) + bytes(16)}}),
           'an overflow area without a service bit is refused')

    for name, address in addresses.items():
        kind = MODEL['personas'][name]['kind']
        other = fixed_payload(2003 if name == 'iphone-bg' else 2002)
        payload = await alpha_visits(alpha, address, kind, other)
        expect(payload == fixed_payload(MODEL['personas'][name]['identifier']), f'{name}: alpha read its fixed payload')
    # Adverts while connected: a persona keeps advertising (checked on the android persona).
    connection = await alpha.connect(hci.Address(addresses['android'], hci.Address.PUBLIC_DEVICE_ADDRESS),
                                     own_address_type=hci.OwnAddressType.PUBLIC)
    await asyncio.sleep(0.3)
    heard.clear()
    await alpha.start_scanning(active=False, filter_duplicates=False)
    await asyncio.sleep(0.6)
    await alpha.stop_scanning()
    expect(heard.get(addresses['android']), 'android goes on advertising while connected')
    await connection.disconnect()
    await asyncio.sleep(0.2)

    # What the personas logged.
    log = {name: events(out, name) for name in addresses}
    for name, evs in log.items():
        start = evs[0]
        expect(start['event'] == 'start' and start['address'] == addresses[name]
               and start['shortName'] == short_name(fixed_payload(start['identifier'])), f'{name}: start event')
        reads = [e for e in evs if e['event'] == 'read']
        expect(len(reads) == 1 and reads[0]['by'] == 'alpha' and reads[0]['address'] == ALPHA,
               f'{name}: one read by alpha logged (a long read of 129 bytes counts once)')
        expect(any(e['event'] == 'connect' and e['by'] == 'alpha' for e in evs)
               and any(e['event'] == 'disconnect' and e['by'] == 'alpha' for e in evs), f'{name}: connect and disconnect by alpha')
        adverts = [e for e in evs if e['event'] == 'adverts' and e['from'] == 'alpha']
        want = MODEL['rssi'][f'alpha>{name}'][0]
        expect(adverts and all(set(e['rssi']) == {want} and e['herald'] for e in adverts),
               f'{name}: heard alpha at the model RSSI {want}')
        writes = [e for e in evs if e['event'] == 'write']
        if MODEL['personas'][name]['kind'] == 'android':
            expect(not writes, f'{name}: no signal writes')
            continue
        kinds = [w['kind'] for w in writes]
        expect(kinds == ['writePayload', 'writePayloadSharing', 'rejected', 'writeRSSI'],
               f'{name}: writes decoded in order: {kinds}')
        expect(writes[0]['payload'] == {'shortName': short_name(fixed_payload(ALPHA_ID)), 'identifier': ALPHA_ID}
               and writes[0]['by'] == 'alpha', f'{name}: writePayload carried alpha\'s payload')
        other = 2003 if name == 'iphone-bg' else 2002
        expect(writes[1]['rssi'] == -60 and writes[1]['shared'] == [{'shortName': short_name(fixed_payload(other)), 'identifier': other}],
               f'{name}: writePayloadSharing carried the other iPhone\'s payload ({other}) at RSSI -60')
        expect(writes[3]['rssi'] == -60, f'{name}: writeRSSI -60 after a rejected bundle')
    centrals = await centrals_at_once(link, alpha, addresses['iphone-fg'], out)
    await settled(centrals + [p.device for p in personas])
    return addresses


async def settled(devices):
    """Waits until no host has a command in flight (a persona re-advertises after each
    disconnection), so that closing the event loop cancels none whose answer is on its way."""
    while any(d.host.pending_response is not None for d in devices):
        await asyncio.sleep(0.01)


async def read_payload(device, address):
    connection = await asyncio.wait_for(
        device.connect(hci.Address(address, hci.Address.PUBLIC_DEVICE_ADDRESS), own_address_type=hci.OwnAddressType.PUBLIC), 5)
    peer = Peer(connection)
    services = await asyncio.wait_for(peer.discover_service(UUID.from_16_bits(P.HERALD_SERVICE)), 3)
    characteristics = {str(c.uuid).lower(): c for c in await asyncio.wait_for(peer.discover_characteristics(service=services[0]), 3)}
    payload = bytes(await asyncio.wait_for(peer.read_value(characteristics[P.PAYLOAD_CHARACTERISTIC]), 3))
    await connection.disconnect()
    return payload


async def centrals_at_once(link, alpha, address, out):
    """Lab nodes run their scan cycles in step: three centrals connect to one phone at the same
    moment (their CONNECT_INDs follow the same advert). Each gets a working link and reads."""
    centrals = [alpha]
    for name, addr in (('beta', 'F0:00:00:00:00:05'), ('gamma', 'F0:00:00:00:00:06')):
        d = node_device(link, name, addr)
        await d.power_on()
        centrals.append(d)
    payloads = await asyncio.gather(*(read_payload(d, address) for d in centrals), return_exceptions=True)
    expect(all(p == fixed_payload(MODEL['personas']['iphone-fg']['identifier']) for p in payloads),
           f'three centrals connecting to iphone-fg at once each read its payload ({[short_name(p) if isinstance(p, bytes) else repr(p) for p in payloads]})')
    readers = sorted(e['by'] for e in events(out, 'iphone-fg') if e['event'] == 'read')[-3:]
    expect(readers == ['alpha', 'beta', 'gamma'], f'iphone-fg logged a read by each ({readers})')
    return centrals


async def paused_while_initiating(out, paused=True):
    """A node that initiates to Q, its set paused by its host (as Linux does) or still
    advertising (a peer is connected to it), accepts a connection only from Q, and only after
    its own attempt to Q has failed (0x3E to its host: Linux 6.1 would take the peripheral-role
    completion for its attempt); a connection from anyone else is refused and fails on the
    initiator's side with 0x3E."""
    state = 'paused' if paused else 'advertising'
    link = ScriptedLink({'nodes': [], 'rssi': {}}, out)
    addresses = {'node': 'F0:00:00:00:00:21', 'x': 'F0:00:00:00:00:22', 'q': 'F0:00:00:00:00:23'}
    devices = {}
    for name, addr in addresses.items():
        devices[name] = node_device(link, name, addr)
        await devices[name].power_on()
    node = link.owner_of(hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS))
    from bumble.device import AdvertisingParameters
    advertising = await devices['node'].create_advertising_set(
        advertising_parameters=AdvertisingParameters(own_address_type=hci.OwnAddressType.PUBLIC))
    if paused:
        await advertising.stop()   # the host pauses the set before it initiates
    expect((node.recently_paused(hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS)) is not None) == paused,
           f'the node\'s set is {state}')

    def initiating_to(name):
        return hci.HCI_LE_Create_Connection_Command(
            le_scan_interval=96, le_scan_window=96, initiator_filter_policy=0, peer_address_type=0,
            peer_address=hci.Address(addresses[name], hci.Address.PUBLIC_DEVICE_ADDRESS), own_address_type=0,
            connection_interval_min=24, connection_interval_max=40, max_latency=0, supervision_timeout=42,
            min_ce_length=0, max_ce_length=0)

    async def connect(name):
        connection = await asyncio.wait_for(devices[name].connect(
            hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS), own_address_type=hci.OwnAddressType.PUBLIC), 5)
        ended = asyncio.get_running_loop().create_future()
        connection.on('disconnection', lambda reason: ended.done() or ended.set_result(reason))
        try:
            return connection, await asyncio.wait_for(asyncio.shield(ended), 1.5)
        except asyncio.TimeoutError:
            return connection, None

    node.pending_le_connection = initiating_to('q')
    _, reason = await connect('x')
    expect(reason == hci.HCI_ErrorCode.CONNECTION_FAILED_TO_BE_ESTABLISHED_ERROR
           and node.pending_le_connection is not None and not node.le_connections,
           f'initiating to q, its set {state}, the node refuses x; x fails with 0x3E ({reason})')
    told = []  # what the node's controller tells its host, before the enhanced-event rewrite
    tell = node.send_hci_packet
    node.send_hci_packet = lambda packet: (told.append(packet), tell(packet))[1]
    _, reason = await connect('q')
    completions = [(p.status, p.role, str(p.peer_address)) for p in told if isinstance(p, hci.HCI_LE_Connection_Complete_Event)]
    q = hci.Address(addresses['q'], hci.Address.PUBLIC_DEVICE_ADDRESS)
    expect(reason is None and node.pending_le_connection is None and q in node.le_connections
           and completions == [(hci.HCI_ErrorCode.CONNECTION_FAILED_TO_BE_ESTABLISHED_ERROR, hci.Role.CENTRAL, str(q)),
                               (hci.HCI_SUCCESS, hci.Role.PERIPHERAL, str(q))],
           f'its set {state}, the node accepts q, the peer it initiates to, after failing its own attempt to q first ({completions})')


async def paused_then_initiating(out, initiates=True):
    """Linux pauses a node's set before it sends its create-connection (its attempt is pending
    from then on). A CONNECT_IND from Q in that gap is held: when the create-connection to Q
    follows, the node fails its own attempt (0x3E) and then accepts Q as peripheral, as when it
    was already initiating; without a create-connection it accepts Q once the hold is over.
    Either way the host is never told of a peripheral connection while its attempt is pending
    (Linux 6.1 took one for its attempt and never initiated again)."""
    link = ScriptedLink({'nodes': [], 'rssi': {}}, out)
    addresses = {'node': 'F0:00:00:00:00:31', 'q': 'F0:00:00:00:00:32'}
    devices = {}
    for name, addr in addresses.items():
        devices[name] = node_device(link, name, addr)
        await devices[name].power_on()
    node = link.owner_of(hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS))
    q = hci.Address(addresses['q'], hci.Address.PUBLIC_DEVICE_ADDRESS)
    from bumble.device import AdvertisingParameters
    advertising = await devices['node'].create_advertising_set(
        advertising_parameters=AdvertisingParameters(own_address_type=hci.OwnAddressType.PUBLIC))
    await advertising.stop()   # the host pauses the set: its create-connection is on the way
    told = []  # the connection events the node's controller tells its host, and when the host initiates
    tell = node.send_hci_packet
    node.send_hci_packet = lambda packet: (told.append(packet), tell(packet))[1]
    connecting = asyncio.ensure_future(asyncio.wait_for(devices['q'].connect(
        hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS), own_address_type=hci.OwnAddressType.PUBLIC), 5))
    for _ in range(200):
        if getattr(node, 'held_connect_ind', None) is not None or connecting.done():
            break
        await asyncio.sleep(0.005)
    expect(getattr(node, 'held_connect_ind', None) is not None and not node.le_connections,
           'a CONNECT_IND just after the node paused its set is held, not yet accepted')
    if initiates:
        told.append('create-connection to q')
        node.on_hci_le_create_connection_command(hci.HCI_LE_Create_Connection_Command(
            le_scan_interval=96, le_scan_window=96, initiator_filter_policy=0, peer_address_type=0, peer_address=q,
            own_address_type=0, connection_interval_min=24, connection_interval_max=40, max_latency=0,
            supervision_timeout=42, min_ce_length=0, max_ce_length=0))
    connection = await connecting
    # q's host sends ATT requests at once, while the node still holds the connection.
    try:
        services = await asyncio.wait_for(Peer(connection).discover_services(), 3)
    except asyncio.TimeoutError:
        services = None
    expect(services is not None, f'q\'s GATT requests sent during the hold are answered ({services})')
    ended = asyncio.get_running_loop().create_future()
    connection.on('disconnection', lambda reason: ended.done() or ended.set_result(reason))
    try:
        reason = await asyncio.wait_for(asyncio.shield(ended), 1.5)
    except asyncio.TimeoutError:
        reason = None
    completions = [p if isinstance(p, str) else (p.status, p.role, str(p.peer_address))
                   for p in told if isinstance(p, (str, hci.HCI_LE_Connection_Complete_Event))]
    expected = (['create-connection to q', (hci.HCI_ErrorCode.CONNECTION_FAILED_TO_BE_ESTABLISHED_ERROR, hci.Role.CENTRAL, str(q))]
                if initiates else []) + [(hci.HCI_SUCCESS, hci.Role.PERIPHERAL, str(q))]
    what = 'its create-connection to q following' if initiates else 'no create-connection following'
    expect(reason is None and node.pending_le_connection is None and q in node.le_connections and completions == expected,
           f'{what}, the node accepts q as peripheral with no attempt of its own pending ({completions}, q: {reason})')


async def reset_ends_links(out):
    """A controller reset (Linux sends one on every power-on) ends its links: the peer's host is
    told its link timed out (0x08), and the reset controller can connect to that peer again
    instead of being answered "connection already exists"."""
    link = ScriptedLink({'nodes': [], 'rssi': {}}, out)
    addresses = {'node': 'F0:00:00:00:00:41', 'p': 'F0:00:00:00:00:42'}
    devices = {}
    for name, addr in addresses.items():
        devices[name] = node_device(link, name, addr)
        await devices[name].power_on()
    node = link.owner_of(hci.Address(addresses['node'], hci.Address.PUBLIC_DEVICE_ADDRESS))
    peer = hci.Address(addresses['p'], hci.Address.PUBLIC_DEVICE_ADDRESS)
    await devices['p'].start_advertising(own_address_type=hci.OwnAddressType.PUBLIC, advertising_interval_min=100,
                                         advertising_interval_max=100)
    connection = await asyncio.wait_for(devices['node'].connect(peer, own_address_type=hci.OwnAddressType.PUBLIC), 5)
    peer_side = next(iter(devices['p'].connections.values()))
    ended = asyncio.get_running_loop().create_future()
    peer_side.on('disconnection', lambda reason: ended.done() or ended.set_result(reason))
    node.on_hci_reset_command(hci.HCI_Reset_Command())
    try:
        reason = await asyncio.wait_for(ended, 3)
    except asyncio.TimeoutError:
        reason = None
    expect(reason == hci.HCI_ErrorCode.CONNECTION_TIMEOUT_ERROR and not node.le_connections,
           f'a reset ends the node\'s link; its peer is told it timed out ({reason})')
    told = []  # kept from the node's Bumble host, which did not ask for this connection
    node.send_hci_packet = told.append
    node.on_hci_le_create_connection_command(hci.HCI_LE_Create_Connection_Command(
        le_scan_interval=96, le_scan_window=96, initiator_filter_policy=0, peer_address_type=0, peer_address=peer,
        own_address_type=0, connection_interval_min=24, connection_interval_max=40, max_latency=0,
        supervision_timeout=42, min_ce_length=0, max_ce_length=0))
    for _ in range(200):
        if any(isinstance(p, hci.HCI_LE_Connection_Complete_Event) for p in told):
            break
        await asyncio.sleep(0.01)
    statuses = [p.status for p in told if isinstance(p, hci.HCI_LE_Connection_Complete_Event)]
    expect(statuses[:1] == [hci.HCI_SUCCESS], f'after the reset the node connects to the peer again ({statuses})')


async def connection_not_taken_up(out):
    """A CONNECT_IND its target never hears (the target is deaf) fails on the initiator's side
    with "connection failed to be established" (0x3E), as a link layer reports it, instead of
    leaving an open link that carries nothing."""
    model = {'nodes': ['central', 'target'], 'rssi': {}, 'faults': {'target': {'kind': 'deaf', 'when': 'target-deaf'}}}
    open(os.path.join(out, 'target-deaf'), 'w').close()
    link = ScriptedLink(model, out)
    devices = {}
    for name, addr in (('central', 'F0:00:00:00:00:11'), ('target', 'F0:00:00:00:00:12')):
        devices[name] = node_device(link, name, addr)
        await devices[name].power_on()
    await devices['target'].start_advertising(own_address_type=hci.OwnAddressType.PUBLIC, advertising_interval_min=100,
                                              advertising_interval_max=100)
    connection = await asyncio.wait_for(devices['central'].connect(
        hci.Address('F0:00:00:00:00:12', hci.Address.PUBLIC_DEVICE_ADDRESS), own_address_type=hci.OwnAddressType.PUBLIC), 5)
    ended = asyncio.get_running_loop().create_future()
    connection.on('disconnection', lambda reason: ended.done() or ended.set_result(reason))
    try:
        reason = await asyncio.wait_for(ended, 3)
    except asyncio.TimeoutError:
        reason = None
    expect(reason == hci.HCI_ErrorCode.CONNECTION_FAILED_TO_BE_ESTABLISHED_ERROR,
           f'a connection the deaf target never took up ends with 0x3E on the initiator ({reason})')


CONTACTS_HEADER = ['time', 'sensor', 'id', 'detect', 'read', 'measure', 'share', 'visit', 'detectHerald', 'delete', 'data']


def contact_rows_of(address, short, rssi_values):
    """Made-up contacts.csv rows for one device: detected, read (its payload's shortName), then
    one RSSI row per value."""
    return ([['t', 'BLE', address, '1', '', '', '', '', '', '', ''],
             ['t', 'BLE', address, '', '2', '', '', '', '', '', short]]
            + [['t', 'BLE', address, '', '', '3', '', '', '', '', f'RSSI:{v:.1f}'] for v in rssi_values])


def check_on_made_up_bundle(out, addresses):
    """check.py's persona check over a bundle of alpha's that detected, read and measured every
    persona, and the persona logs just written."""
    folder = os.path.join(out, 'bundle', 'nodes', 'alpha')
    os.makedirs(folder)
    rows = [CONTACTS_HEADER]
    names = []
    for name, address in addresses.items():
        short = short_name(fixed_payload(MODEL['personas'][name]['identifier']))
        names.append(short)
        rows += contact_rows_of(address, short, MODEL['rssi'][f'{name}>alpha'] * 3)
    csv.writer(open(os.path.join(folder, 'contacts.csv'), 'w')).writerows(rows)
    open(os.path.join(folder, 'detection.csv'), 'w').write(','.join(['alpha', 'Linux', '6.1', short_name(fixed_payload(ALPHA_ID))] + sorted(names)) + '\n')
    controllers = {'alpha': {'address': ALPHA}} | {
        n: {'address': a, 'kind': MODEL['personas'][n]['kind'], 'identifier': MODEL['personas'][n]['identifier']}
        for n, a in addresses.items()}
    nodes = [{'name': 'alpha', 'identifier': ALPHA_ID, 'short': short_name(fixed_payload(ALPHA_ID))}]
    failures = []
    check.check_personas(out, os.path.join(out, 'bundle'), nodes, MODEL, controllers, failures.append)
    expect(not failures, f'check.py passes the personas ({failures})')
    # And fails a node that never read one.
    open(os.path.join(folder, 'contacts.csv'), 'w').write(','.join(rows[0]) + '\n')
    open(os.path.join(folder, 'detection.csv'), 'w').write(f'alpha,Linux,6.1,{short_name(fixed_payload(ALPHA_ID))}\n')
    failures = []
    check.check_personas(out, os.path.join(out, 'bundle'), nodes, MODEL, controllers, failures.append)
    expect(len(failures) == 9, f'check.py fails a node that did not detect, read or measure any persona ({len(failures)} failures)')
    # And an iPhone that no node shared a payload with.
    path = os.path.join(out, 'persona-iphone-bg.jsonl')
    kept = [e for e in events(out, 'iphone-bg') if e.get('kind') != 'writePayloadSharing']
    open(path, 'w').write(''.join(json.dumps(e) + '\n' for e in kept))
    failures = []
    check.check_personas(out, os.path.join(out, 'bundle'), nodes, MODEL, controllers, failures.append)
    expect(failures[9:] == ['persona iphone-bg: no payload-sharing write carried another device\'s payload'],
           f'check.py fails an iPhone persona without a payload-sharing write ({failures[9:]})')


def check_pairs_on_made_up_bundle(out):
    """check.py's pair check over a bundle of two nodes where beta, its advertising failed, wrote
    the RSSI it measured of alpha to alpha: accepted only when both logs show it."""
    model = {'rssi': {'alpha>beta': [-52, -58], 'beta>alpha': [-54, -60]}}
    ids = {'alpha': 1001, 'beta': 1002}
    controllers = {'alpha': {'address': 'F0:00:00:00:00:01'}, 'beta': {'address': 'F0:00:00:00:00:02'}}
    nodes = [{'name': n, 'identifier': i, 'short': short_name(fixed_payload(i))} for n, i in ids.items()]
    bundle = os.path.join(out, 'pairs')
    for rx, tx in (('alpha', 'beta'), ('beta', 'alpha')):
        folder = os.path.join(bundle, 'nodes', rx)
        os.makedirs(folder)
        address, short = controllers[tx]['address'], short_name(fixed_payload(ids[tx]))
        values = model['rssi'][f'{tx}>{rx}'] * 6 + ([-58] if rx == 'alpha' else [])
        csv.writer(open(os.path.join(folder, 'contacts.csv'), 'w')).writerows([CONTACTS_HEADER] + contact_rows_of(address, short, values))
        open(os.path.join(folder, 'detection.csv'), 'w').write(f'{rx},Linux,6.1,{short_name(fixed_payload(ids[rx]))},{short}\n')

    def failures_with(alpha_log, beta_log):
        open(os.path.join(bundle, 'nodes', 'alpha', 'log.txt'), 'w').write(alpha_log)
        open(os.path.join(bundle, 'nodes', 'beta', 'log.txt'), 'w').write(beta_log)
        failures = []
        check.check_pairs(bundle, nodes, model, controllers, failures.append)
        return failures
    outside = ["alpha: RSSI for beta [-60.0, -58.0, -54.0] outside the script [-54, -60]"]
    wrote = 'BLESensor fault: advertising failed: failed; writing payload to peers instead\n'
    marked = 'BLESensor info: F0:00:00:00:00:02 is receive-only (it writes to this node)\n'
    neither, both = failures_with('', ''), failures_with(marked, wrote)
    expect(neither == outside, f'check.py fails an RSSI value from the other direction ({neither})')
    expect(failures_with(marked, '') == outside, 'check.py fails it when the sender never logged failed advertising')
    expect(failures_with('', wrote) == outside, 'check.py fails it when the receiver never logged a write')
    expect(both == [], f'check.py accepts RSSI the sender wrote ({both})')


def main():
    with tempfile.TemporaryDirectory() as out:
        try:
            addresses = asyncio.run(asyncio.wait_for(run(out), 30))
            asyncio.run(asyncio.wait_for(connection_not_taken_up(out), 15))
            asyncio.run(asyncio.wait_for(paused_while_initiating(out), 15))
            asyncio.run(asyncio.wait_for(paused_while_initiating(out, paused=False), 15))
            asyncio.run(asyncio.wait_for(paused_then_initiating(out), 15))
            asyncio.run(asyncio.wait_for(paused_then_initiating(out, initiates=False), 15))
            asyncio.run(asyncio.wait_for(reset_ends_links(out), 15))
            check_on_made_up_bundle(out, addresses)
            check_pairs_on_made_up_bundle(out)
        except AssertionError as e:
            print(f'FAIL {e}')
            for f in sorted(os.listdir(out)):
                if f.startswith('persona-'):
                    print(f'--- {f}')
                    print(open(os.path.join(out, f)).read(), end='')
            return 1
    print('test_personas: all passed')
    return 0


if __name__ == '__main__':
    sys.exit(main())
