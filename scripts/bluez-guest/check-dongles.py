"""Checks a `make test-dongles` run from its outputs (on the host, after the guest powered off).

    python3 check-dongles.py OUTDIR MODEL.json

- `herald-lab dongles` on the guest (dongles-local.json) lists the six controllers with their
  addresses and the makes and firmware versions the model gave them;
- the first health check passed every dongle, the second failed d3 (nobody heard it);
- the run of plans/dongles-5.yaml: its pre-flight left d3 out and the spare took its node; the
  five nodes are complete on five other dongles, each detected every other node, and the manifest
  records which dongle ran which node;
- the coordinator's `herald-lab dongles` (dongles.json): six dongles with identity and history,
  d3 bad (quarantined automatically after two failed checks, with the evidence), the others good.
Prints the figures (pre-flight time per dongle, the quarantined dongle's record) and exits 1 on
any failure. A guest that died (guest-died.txt, a kernel BUG outside the Bluetooth stack on the
console) or outputs that are missing or unreadable end in FAIL lines and the kernel's trace.
"""
import glob, json, os, sys, time

import guest_console


def outputs(out, fail):
    """Readers of OUTDIR's files that fail (once per file) with the file and the problem when
    it is missing or unreadable, and give `default` instead."""
    def text(name, default=''):
        path = os.path.join(out, name)
        try:
            with open(path, errors='replace') as f:
                return f.read()
        except OSError as e:
            fail(f'{path}: {e.strerror or e} (the guest run did not get that far; see {out}/console.log)')
            return default

    def data(name, default):
        raw = text(name, None)
        if raw is None:
            return default
        try:
            return json.loads(raw)
        except ValueError as e:
            fail(f'{os.path.join(out, name)}: not JSON ({e})')
            return default
    return text, data


def main(out, model_path):
    failures = guest_console.failures(out)
    fail = failures.append
    try:
        check(out, model_path, fail)
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:
        # Outputs of an unexpected shape: say which, never a traceback.
        fail(f'the outputs in {out} are not what a finished run leaves ({type(e).__name__}: {e})')
    for f in failures:
        print('FAIL:', f)
    if failures:
        print(f'logs: {out}/lab/logs, bluetoothd: {out}/bluetoothd.log, controllers: {out}/controllers.log, console: {out}/console.log')
    guest_console.print_traces(out)
    return 1 if failures else 0


def check(out, model_path, fail):
    text, data = outputs(out, fail)
    model = json.load(open(model_path))
    controllers = data('controllers.json', {})
    address = {n: controllers[n]['address'] for n in model['nodes'] if n in controllers}
    if sorted(address) != sorted(model['nodes']):
        fail(f"controllers.json names {sorted(address)}, the model {sorted(model['nodes'])}: the controllers never all started")
        return
    faulty = address['d3']
    exits = data('exits.json', {})
    print(f'exits: {exits}')

    # This host's listing.
    local = data('dongles-local.json', [])
    by_address = {d.get('id'): d for d in local}
    for n in model['nodes']:
        d = by_address.get(address[n])
        want = model['identity'][n]
        if not d:
            fail(f'herald-lab dongles (this host) does not list {n} ({address[n]})')
            continue
        got = (d.get('manufacturer'), d.get('lmpSubversion'), d.get('hciVersion'))
        ok = got == (want['manufacturer'], want['lmp_subversion'], want['version'])
        print(f"{'ok  ' if ok else 'FAIL'} local {n}: {d.get('adapter')} {d.get('id')} {d.get('manufacturerName')} ({d.get('manufacturer')}) "
              f"HCI {d.get('hciVersion')} LMP {d.get('lmpVersion')}.{d.get('lmpSubversion')} bus {d.get('bus')}")
        if not ok:
            fail(f'{n}: listed as make/subversion/version {got}, the controller says {want}')

    # The health checks.
    check1, check2 = text('check1.txt'), text('check2.txt')
    if exits.get('check1') != 0:
        fail(f"health check 1 (all dongles working) exited {exits.get('check1')}: {check1[-400:]}")
    if exits.get('check2') != 1:
        fail(f"health check 2 (d3 mute) exited {exits.get('check2')}, expected 1")
    if 'hostA-d3' not in check2 or 'FAILED' not in check2:
        fail('health check 2 does not fail d3')

    # The run.
    bundles = sorted(glob.glob(os.path.join(out, 'results', 'dongles-5-*', 'manifest.json')))
    if not bundles:
        fail(f'no bundle of dongles-5 under {out}/results (see {out}/run.txt and {out}/lab/logs)')
    else:
        bundle = os.path.dirname(bundles[-1])
        manifest = data(os.path.relpath(bundles[-1], out), {})
        print(f'bundle {bundle}')
        pf = manifest.get('preflight') or []
        for v in pf:
            took = f", the last after {v['seconds']:.1f} s" if v.get('seconds') is not None else ''
            print(f"  pre-flight {v['dongle']:10} {'ok    ' if v['ok'] else 'FAILED'} heard {len(v.get('saw', []))}, heard by {len(v.get('seenBy', []))}{took}"
                  + (f": {v['reason']}" if v.get('reason') else ''))
        left = [v for v in pf if not v['ok']]
        if [v.get('dongleId') for v in left] != [faulty]:
            fail(f'the pre-flight left out {[v["dongle"] for v in left]}, expected only d3 ({faulty})')
        if len(pf) != 6:
            fail(f'the pre-flight checked {len(pf)} dongles, expected 6 (5 nodes and a spare)')
        nodes = manifest.get('nodes', [])
        used = [((n.get('dongle') or {}).get('id')) for n in nodes]
        for n in nodes:
            d = n.get('dongle') or {}
            print(f"  node {n['name']}: {n['state']} on dongle {d.get('name')} {d.get('id')} ({d.get('host')}, {d.get('manufacturerName')}, LMP subversion {d.get('lmpSubversion')})"
                  + (f" - {n.get('message')}" if n.get('message') else ''))
            # Complete; or partial only for what the emulated stack does on its own: the run's
            # outlier (a node that detected nobody, or nobody detected, among nodes that did), or
            # gaps while bluetoothd was gone or stuck (the guest's kernel 6.1 sometimes oopses in
            # hci_chan_del when bluetoothd closes an L2CAP socket, which kills bluetoothd, and
            # sometimes never completes a discovery start after a connection ends, which stalls
            # bluetoothd's one-at-a-time management queue for every adapter: the nodes then see
            # their dongles stop answering, try to recover them, and mark the time as gaps).
            if n['state'] != 'complete':
                gaps = [g['reason'] for g in n.get('gaps') or []]
                causes = ('bluetoothd left the bus', 'power-cycled to recover it', 'was powered off', 'dongle not answering')
                stack = all(any(c in g for c in causes) for g in gaps) and gaps
                outlier = 'its dongle looks faulty' in (n.get('message') or '')
                if n['state'] == 'partial' and (stack or outlier):
                    print(f"  note: {n['name']} is partial: {n.get('message')}")
                else:
                    fail(f"node {n['name']} is {n['state']}: {n.get('message')}")
        if len(nodes) != 5 or faulty in used or len(set(used)) != 5 or None in used:
            fail(f'the five nodes ran on {used}; expected five distinct dongles without d3')
        # Which pairs got as far as a payload read in the time varies on emulated radios (six
        # controllers on two emulated cores): the figures are printed, the radios must work.
        detected = {}
        for rx in nodes:
            found = text(os.path.relpath(os.path.join(bundle, 'nodes', rx['name'], 'detection.csv'), out))
            detected[rx['name']] = {tx['name'] for tx in nodes if tx is not rx and tx['shortName'] in found}
        pairs = sum(len(v) for v in detected.values())
        print(f"  detections: {pairs} of {len(nodes) * (len(nodes) - 1)} ordered pairs; " + ', '.join(f"{n} detected {sorted(v)}" for n, v in detected.items()))
        if pairs < len(nodes):
            fail(f'only {pairs} detections: the radios hardly worked (see the nodes\' log.txt)')

    # The coordinator's dongles.
    lab = data('dongles.json', [])
    print(f'the coordinator knows {len(lab)} dongles:')
    for d in lab:
        info = d['info']
        print(f"  {info['name']:9} {d['id']} {d['health']:8} host {info.get('host')} {info.get('manufacturerName')} "
              f"LMP {info.get('lmpVersion')}.{info.get('lmpSubversion')} history: {', '.join(e['kind'] for e in d['history'])}")
    if sorted(d['id'] for d in lab) != sorted(address.values()):
        fail(f'the coordinator lists {sorted(d["id"] for d in lab)}, expected the six controllers')
    for d in lab:
        if d['id'] == faulty:
            since = d.get('healthSince')
            since = time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(since)) if isinstance(since, (int, float)) else since
            print(f"quarantined: {d['info']['name']} {d['id']}: {d['health']} since {since}: {d.get('healthReason')}")
            for e in d['history']:
                print(f"    {e['kind']:10} {'ok  ' if e['ok'] else 'FAIL'} {e['message']}" + (f" [run {e['run']}]" if e.get('run') else ''))
                if e.get('evidence') and (e['kind'] == 'health' or not e['ok']):
                    print(f"        evidence: {e['evidence']}")
            if d['health'] != 'bad' or not (d.get('healthReason') or '').startswith('quarantined: failed 2 checks in a row'):
                fail(f"d3 is {d['health']} ({d.get('healthReason')}), expected quarantined after 2 failed checks")
            q = [e for e in d['history'] if e['kind'] == 'health' and not e['ok']]
            if not q or len(json.loads(q[0].get('evidence') or '[]')) != 2:
                fail('d3 has no quarantine event with the evidence of its two failures')
        else:
            if d['health'] != 'good':
                fail(f"{d['info']['name']} is {d['health']}, expected good")
            if not any(e['kind'] == 'registered' for e in d['history']):
                fail(f"{d['info']['name']}: no registration in its history")
    restarts = os.path.join(out, 'bluetoothd-restarts.log')
    if os.path.exists(restarts):
        print(f"bluetoothd was restarted {len(text('bluetoothd-restarts.log').splitlines())} time(s) in the guest (see {out}/console.log for the kernel's oops)")


if __name__ == '__main__':
    sys.exit(main(*sys.argv[1:3]))
