#!/usr/bin/env bash
# Builds herald-lab_<version>_<arch>.deb from a release binary whose Swift runtime is linked in
# (swift build --static-swift-stdlib): the binary, systemd units for agents (template), the
# coordinator and the air, the udev rule for USB resets, the docs, and the system user. Its
# dependencies are what dpkg-shlibdeps reads off the binary (libc, libdbus, libbluetooth,
# libsqlite3, ...) plus bluez and dbus.
#
#   scripts/deb/build.sh BINARY OUTDIR     prints the .deb's path
set -euo pipefail
bin=${1:?usage: build.sh BINARY OUTDIR}
out=${2:?usage: build.sh BINARY OUTDIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "deb: $*" >&2; exit 2; }
[ -x "$bin" ] || fail "$bin is not an executable (make deb builds it)"
command -v dpkg-shlibdeps >/dev/null || fail "dpkg-shlibdeps is missing: apt-get install dpkg-dev"
if ldd "$bin" | grep -q libswiftCore; then fail "$bin links the Swift runtime dynamically; build it with --static-swift-stdlib"; fi

# "herald-lab 0.2.0 (commit 1a2b3c4d5e6f)" -> 0.2.0+g1a2b3c4d5e6f (".dirty" for uncommitted changes)
line=$("$bin" --version)
release=$(sed -n 's/^herald-lab \([0-9][0-9.]*\) (commit .*$/\1/p' <<<"$line")
commit=$(sed -n 's/^herald-lab [0-9.]* (commit \([0-9a-f]*\)\(-dirty\)\{0,1\})$/\1/p' <<<"$line")
[ -n "$release" ] || fail "cannot read the version from \"$line\""
version=$release${commit:++g$commit}
case "$line" in *-dirty*) version=$version.dirty ;; esac
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
install -D -m 0755 "$bin" "$pkg/usr/bin/herald-lab"
strip --strip-unneeded "$pkg/usr/bin/herald-lab" 2>/dev/null || true
units=$pkg/lib/systemd/system
install -d "$units"
# The same agent template install.sh installs, calling the packaged binary.
sed 's#/usr/local/bin/herald-lab#/usr/bin/herald-lab#g; s#/usr/local/share/doc/herald-lab#/usr/share/doc/herald-lab#g' \
    "$top/agents/herald-lab-agent@.service" > "$units/herald-lab-agent@.service"
install -m 0644 "$top/packaging/deb/herald-lab-coordinator.service" "$top/packaging/deb/herald-lab-air.service" "$units/"
chmod 0644 "$units"/*
install -D -m 0644 "$top/packaging/deb/90-herald-lab.rules" "$pkg/lib/udev/rules.d/90-herald-lab.rules"
doc=$pkg/usr/share/doc/herald-lab
install -D -m 0644 "$top/README.md" "$doc/README.md"
install -m 0644 "$top/agents/README.md" "$doc/agents-README.md"
install -m 0644 "$top/agents/inventory.example.yaml" "$doc/"
install -D -m 0644 "$top/packaging/grafana/heraldlab.json" "$pkg/usr/share/herald-lab/grafana/heraldlab.json"
# The dashboard's templates, style sheet and scripts (SwiftPM's resource bundle beside the built
# binary): /usr/bin/herald-lab reads them from /usr/share/herald-lab/dashboard (DashboardTemplates).
resources=$(dirname "$bin")/HeraldLab_LabCoordinator.resources/Dashboard
[ -d "$resources" ] || fail "$resources is missing (the build's resource bundle of the dashboard)"
install -d "$pkg/usr/share/herald-lab/dashboard"
install -m 0644 "$resources"/* "$pkg/usr/share/herald-lab/dashboard/"
printf 'HeraldLab %s (commit %s): a test lab for the Herald BLE proximity protocol.\n' "$release" "${commit:-unknown}" > "$doc/copyright"

# Shared libraries the binary needs, as Debian packages.
mkdir -p "$stage/src/debian"
printf 'Source: herald-lab\n\nPackage: herald-lab\nArchitecture: any\n' > "$stage/src/debian/control"
shlibs=$(cd "$stage/src" && dpkg-shlibdeps -O "$pkg/usr/bin/herald-lab" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || fail "dpkg-shlibdeps found no dependencies for $bin"

install -d "$pkg/DEBIAN"
install -m 0755 "$top/packaging/deb/postinst" "$top/packaging/deb/postrm" "$pkg/DEBIAN/"
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: herald-lab
Version: $version
Architecture: $arch
Maintainer: HeraldLab <heraldlab@localhost>
Installed-Size: $size
Depends: $shlibs, bluez, dbus, adduser
Section: net
Priority: optional
Description: test lab for the Herald BLE proximity protocol
 herald-lab runs Herald sensor nodes on Linux Bluetooth dongles (BlueZ over D-Bus), coordinates
 them across hosts, gathers their logs into results bundles and analyses them. Units:
 herald-lab-agent@NAME (one per dongle), herald-lab-coordinator and herald-lab-air.
CONTROL
mkdir -p "$out"
deb=$out/herald-lab_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
