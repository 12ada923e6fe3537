#!/usr/bin/env bash
# Run a command inside a QEMU guest whose (Debian) kernel has Bluetooth and hci_vhci, with the
# host's / visible read-only, so host-built binaries and the host's bluetoothd, dbus-daemon and
# Python (bumble, bleak) run unchanged. See scripts/bluez/README.md.
#
#   guest.sh prepare                     download + unpack the kernel, build the initramfs
#   guest.sh run OUTDIR -- COMMAND...    boot, run COMMAND in the host tree, power off
#
# Environment: BLUEZ_CACHE (default /work/main/.build-bluez), BLUEZ_GUEST_TIMEOUT (seconds,
# default 600), BLUEZ_GUEST_MEM (MiB, default 2048), BLUEZ_GUEST_SMP (default 2),
# BLUEZ_GUEST_QUIET=1 (do not copy the console to stdout; it is always in OUTDIR/console.log).
set -euo pipefail

CACHE=${BLUEZ_CACHE:-/work/main/.build-bluez}
KROOT=$CACHE/kernel          # dpkg -x of the kernel package
IROOT=$CACHE/initrd          # initramfs staging tree
INITRD=$CACHE/initrd.cpio.gz

# Modules the init inserts before the host root is reachable, in dependency order
# (virtio_pci and 9p are modules in Debian's kernel). Dependencies are resolved by modprobe
# --show-depends at prepare time, so this list only names the leaves.
EARLY_MODULES="virtio_pci 9pnet_virtio 9p"
# Loaded once the host tree is mounted (Bluetooth + the crypto it asks for via AF_ALG).
BT_MODULES="af_alg algif_hash algif_skcipher cmac ecb bluetooth hci_vhci"

die() { echo "guest.sh: $*" >&2; exit 2; }

kernel_version() {
    local d
    for d in "$KROOT"/lib/modules/* "$KROOT"/usr/lib/modules/*; do
        [ -d "$d" ] && { basename "$d"; return; }
    done
    return 1
}

modules_base() {  # the -d/-b root for depmod/modprobe (lib/modules or usr/lib/modules under it)
    if [ -d "$KROOT/lib/modules" ]; then echo "$KROOT"; else echo "$KROOT/usr"; fi
}

prepare() {
    mkdir -p "$CACHE"
    command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"
    [ -x /bin/busybox ] || die "/bin/busybox missing (apt-get install busybox-static)"
    file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || \
        echo "guest.sh: warning: /bin/busybox does not look static (busybox-static is needed)" >&2
    for t in bluetoothd dbus-daemon cpio depmod modprobe; do
        command -v $t >/dev/null || [ -x /usr/sbin/$t ] || [ -x /sbin/$t ] || \
            die "$t missing (apt-get install bluez dbus cpio kmod)"
    done

    if [ -f "$KROOT/.unpacked" ]; then
        echo "guest.sh: kernel already unpacked in $KROOT ($(kernel_version))"
    else
        local pkg deb
        pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
        [ -n "$pkg" ] || die "cannot find the kernel package behind linux-image-amd64"
        mkdir -p "$CACHE/dl"
        deb=$(ls "$CACHE"/dl/"${pkg}"_*.deb 2>/dev/null | head -1 || true)
        if [ -z "$deb" ]; then
            echo "guest.sh: downloading $pkg"
            (cd "$CACHE/dl" && apt-get download "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' ) || true
            deb=$(ls "$CACHE"/dl/"${pkg}"_*.deb 2>/dev/null | head -1 || true)
            [ -n "$deb" ] || die "apt-get download $pkg failed"
        fi
        rm -rf "$KROOT"; mkdir -p "$KROOT"
        echo "guest.sh: unpacking $(basename "$deb")"
        dpkg -x "$deb" "$KROOT"
        local kver; kver=$(kernel_version) || die "no lib/modules in $deb"
        depmod -b "$(modules_base)" "$kver"
        touch "$KROOT/.unpacked"
    fi
    local kver base; kver=$(kernel_version); base=$(modules_base)
    ls "$KROOT"/boot/vmlinuz-"$kver" >/dev/null || die "no vmlinuz in $KROOT/boot"

    # initramfs: static busybox, the early modules, /init. Rebuilt each time (cheap, < 1 s),
    # so edits to this script take effect.
    rm -rf "$IROOT"; mkdir -p "$IROOT"/{bin,sbin,dev,proc,sys,host,modules,lib}
    cp /bin/busybox "$IROOT/bin/busybox"
    local mods=() line ko
    while read -r line; do
        case $line in insmod\ *) ko=${line#insmod }; ko=${ko%% *};;  *) continue;; esac
        case " ${mods[*]-} " in *" $(basename "$ko") "*) continue;; esac
        case $ko in
            *.ko) cp "$ko" "$IROOT/modules/";;
            *.ko.xz) xz -dc "$ko" > "$IROOT/modules/$(basename "$ko" .xz)"; ko=${ko%.xz};;
            *.ko.zst) zstd -qdc "$ko" > "$IROOT/modules/$(basename "$ko" .zst)"; ko=${ko%.zst};;
            *) die "unexpected module file $ko";;
        esac
        mods+=("$(basename "$ko")")
    done < <(modprobe -d "$base" -S "$kver" --show-depends -a $EARLY_MODULES)
    [ ${#mods[@]} -gt 0 ] || die "modprobe --show-depends found no early modules"
    # /lib/modules inside the initramfs points at the unpacked tree (reachable once the host
    # root is mounted at /host), for anything that looks there.
    ln -s "/host$base/lib/modules" "$IROOT/lib/modules"

    sed -e "s|@EARLY@|${mods[*]}|" -e "s|@BT_MODULES@|$BT_MODULES|" \
        -e "s|@MODBASE@|$base|" > "$IROOT/init" <<'INIT'
#!/bin/busybox sh
# /init of the BlueZ test guest (generated by scripts/bluez/guest.sh prepare).
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "init: guest kernel $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s"

fail() { echo "init: FATAL: $*"; poweroff -f; sleep 5; }
for m in @EARLY@; do insmod /modules/$m || echo "init: insmod $m failed"; done

arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
OUT=$(arg bluez.out)
H=/host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot $H \
    || fail "cannot mount the host root over 9p"

# Kernel module requests (af_alg/cmac for Bluetooth's crypto, ...) run the usermode helper in
# this initramfs root: hand them to the host's kmod modprobe over the unpacked kernel tree.
cat > /sbin/modprobe <<EOF
#!/bin/busybox sh
exec /bin/busybox chroot $H /sbin/modprobe -d @MODBASE@ "\$@"
EOF
chmod +x /sbin/modprobe
echo /sbin/modprobe > /proc/sys/kernel/modprobe

# Writable and virtual file systems inside the host tree.
mount -t proc proc $H/proc
mount -t sysfs sys $H/sys
mount -t devtmpfs dev $H/dev
mkdir -p $H/dev/pts $H/dev/shm 2>/dev/null
mount -t devpts devpts $H/dev/pts
mount -t tmpfs tmpfs $H/dev/shm
for d in /tmp /run /var/tmp /var/log /var/lib/bluetooth /var/cache; do
    [ -d $H$d ] && [ ! -L $H$d ] && mount -t tmpfs -o mode=0755 tmpfs $H$d
done
chmod 1777 $H/tmp $H/var/tmp
# modprobe for the guest's own processes (the tree's /lib/modules does not hold this kernel).
mkdir -p $H/run/guest-bin
cat > $H/run/guest-bin/modprobe <<EOF
#!/bin/sh
exec /sbin/modprobe -d @MODBASE@ "\$@"
EOF
chmod +x $H/run/guest-bin/modprobe

mkdir -p $H$OUT 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 hostout $H$OUT \
    || fail "cannot mount the output share at $OUT"

/sbin/modprobe -a @BT_MODULES@ || echo "init: modprobe of the Bluetooth modules failed"
[ -e $H/dev/vhci ] || echo "init: WARNING: no /dev/vhci"
ip link set lo up 2>/dev/null

echo "init: running the guest command after $(cut -d' ' -f1 /proc/uptime) s"
chroot $H /bin/sh $OUT/.guest-command.sh
rc=$?
echo "init: guest command exited with $rc after $(cut -d' ' -f1 /proc/uptime) s"
echo $rc > $H$OUT/guest-exit-code
sync
umount $H$OUT 2>/dev/null
poweroff -f
sleep 10
INIT
    chmod +x "$IROOT/init"
    (cd "$IROOT" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    echo "guest.sh: ready: kernel $kver, initramfs $INITRD ($(du -h "$INITRD" | cut -f1))"
}

run() {
    [ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: guest.sh run OUTDIR -- COMMAND..."
    local out=$1; shift 2
    [ -f "$INITRD" ] && [ -f "$KROOT/.unpacked" ] || die "run 'guest.sh prepare' first"
    mkdir -p "$out"; out=$(cd "$out" && pwd -P)
    case $out in *[[:space:]]*) die "OUTDIR must not contain spaces: $out";; esac
    local kver; kver=$(kernel_version)
    rm -f "$out/guest-exit-code" "$out/console.log"

    # The command runs in the guest with a clean environment; paths resolved on the host.
    local pybin swiftbin
    pybin=$(python3 -c 'import os,sys; print(os.path.dirname(os.path.realpath(sys.executable)))' 2>/dev/null || true)
    swiftbin=/opt/swift/usr/bin
    {
        echo "# generated by guest.sh run; executed by the guest's /init inside the host tree"
        echo "export PATH=/run/guest-bin${pybin:+:$pybin}:$swiftbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        echo "export HOME=/root LANG=C.UTF-8 TERM=dumb PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1"
        echo "export BLUEZ_GUEST=1 BLUEZ_OUT=$(printf %q "$out")"
        echo "cd $(printf %q "$(pwd -P)") 2>/dev/null || cd /"
        printf 'exec'; printf ' %q' "$@"; echo
    } > "$out/.guest-command.sh"

    local timeout=${BLUEZ_GUEST_TIMEOUT:-600}
    local start=$SECONDS qrc=0
    local qemu=(qemu-system-x86_64 -accel tcg -cpu max -m "${BLUEZ_GUEST_MEM:-2048}"
        -smp "${BLUEZ_GUEST_SMP:-2}" -nographic -no-reboot -nic none
        -kernel "$KROOT/boot/vmlinuz-$kver" -initrd "$INITRD"
        -append "console=ttyS0 quiet loglevel=4 panic=-1 bluez.out=$out"
        -fsdev local,id=hostroot,path=/,security_model=none,readonly=on
        -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
        -fsdev local,id=hostout,path="$out",security_model=none
        -device virtio-9p-pci,fsdev=hostout,mount_tag=hostout)
    echo "guest.sh: booting (timeout ${timeout}s), console -> $out/console.log" >&2
    if [ "${BLUEZ_GUEST_QUIET:-0}" = 1 ]; then
        timeout -k 10 "$timeout" "${qemu[@]}" </dev/null >"$out/console.log" 2>&1 || qrc=$?
    else
        set +o pipefail
        timeout -k 10 "$timeout" "${qemu[@]}" </dev/null 2>&1 | tee "$out/console.log"
        qrc=${PIPESTATUS[0]}
        set -o pipefail
    fi
    local elapsed=$((SECONDS - start))
    if [ -s "$out/guest-exit-code" ]; then
        local rc; rc=$(tr -dc 0-9 < "$out/guest-exit-code")
        echo "guest.sh: guest command exited with ${rc:-?} (${elapsed}s wall)" >&2
        exit "${rc:-99}"
    fi
    if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        echo "guest.sh: ERROR: guest timed out after ${timeout}s (BLUEZ_GUEST_TIMEOUT); no exit code written. See $out/console.log" >&2
    else
        echo "guest.sh: ERROR: guest stopped (qemu status $qrc, ${elapsed}s) without writing an exit code (kernel panic or init failure?). See $out/console.log" >&2
        tail -n 20 "$out/console.log" >&2 || true
    fi
    exit 99
}

case ${1:-} in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run OUTDIR -- COMMAND..." >&2; exit 2 ;;
esac
