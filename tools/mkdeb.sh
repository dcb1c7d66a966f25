#!/usr/bin/env bash
# Builds the pylon .deb with dpkg-deb from the release build: `tools/mkdeb.sh VERSION ARCH OUT.deb`
# (run by `make deb`). The runtime dependencies are computed from the binaries themselves: every
# shared library they load (ldd) mapped to its Debian package (dpkg -S), at least the installed
# upstream version.
set -euo pipefail
version=$1 arch=$2 out=$3
cd "$(dirname "$0")/.."
stage=.build/deb/stage
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$(dirname "$out")"
make --no-print-directory install-files DESTDIR="$PWD/$stage" PREFIX=/usr BIN_SRC=.build/release >/dev/null

# Debian ships stripped executables (debug symbols would be a -dbgsym package): about a third
# of each release binary's size.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage"/usr/bin/pylonctl \
    "$stage"/usr/bin/pylon-backend "$stage"/usr/lib/pylon/pylon

# Depends: packages of the shared libraries the ELF files link directly (DT_NEEDED), located
# with ldd; the version is at least the installed one (the build machine's).
declare -A deps=()
for f in "$stage"/usr/bin/pylonctl "$stage"/usr/bin/pylon-backend "$stage"/usr/lib/pylon/pylon; do
    for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        lib=$(ldd "$f" | awk -v so="$so" '$1 == so && $3 ~ /^\// { print $3 }')
        [ -n "$lib" ] || { [[ $so == ld-linux* ]] && continue; echo "mkdeb: $so not found" >&2; exit 1; }
        pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true)
        pkg=${pkg%%:*}
        [ -n "$pkg" ] || { echo "mkdeb: no package owns $lib" >&2; exit 1; }
        deps[$pkg]=1
    done
done
# adduser and init-system-helpers (deb-systemd-helper) for the maintainer scripts; mosquitto is
# the push plugin's broker (enabled in the shipped configuration) and python3 runs
# pylon-dynsec-init, which writes its dynamic-security file once.
depends="adduser, init-system-helpers (>= 1.54), mosquitto (>= 2.0), python3"
for p in $(printf '%s\n' "${!deps[@]}" | sort); do
    v=$(dpkg-query -W -f='${Version}' "$p" | sed -e 's/-[^-]*$//' -e 's/[+~].*$//')
    depends+=", $p (>= $v)"
done

size=$(du -sk "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: pylon
Version: $version
Architecture: $arch
Maintainer: Pylon maintainers <pylon@example.invalid>
Installed-Size: $size
Depends: $depends
Recommends: systemd
Suggests: prometheus-node-exporter
Section: net
Priority: optional
Homepage: https://example.invalid/pylon
Description: local JSON-RPC bus serving mobile-engagement SDK services
 pylond routes newline-delimited JSON-RPC 2.0 between local clients on a Unix
 socket and supervised plugin executables: the batch uploader, MA analytics,
 push (over MQTT) and the tag manager. pylonctl is its command-line client;
 pylon-backend is the reference HTTP backend; the Python package "pylon" is the
 client and plugin helper for the system Python.
 The pylond service runs as the pylon system user, hardened; members of the
 pylon group may connect to /run/pylon/pylon.sock.
CONTROL
rm -f "$stage/etc/pylon/pylon.json.dist"

# The broker: Debian's mosquitto.service reads /etc/mosquitto/conf.d/*.conf. The package's file is
# the example's directives with this architecture's plugin path; the dynamic-security file it
# names is written once by the postinst (pylon-dynsec-init, shipped in /usr/lib/pylon).
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
install -d "$stage/etc/mosquitto/conf.d" "$stage/usr/lib/pylon"
{
    echo "# Pylon's push broker on 127.0.0.1:1883, installed by the pylon package (a conffile; the"
    echo "# commented original is /usr/share/doc/pylon/examples/mosquitto-pylon-push.conf)."
    grep -v -e '^#' -e '^$' etc/mosquitto/pylon-push.conf \
        | sed "s|^plugin /usr/lib/[^/]*/|plugin /usr/lib/$multiarch/|"
} > "$stage/etc/mosquitto/conf.d/pylon-push.conf"
install -m 755 tools/pylon-dynsec-init "$stage/usr/lib/pylon/pylon-dynsec-init"

# The Python client and plugin helper, for the system Python (standard library only; typed).
pydir="$stage/usr/lib/python3/dist-packages/pylon"
install -d "$pydir"
install -m 644 clients/python/src/pylon/*.py clients/python/src/pylon/py.typed "$pydir/"

# Documentation: what the man pages and unit files point to, the copyright file and a changelog.
docdir="$stage/usr/share/doc/pylon"
install -d "$docdir"
install -m 644 README.md docs/*.md docs/backend-openapi.yaml "$docdir/"
gzip -9n "$docdir/BENCHMARKS.md"
install -m 644 tools/debian-copyright "$docdir/copyright"
# pylon.json holds the broker and backend credentials: 0640 root:pylon on purpose (docs/SECURITY.md).
install -d "$stage/usr/share/lintian/overrides"
echo "pylon: non-standard-file-perm 0640 != 0644 [etc/pylon/pylon.json]" > "$stage/usr/share/lintian/overrides/pylon"
{
    echo "pylon ($version) unstable; urgency=medium"
    echo
    echo "  * Release $version, built from git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
    echo "    The project's history is its git log; docs/ describes the behaviour."
    echo
    echo " -- Pylon maintainers <pylon@example.invalid>  $(date -R -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")"
} | gzip -9n > "$docdir/changelog.gz"
# Every file under /etc is the operator's to edit (the GTM default containers pylon.json points
# to included): dpkg keeps their changes on upgrade and asks.
(cd "$stage" && find etc -type f | sort | sed 's|^|/|') > "$stage/DEBIAN/conffiles"

cat > "$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent group pylon >/dev/null; then addgroup --system --quiet pylon; fi
    if ! getent passwd pylon >/dev/null; then
        adduser --system --quiet --ingroup pylon --home /var/lib/pylon --no-create-home \
            --shell /usr/sbin/nologin --gecos "Pylon daemon" pylon
    fi
    # The configuration holds credentials (broker, backend): readable by root and the pylon
    # group only. Set once, while it is still the shipped root:root file.
    if [ "$(stat -c %G /etc/pylon/pylon.json 2>/dev/null)" = root ]; then
        chgrp pylon /etc/pylon/pylon.json && chmod 0640 /etc/pylon/pylon.json
    fi
    # The device credential every plugin presents to the backend (credentialFile), and the
    # enrolment secret of the reference backend on this machine (pylon-backend.service loads
    # it): created once, never overwritten (a fleet's operator puts the fleet's key there).
    if [ ! -e /etc/pylon/device.key ]; then
        (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > /etc/pylon/device.key)
        chown pylon:pylon /etc/pylon/device.key
    fi
    # The push broker: the reference backend's broker login (0600 root; pylon-backend.service
    # loads it) and mosquitto's dynamic-security file with that login as its admin, both written
    # once. mosquitto then reads /etc/mosquitto/conf.d/pylon-push.conf: restart it if it runs.
    if [ ! -e /etc/pylon/broker.password ]; then
        (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > /etc/pylon/broker.password)
    fi
    if [ ! -e /var/lib/mosquitto/dynsec.json ]; then
        install -d -m 0755 -o mosquitto -g mosquitto /var/lib/mosquitto
        /usr/lib/pylon/pylon-dynsec-init /var/lib/mosquitto/dynsec.json pylon-backend /etc/pylon/broker.password
        chown mosquitto:mosquitto /var/lib/mosquitto/dynsec.json
    fi
    # Enabled, not started: the operator sets the backend URL in /etc/pylon/pylon.json first.
    deb-systemd-helper unmask pylond.service >/dev/null || true
    deb-systemd-helper enable pylond.service >/dev/null || true
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        deb-systemd-invoke try-restart mosquitto.service >/dev/null || true
        # An upgrade restarts what runs, so the new host and plugins replace the old ones
        # (an old pylond would otherwise keep running and respawn the new plugin binaries).
        if [ -n "$2" ]; then
            deb-systemd-invoke try-restart pylon-backend.service pylond.service >/dev/null || true
        fi
    fi
fi
exit 0
SCRIPT
cat > "$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop pylond.service pylon-backend.service >/dev/null || true
fi
exit 0
SCRIPT
cat > "$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi
if [ "$1" = remove ]; then
    deb-systemd-helper mask pylond.service >/dev/null || true
fi
if [ "$1" = purge ]; then
    deb-systemd-helper purge pylond.service pylon-backend.service >/dev/null || true
    deb-systemd-helper unmask pylond.service >/dev/null || true
    # State (consent, queues, MA identities) and the service identity go with a purge.
    rm -rf /var/lib/pylon /var/lib/private/pylon-backend /var/lib/pylon-backend /run/pylon
    rm -f /etc/pylon/device.key /etc/pylon/broker.password /var/lib/mosquitto/dynsec.json
    rmdir /etc/pylon 2>/dev/null || true
    if getent passwd pylon >/dev/null; then deluser --system --quiet pylon >/dev/null 2>&1 || userdel pylon || true; fi
    if getent group pylon >/dev/null; then delgroup --system --quiet pylon >/dev/null 2>&1 || groupdel pylon || true; fi
fi
exit 0
SCRIPT
chmod 755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"
find "$stage" -type d -exec chmod 755 {} +
dpkg-deb --root-owner-group --build "$stage" "$out" >/dev/null
echo "built $out"
dpkg-deb --field "$out" Depends
