"""What the guest's kernel said on its console (OUTDIR/console.log), for guest.sh's watch and for
the checks (check.py, check-dongles.py, why-failed.sh).

    python3 guest_console.py watch CONSOLE    exit 3 (4: its trace still printing) and one line
                                              when the guest is dying, else 0
    python3 guest_console.py report OUTDIR    FAIL lines and the kernel's traces, exit 1 if any
    python3 guest_console.py count CONSOLE    "OOPSES FATAL": how many, and how many outside Bluetooth

A kernel BUG, Oops or panic is an "oops" here: its first line, the functions of its call trace
(with their modules) and whether its block ended (`---[ end trace`). One whose call trace runs
through the Bluetooth stack (a frame in module bluetooth or hci_vhci: Linux 6.1's list_del BUG in
hci_chan_del, ARCHITECTURE.md) kills the process that hit it, bluetoothd, and the tiers are built
to ride through that (bluetoothd is restarted as systemd would); any other (the 9p root's slab
corruption in v9fs_dir_release, a panic) means the guest itself is dying: guest.sh stops the run
at once, and the checks fail with the trace. guest.sh writes why it stopped a guest to
OUTDIR/guest-died.txt.
"""
import os, re, sys

START = re.compile(r'kernel BUG at|\bBUG: |\bOops: |general protection fault|Kernel panic|list_(del|add) corruption')
END = re.compile(r'---\[ end (trace|Kernel panic)')
FRAME = re.compile(r'^\s*(\? )?([A-Za-z0-9_.]+)\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[([A-Za-z0-9_]+)\])?')
STAMP = re.compile(r'^\[\s*\d+\.\d+\]\s?')
# The firmware's and the terminal's escape sequences (SeaBIOS clears the screen on line 1) and
# other control characters: never part of what the kernel said.
CONTROL = re.compile(r'\x1b(\[[0-9;?]*[A-Za-z]|.)|[\x00-\x08\x0b-\x1f\x7f]')
BLUETOOTH_MODULES = {'bluetooth', 'hci_vhci', 'btusb', 'rfcomm', 'bnep'}
DIED_FILE = 'guest-died.txt'


def oopses(text):
    """The console's oopses, in order: dicts with title, lines, frames [(function, module)],
    complete, bluetooth (its call trace runs through the Bluetooth stack) and panic."""
    found, current, in_trace = [], None, False
    for raw in text.splitlines():
        line = STAMP.sub('', CONTROL.sub('', raw).rstrip())
        if START.search(line) and (current is None or current['complete']):
            # A new oops; marker lines inside one still open (list_del corruption, then its
            # kernel BUG) belong to it.
            current = {'title': line.strip(), 'lines': [], 'frames': [], 'complete': False, 'panic': False}
            found.append(current)
            in_trace = False
        if current is None or current['complete']:
            continue
        current['lines'].append(line)
        if ('kernel BUG at' in line or 'BUG: ' in line) and 'corruption' in current['title']:
            current['title'] = line.strip()  # the BUG its corruption report led to
        if 'Kernel panic' in line:
            current['panic'] = True
        if 'Call Trace:' in line:
            in_trace = True
        elif line.strip().startswith(('Modules linked in', 'RIP:', '</TASK>')):
            in_trace = False
        elif in_trace:
            m = FRAME.match(line)
            if m and not m.group(1):
                current['frames'].append((m.group(2), m.group(3)))
        if END.search(line):
            current['complete'] = True
    for o in found:
        o['bluetooth'] = any(module in BLUETOOTH_MODULES for _, module in o['frames']) and not o['panic']
    return found


def summary(oops):
    """One line: its title and the innermost frames of its call trace."""
    frames = ' <- '.join(f for f, _ in oops['frames'][:4])
    where = f' in {frames}' if frames else ''
    kind = 'Bluetooth stack' if oops['bluetooth'] else 'the guest'
    return f"{oops['title']}{where} ({kind}{'' if oops['complete'] else ', trace cut short'})"


def read(path):
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except OSError:
        return ''


def fatal(oops):
    return not oops['bluetooth']


def watch(console):
    """For guest.sh: 3 and its summary for the first oops outside the Bluetooth stack (or a
    panic) whose block ended, 4 for one still being printed (guest.sh gives it a few seconds),
    0 for none."""
    found = [o for o in oopses(read(console)) if fatal(o)]
    for o in found:
        if o['complete'] or o['panic']:
            print(summary(o))
            return 3
    if found:
        print(summary(found[0]))
        return 4
    return 0


def failures(out):
    """FAIL lines for a guest that died: guest.sh's reason, and each oops outside the Bluetooth
    stack (with its call trace's innermost functions)."""
    found = []
    died = read(os.path.join(out, DIED_FILE)).strip()
    if died:
        found.append(f'the guest died: {died.splitlines()[0]}')
    for o in oopses(read(os.path.join(out, 'console.log'))):
        if fatal(o):
            found.append(f'kernel: {summary(o)}')
    return found


def print_traces(out, trace_lines=25):
    """Every oops on the console: its summary and the first lines of its block."""
    console = os.path.join(out, 'console.log')
    for o in oopses(read(console)):
        print(f"--- kernel oops on {console}: {summary(o)}")
        for line in o['lines'][:trace_lines]:
            print('   ', line)


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == 'watch':
        sys.exit(watch(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == 'count':
        found = oopses(read(sys.argv[2]))
        print(len(found), sum(1 for o in found if fatal(o)))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == 'report':
        found = failures(sys.argv[2])
        for f in found:
            print('FAIL:', f)
        print_traces(sys.argv[2])
        sys.exit(1 if found else 0)
    print('usage: guest_console.py watch CONSOLE | report OUTDIR | count CONSOLE', file=sys.stderr)
    sys.exit(2)
