#!/bin/bash
# Real bluetoothd without Bluetooth on the host: a QEMU guest running Debian's packaged kernel
# (which has the bluetooth and hci_vhci modules) over this machine's own root file system.
#
#   guest.sh prepare              download and unpack the kernel, build the initramfs (once)
#   guest.sh run OUTDIR SCRIPT    boot, run SCRIPT (bash, as root) in the guest, power off
#
# HERALD_LAB names the herald-lab binary the guest runs (default: the release build; make passes the packaged one).
#
# BLUEZ_STACK picks the Linux Bluetooth stack under test:
#   bookworm-backports  Debian 12 as agents/README.md tells a lab to run it: this machine's
#             BlueZ (5.66) on the kernel from bookworm-backports (6.12), downloaded with an apt
#             configuration of its own in the cache (the host's apt sources stay as they are)
#   bookworm  Debian 12 as installed: its own kernel (6.1), whose Bluetooth stack has a BUG
#             (list corruption in hci_chan_del, ARCHITECTURE.md) that now and then wedges a
#             node's connections for the rest of a run; kept for looking at 6.1, not in CI
#   trixie    Debian 13: kernel 6.12 and BlueZ 5.82 from a trixie root built with mmdebstrap
#             from Debian's packages; bluetoothd runs chrooted there, on the guest's system bus
#
# The guest sees the host's / read-only over virtio-9p (so binaries built here run unchanged),
# OUTDIR read-write at the same path, and fresh tmpfs on /tmp, /run, /var/lib/bluetooth and
# /root. SCRIPT's exit status becomes guest.sh's; the console is saved to OUTDIR/console.log.
# A guest that dies is stopped at once, not at the timeout (watch_guest): guest.sh then exits 98
# (a kernel BUG, Oops or panic outside the Bluetooth stack), 97 (no heartbeat) or 99 (timeout),
# with the reason in OUTDIR/guest-died.txt and the kernel's trace on stderr.
# BLUEZ_GUEST_CPUS (2), BLUEZ_GUEST_MEMORY (MiB, 2048) and BLUEZ_GUEST_NICE (-10) size the guest.
# Emulation is TCG (KVM is present on these machines but does not work).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STACK=${BLUEZ_STACK:-bookworm-backports}
case "$STACK" in bookworm-backports|bookworm|trixie) ;;
    *) echo "bluez-guest: BLUEZ_STACK=$STACK: must be bookworm-backports, bookworm or trixie" >&2; exit 2 ;; esac
CACHE=${BLUEZ_CACHE:-$REPO/.build-bluez}/$STACK
TIMEOUT=${BLUEZ_GUEST_TIMEOUT:-900}
# How long the guest may go without a heartbeat (init writes one every 5 s) once it has begun,
# and how long it may take to begin.
STALL=${BLUEZ_GUEST_STALL:-90}
BOOT_LIMIT=${BLUEZ_GUEST_BOOT_LIMIT:-240}
CPUS=${BLUEZ_GUEST_CPUS:-2}
MEMORY=${BLUEZ_GUEST_MEMORY:-2048}
NICE=${BLUEZ_GUEST_NICE:--10}
DIED=guest-died.txt
# The herald-lab the guest runs: the release build (a debug build is several times slower, and
# under TCG the guest's CPU is what the emulated radio's timing depends on).
BIN=${HERALD_LAB:-$REPO/.build/release/herald-lab}

say() { echo "bluez-guest: $*" >&2; }

kernel_version() { ls "$CACHE/root/lib/modules" 2>/dev/null | head -1; }

# apt-get and apt-cache over bookworm-backports alone, with lists and downloads in the cache and
# the host's sources, lists and package caches untouched (the archive keys are the host's).
backports_apt() {
    local tool=$1; shift
    local apt="$CACHE/apt"
    mkdir -p "$apt/lists/partial" "$apt/archives/partial"
    echo "deb http://deb.debian.org/debian bookworm-backports main" > "$apt/sources.list"
    "$tool" -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$apt/lists" -o Dir::Cache::Archives="$apt/archives" \
        -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= "$@"
}

prepare() {
    for tool in qemu-system-x86_64 busybox cpio depmod dpkg; do
        command -v "$tool" >/dev/null || { say "missing $tool: run 'make deps' (apt-get install qemu-system-x86 busybox-static cpio kmod)"; exit 2; }
    done
    mkdir -p "$CACHE"
    if [ "$STACK" = trixie ] && [ -z "$(kernel_version)" ]; then
        command -v mmdebstrap >/dev/null || { say "missing mmdebstrap: apt-get install mmdebstrap"; exit 2; }
        say "building a Debian 13 root (kernel, BlueZ, D-Bus) with mmdebstrap"
        rm -rf "$CACHE/root"
        mmdebstrap --quiet --variant=essential --include=bluez,dbus,linux-image-amd64,kmod trixie "$CACHE/root" http://deb.debian.org/debian \
            || { say "mmdebstrap failed"; exit 2; }
    fi
    # Mount points for running bluetoothd chrooted in the root (the guest sees it read-only).
    [ "$STACK" = trixie ] && mkdir -p "$CACHE/root/run/dbus" "$CACHE/root/var/lib/bluetooth" "$CACHE/root/tmp"
    if [ -z "$(kernel_version)" ]; then
        local pkg apt=(env)
        if [ "$STACK" = bookworm-backports ]; then
            apt=(backports_apt)
            "${apt[@]}" apt-get update -qq || { say "apt-get update of bookworm-backports failed"; exit 2; }
        fi
        pkg=$("${apt[@]}" apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
        [ -n "$pkg" ] || { say "apt-cache knows no linux-image-amd64$([ "$STACK" = bookworm-backports ] && echo " in bookworm-backports" || echo ": run apt-get update")"; exit 2; }
        say "downloading $pkg"
        (cd "$CACHE" && rm -f ./*.deb && "${apt[@]}" apt-get download "$pkg" >/dev/null 2>&1) || { say "apt-get download $pkg failed"; exit 2; }
        rm -rf "$CACHE/root"
        dpkg -x "$CACHE"/"$pkg"_*.deb "$CACHE/root"
        rm -f "$CACHE"/*.deb
    fi
    local kver mods
    kver=$(kernel_version)
    depmod -b "$CACHE/root" "$kver"
    mods="$CACHE/root/lib/modules/$kver"

    # The initramfs: static busybox, the modules needed to reach the 9p shares, and /init.
    local ir="$CACHE/initramfs"
    rm -rf "$ir" && mkdir -p "$ir"/{bin,proc,sys,dev,host,modules}
    cp "$(command -v busybox)" "$ir/bin/busybox"
    local order="" f
    # Load order with dependencies first, as modprobe would.
    for f in $(for m in virtio_pci 9pnet_virtio 9p; do modprobe -d "$CACHE/root" -S "$kver" --show-depends "$m"; done | awk '$1 == "insmod" {print $2}'); do
        case " $order " in *" $(basename "$f") "*) continue ;; esac
        cp "$f" "$ir/modules/"
        order="$order $(basename "$f")"
    done
    local python
    python=$(python3 -c 'import sys; print(sys.executable)')
    sed -e "s|@PYTHON@|$python|g" -e "s|@PYBIN@|$(dirname "$python")|g" -e "s|@KVER@|$kver|g" -e "s|@CACHE@|$CACHE|g" -e "s|@MODULES@|$order|g" \
        -e "s|@STACK@|$STACK|g" "$HERE/init" > "$ir/init"
    chmod +x "$ir/init"
    (cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) > "$CACHE/initramfs.gz"
    say "ready: stack $STACK, kernel $kver, initramfs $(du -h "$CACHE/initramfs.gz" | cut -f1)"
}

run() {
    local out=$1 script=$2
    [ -f "$CACHE/initramfs.gz" ] || prepare
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    # The guest's /tmp is its own: run a copy kept in OUTDIR.
    cp "$script" "$out/guest-script.sh"
    script="$out/guest-script.sh"
    rm -f "$out/guest-exit-code"
    [ -x "$BIN" ] || { say "no herald-lab at $BIN: run 'swift build -c release --product herald-lab' (or set HERALD_LAB)"; exit 2; }
    local kver
    kver=$(kernel_version)
    say "booting $kver (TCG, stack $STACK) to run $script; console: $out/console.log"
    local started=$SECONDS
    rm -f "$out/heartbeat" "$out/$DIED"
    set +e
    # The emulated radios' timing is the guest's CPU time (TCG): on a machine busy with other work
    # the guest runs ahead of it (BLUEZ_GUEST_NICE, default -10; 0 to leave it be; a user who is
    # not root cannot go below 0, and QEMU then runs at 0). no_timer_check:
    # on a loaded host TCG is too slow for the kernel's boot-time check of the IO-APIC timer, and
    # the guest panicked at 0.06 s ("IO-APIC + timer doesn't work!", issue 20's first loop run).
    setsid nice -n "$NICE" qemu-system-x86_64 -accel tcg -cpu max -m "$MEMORY" -smp "$CPUS" \
        -nographic -no-reboot -nic none \
        -kernel "$CACHE/root/boot/vmlinuz-$kver" -initrd "$CACHE/initramfs.gz" \
        -append "console=ttyS0 panic=-1 no_timer_check quiet loglevel=3 hl_out=$out hl_script=$script hl_repo=$REPO hl_bin=$BIN" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs local,path="$out",mount_tag=out,security_model=none \
        </dev/null >"$out/console.log" 2>&1 &
    local qemu=$!
    # With autogroups (sched_autogroup_enabled) nice weighs only within a session, and every
    # other session on the machine gets as much CPU as QEMU's: QEMU has a session of its own
    # (setsid) whose autogroup gets the same nice.
    # (setsid runs in the child: wait until it has its own group, or this session's would change.)
    local ours group
    ours=$(cut -d' ' -f1 "/proc/$$/autogroup" 2>/dev/null)
    for _ in $(seq 1 50); do
        group=$(cut -d' ' -f1 "/proc/$qemu/autogroup" 2>/dev/null) || break
        if [ -n "$group" ] && [ "$group" != "$ours" ]; then echo "$NICE" > "/proc/$qemu/autogroup" 2>/dev/null; break; fi
        sleep 0.1
    done
    watch_guest "$qemu" "$out" "$started"
    local died=$?
    wait "$qemu"
    local code=$?
    set -e
    if [ "$died" -ne 0 ]; then
        say "stopped the guest after $((SECONDS - started)) s: $(head -1 "$out/$DIED")"
        python3 "$HERE/guest_console.py" report "$out" >&2 || true
        exit "$died"
    fi
    if [ ! -f "$out/guest-exit-code" ]; then
        say "the guest never finished the script (qemu exit $code after $((SECONDS - started)) s); last console lines:"
        tail -n 30 "$out/console.log" >&2
        exit 99
    fi
    code=$(cat "$out/guest-exit-code")
    say "guest script exited $code after $((SECONDS - started)) s"
    exit "$code"
}

# watch_guest QEMU_PID OUTDIR STARTED: returns 0 when QEMU exits by itself; otherwise stops it and
# returns why, written to OUTDIR/guest-died.txt: 98 the console showed a kernel BUG, Oops or panic
# outside the Bluetooth stack (guest_console.py), 97 the guest stopped answering (its heartbeat,
# a read of the host root over 9p and a write to OUTDIR every 5 s, older than STALL s), 99 the
# run took longer than TIMEOUT s. Samples the host's load into OUTDIR/host-load.log every 10 s.
watch_guest() {
    local qemu=$1 out=$2 started=$3 why="" code=0 bugs=0 dying=""
    local next_load=$SECONDS
    while kill -0 "$qemu" 2>/dev/null; do
        sleep 2
        if [ "$SECONDS" -ge "$next_load" ]; then
            echo "$(date +%T) +$((SECONDS - started))s host load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/host-load.log"
            next_load=$((SECONDS + 10))
        fi
        # The Bluetooth stack's own BUG (Linux 6.1, hci_chan_del) kills bluetoothd and the run rides
        # through it; any other means the guest itself is dying.
        local now_bugs
        now_bugs=$(grep -cE 'kernel BUG at|BUG: |Oops: |general protection fault|Kernel panic|list_(del|add) corruption' "$out/console.log" 2>/dev/null)
        if [ "${now_bugs:-0}" -ne "$bugs" ] || [ -n "$dying" ]; then
            bugs=${now_bugs:-0}
            local verdict status
            verdict=$(python3 "$HERE/guest_console.py" watch "$out/console.log"); status=$?
            if [ "$status" -eq 3 ] || { [ "$status" -eq 4 ] && [ -n "$dying" ] && [ $((SECONDS - dying)) -ge 15 ]; }; then
                why="kernel: $verdict"; code=98; break
            elif [ "$status" -eq 4 ]; then
                dying=${dying:-$SECONDS}
            else
                dying=""
            fi
        fi
        local beat=""
        [ -f "$out/heartbeat" ] && beat=$(( $(date +%s) - $(stat -c %Y "$out/heartbeat") ))
        if [ -n "$beat" ] && [ "$beat" -gt "$STALL" ]; then
            why="the guest stopped answering: no heartbeat for $beat s (limit $STALL s)"; code=97; break
        elif [ -z "$beat" ] && [ $((SECONDS - started)) -gt "$BOOT_LIMIT" ]; then
            why="the guest stopped answering: no heartbeat $BOOT_LIMIT s after boot"; code=97; break
        fi
        if [ $((SECONDS - started)) -ge "$TIMEOUT" ]; then
            why="the run took longer than $TIMEOUT s (BLUEZ_GUEST_TIMEOUT)"; code=99; break
        fi
    done
    [ "$code" -eq 0 ] && return 0
    echo "$why (after $((SECONDS - started)) s; console: $out/console.log)" > "$out/$DIED"
    kill -TERM "$qemu" 2>/dev/null
    for _ in 1 2 3 4 5; do kill -0 "$qemu" 2>/dev/null || break; sleep 1; done
    kill -KILL "$qemu" 2>/dev/null
    return "$code"
}

# Sourced (test_checks.py tests watch_guest): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
    prepare) prepare ;;
    run) [ $# -eq 3 ] || { echo "usage: $0 run OUTDIR SCRIPT" >&2; exit 2; }; run "$2" "$3" ;;
    *) echo "usage: $0 prepare | run OUTDIR SCRIPT" >&2; exit 2 ;;
esac
