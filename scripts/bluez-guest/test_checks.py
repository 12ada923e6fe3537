"""Host-side self-test of what a dead or half-finished guest run leaves to the checks, no QEMU:
made-up output folders through check.py, check-dongles.py, why-failed.sh and guest_console.py, as
processes (what CI prints), and guest.sh's watch over a stand-in for QEMU.

    python3 scripts/bluez-guest/test_checks.py [-v]

- guest_console.py tells the guest's own kernel BUG (the 9p root's slab corruption, seen in a
  trixie dongles run) from the Bluetooth stack's (Linux 6.1's list_del in hci_chan_del, which the
  tiers ride through), and an oops still being printed from one that ended;
- check-dongles.py and check.py over an empty folder, over a dongles run that stopped after the
  first health check failed (no check1.txt: the traceback of issue 20) and over a guest that died
  of that BUG end in FAIL lines naming the file or the BUG and print the kernel's trace, exit 1,
  never a Python traceback;
- why-failed.sh prints guest.sh's reason and the trace;
- check.py sums up each node's connection attempts from the controllers' trace;
- guest.sh's watch stops a stand-in for QEMU whose heartbeat stops (97) or whose console shows
  the 9p BUG (98), and lets one whose console shows the Bluetooth stack's BUG run to its end.
Exits 1 on the first failure. About 15 s.
"""
import json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import guest_console

# The trixie guest's console in issue 20's second dongles run, in the form Linux 6.12 prints it.
OOPS_9P = """[   54.101234] list_del corruption. next->prev should be ffff888003e4c2c0, but was ffff888003e4c000. (next=ffff888003e4c2c8)
[   54.101300] ------------[ cut here ]------------
[   54.101301] kernel BUG at lib/list_debug.c:35!
[   54.101400] Oops: invalid opcode: 0000 [#1] PREEMPT SMP NOPTI
[   54.101500] CPU: 0 UID: 0 PID: 731 Comm: python3 Not tainted 6.12.57+deb13-amd64 #1  Debian 6.12.57-1
[   54.101600] RIP: 0010:__list_del_entry_valid_or_report+0x9d/0xc0
[   54.101700] Call Trace:
[   54.101701]  <TASK>
[   54.101702]  ? die+0x36/0x90
[   54.101703]  ? do_trap+0xdd/0x100
[   54.101704]  kfree+0x23e/0x3a0
[   54.101705]  p9_client_clunk+0x4c/0x80 [9pnet]
[   54.101706]  v9fs_dir_release+0x5b/0x110 [9p]
[   54.101707]  __fput+0xe6/0x2a0
[   54.101708]  __x64_sys_close+0x3c/0x80
[   54.101709]  </TASK>
[   54.101710] Modules linked in: hci_vhci bluetooth ecdh_generic 9p 9pnet_virtio 9pnet
[   54.101711] ---[ end trace 0000000000000000 ]---
"""
# Linux 6.1's own Bluetooth BUG (ARCHITECTURE.md): bluetoothd is killed, the guest lives on.
OOPS_BT = """[   80.120000] list_del corruption, ffff8880061e1c00->next is LIST_POISON1 (dead000000000100)
[   80.120001] ------------[ cut here ]------------
[   80.120002] kernel BUG at lib/list_debug.c:56!
[   80.120003] invalid opcode: 0000 [#1] PREEMPT SMP NOPTI
[   80.120004] Call Trace:
[   80.120005]  <TASK>
[   80.120006]  ? __die_body.cold+0x1a/0x1f
[   80.120007]  hci_chan_del+0x1f/0x80 [bluetooth]
[   80.120008]  l2cap_conn_del+0x1b9/0x230 [bluetooth]
[   80.120009]  l2cap_sock_release+0x5d/0xa0 [bluetooth]
[   80.120010]  __sock_release+0x3d/0xa0
[   80.120011]  </TASK>
[   80.120012] Modules linked in: hci_vhci bluetooth 9p 9pnet
[   80.120013] ---[ end trace 0000000000000000 ]---
"""
VERBOSE = '-v' in sys.argv
# A loaded host's TCG too slow for the kernel's boot-time timer check (the first loop run of
# issue 20, before guest.sh booted with no_timer_check): SeaBIOS's escapes on the same line.
PANIC_AT_BOOT = ("\x1bc\x1b[?7l\x1b[2J[    0.064000] Kernel panic - not syncing: IO-APIC + timer doesn't work!  Boot with apic=debug.\r\n"
                 "[    0.064000] Call Trace:\r\n[    0.064000]  <TASK>\r\n[    0.064000]  dump_stack_lvl+0x5d/0x80\r\n"
                 "[    0.064000]  panic+0x118/0x2db\r\n[    0.064000]  setup_IO_APIC+0x708/0x790\r\n[    0.064000]  </TASK>\r\n")
DIED = 'kernel: kernel BUG at lib/list_debug.c:35! in kfree <- p9_client_clunk <- v9fs_dir_release <- __fput (the guest) (after 61 s)'


def expect(condition, what):
    if not condition:
        raise AssertionError(what)
    if VERBOSE:
        print(f'ok   {what}')


def folder(base, name, files):
    path = os.path.join(base, name)
    os.makedirs(path)
    for rel, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        open(os.path.join(path, rel), 'w').write(content if isinstance(content, str) else json.dumps(content))
    return path


def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    return p.returncode, p.stdout + p.stderr


def console_classification(base):
    path = os.path.join(base, 'c.log')
    for text, want, what in ((OOPS_9P, 3, "the 9p root's BUG stops the guest"),
                             (OOPS_BT, 0, "the Bluetooth stack's BUG does not (bluetoothd is restarted)"),
                             ('\n'.join(OOPS_9P.splitlines()[:12]), 4, 'an oops still being printed waits for its end'),
                             (PANIC_AT_BOOT, 3, 'a panic stops it, its trace complete or not'),
                             ('[ 1.0] init: running\n', 0, 'a quiet console is fine')):
        open(path, 'w').write(text)
        code, output = run(sys.executable, os.path.join(HERE, 'guest_console.py'), 'watch', path)
        expect(code == want, f'guest_console watch: {what} (exit {code}: {output.strip()})')
    panic = guest_console.summary(guest_console.oopses(PANIC_AT_BOOT)[0])
    expect(panic.startswith("Kernel panic - not syncing: IO-APIC + timer doesn't work!") and '\x1b' not in panic,
           f'a panic is named without the console\'s escape sequences ({panic!r})')
    found = guest_console.oopses(OOPS_BT + OOPS_9P)
    expect([o['bluetooth'] for o in found] == [True, False] and all(o['complete'] for o in found),
           'two oopses on one console are told apart')
    expect(guest_console.summary(found[1]).startswith('kernel BUG at lib/list_debug.c:35! in kfree <- p9_client_clunk <- v9fs_dir_release'),
           f'the summary names the BUG and its call trace ({guest_console.summary(found[1])})')


def no_traceback(code, output, what, must):
    expect(code == 1 and 'Traceback' not in output, f'{what}: exit 1 without a traceback (exit {code})')
    for m in must:
        expect(m in output, f'{what}: says "{m}"')


def checks_on_made_up_outputs(base):
    dongles = [sys.executable, os.path.join(HERE, 'check-dongles.py')]
    bluez = [sys.executable, os.path.join(HERE, 'check.py')]
    model_d, model_b = os.path.join(HERE, 'model-dongles.json'), os.path.join(HERE, 'model.json')
    plan = os.path.join(REPO, 'plans', 'bluez-3.yaml')
    empty = folder(base, 'empty', {})
    no_traceback(*run(*dongles, empty, model_d), 'check-dongles.py on an empty folder', [f'FAIL: {empty}/controllers.json'])
    no_traceback(*run(*bluez, empty, plan, model_b), 'check.py on an empty folder', ['FAIL: no bundle under'])

    # A dongles run whose first health check failed and whose guest went no further.
    controllers = {f'd{i}': {'address': f'F0:00:00:00:00:0{i}'} for i in range(1, 7)}
    stopped = folder(base, 'stopped', {'controllers.json': controllers, 'exits.json': {'check1': 1}, 'dongles-local.json': []})
    no_traceback(*run(*dongles, stopped, model_d), 'check-dongles.py without check1.txt',
                 [f'FAIL: {stopped}/check1.txt: No such file', 'FAIL: health check 1 (all dongles working) exited 1',
                  'FAIL: no bundle of dongles-5'])
    garbled = folder(base, 'garbled', {'controllers.json': controllers, 'exits.json': '{"check1": 0,', 'dongles.json': {'not': 'a list'}})
    no_traceback(*run(*dongles, garbled, model_d), 'check-dongles.py over malformed JSON', [f'FAIL: {garbled}/exits.json: not JSON'])

    # A guest that died of the 9p BUG, stopped by guest.sh.
    for name, argv in (('died-dongles', dongles + [None, model_d]), ('died-bluez', bluez + [None, plan, model_b])):
        died = folder(base, name, {'console.log': '[ 1.0] init: running\n' + OOPS_9P, 'guest-died.txt': DIED + '\n',
                                   'controllers.json': controllers})
        argv[argv.index(None)] = died
        code, output = run(*argv)
        no_traceback(code, output, f'{os.path.basename(argv[1])} on a guest that died',
                     ['FAIL: the guest died: kernel: kernel BUG at lib/list_debug.c:35!',
                      'FAIL: kernel: kernel BUG at lib/list_debug.c:35! in kfree <- p9_client_clunk',
                      'p9_client_clunk+0x4c/0x80 [9pnet]'])
        expect(output.rstrip().endswith('---[ end trace 0000000000000000 ]---'), f'{os.path.basename(argv[1])} ends with the kernel trace')
    open(os.path.join(died, 'check.txt'), 'w').write(output)
    code, output = run('bash', os.path.join(HERE, 'why-failed.sh'), died)
    expect('guest.sh stopped the guest: kernel: kernel BUG at lib/list_debug.c:35!' in output
           and 'v9fs_dir_release+0x5b/0x110 [9p]' in output and len(output.splitlines()) <= 70,
           f'why-failed.sh gives the reason and the trace in {len(output.splitlines())} lines')

    # The Bluetooth stack's BUG alone is not a failure of the guest.
    bt = folder(base, 'bt', {'console.log': OOPS_BT})
    expect(guest_console.failures(bt) == [], 'the Bluetooth stack\'s BUG alone fails nothing by itself')


WATCH = r"""
. "$HERE/guest.sh"
set +e
out=$1; mkdir -p "$out"; : > "$out/console.log"; date +%s > "$out/heartbeat"
( while [ ! -e "$out/stop-beating" ]; do date +%s > "$out/heartbeat"; sleep 1; done ) & beat=$!
sleep "$2" & qemu=$!
( sleep 2; case "$3" in stall) touch "$out/stop-beating" ;; *) cat "$3" >> "$out/console.log" ;; esac ) &
watch_guest "$qemu" "$out" "$SECONDS"; code=$?
kill "$beat" "$qemu" 2>/dev/null
echo "exit $code: $(cat "$out/guest-died.txt" 2>/dev/null)"
"""


def watch_stops_a_dying_guest(base):
    env = dict(os.environ, HERE=HERE, BLUEZ_GUEST_STALL='3', BLUEZ_GUEST_BOOT_LIMIT='30', BLUEZ_GUEST_TIMEOUT='60')
    oops = {}
    for name, text in (('9p', OOPS_9P), ('bt', OOPS_BT)):
        oops[name] = os.path.join(base, f'{name}.txt')
        open(oops[name], 'w').write(text)

    def watch(name, lifetime, event):
        p = subprocess.run(['bash', '-c', WATCH, 'watch', os.path.join(base, 'watch-' + name), str(lifetime), event],
                           capture_output=True, text=True, timeout=90, env=env)
        return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr
    said = watch('stall', 60, 'stall')
    expect(said.startswith('exit 97: the guest stopped answering: no heartbeat for'), f'a guest whose heartbeat stops is stopped ({said})')
    said = watch('9p', 60, oops['9p'])
    expect(said.startswith('exit 98: kernel: kernel BUG at lib/list_debug.c:35! in kfree <- p9_client_clunk'),
           f'a guest whose console shows the 9p BUG is stopped ({said})')
    said = watch('bt', 6, oops['bt'])
    expect(said == 'exit 0:', f"a guest with the Bluetooth stack's BUG runs to its end ({said})")


def initiator_summaries(base):
    """check.py's line on a node's connection attempts, from a made-up controllers trace: a node
    whose last create-connection was answered "connection already exists" long before the end
    (Linux 6.1 stopped initiating), a node that connected, one that never initiated, no trace."""
    import check
    out = folder(base, 'initiators', {'controllers.log': '\n'.join([
        'controllers ready: alpha=F0:00:00:00:00:01',
        '    52.189 alpha create connection to F0:00:00:00:00:03/P pending',
        '    52.585 alpha connection complete to host: status 11 role 0 peer F0:00:00:00:00:03/P handle 0',
        '    60.000 beta create connection to F0:00:00:00:00:01/P pending',
        '    60.400 beta connection complete to host: status 0 role 0 peer F0:00:00:00:00:01/P handle 1',
        '    61.000 alpha connection complete to host: status 0 role 1 peer F0:00:00:00:00:02/P handle 1',
        'garbage line', '   x.y gamma create connection to nowhere',
        '   286.300 beta disconnected F0:00:00:00:00:01/P 19', ''])})
    got = {n: check.initiator_summary(out, n) for n in ('alpha', 'beta', 'gamma')}
    expect(got == {
        'alpha': "alpha's controller got 1 create-connection(s), the last at 52.2 s (status 11: connection already exists); the trace goes on 234 s after it",
        'beta': "beta's controller got 1 create-connection(s), the last at 60.0 s (connected); the trace goes on 226 s after it",
        'gamma': "gamma's controller got no create-connection in the run"}, f'check.py sums up each controller\'s attempts ({got})')
    expect(check.initiator_summary(folder(base, 'no-trace', {}), 'alpha') is None, 'no controllers.log: no line')


def main():
    with tempfile.TemporaryDirectory() as base:
        try:
            initiator_summaries(base)
            console_classification(base)
            checks_on_made_up_outputs(base)
            watch_stops_a_dying_guest(base)
        except AssertionError as e:
            print(f'FAIL {e}')
            return 1
    print('test_checks: all passed')
    return 0


if __name__ == '__main__':
    sys.exit(main())
