"""Checks a `make test-bluez` run from its outputs (on the host, after the guest powered off).

    python3 check.py OUTDIR PLAN.yaml MODEL.json

From the bundle the lab run gathered (OUTDIR/results/<run>/): every node's detection.csv lists
every other node's shortName, its contacts.csv has read rows with that shortName and RSSI rows
whose values are the scripted model's for that pair (sender>receiver) and change with it (RSSI
a node wrote while it could not advertise is the other direction's, accepted only when both nodes'
logs show the failed advertising and the write); the
manifest records each node's controller identity (the Bumble controller's address). From bleak
(OUTDIR/bleak.json): an outside client read a node's payload characteristic and got the node's
fixed payload. Prints one line per pair and exits 1 on any failure.

When MODEL.json lists phone personas (personas.py), every node must also detect, read and measure
each of them (its contacts.csv: rows whose id is the persona's address or an id it read the
persona's fixed payload from), and each iPhone persona's log (OUTDIR/persona-<name>.jsonl) must
show a node writing its payload to it and a payload-sharing write carrying another device's
payload. One line per node and persona, with the persona's own counts of what that node did.

A guest that died (guest-died.txt, a kernel BUG outside the Bluetooth stack on the console) or
outputs that are missing or unreadable end in FAIL lines and the kernel's trace, never a traceback.
"""
import base64, csv, datetime, glob, json, os, struct, sys

import guest_console


def fixed_payload(identifier):
    return bytes([0]) + struct.pack('<H', 0) + struct.pack('<i', identifier) + bytes(129 - 7)


def short_name(payload):
    return base64.b64encode(payload[3:]).decode()[:6]


def persona_events(out, name):
    path = os.path.join(out, f'persona-{name}.jsonl')
    if not os.path.exists(path):
        return None
    events = []
    for line in open(path):
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line cut short when the guest powered off
    return events


def contact_rows(bundle, node):
    """A node's contacts.csv rows without the header and without short rows; none when the node
    wrote no contacts.csv (each check then fails that node with its own FAIL lines)."""
    path = os.path.join(bundle, 'nodes', node, 'contacts.csv')
    if not os.path.exists(path):
        return []
    return [r for r in list(csv.reader(open(path)))[1:] if len(r) >= 11]


def detection_text(bundle, node):
    """A node's detection.csv as text; empty when the node wrote none (its checks then fail)."""
    path = os.path.join(bundle, 'nodes', node, 'detection.csv')
    return open(path, errors='replace').read() if os.path.exists(path) else ''


def node_log(bundle, node):
    """A node's sensor log (log.txt) as lines; none when the node wrote none."""
    path = os.path.join(bundle, 'nodes', node, 'log.txt')
    return [l.rstrip() for l in open(path, errors='replace')] if os.path.exists(path) else []


def check_personas(out, bundle, nodes, model, controllers, fail):
    """The personas' lines and failures (see the module's description)."""
    personas = model.get('personas') or {}
    for name in [n for n in personas if n not in controllers]:
        fail(f"persona {name} was not on the link in this run ({out}/controllers.json has no entry; see {out}/controllers.log)")
    personas = {n: spec for n, spec in personas.items() if n in controllers}
    if not personas:
        return
    logs = {name: persona_events(out, name) for name in personas}
    node_ids = {n['identifier'] for n in nodes}
    print(f"{'receiver':9} {'persona':9} {'kind':14} {'detected':>8} {'reads':>5} {'RSSI rows':>9}  values seen (scripted); "
          f"the persona logged: reads, payload writes, sharing writes [shared]")
    for rx in nodes:
        detection = detection_text(bundle, rx['name'])
        rows = contact_rows(bundle, rx['name'])
        for name, spec in personas.items():
            kind = spec['kind']
            short = short_name(fixed_payload(spec['identifier']))
            address = controllers[name]['address'].upper()
            read_rows = [r for r in rows if r[4] == '2' and r[10] == short]
            ids = {r[2].upper() for r in read_rows} | {address}
            detected = short in detection or any(r[3] == '1' and r[2].upper() in ids for r in rows)
            rssi = [float(r[10].split(':')[1].split('[')[0]) for r in rows
                    if r[5] == '3' and r[2].upper() in ids and r[10].startswith('RSSI:')]
            scripted = model['rssi'].get(f"{name}>{rx['name']}", [model.get('default', -70)])
            seen = sorted(set(rssi))
            events = [e for e in logs[name] or [] if e.get('by') == rx['name']]
            reads = sum(1 for e in events if e['event'] == 'read')
            writes = [e for e in events if e['event'] == 'write']
            payload_writes = sum(1 for w in writes if w['kind'] == 'writePayload')
            sharing = [w for w in writes if w['kind'] == 'writePayloadSharing']
            shared = sorted({s['shortName'] for w in sharing for s in w['shared']})
            print(f"{rx['name']:9} {name:9} {kind:14} {str(detected):>8} {len(read_rows):>5} {len(rssi):>9}  {seen} ({scripted}); "
                  f"{reads} read(s), {payload_writes} payload write(s), {len(sharing)} sharing write(s) {shared}")
            if not detected:
                fail(f"{rx['name']}: did not detect persona {name} ({short}, {address})")
            if not read_rows:
                fail(f"{rx['name']}: no read row for persona {name} ({short})")
            if not rssi:
                fail(f"{rx['name']}: no RSSI row for persona {name} ({address})")
            if not set(rssi) <= {float(v) for v in scripted}:
                fail(f"{rx['name']}: RSSI for persona {name} {seen} outside the script {scripted}")
    for name, spec in personas.items():
        events = logs[name]
        if events is None:
            fail(f"persona {name}: no log {out}/persona-{name}.jsonl (see {out}/controllers.log)")
            continue
        by = {}
        for e in events:
            if e['event'] in ('read', 'write'):
                key = e['kind'] if e['event'] == 'write' else 'read'
                by.setdefault(e.get('by') or e.get('address'), {}).setdefault(key, 0)
                by[e.get('by') or e.get('address')][key] += 1
        print(f"persona {name} ({spec['kind']}): {sum(1 for e in events if e['event'] == 'read')} read(s) in all; by device: {by}")
        if not spec['kind'].startswith('ios'):
            continue
        writes = [e for e in events if e['event'] == 'write']
        from_nodes = [w for w in writes if w['kind'] == 'writePayload' and w['payload'].get('identifier') in node_ids]
        sharing = [w for w in writes if w['kind'] == 'writePayloadSharing'
                   and any(s.get('identifier') != spec['identifier'] for s in w['shared'])]
        shared = sorted({s['shortName'] for w in sharing for s in w['shared']})
        print(f"persona {name}: {len(from_nodes)} node payload write(s), {len(sharing)} sharing write(s) carrying {shared}")
        if not from_nodes:
            fail(f"persona {name}: no node wrote its payload to it")
        if not sharing:
            fail(f"persona {name}: no payload-sharing write carried another device's payload")


def check_pairs(bundle, nodes, model, controllers, fail):
    """Each node detected, read and measured every other node, with RSSI values from the script
    that changed as the script did (see the module's description)."""
    print(f"{'receiver':9} {'sender':9} {'detected':>8} {'reads':>5} {'RSSI rows':>9}  values seen (scripted)")
    logs = {n['name']: node_log(bundle, n['name']) for n in nodes}
    advertising_failed = {name: any('advertising failed' in l for l in lines) for name, lines in logs.items()}
    receive_only = {name: [l for l in lines if ' is receive-only' in l] for name, lines in logs.items()}
    for rx in nodes:
        detection = detection_text(bundle, rx['name'])
        rows = contact_rows(bundle, rx['name'])
        for tx in nodes:
            if tx is rx:
                continue
            read_ids = [r[2] for r in rows if r[4] == '2' and r[10] == tx['short']]
            reads = len(read_ids)
            ids = set(read_ids) | {controllers[tx['name']]['address']}
            rssi = [float(r[10].split(':')[1]) for r in rows if r[5] == '3' and r[2] in ids and r[10].startswith('RSSI:')]
            scripted = model['rssi'][f"{tx['name']}>{rx['name']}"]
            allowed = {float(v) for v in scripted}
            # A node whose advertising failed (bluetoothd back before its advertising manager)
            # writes its payload and the RSSI it measures of the peer, as Herald's receive-only
            # devices do; the peer logs that RSSI as its measurement. Those values are the script's
            # other direction, and count only when both logs say so.
            written = []
            if advertising_failed[tx['name']] and any(i + ' is receive-only' in l for l in receive_only[rx['name']] for i in ids):
                reverse = {float(v) for v in model['rssi'].get(f"{rx['name']}>{tx['name']}", [])} - allowed
                written = [v for v in rssi if v in reverse]
                rssi = [v for v in rssi if v not in reverse]
            seen = sorted(set(rssi))
            detected = tx['short'] in detection
            print(f"{rx['name']:9} {tx['name']:9} {str(detected):>8} {reads:>5} {len(rssi):>9}  {seen} ({scripted})"
                  + (f"; {len(written)} written by {tx['name']} while it could not advertise: {sorted(set(written))}" if written else ''))
            if not detected:
                fail(f"{rx['name']}: detection.csv lacks {tx['name']} ({tx['short']})")
            if reads == 0:
                fail(f"{rx['name']}: no read row for {tx['name']} ({tx['short']})")
            if len(rssi) < 10:
                fail(f"{rx['name']}: only {len(rssi)} RSSI rows for {tx['name']}")
            if not set(rssi) <= allowed:
                fail(f"{rx['name']}: RSSI for {tx['name']} {seen} outside the script {scripted}")
            if len(set(rssi)) < min(2, len(scripted)):
                fail(f"{rx['name']}: RSSI for {tx['name']} did not follow the script's change ({seen})")


def plan_nodes(path):
    # The plan's nodes and pinned identifiers (a small reader for this plan's YAML shape).
    nodes, current = [], None
    for line in open(path):
        s = line.strip()
        if s.startswith('- name:'):
            current = {'name': s.split(':', 1)[1].strip()}
            nodes.append(current)
        elif s.startswith('identifier:') and current is not None:
            current['identifier'] = int(s.split(':', 1)[1])
    return nodes


def main(out, plan_path, model_path):
    failures = guest_console.failures(out)
    fail = failures.append
    bundle, nodes, controllers = None, [], {}
    try:
        bundle, nodes, controllers = check(out, plan_path, model_path, fail)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OSError) as e:
        # Outputs of an unexpected shape: say which, never a traceback.
        fail(f'the outputs in {out} are not what a finished run leaves ({type(e).__name__}: {e})')
    for f in failures:
        print('FAIL:', f)
    if failures:
        if bundle:
            diagnose(out, bundle, nodes, controllers, failures)
        print(f'bluetoothd log: {out}/bluetoothd.log; node logs: {bundle or out + "/results/*"}/nodes/*/log.txt; lab logs: {out}/lab/logs')
    guest_console.print_traces(out)
    return 1 if failures else 0


def read_json(path, fail, default):
    """A JSON output of the guest run, or `default` and a FAIL line naming the file and the problem."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f'{path}: {e.strerror or e} (the guest run did not get that far; see the console)')
    except ValueError as e:
        fail(f'{path}: not JSON ({e})')
    return default


def check(out, plan_path, model_path, fail):
    """Every check of the module's description; returns the bundle, the plan's nodes and the
    controllers for the diagnosis (bundle None when there is none)."""
    model = json.load(open(model_path))
    nodes = plan_nodes(plan_path)
    for n in nodes:
        n['short'] = short_name(fixed_payload(n['identifier']))
    controllers = read_json(os.path.join(out, 'controllers.json'), fail, {})
    bundles = sorted(glob.glob(os.path.join(out, 'results', '*', 'manifest.json')))
    if not bundles:
        fail(f'no bundle under {out}/results (see {out}/lab/logs and {out}/console.log)')
        return None, nodes, controllers
    missing = [n['name'] for n in nodes if n['name'] not in controllers]
    if missing:
        fail(f'{out}/controllers.json has no controller for {missing}')
        return None, nodes, controllers
    bundle = os.path.dirname(bundles[-1])
    manifest = read_json(bundles[-1], fail, {})
    print(f'bundle {bundle}')
    manifest_nodes = {n['name']: n for n in manifest.get('nodes', [])}
    for n in nodes:
        c = (manifest_nodes.get(n['name']) or {}).get('controller') or {}
        want = controllers[n['name']]['address']
        if c.get('address', '').upper() != want:
            fail(f"{n['name']}: manifest controller {c} is not the adapter {want}")
        else:
            print(f"{n['name']}: controller {c.get('address')} HCI {c.get('hciVersion')} LMP {c.get('lmpVersion')}.{c.get('lmpSubversion')} manufacturer {c.get('manufacturer')}")
    stack = read_json(os.path.join(out, 'stack.json'), fail, {})
    print(f"stack {stack.get('stack')}: kernel {stack.get('kernel')}, BlueZ {stack.get('bluez')}")
    for n in nodes:
        m = manifest_nodes.get(n['name']) or {}
        ok = m.get('osVersion') == stack.get('kernel') and m.get('bluezVersion') == stack.get('bluez')
        print(f"{'ok  ' if ok else 'FAIL'} {n['name']}: manifest says kernel {m.get('osVersion')}, BlueZ {m.get('bluezVersion')}")
        if not ok:
            fail(f"{n['name']}: the manifest's kernel/BlueZ {m.get('osVersion')}/{m.get('bluezVersion')} are not the guest's {stack.get('kernel')}/{stack.get('bluez')}")
    check_pairs(bundle, nodes, model, controllers, fail)
    check_personas(out, bundle, nodes, model, controllers, fail)
    check_restart(out, bundle, nodes, controllers, fail)
    bleak_path = os.path.join(out, 'bleak.json')
    payloads = read_json(bleak_path, fail, {}) if os.path.exists(bleak_path) else {}
    expected = {fixed_payload(n['identifier']).hex(): n['name'] for n in nodes}
    good = {a: expected[p] for a, p in payloads.items() if p in expected}
    print(f"bleak read the payload characteristic of {len(good)} node(s): {good}")
    if not good:
        fail(f'bleak read no node payload (see {out}/bleak.log)')
    return bundle, nodes, controllers


def initiator_summary(out, name):
    """One line on node `name`'s connection attempts as its controller saw them (controllers.log):
    how many create-connection commands its host sent, when the last came, how it was answered,
    and how long the trace goes on after it. A Linux 6.1 host that was told of a connection as
    peripheral while its own attempt was pending never sent one again (ARCHITECTURE.md); its
    sensor's Connects then reach bluetoothd and the kernel but never the controller."""
    path = os.path.join(out, 'controllers.log')
    if not os.path.exists(path):
        return None
    creates, last_answer, end = [], None, None
    for line in open(path, errors='replace'):
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        try:
            at = float(parts[0])
        except ValueError:
            continue
        end = at
        if parts[1] != name:
            continue
        if 'create connection to' in parts[2]:
            creates.append(at)
            last_answer = None
        elif creates and last_answer is None and 'connection complete to host' in parts[2] and 'role 0' in parts[2]:
            last_answer = parts[2].split('status', 1)[-1].split()[0] if 'status' in parts[2] else '?'
    if not creates:
        return f"{name}'s controller got no create-connection in the run"
    answer = {None: 'no answer traced', '0': 'connected', '11': 'status 11: connection already exists',
              '62': 'status 62: failed to be established', '2': 'status 2: cancelled'}.get(last_answer, f'status {last_answer}')
    return (f"{name}'s controller got {len(creates)} create-connection(s), the last at {creates[-1]:.1f} s ({answer}); "
            f"the trace goes on {end - creates[-1]:.0f} s after it")


def diagnose(out, bundle, nodes, controllers, failures):
    """What a failing run's own logs say, printed with its FAIL lines (CI keeps only the output):
    for each receiver named in a failure, its controller's connection attempts and its sensor's
    log lines about the peers named there, and the guest's load over the run."""
    names = {n['name'] for n in nodes} | set(controllers)
    for rx in nodes:
        peers = {p for f in failures if f.startswith(rx['name'] + ':') for p in names if p != rx['name'] and p in f}
        if not peers:
            continue
        addresses = {controllers[p]['address'] for p in peers if p in controllers}
        lines = node_log(bundle, rx['name'])
        about = [l for l in lines if any(a in l for a in addresses) or 'radio' in l or 'bluetoothd' in l]
        summary = initiator_summary(out, rx['name'])
        if summary:
            print(f"--- {summary}")
        print(f"--- {rx['name']}'s log about {', '.join(sorted(peers))} ({len(about)} of {len(lines)} lines; last 25)")
        for l in about[-25:]:
            print('   ', l)
    load = os.path.join(out, 'load.log')
    if os.path.exists(load):
        rows = [l.split(' cpu-s:')[0] for l in open(load, errors='replace')]
        print(f"--- guest load ({len(rows)} samples, every 4th):")
        for l in rows[::4]:
            print('   ', l)


def row_time(text):
    return datetime.datetime.strptime(text, '%Y-%m-%d %H:%M:%S.%f%z').timestamp()


RESUME_LIMIT = 30.0


def check_restart(out, bundle, nodes, controllers, fail):
    """bluetoothd was killed once mid-run (OUTDIR/bluetoothd-killed holds when, and
    OUTDIR/bluetoothd-ready when it was back on the bus with its adapters): every node must be
    measuring every peer again (an RSSI row) within RESUME_LIMIT seconds of bluetoothd being back."""
    path = os.path.join(out, 'bluetoothd-killed')
    if not os.path.exists(path):
        fail('bluetoothd was never killed (no bluetoothd-killed): the restart was not tested')
        return
    killed = float(open(path).read().strip())
    ready_path = os.path.join(out, 'bluetoothd-ready')
    if not os.path.exists(ready_path):
        fail('bluetoothd did not come back with its adapters after it was killed (no bluetoothd-ready)')
        return
    ready = float(open(ready_path).read().strip())
    clock = lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%H:%M:%S.%f')[:-3]
    print(f"bluetoothd killed at {clock(killed)}, back with its adapters {ready - killed:.1f} s later")
    print(f"     {'receiver':9} {'sender':9} {'RSSI again after':>16} {'after kill':>10} {'reads after':>11}")
    for rx in nodes:
        rows = contact_rows(bundle, rx['name'])
        for tx in nodes:
            if tx is rx:
                continue
            ids = {r[2] for r in rows if r[4] == '2' and r[10] == tx['short']} | {controllers[tx['name']]['address']}
            # Rows after bluetoothd is back: one stamped just after the kill is a report it sent
            # before it died, not the node measuring again.
            after = [row_time(r[0]) for r in rows if r[2] in ids and r[5] == '3' and row_time(r[0]) > ready]
            reads = sum(1 for r in rows if r[4] == '2' and r[10] == tx['short'] and row_time(r[0]) > killed)
            since_ready = f"{after[0] - ready:.1f} s" if after else 'never'
            since_kill = f"{after[0] - killed:.1f} s" if after else 'never'
            ok = bool(after) and after[0] - ready <= RESUME_LIMIT
            print(f"{'ok  ' if ok else 'FAIL'} {rx['name']:9} {tx['name']:9} {since_ready:>16} {since_kill:>10} {reads:>11}")
            if not ok:
                fail(f"{rx['name']}: measured {tx['name']} again {since_ready} after bluetoothd was back (limit {RESUME_LIMIT:.0f} s)")


if __name__ == '__main__':
    sys.exit(main(*sys.argv[1:4]))
