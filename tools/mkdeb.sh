#!/usr/bin/env bash
# Builds Pylon's Debian packages with dpkg-deb from the release build (run by `make deb`):
#
#   tools/mkdeb.sh VERSION ARCH OUTDIR
#
#   OUTDIR/pylon_VERSION_ARCH.deb          a device: pylond, its plugins, pylonctl. No broker,
#                                          no libpq, no libnats.
#   OUTDIR/pylon-backend_VERSION_ARCH.deb  a server: pylon-backend and its console, the fleet
#                                          tools, pylon-backend@.service for N instances, the
#                                          mosquitto auth plugin with an example conf.d snippet.
#   OUTDIR/python3-pylon_VERSION_all.deb   the Python client and plugin helper.
#
# Each package's library dependencies are computed from its ELF files: every shared library
# they link directly (DT_NEEDED), located with ldd and mapped to its Debian package (dpkg -S),
# at least the installed upstream version. The device package refuses to build if that list
# names a broker, libpq or libnats.
set -euo pipefail
version=$1 arch=$2 outdir=$3
cd "$(dirname "$0")/.."
work=.build/deb
mkdir -p "$work" "$outdir"
maintainer="Pylon maintainers <pylon@example.invalid>"

# The packages of the shared libraries the given ELF files link directly, as Depends entries:
# those they need at exec (DT_NEEDED) and those they open on first use (Sources/CLazyLink names
# their SONAMEs; a file holding one of those strings opens it).
lazy_sonames=$(sed -n 's/^#define PYLON_LAZY_[A-Z]* "\(.*\)"$/\1/p' Sources/CLazyLink/include/lazy_link.h)
lib_depends() {
    declare -A deps=()
    local f so lib pkg
    for f in "$@"; do
        for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p') \
            $(for so in $lazy_sonames; do grep -qaF "$so" "$f" && echo "$so"; done); do
            lib=$(ldd "$f" | awk -v so="$so" '$1 == so && $3 ~ /^\// { print $3 }')
            [ -n "$lib" ] || lib=$(ldconfig -p | awk -v so="$so" '$1 == so { print $NF; exit }')
            [ -n "$lib" ] || { [[ $so == ld-linux* ]] && continue; echo "mkdeb: $f: $so not found" >&2; exit 1; }
            pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true)
            pkg=${pkg%%:*}
            [ -n "$pkg" ] || { echo "mkdeb: no package owns $lib" >&2; exit 1; }
            deps[$pkg]=1
        done
    done
    for pkg in $(printf '%s\n' "${!deps[@]}" | sort); do
        printf ', %s (>= %s)' "$pkg" "$(dpkg-query -W -f='${Version}' "$pkg" | sed -e 's/-[^-]*$//' -e 's/[+~].*$//')"
    done
}

# A fresh staging tree for package $1.
new_stage() {
    local s=$work/$1
    rm -rf "$s"
    mkdir -p "$s/DEBIAN"
    echo "$s"
}

# The copyright file and a changelog: what Debian wants in every package's doc directory.
common_docs() {
    local pkg=$1 s=$2 docdir=$2/usr/share/doc/$1
    install -d "$docdir"
    install -m 644 tools/debian-copyright "$docdir/copyright"
    {
        echo "$pkg ($version) unstable; urgency=medium"
        echo
        echo "  * Release $version, built from git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
        echo "    The project's history is its git log; docs/ describes the behaviour."
        echo
        echo " -- $maintainer  $(date -R -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")"
    } | gzip -9n > "$docdir/changelog.gz"
}

# Debian ships stripped executables (debug symbols would be a -dbgsym package): about a third
# of each release binary's size.
strip_elf() { strip --strip-unneeded --remove-section=.comment --remove-section=.note "$@"; }

# control (from stdin, Installed-Size added), conffiles (every file under /etc: the operator's to
# edit, kept on upgrade), md5sums (dpkg --verify), modes, then the .deb.
finish() {
    local s=$1 out=$2
    { cat; echo "Installed-Size: $(du -sk --exclude=DEBIAN "$s" | cut -f1)"; } > "$s/DEBIAN/control"
    if [ -d "$s/etc" ]; then (cd "$s" && find etc -type f | sort | sed 's|^|/|') > "$s/DEBIAN/conffiles"; fi
    (cd "$s" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0r md5sum) \
        > "$s/DEBIAN/md5sums"
    for m in postinst prerm postrm; do [ -e "$s/DEBIAN/$m" ] && chmod 755 "$s/DEBIAN/$m"; done
    find "$s" -type d -exec chmod 755 {} +
    dpkg-deb --root-owner-group --build "$s" "$out" >/dev/null
    echo "built $out"
    dpkg-deb --field "$out" Depends
}

# ---- pylon: the device -------------------------------------------------------------------------
s=$(new_stage pylon)
make --no-print-directory install-device-files DESTDIR="$PWD/$s" PREFIX=/usr BIN_SRC=.build/release >/dev/null
rm -f "$s/etc/pylon/pylon.json.dist"
strip_elf "$s/usr/bin/pylonctl" "$s/usr/lib/pylon/pylon"
device_libs=$(lib_depends "$s/usr/bin/pylonctl" "$s/usr/lib/pylon/pylon")
# The point of the split: a device never pulls in a broker or the server side's client libraries.
if grep -E -q '(^|, )(mosquitto|libpq[0-9]*|libnats[0-9.]*) ' <<<"$device_libs"; then
    echo "mkdeb: the device binaries link a server-side library:$device_libs" >&2
    exit 1
fi
common_docs pylon "$s"
# What the man pages and the unit point to; the server side's documents are pylon-backend's.
install -m 644 README.md $(ls docs/*.md | grep -v -e FLEET.md -e CONSOLE.md -e AUTOMATION.md) "$s/usr/share/doc/pylon/"
gzip -9n "$s/usr/share/doc/pylon/BENCHMARKS.md"
install -d "$s/usr/share/lintian/overrides"
cat > "$s/usr/share/lintian/overrides/pylon" <<'OVERRIDES'
# pylon.json names the credential files and broker settings: 0640 root:pylon on purpose
# (docs/SECURITY.md); dpkg ships it 0640 root:root, the postinst gives it its group.
pylon: non-standard-file-perm 0640 != 0644 [etc/pylon/pylon.json]
# INSTALL.md is the operator's guide the man pages point to (units, logs, metrics, exit
# statuses, removal), not instructions to build or install from source.
pylon: package-contains-upstream-installation-documentation [usr/share/doc/pylon/INSTALL.md]
OVERRIDES

cat > "$s/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent group pylon >/dev/null; then addgroup --system --quiet pylon; fi
    if ! getent passwd pylon >/dev/null; then
        adduser --system --quiet --ingroup pylon --home /var/lib/pylon --no-create-home \
            --shell /usr/sbin/nologin --gecos "Pylon daemon" pylon
    fi
    # The configuration is readable by root and the pylon group only. Set once, while it is
    # still the shipped root:root file.
    if [ "$(stat -c %G /etc/pylon/pylon.json 2>/dev/null)" = root ]; then
        chgrp pylon /etc/pylon/pylon.json && chmod 0640 /etc/pylon/pylon.json
    fi
    # The device credential every plugin presents to the backend (credentialFile): created once,
    # never overwritten. A fleet's operator puts the fleet's enrolment secret there; with
    # pylon-backend on this machine it is that backend's secret.
    if [ ! -e /etc/pylon/device.key ]; then
        if [ -s /etc/pylon-backend/enrol.secret ]; then
            (umask 077; cat /etc/pylon-backend/enrol.secret > /etc/pylon/device.key)
        else
            (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > /etc/pylon/device.key)
        fi
        chown pylon:pylon /etc/pylon/device.key
    fi
    # Enabled, not started: the operator sets the backend URL in /etc/pylon/pylon.json first.
    deb-systemd-helper unmask pylond.service >/dev/null || true
    deb-systemd-helper enable pylond.service >/dev/null || true
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        # An upgrade restarts a running host, so the new plugins replace the old ones (an old
        # pylond would otherwise keep running and respawn the new plugin binaries).
        if [ -n "$2" ]; then deb-systemd-invoke try-restart pylond.service >/dev/null || true; fi
    fi
fi
exit 0
SCRIPT
cat > "$s/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop pylond.service >/dev/null || true
fi
exit 0
SCRIPT
cat > "$s/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi
if [ "$1" = remove ]; then
    deb-systemd-helper mask pylond.service >/dev/null || true
fi
if [ "$1" = purge ]; then
    deb-systemd-helper purge pylond.service >/dev/null || true
    deb-systemd-helper unmask pylond.service >/dev/null || true
    # State (consent, queues, MA identities) and the device credential go with a purge.
    rm -rf /var/lib/pylon /run/pylon
    rm -f /etc/pylon/device.key
    rmdir /etc/pylon 2>/dev/null || true
    if getent passwd pylon >/dev/null; then deluser --system --quiet pylon >/dev/null 2>&1 || userdel pylon || true; fi
    if getent group pylon >/dev/null; then delgroup --system --quiet pylon >/dev/null 2>&1 || groupdel pylon || true; fi
fi
exit 0
SCRIPT
finish "$s" "$outdir/pylon_${version}_${arch}.deb" <<CONTROL
Package: pylon
Version: $version
Architecture: $arch
Maintainer: $maintainer
Depends: adduser, init-system-helpers (>= 1.54)$device_libs
Recommends: systemd
Suggests: python3-pylon, prometheus-node-exporter
Section: net
Priority: optional
Homepage: https://example.invalid/pylon
Description: local JSON-RPC bus serving mobile-engagement SDK services
 pylond routes newline-delimited JSON-RPC 2.0 between local clients on a Unix
 socket and supervised plugin executables: the batch uploader, MA analytics,
 push (an MQTT client of the fleet's broker) and the tag manager. pylonctl is
 its command-line client. This is what a device runs; the servers are in
 pylon-backend, the Python client in python3-pylon.
 The pylond service runs as the pylon system user, hardened; members of the
 pylon group may connect to /run/pylon/pylon.sock.
CONTROL

# ---- pylon-backend: the server -----------------------------------------------------------------
# The broker plugin, built with all of Debian's hardening flags (bindnow included; from the
# environment, so that its Makefile's own flags are added to them).
rm -f "$work/pylon_auth.so"
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS) $(dpkg-buildflags --get LDFLAGS)" \
    make -s --no-print-directory -C tools/mosquitto-auth OUT="$PWD/$work/pylon_auth.so"
s=$(new_stage pylon-backend)
make --no-print-directory install-backend-files DESTDIR="$PWD/$s" PREFIX=/usr BIN_SRC=.build/release \
    AUTH_SO="$work/pylon_auth.so" >/dev/null
strip_elf "$s/usr/bin/pylon-backend" "$s/usr/lib/pylon-backend/pylon_auth.so"
backend_libs=$(lib_depends "$s/usr/bin/pylon-backend" "$s/usr/lib/pylon-backend/pylon_auth.so")
common_docs pylon-backend "$s"
install -d "$s/usr/share/lintian/overrides"
cat > "$s/usr/share/lintian/overrides/pylon-backend" <<'OVERRIDES'
# INSTALL.md is the operator's guide pylon-backend(8) points to (the packages, the units, the
# broker set-up, N instances), not instructions to build or install from source.
pylon-backend: package-contains-upstream-installation-documentation [usr/share/doc/pylon-backend/INSTALL.md]
# The operator console: the web application pylon-backend serves (--console-dir), not documentation.
pylon-backend: package-contains-documentation-outside-usr-share-doc [usr/share/pylon/console/index.html]
# A drop-in for Debian's mosquitto.service (its LimitNOFILE), not a service of this package:
# there is no init script to ship.
pylon-backend: package-supports-alternative-init-but-no-init.d-script [lib/systemd/system/mosquitto.service.d/]
pylon-backend: package-supports-alternative-init-but-no-init.d-script [lib/systemd/system/mosquitto.service.d/pylon-backend-nofile.conf]
OVERRIDES
install -m 644 README.md docs/FLEET.md docs/SECURITY.md docs/CONSOLE.md docs/AUTOMATION.md docs/INSTALL.md docs/PUSH.md \
    docs/backend-openapi.yaml "$s/usr/share/doc/pylon-backend/"

cat > "$s/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent group pylon-backend >/dev/null; then addgroup --system --quiet pylon-backend; fi
    if ! getent passwd pylon-backend >/dev/null; then
        adduser --system --quiet --ingroup pylon-backend --home /var/lib/pylon-backend --no-create-home \
            --shell /usr/sbin/nologin --gecos "Pylon backend" pylon-backend
    fi
    # The secrets every instance shares (pylon-backend@.service loads them), each created once,
    # 0600 root, never overwritten: the enrolment secret (with the device package on this
    # machine, its device.key), the operator token, and the key that signs the devices' broker
    # passwords, `<kid>:<hex>`.
    cd /etc/pylon-backend
    umask 077
    if [ ! -e enrol.secret ]; then
        if [ -s /etc/pylon/device.key ]; then cat /etc/pylon/device.key > enrol.secret
        else od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > enrol.secret; fi
    fi
    [ -e operator.token ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > operator.token
    [ -e broker.key ] || { printf k1:; od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; } > broker.key
    # The keys the broker's pylon_auth plugin accepts (several during a rotation): read by the
    # mosquitto user, so 0640 root:mosquitto once mosquitto is installed.
    [ -e broker-keys ] || cat broker.key > broker-keys
    if getent group mosquitto >/dev/null && [ "$(stat -c %G broker-keys)" = root ]; then
        chgrp mosquitto broker-keys && chmod 0640 broker-keys
    fi
    if [ -d /run/systemd/system ]; then
        # Also reads the drop-in raising mosquitto's LimitNOFILE (in effect at its next start).
        systemctl --system daemon-reload >/dev/null || true
        # An upgrade restarts the instances that run.
        if [ -n "$2" ]; then deb-systemd-invoke try-restart 'pylon-backend@*.service' >/dev/null || true; fi
    fi
fi
exit 0
SCRIPT
cat > "$s/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop 'pylon-backend@*.service' >/dev/null || true
fi
exit 0
SCRIPT
cat > "$s/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi
if [ "$1" = purge ]; then
    # Instances the operator enabled, their state (SQLite databases), the secrets and the user.
    rm -f /etc/systemd/system/*.wants/pylon-backend@*.service
    rm -rf /var/lib/pylon-backend
    rm -f /etc/pylon-backend/enrol.secret /etc/pylon-backend/operator.token \
        /etc/pylon-backend/broker.key /etc/pylon-backend/broker-keys
    rmdir /etc/pylon-backend 2>/dev/null || true
    if getent passwd pylon-backend >/dev/null; then
        deluser --system --quiet pylon-backend >/dev/null 2>&1 || userdel pylon-backend || true
    fi
    if getent group pylon-backend >/dev/null; then
        delgroup --system --quiet pylon-backend >/dev/null 2>&1 || groupdel pylon-backend || true
    fi
fi
exit 0
SCRIPT
# python3 runs the fleet tools; openssl signs pylon-nats-auth's keys; mosquitto is the packaged
# broker path, but the broker may run elsewhere (or be the nats-server cluster).
finish "$s" "$outdir/pylon-backend_${version}_${arch}.deb" <<CONTROL
Package: pylon-backend
Version: $version
Architecture: $arch
Maintainer: $maintainer
Depends: adduser, init-system-helpers (>= 1.54), python3$backend_libs
Recommends: mosquitto (>= 2.0), openssl, systemd
Suggests: postgresql, nats-server, haproxy
Section: net
Priority: optional
Homepage: https://example.invalid/pylon
Description: Pylon's server side: device registration, ingest, push, console
 pylon-backend registers devices, stores their uploads and MA calls (SQLite,
 or PostgreSQL shared by any number of instances, with an optional NATS
 JetStream ingest stream), sends pushes through an MQTT broker and serves the
 operator console. pylon-backend@.service runs one instance per
 /etc/pylon-backend/NAME.env.
 Also: pylon_auth, a mosquitto plugin that checks the devices' signed broker
 credentials without per-device broker state (an example conf.d snippet and a
 drop-in raising mosquitto's descriptor limit; mosquitto's own files are left
 alone), and the fleet tools pylon-nats-auth, pylon-nats-cluster and
 pylon-stream-consumer.
CONTROL

# ---- python3-pylon: the client -----------------------------------------------------------------
s=$(new_stage python3-pylon)
pydir="$s/usr/lib/python3/dist-packages/pylon"
install -d "$pydir"
install -m 644 clients/python/src/pylon/*.py clients/python/src/pylon/py.typed "$pydir/"
common_docs python3-pylon "$s"
install -m 644 clients/python/README.md "$s/usr/share/doc/python3-pylon/"
# Byte-compiled at install as Debian's Python packages are (py3compile), and those files
# removed again before the sources go (py3clean): nothing is left behind.
cat > "$s/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ] && command -v py3compile >/dev/null; then py3compile -p python3-pylon; fi
exit 0
SCRIPT
cat > "$s/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if command -v py3clean >/dev/null; then py3clean -p python3-pylon; fi
exit 0
SCRIPT
finish "$s" "$outdir/python3-pylon_${version}_all.deb" <<CONTROL
Package: python3-pylon
Version: $version
Architecture: all
Maintainer: $maintainer
Depends: python3 (>= 3.9)
Suggests: pylon
Section: python
Priority: optional
Homepage: https://example.invalid/pylon
Description: Python client and plugin helper for the Pylon host
 The "pylon" package for the system Python (standard library only, typed):
 a client of pylond's JSON-RPC 2.0 Unix socket (blocking and asyncio), a
 helper to write plugins, and pytest fixtures that start a private host with
 fake services for an app's tests.
CONTROL
