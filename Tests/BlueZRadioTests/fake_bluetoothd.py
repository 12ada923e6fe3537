"""A simulated bluetoothd for the BlueZ transport's tests (dbus-fast, on the test's private bus).

It owns org.bluez and serves the part of BlueZ 5.66's API the Herald sensor uses, with BlueZ's
types: ObjectManager at /, Adapter1 (+ GattManager1, LEAdvertisingManager1) at /org/bluez/hci0,
and one remote Herald device that appears when discovery starts, advertises every 0.1 s
(RSSI follows a script; ManufacturerData a{qv} re-sent on every advert as with DuplicateData),
accepts Connect (GATT objects under serviceXXXX/charYYYY, then ServicesResolved) and serves a
fixed payload. Like bluetoothd, RegisterApplication calls the app's GetManagedObjects and
RegisterAdvertisement calls Properties.GetAll before replying.

Test control at /org/heraldlab/fake (org.heraldlab.Fake):
  State() -> s            JSON of what the app did (power, filter, app tree, advertisement, counts)
  ReadLocal(q) -> ay      reads the app's payload characteristic at an offset, as a remote central
  WriteLocal(ay)          writes the app's signal characteristic, as a remote central
  FailNext(s, s)          the next call of a member answers with org.bluez.Error.<name>
  Restart()               bluetoothd stops (name released, objects gone) and comes back in 0.5 s
  RemoveAdapter()         the adapter disappears (InterfacesRemoved)
  Wedge(s, b)             the controller stops answering: adapter calls (discovery, advertising,
                          GATT application) fail ("fail": org.bluez.Error.Failed) or are never
                          answered ("hang"), until a power-cycle (b false) or a Replug (b true)
  Replug()                the adapter goes away and comes back 0.5 s later, powered off, with the
                          same address (what a USB reset does); a wedge is cleared
  Beacon(ay)              the remote device also advertises manufacturer data 0xFFFF with these bytes
  StallConnects(b)        Device1.Connect is never answered (b true) until the adapter is powered off
                          and on again, as with a kernel that stopped initiating (Linux 6.1 after a
                          connection collision: bluetoothd passes each Connect on and waits)
  Slow(s, d)              every call of a member is answered d seconds late (0: on time again), as
                          a bluetoothd busy with many adapters on a loaded host answers
  PeerLink()              the remote connects to us (Connected and ServicesResolved true without a
                          Connect; at once, or when it is discovered), and closes that link at our next ReadValue, which then fails
                          "Failed: Not connected" as bluetoothd 5.82 answers (two nodes reading
                          each other at once); the link's PropertiesChanged follows the answer 20 ms later
State() includes 'power' (every Powered value set), 'wedgedCalls', 'replugs', 'stalledConnects' and
'peerLinkDrops'.

Usage: fake_bluetoothd.py BUS_ADDRESS PAYLOAD_HEX RSSI_LIST(comma separated)
"""
import asyncio, json, sys
from dbus_fast.aio import MessageBus
from dbus_fast import Message, MessageType, Variant

ADAPTER = '/org/bluez/hci0'
REMOTE_ADDR = '11:22:33:44:55:66'
REMOTE = ADAPTER + '/dev_' + REMOTE_ADDR.replace(':', '_')
SERVICE = REMOTE + '/service0010'
PAYLOAD_CHAR = SERVICE + '/char0011'
SIGNAL_CHAR = SERVICE + '/char0013'
CENTRAL = ADAPTER + '/dev_AA_BB_CC_DD_EE_01'
HERALD = '0000fcf6-0000-1000-8000-00805f9b34fb'
PSEUDO = bytes([1, 2, 3, 4, 5, 6])
OM = 'org.freedesktop.DBus.ObjectManager'
PROPS = 'org.freedesktop.DBus.Properties'


class Fake:
    def __init__(self, address, payload, rssi):
        self.address, self.payload, self.rssi = address, payload, rssi
        self.state = {'powerSets': 0, 'filter': None, 'discoveryStarts': 0, 'discoveryStops': 0,
                      'apps': [], 'adverts': [], 'unregistered': 0, 'connects': 0, 'disconnects': 0,
                      'reads': 0, 'writes': [], 'restarts': 0, 'power': [], 'wedgedCalls': 0, 'replugs': 0, 'appsRefused': 0,
                      'stalledConnects': 0, 'peerLinkDrops': 0}
        self.wedge = None   # (mode, sticky)
        self.stall_connects = False  # Connect never answered until a power-on
        self.peer_link = False  # the remote's own link to us, closed at our next ReadValue
        self.beacon = None  # extra manufacturer data 0xFFFF of the remote
        self.fail = {}
        self.hang = set()   # methods whose next call is never answered (a controller that hangs)
        self.slow = {}      # member -> seconds every call of it is answered late
        self.delayed = set()  # (sender, serial) of the calls being handled late
        self.discovering = False
        self.advertiser = None
        self.app = None  # (sender, root, tree)
        self.reset_objects()

    def reset_objects(self):
        self.objects = {ADAPTER: {
            'org.bluez.Adapter1': {'Address': Variant('s', 'AA:BB:CC:DD:EE:00'), 'Name': Variant('s', 'fake'),
                                   'Powered': Variant('b', False), 'Discovering': Variant('b', False),
                                   'Roles': Variant('as', ['central', 'peripheral'])},
            'org.bluez.GattManager1': {},
            'org.bluez.LEAdvertisingManager1': {'ActiveInstances': Variant('y', 0), 'SupportedInstances': Variant('y', 4),
                                                'SupportedIncludes': Variant('as', ['tx-power', 'appearance', 'local-name'])},
        }}

    # --- signals
    def added(self, path, ifaces):
        self.objects.setdefault(path, {}).update(ifaces)
        self.bus.send(Message(message_type=MessageType.SIGNAL, path='/', interface=OM, member='InterfacesAdded',
                              signature='oa{sa{sv}}', body=[path, ifaces]))

    def removed(self, path):
        ifaces = self.objects.pop(path, None)
        if ifaces is None:
            return
        self.bus.send(Message(message_type=MessageType.SIGNAL, path='/', interface=OM, member='InterfacesRemoved',
                              signature='oas', body=[path, sorted(ifaces.keys())]))

    def changed(self, path, iface, props):
        self.objects[path][iface].update(props)
        self.bus.send(Message(message_type=MessageType.SIGNAL, path=path, interface=PROPS, member='PropertiesChanged',
                              signature='sa{sv}as', body=[iface, props, []]))

    # --- the remote device
    async def advertise(self):
        i = 0
        while self.discovering:
            rssi = self.rssi[i % len(self.rssi)]
            if REMOTE not in self.objects:
                self.added(REMOTE, {'org.bluez.Device1': {
                    'Address': Variant('s', REMOTE_ADDR), 'AddressType': Variant('s', 'random'),
                    'Adapter': Variant('o', ADAPTER), 'RSSI': Variant('n', rssi),
                    'ManufacturerData': Variant('a{qv}', self.manufacturer()),
                    'UUIDs': Variant('as', [HERALD]), 'Connected': Variant('b', self.peer_link),
                    'ServicesResolved': Variant('b', self.peer_link), 'Paired': Variant('b', False)}})
                if self.peer_link:
                    self.add_services()
            else:
                props = {'ManufacturerData': Variant('a{qv}', self.manufacturer())}
                if self.objects[REMOTE]['org.bluez.Device1']['RSSI'].value != rssi:
                    props['RSSI'] = Variant('n', rssi)
                self.changed(REMOTE, 'org.bluez.Device1', props)
            i += 1
            await asyncio.sleep(0.1)

    def manufacturer(self):
        data = {0x05F1: Variant('ay', PSEUDO)}
        if self.beacon is not None:
            data[0xFFFF] = Variant('ay', self.beacon)
        return data

    async def replug(self):
        self.state['replugs'] += 1
        self.discovering = False
        self.wedge = None
        for p in sorted(self.objects, reverse=True):
            self.removed(p)
        await asyncio.sleep(0.5)
        self.reset_objects()
        self.bus.send(Message(message_type=MessageType.SIGNAL, path='/', interface=OM, member='InterfacesAdded',
                              signature='oa{sa{sv}}', body=[ADAPTER, self.objects[ADAPTER]]))

    async def connect(self, msg):
        self.state['connects'] += 1
        await asyncio.sleep(0.05)
        self.changed(REMOTE, 'org.bluez.Device1', {'Connected': Variant('b', True)})
        self.add_services()
        await asyncio.sleep(0.05)
        self.changed(REMOTE, 'org.bluez.Device1', {'ServicesResolved': Variant('b', True)})
        self.bus.send(Message.new_method_return(msg))

    def add_services(self):
        if SERVICE not in self.objects:
            self.added(SERVICE, {'org.bluez.GattService1': {'UUID': Variant('s', HERALD), 'Primary': Variant('b', True),
                                                            'Device': Variant('o', REMOTE)}})
            self.added(PAYLOAD_CHAR, {'org.bluez.GattCharacteristic1': {
                'UUID': Variant('s', '3e98c0f8-8f05-4829-a121-43e38f8933e7'), 'Service': Variant('o', SERVICE),
                'Flags': Variant('as', ['read'])}})
            self.added(SIGNAL_CHAR, {'org.bluez.GattCharacteristic1': {
                'UUID': Variant('s', 'f617b813-092e-437a-8324-e09a80821a11'), 'Service': Variant('o', SERVICE),
                'Flags': Variant('as', ['write', 'write-without-response'])}})

    # --- registrations: call back into the app before replying, as bluetoothd does
    async def register_app(self, msg):
        root = msg.body[0]
        if self.app is not None and self.app[:2] == (msg.sender, root):
            # As bluetoothd: an application stays registered until it is unregistered, its
            # client leaves the bus or bluetoothd restarts (a power-cycle keeps it).
            self.state['appsRefused'] += 1
            self.bus.send(Message.new_error(msg, 'org.bluez.Error.AlreadyExists', 'Already Exists'))
            return
        reply = await self.bus.call(Message(destination=msg.sender, path=root, interface=OM, member='GetManagedObjects'))
        if reply.message_type == MessageType.ERROR:
            self.bus.send(Message.new_error(msg, 'org.bluez.Error.Failed', 'GetManagedObjects failed'))
            return
        tree = {p: {i: {k: v.value for k, v in props.items()} for i, props in ifs.items()} for p, ifs in reply.body[0].items()}
        self.app = (msg.sender, root, tree)
        self.state['apps'].append(jsonable(tree))
        self.bus.send(Message.new_method_return(msg))

    async def register_advert(self, msg):
        path = msg.body[0]
        reply = await self.bus.call(Message(destination=msg.sender, path=path, interface=PROPS, member='GetAll',
                                            signature='s', body=['org.bluez.LEAdvertisement1']))
        if reply.message_type == MessageType.ERROR:
            self.bus.send(Message.new_error(msg, 'org.bluez.Error.Failed', 'GetAll failed'))
            return
        props = {k: v.value for k, v in reply.body[0].items()}
        self.advertiser = (msg.sender, path)
        self.state['adverts'].append({'path': path, 'props': jsonable(props)})
        self.bus.send(Message.new_method_return(msg))

    def app_char(self, uuid):
        sender, root, tree = self.app
        for p, ifs in tree.items():
            c = ifs.get('org.bluez.GattCharacteristic1')
            if c and c['UUID'] == uuid:
                return sender, p
        raise KeyError(uuid)

    async def read_local(self, msg):
        sender, path = self.app_char('3e98c0f8-8f05-4829-a121-43e38f8933e7')
        opts = {'offset': Variant('q', msg.body[0]), 'device': Variant('o', CENTRAL), 'mtu': Variant('q', 23),
                'link': Variant('s', 'LE')}
        reply = await self.bus.call(Message(destination=sender, path=path, interface='org.bluez.GattCharacteristic1',
                                            member='ReadValue', signature='a{sv}', body=[opts]))
        if reply.message_type == MessageType.ERROR:
            self.bus.send(Message.new_error(msg, reply.error_name, str(reply.body[0] if reply.body else '')))
        else:
            self.bus.send(Message.new_method_return(msg, 'ay', reply.body))

    async def write_local(self, msg):
        sender, path = self.app_char('f617b813-092e-437a-8324-e09a80821a11')
        opts = {'offset': Variant('q', 0), 'device': Variant('o', CENTRAL), 'type': Variant('s', 'request')}
        reply = await self.bus.call(Message(destination=sender, path=path, interface='org.bluez.GattCharacteristic1',
                                            member='WriteValue', signature='aya{sv}', body=[msg.body[0], opts]))
        if reply.message_type == MessageType.ERROR:
            self.bus.send(Message.new_error(msg, reply.error_name, ''))
        else:
            self.bus.send(Message.new_method_return(msg))

    async def restart(self, msg):
        self.state['restarts'] += 1
        self.bus.send(Message.new_method_return(msg))
        self.discovering = False
        self.app = None
        self.advertiser = None
        await self.bus.release_name('org.bluez')
        self.reset_objects()
        await asyncio.sleep(0.5)
        await self.bus.request_name('org.bluez')

    async def late(self, msg, seconds):
        """Handles a call `seconds` late, as it would have been handled at once."""
        await asyncio.sleep(seconds)
        self.delayed.add((msg.sender, msg.serial))
        reply = self.handler(msg)
        self.delayed.discard((msg.sender, msg.serial))
        if isinstance(reply, Message):
            self.bus.send(reply)

    # --- dispatch
    def handler(self, msg):
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        m, path, iface = msg.member, msg.path, msg.interface
        if m in self.fail:
            name = self.fail.pop(m)
            return Message.new_error(msg, 'org.bluez.Error.' + name, 'injected by the test')
        if m in self.slow and iface != 'org.heraldlab.Fake' and (msg.sender, msg.serial) not in self.delayed:
            self.state.setdefault('slowCalls', {}).setdefault(m, 0)
            self.state['slowCalls'][m] += 1
            asyncio.ensure_future(self.late(msg, self.slow[m])); return True
        if m in self.hang and iface != 'org.heraldlab.Fake':
            self.hang.discard(m)
            self.state.setdefault('hung', []).append(m)
            return True  # never answered
        if iface == 'org.heraldlab.Fake':
            if m == 'State':
                return Message.new_method_return(msg, 's', [json.dumps(self.state)])
            if m == 'ReadLocal':
                asyncio.ensure_future(self.read_local(msg)); return True
            if m == 'WriteLocal':
                asyncio.ensure_future(self.write_local(msg)); return True
            if m == 'FailNext':
                self.fail[msg.body[0]] = msg.body[1]; return Message.new_method_return(msg)
            if m == 'HangNext':
                self.hang.add(msg.body[0]); return Message.new_method_return(msg)
            if m == 'Restart':
                asyncio.ensure_future(self.restart(msg)); return True
            if m == 'Wedge':
                self.wedge = (msg.body[0], msg.body[1]); return Message.new_method_return(msg)
            if m == 'Replug':
                asyncio.ensure_future(self.replug()); return Message.new_method_return(msg)
            if m == 'Slow':
                if msg.body[1] > 0:
                    self.slow[msg.body[0]] = msg.body[1]
                else:
                    self.slow.pop(msg.body[0], None)
                return Message.new_method_return(msg)
            if m == 'StallConnects':
                self.stall_connects = bool(msg.body[0]); return Message.new_method_return(msg)
            if m == 'PeerLink':
                self.peer_link = True
                if REMOTE in self.objects:  # else it appears connected when discovered
                    self.add_services()
                    self.changed(REMOTE, 'org.bluez.Device1', {'Connected': Variant('b', True), 'ServicesResolved': Variant('b', True)})
                return Message.new_method_return(msg)
            if m == 'Beacon':
                self.beacon = bytes(msg.body[0]); return Message.new_method_return(msg)
            if m == 'RemoveAdapter':
                self.discovering = False
                for p in sorted(self.objects, reverse=True):
                    self.removed(p)
                return Message.new_method_return(msg)
            return None
        wedgeable = {'org.bluez.Adapter1': ('SetDiscoveryFilter', 'StartDiscovery', 'StopDiscovery'),
                     'org.bluez.LEAdvertisingManager1': ('RegisterAdvertisement', 'UnregisterAdvertisement'),
                     'org.bluez.GattManager1': ('RegisterApplication',)}
        if self.wedge is not None and m in wedgeable.get(iface, ()):
            self.state['wedgedCalls'] += 1
            if self.wedge[0] == 'hang':
                return True
            return Message.new_error(msg, 'org.bluez.Error.Failed', 'Timeout waiting for the controller')
        if iface == OM and m == 'GetManagedObjects' and path == '/':
            return Message.new_method_return(msg, 'a{oa{sa{sv}}}', [self.objects])
        if path not in self.objects:
            return Message.new_error(msg, 'org.freedesktop.DBus.Error.UnknownObject', path)
        if iface == PROPS:
            if m == 'Get':
                v = self.objects[path].get(msg.body[0], {}).get(msg.body[1])
                if v is None:
                    return Message.new_error(msg, 'org.freedesktop.DBus.Error.InvalidArgs', 'no property')
                return Message.new_method_return(msg, 'v', [v])
            if m == 'GetAll':
                return Message.new_method_return(msg, 'a{sv}', [self.objects[path].get(msg.body[0], {})])
            if m == 'Set' and path == ADAPTER and msg.body[1] == 'Powered':
                self.state['powerSets'] += 1
                on = bool(msg.body[2].value)
                self.state['power'].append(on)
                if not on:
                    self.discovering = False
                if not on and self.stall_connects:
                    self.stall_connects = 'off'  # powering off flushes the kernel's connections
                if on and self.stall_connects == 'off':
                    self.stall_connects = False
                if on and self.wedge is not None and not self.wedge[1]:
                    self.wedge = None  # a power-cycle clears a controller that is not stuck for good
                self.changed(ADAPTER, 'org.bluez.Adapter1', {'Powered': msg.body[2]})
                return Message.new_method_return(msg)
        if iface == 'org.bluez.Adapter1':
            if m == 'SetDiscoveryFilter':
                self.state['filter'] = jsonable({k: v.value for k, v in msg.body[0].items()})
                return Message.new_method_return(msg)
            if m == 'StartDiscovery':
                self.state['discoveryStarts'] += 1
                if not self.discovering:
                    self.discovering = True
                    self.changed(ADAPTER, 'org.bluez.Adapter1', {'Discovering': Variant('b', True)})
                    asyncio.ensure_future(self.advertise())
                return Message.new_method_return(msg)
            if m == 'StopDiscovery':
                self.state['discoveryStops'] += 1
                if not self.discovering:
                    return Message.new_error(msg, 'org.bluez.Error.Failed', 'No discovery started')
                self.discovering = False
                self.changed(ADAPTER, 'org.bluez.Adapter1', {'Discovering': Variant('b', False)})
                return Message.new_method_return(msg)
        if iface == 'org.bluez.GattManager1' and m == 'RegisterApplication':
            asyncio.ensure_future(self.register_app(msg)); return True
        if iface == 'org.bluez.LEAdvertisingManager1':
            if m == 'RegisterAdvertisement':
                asyncio.ensure_future(self.register_advert(msg)); return True
            if m == 'UnregisterAdvertisement':
                self.state['unregistered'] += 1
                return Message.new_method_return(msg)
        if iface == 'org.bluez.Device1' and path == REMOTE:
            if m == 'Connect':
                if self.stall_connects:
                    self.state['stalledConnects'] += 1
                    return True  # never answered
                asyncio.ensure_future(self.connect(msg)); return True
            if m == 'Disconnect':
                self.state['disconnects'] += 1
                self.changed(REMOTE, 'org.bluez.Device1', {'ServicesResolved': Variant('b', False), 'Connected': Variant('b', False)})
                return Message.new_method_return(msg)
        if iface == 'org.bluez.GattCharacteristic1':
            if not self.objects[REMOTE]['org.bluez.Device1']['Connected'].value:
                return Message.new_error(msg, 'org.bluez.Error.NotConnected', 'Not connected')
            if m == 'ReadValue' and path == PAYLOAD_CHAR and self.peer_link:
                self.peer_link = False
                self.state['peerLinkDrops'] += 1
                # The answer goes first and the link's PropertiesChanged 20 ms after it: a client
                # that trusts its copy of Connected right after the answer finds the link still up.
                asyncio.get_running_loop().call_later(0.02, lambda: self.changed(
                    REMOTE, 'org.bluez.Device1', {'ServicesResolved': Variant('b', False), 'Connected': Variant('b', False)}))
                return Message.new_error(msg, 'org.bluez.Error.Failed', 'Not connected')
            if m == 'ReadValue' and path == PAYLOAD_CHAR:
                self.state['reads'] += 1
                return Message.new_method_return(msg, 'ay', [self.payload])
            if m == 'WriteValue' and path == SIGNAL_CHAR:
                self.state['writes'].append(msg.body[0].hex())
                return Message.new_method_return(msg)
        return None

    async def run(self):
        self.bus = await MessageBus(bus_address=self.address).connect()
        self.bus.add_message_handler(self.handler)
        await self.bus.request_name('org.bluez')
        await self.bus.request_name('org.heraldlab.Fake')
        await self.bus.wait_for_disconnect()


def jsonable(v):
    if isinstance(v, Variant):
        return jsonable(v.value)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


if __name__ == '__main__':
    try:
        asyncio.run(Fake(sys.argv[1], bytes.fromhex(sys.argv[2]), [int(x) for x in sys.argv[3].split(',')]).run())
    except Exception:
        pass  # the test's bus went away
