# Pylon — build, run and test. Works as root on a fresh Debian 12 machine with the Swift toolchain:
# every target first installs the Debian packages it needs (`make deps`).
SHELL := /bin/bash
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
DEB_PACKAGES := pkg-config libuv1-dev libjson-c-dev libcurl4-openssl-dev libsqlite3-dev libhttp-parser-dev zlib1g-dev socat python3 mosquitto libmosquitto-dev libpcre2-dev libplist-dev libsystemd-dev python3-pip curl \
	libpq-dev postgresql-15 libnats-dev nats-server haproxy lintian
# The broker cluster: libcrypto (ed25519 for the devices' NATS JWTs) and the openssl CLI (tools/pylon-nats-auth).
DEB_PACKAGES += libssl-dev openssl
# promtool (Debian's prometheus) checks the metrics exporter's output in the tests.
DEB_PACKAGES += prometheus
# The mosquitto auth plugin (tools/mosquitto-auth): the broker's v5 plugin API headers.
DEB_PACKAGES += mosquitto-dev
# nft drops a test database's packets (PostgresBlackholeTests).
DEB_PACKAGES += nftables
# The console's browser tests (make test-console): Debian's headless Chromium and its driver.
DEB_PACKAGES += chromium chromium-driver
RUN_DIR ?= $(CURDIR)/run
# Always this run directory's socket: a PYLON_SOCKET exported for an earlier `make run` must not
# point a second one (another RUN_DIR) at the first one's socket.
export PYLON_SOCKET := $(RUN_DIR)/pylon.sock

.PHONY: all deps pydeps build mosquitto-auth release run test test-unit test-install test-run test-deb test-python test-console install install-files install-device-files install-backend-files deb bench clean format format-check anchors fuzz fuzz-build test-asan soak

all: build

## Install missing Debian packages (needs root; a no-op when all are present).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps mosquitto-auth
	$(SWIFT) build

## The broker plugin that checks the devices' signed credentials (docs/FLEET.md): .build/pylon_auth.so
mosquitto-auth: deps
	@mkdir -p .build && $(MAKE) -s --no-print-directory -C tools/mosquitto-auth OUT=$(CURDIR)/.build/pylon_auth.so

## The Swift runtime and libstdc++ (its C++) linked statically: tools/static-libstdc++ is a linker
## script that sends the runtime's -lstdc++ to libstdc++.a, and the last -l:libstdc++.a resolves
## what the runtime's archives need after it. No process maps libstdc++.so.6 (docs/BENCHMARKS.md,
## "Footprint").
release: deps
	$(SWIFT) build -c release --static-swift-stdlib \
	  -Xlinker -L$(CURDIR)/tools/static-libstdc++ -Xlinker -l:libstdc++.a

BACKEND_LISTEN ?= 127.0.0.1:8780
MQTT_LISTEN ?= 127.0.0.1:1883

## Start the MQTT broker (MQTT_LISTEN), the reference backend (BACKEND_LISTEN, serving the operator
## console from clients/console at its root) and the host with every plugin, wired to them. The
## configuration is CONFIG (default: the tracked etc/pylon.json): every
## backend URL (http://127.0.0.1:8780), the broker port (1883) and /etc/pylon/device.key in it are
## rewritten to this run's into $(RUN_DIR)/pylon.json at each start (the file pylond reads and
## `pylonctl reload` re-reads), so a second `make run RUN_DIR=... BACKEND_LISTEN=... MQTT_LISTEN=...`
## is fully separate from the first, and a plugin added to your own CONFIG stays. Both ports are
## checked free first. $(RUN_DIR)/env is written for other terminals: `. run/env` sets
## PYLON_SOCKET, PATH, BACKEND and OP (the operator API's Authorization header). Everything stops
## with its session: Ctrl-C, or closing the terminal (SIGHUP, which pylond alone would take as
## "reload"), stops pylond, backend and broker.
## RUN_GROUP=GROUP lets that group's members (users who are not admins) reach the socket: RUN_DIR
## is then 0750 with that group, and pylond's socket 0660 with socketGroup GROUP. Default: RUN_DIR
## 0700, for the user who ran make run only.
CONFIG ?= etc/pylon.json
RUN_GROUP ?=
MQTT_PORT = $(lastword $(subst :, ,$(MQTT_LISTEN)))
run: build
	@test -r "$(CONFIG)" || { echo "make run: CONFIG=$(CONFIG) is not a readable file" >&2; exit 2; }
	@for l in $(BACKEND_LISTEN) $(MQTT_LISTEN); do python3 -c 'import socket,sys; h,p=sys.argv[1].rsplit(":",1); s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind((h,int(p)))' $$l 2>/dev/null \
	  || { echo "make run: $$l is in use (another 'make run'?); choose others: make run BACKEND_LISTEN=127.0.0.1:8790 MQTT_LISTEN=127.0.0.1:1884 RUN_DIR=..." >&2; exit 1; }; done
	@if [ -n "$(RUN_GROUP)" ]; then install -d -m 750 -g "$(RUN_GROUP)" $(RUN_DIR); else install -d -m 700 $(RUN_DIR); fi
	@install -d -m 700 $(RUN_DIR)/state
	@# Secrets (mode 0600, kept across runs): the operator token, the enrolment secret every plugin
	@# presents (credentialFile) and the backend's broker password; the broker's dynsec file.
	@umask 077; for f in operator.token device.key broker.password; do [ -s $(RUN_DIR)/$$f ] \
	  || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > $(RUN_DIR)/$$f; chmod 600 $(RUN_DIR)/$$f; done
	@[ -s $(RUN_DIR)/dynsec.json ] || tools/pylon-dynsec-init $(RUN_DIR)/dynsec.json pylon-backend $(RUN_DIR)/broker.password
	@sed -e 's|http://127.0.0.1:8780|http://$(BACKEND_LISTEN)|g' -e 's|"port": *1883\b|"port": $(MQTT_PORT)|g' \
	  -e 's|/etc/pylon/device.key|$(RUN_DIR)/device.key|g' "$(CONFIG)" > $(RUN_DIR)/pylon.json
	@[ -z "$(RUN_GROUP)" ] || python3 -c 'import json,sys; p,g=sys.argv[1:]; c=json.load(open(p)); c.update(socketGroup=g, socketMode="0660"); json.dump(c,open(p,"w"),indent=1)' $(RUN_DIR)/pylon.json "$(RUN_GROUP)"
	@printf '%s\n' "# Written by make run ($(CONFIG)): in another terminal, . $(RUN_DIR)/env" \
	  "export PYLON_SOCKET='$(PYLON_SOCKET)'" "export PATH='$(CURDIR)/.build/debug':\"\$$PATH\"" \
	  "BACKEND='http://$(BACKEND_LISTEN)'" "MQTT_LISTEN='$(MQTT_LISTEN)'" \
	  "OP=\"Authorization: Bearer \$$(cat '$(RUN_DIR)/operator.token')\"" > $(RUN_DIR)/env
	@sed -e 's|^listener 1883 127.0.0.1|listener $(MQTT_PORT) 127.0.0.1|' -e 's|^plugin_opt_config_file .*|plugin_opt_config_file $(RUN_DIR)/dynsec.json|' \
	  -e "s|^plugin /usr/lib/.*|plugin $$(ls /usr/lib/*/mosquitto_dynamic_security.so | head -n1)|" etc/mosquitto.conf > $(RUN_DIR)/mosquitto.conf
	@(cd $(RUN_DIR) && exec mosquitto -c $(RUN_DIR)/mosquitto.conf 2>>$(RUN_DIR)/mosquitto.log) & broker=$$!; \
	.build/debug/pylon-backend --listen $(BACKEND_LISTEN) --db $(RUN_DIR)/backend.db --mqtt $(MQTT_LISTEN) \
	  --operator-token-file $(RUN_DIR)/operator.token --enrol-secret-file $(RUN_DIR)/device.key \
	  --mqtt-username pylon-backend --mqtt-password-file $(RUN_DIR)/broker.password --mqtt-dynsec \
	  --console-dir $(CURDIR)/clients/console > $(RUN_DIR)/backend.out & backend=$$!; \
	trap 'kill $$backend $$broker 2>/dev/null' EXIT INT TERM HUP; \
	for i in $$(seq 50); do grep -q listening $(RUN_DIR)/backend.out 2>/dev/null && break; \
	  kill -0 $$backend 2>/dev/null || break; sleep 0.1; done; \
	if ! grep -q listening $(RUN_DIR)/backend.out 2>/dev/null; then \
	  echo "make run: pylon-backend could not listen on $(BACKEND_LISTEN) (in use by another 'make run'?); choose another: make run BACKEND_LISTEN=127.0.0.1:8790 MQTT_LISTEN=127.0.0.1:1884 RUN_DIR=..." >&2; exit 1; fi; \
	kill -0 $$broker 2>/dev/null || { echo "make run: mosquitto could not start on $(MQTT_LISTEN) (see $(RUN_DIR)/mosquitto.log)" >&2; exit 1; }; \
	echo "mosquitto: $(MQTT_LISTEN)   pylon-backend: http://$(BACKEND_LISTEN)   pylond: socket $(PYLON_SOCKET)   config: $(CONFIG)"; \
	echo "console: http://$(BACKEND_LISTEN)/   (log in with an operator account, or the operator token in $(RUN_DIR)/operator.token)"; \
	echo "use: . $(RUN_DIR)/env   (PYLON_SOCKET, PATH, BACKEND, OP)   then: pylonctl status"; \
	echo "operator API (token in $(RUN_DIR)/operator.token, mode 0600):"; \
	echo "  curl -H \"\$$OP\" \$$BACKEND/v1/inspect/stats"; \
	PYLON_STATE_DIR=$(RUN_DIR)/state .build/debug/pylond --config $(RUN_DIR)/pylon.json & pylond=$$!; \
	trap 'kill $$pylond $$backend $$broker 2>/dev/null; wait $$pylond 2>/dev/null' EXIT INT TERM HUP; \
	wait $$pylond

## pytest and mypy for the Python client tests, selenium for the console's browser tests (pip;
## Debian's python3 needs --break-system-packages).
pydeps: deps
	@for m in pytest mypy selenium; do python3 -c "import $$m" 2>/dev/null || python3 -m pip install -q $$m 2>/dev/null \
	  || python3 -m pip install -q --break-system-packages $$m; done

## Every test: unit and integration tests against the real host and plugins, the Python client
## against the real host, and the installed tree (DESTDIR) end to end. The .deb test (each package
## installed, checked, removed and purged in a throw-away overlay of this machine) is `make test-deb`. Measured on 2 cores: release build
## 1-3 min, the deb test 20 s (the rest of `make test` ~2 min), so `make test` runs it too when it
## can (root, dpkg, pylon not installed); PYLON_TEST_DEB=0 skips it. Randomised property tests draw
## all their inputs here (PYLON_PROPERTY_RUNS=full), a quarter of them in test-unit and test-asan.
test: build pydeps
	PYLON_PROPERTY_RUNS=full $(SWIFT) test --no-parallel
	$(MAKE) --no-print-directory test-python test-console test-install test-run fleet-test
	@if [ "$(PYLON_TEST_DEB)" != 0 ] && [ "$$(id -u)" = 0 ] && command -v dpkg-deb >/dev/null \
	    && ! dpkg -s pylon >/dev/null 2>&1; then $(MAKE) --no-print-directory test-deb; \
	else echo "make test: .deb test skipped (not root, no dpkg, pylon installed, or PYLON_TEST_DEB=0)"; fi

## The inner loop: every test that starts no process (no pylond, plugin, backend, broker or
## database), in parallel, under 10 s after a build. The process suites (IntegrationTests and the
## backend binary's suites in BackendTests) are `make test`'s. A suite added to BackendTests that
## starts no process belongs in UNIT_SUITES.
UNIT_TARGETS := PylonCoreTests PylonProtocolTests PylonHostTests UploaderTests MATests PushTests TagEngineTests FleetTests StoreLogTests
UNIT_SUITES := BackendTests.BatchReaderTests BackendTests.BrokerClusterOptionsTests BackendTests.ConsoleUnitTests BackendTests.AutomationUnitTests BackendTests.AutomationStepsTests BackendTests.AutomationTimeZoneTests BackendTests.FreePortTests BackendTests.GroupCommitTests
## UNIT_TMPDIR: where their temporary files go (a tmpfs: the store tests check logic, not the disk).
UNIT_TMPDIR ?= $(shell test -w /dev/shm && echo /dev/shm || echo /tmp)
test-unit: deps
	TMPDIR=$(UNIT_TMPDIR) $(SWIFT) test --parallel $(foreach t,$(UNIT_TARGETS),--filter '^$(t)\.') $(foreach s,$(UNIT_SUITES),--filter '^$(s)/')

test-python: build pydeps
	cd clients/python && PYLON_BUILD_DIR=$(CURDIR)/.build/debug PYTHONPATH=$(CURDIR)/clients/python/src \
	  python3 -m pytest -q -p no:cacheprovider tests

## The operator console (clients/console) in Debian's headless Chromium, driven by Selenium with
## /usr/bin/chromedriver (nothing downloaded), against a real backend, mosquitto and pylond on free
## ports. Screenshots of the main pages go to docs/console (PYLON_CONSOLE_SCREENSHOTS= for none).
test-console: build pydeps
	cd Tests/console && PYLON_BUILD_DIR=$(CURDIR)/.build/debug SE_OFFLINE=true \
	  python3 -m pytest -q -p no:cacheprovider .

## `make run` on free loopback ports in a session of its own: a hang-up stops pylond, the backend
## and the broker, and it starts again on the same RUN_DIR; Ctrl-C stops it.
test-run: build
	Tests/install/run-test.sh
	Tests/install/readme-test.sh

## Installs the debug build into a temporary DESTDIR and runs the installed tree end to end.
test-install: build
	Tests/install/install-test.sh $(CURDIR)/.build/debug

## Builds the three .debs, lintian on each, then installs them in throw-away copies of this
## machine (an overlay of / in a private mount and network namespace, nothing written to the
## real /usr, /etc or users): the device package where mosquitto is removed first, pylon-backend
## with the packaged push path end to end; dpkg -r / -P leave nothing behind. Needs root.
test-deb: deb
	Tests/install/deb-test.sh $(DEB_DIR) $(VERSION) $(DEB_ARCH)

# ---- Installation -----------------------------------------------------------------------------
VERSION := 0.1.0
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
BINDIR = $(PREFIX)/bin
PYLONLIBDIR = $(PREFIX)/lib/pylon
PLUGINDIR = $(PYLONLIBDIR)/plugins
MANDIR = $(PREFIX)/share/man
UNITDIR ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
SYSUSERSDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/sysusers.d,$(PREFIX)/lib/sysusers.d)
BASHCOMPDIR = $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR = $(PREFIX)/share/zsh/vendor-completions
BACKENDDOCDIR = $(PREFIX)/share/doc/pylon-backend
## The mosquitto auth plugin (make mosquitto-auth) and where it is installed.
BACKENDLIBDIR = $(PREFIX)/lib/pylon-backend
AUTH_SO ?= .build/pylon_auth.so
FLEET_TOOLS := pylon-nats-auth pylon-nats-cluster pylon-stream-consumer
## The operator console's static files (pylon-backend --console-dir).
CONSOLEDIR = $(PREFIX)/share/pylon/console
## Where the installed configuration sends uploads and MA calls.
BACKEND_URL ?= http://127.0.0.1:8780
## Binaries to install (the release build by default).
BIN_SRC ?= .build/release

## Release build, then install-files. DESTDIR= (empty) and root also create the pylon and
## pylon-backend users.
install: release mosquitto-auth install-files
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then \
	  systemd-sysusers $(SYSUSERSDIR)/pylon.conf $(SYSUSERSDIR)/pylon-backend.conf; fi

## Both halves: what a device runs and what a server runs. The .debs split them the same way
## (tools/mkdeb.sh: pylon, pylon-backend, python3-pylon).
install-files: install-device-files install-backend-files

## The device: pylond, its plugins, pylonctl, their unit, configuration and manuals.
install-device-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(SYSCONFDIR)/pylon $(DESTDIR)$(UNITDIR) \
	  $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
	  $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	install -m 755 $(BIN_SRC)/pylonctl $(DESTDIR)$(BINDIR)/
	@# The device's programs are one multi-call executable (Sources/pylon): pylond and the four
	@# plugins are relative links to it, so they share its code pages and one Swift runtime.
	install -m 755 $(BIN_SRC)/pylon $(DESTDIR)$(PYLONLIBDIR)/pylon
	ln -sfr $(DESTDIR)$(PYLONLIBDIR)/pylon $(DESTDIR)$(BINDIR)/pylond
	for p in pylon-uploader pylon-ma pylon-push pylon-gtm; do ln -sfr $(DESTDIR)$(PYLONLIBDIR)/pylon $(DESTDIR)$(PLUGINDIR)/$$p; done
	install -d $(DESTDIR)$(SYSCONFDIR)/pylon/gtm
	install -m 644 etc/gtm/* $(DESTDIR)$(SYSCONFDIR)/pylon/gtm/
	sed -e 's|@BACKEND_URL@|$(BACKEND_URL)|g' -e 's|@PLUGINDIR@|$(PLUGINDIR)|g' etc/pylon.prod.json > $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json.dist
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json ]; then \
	  echo "kept $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; the shipped one is pylon.json.dist"; \
	else mv $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json.dist $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; \
	  chmod 640 $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; \
	  if [ -z "$(DESTDIR)" ] && getent group pylon >/dev/null; then chgrp pylon $(SYSCONFDIR)/pylon/pylon.json; fi; fi
	sed -e 's|/usr/local/bin/|$(BINDIR)/|' etc/pylond.service > $(DESTDIR)$(UNITDIR)/pylond.service
	chmod 644 $(DESTDIR)$(UNITDIR)/pylond.service
	install -m 644 etc/pylon.sysusers $(DESTDIR)$(SYSUSERSDIR)/pylon.conf
	gzip -9n < docs/man/pylonctl.1 > $(DESTDIR)$(MANDIR)/man1/pylonctl.1.gz
	gzip -9n < docs/man/pylon.json.5 > $(DESTDIR)$(MANDIR)/man5/pylon.json.5.gz
	gzip -9n < docs/man/pylond.8 > $(DESTDIR)$(MANDIR)/man8/pylond.8.gz
	install -m 644 etc/completion/pylonctl.bash $(DESTDIR)$(BASHCOMPDIR)/pylonctl
	install -m 644 etc/completion/_pylonctl $(DESTDIR)$(ZSHCOMPDIR)/_pylonctl

## The server: pylon-backend and its console, the fleet tools, the template unit for N instances
## with main.env, the mosquitto auth plugin with an example conf.d snippet (mosquitto's own
## files are left alone) and a drop-in raising mosquitto's descriptor limit.
install-backend-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(BACKENDLIBDIR) $(DESTDIR)$(SYSCONFDIR)/pylon-backend $(DESTDIR)$(UNITDIR) \
	  $(DESTDIR)$(UNITDIR)/mosquitto.service.d $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8 \
	  $(DESTDIR)$(BACKENDDOCDIR)/examples
	install -m 755 $(BIN_SRC)/pylon-backend $(DESTDIR)$(BINDIR)/
	@# The fleet tools docs/FLEET.md names (Python 3, standard library and the openssl CLI).
	for t in $(FLEET_TOOLS); do sed '1s|^#!/usr/bin/env python3|#!/usr/bin/python3|' tools/$$t > $(DESTDIR)$(BINDIR)/$$t; \
	  chmod 755 $(DESTDIR)$(BINDIR)/$$t; gzip -9n < tools/deb/man/$$t.1 > $(DESTDIR)$(MANDIR)/man1/$$t.1.gz; done
	install -m 644 $(AUTH_SO) $(DESTDIR)$(BACKENDLIBDIR)/pylon_auth.so
	@[ -e $(DESTDIR)$(SYSCONFDIR)/pylon-backend/main.env ] && echo "kept $(DESTDIR)$(SYSCONFDIR)/pylon-backend/main.env" \
	  || install -m 644 etc/pylon-backend/main.env $(DESTDIR)$(SYSCONFDIR)/pylon-backend/main.env
	@[ -e $(DESTDIR)$(SYSCONFDIR)/pylon-backend/revoked ] || install -m 644 etc/pylon-backend/revoked $(DESTDIR)$(SYSCONFDIR)/pylon-backend/revoked
	sed -e 's|/usr/local/bin/|$(BINDIR)/|' -e 's|/usr/local/share/pylon/console|$(CONSOLEDIR)|' \
	  etc/systemd/pylon-backend@.service > $(DESTDIR)$(UNITDIR)/pylon-backend@.service
	chmod 644 $(DESTDIR)$(UNITDIR)/pylon-backend@.service
	install -m 644 etc/systemd/mosquitto-nofile.conf $(DESTDIR)$(UNITDIR)/mosquitto.service.d/pylon-backend-nofile.conf
	install -m 644 etc/pylon-backend.sysusers $(DESTDIR)$(SYSUSERSDIR)/pylon-backend.conf
	sed 's|^plugin /usr/lib/pylon-backend/|plugin $(BACKENDLIBDIR)/|' etc/mosquitto/pylon-auth.conf \
	  > $(DESTDIR)$(BACKENDDOCDIR)/examples/mosquitto-pylon-auth.conf
	gzip -9n < docs/man/pylon-backend.8 > $(DESTDIR)$(MANDIR)/man8/pylon-backend.8.gz
	install -d $(DESTDIR)$(CONSOLEDIR)/css $(DESTDIR)$(CONSOLEDIR)/js/pages
	install -m 644 clients/console/index.html $(DESTDIR)$(CONSOLEDIR)/
	install -m 644 clients/console/css/*.css $(DESTDIR)$(CONSOLEDIR)/css/
	install -m 644 clients/console/js/*.js $(DESTDIR)$(CONSOLEDIR)/js/
	install -m 644 clients/console/js/pages/*.js $(DESTDIR)$(CONSOLEDIR)/js/pages/

## Three Debian packages (dpkg-deb) of the release build in .build/deb: pylon (devices: no broker,
## no libpq, no libnats), pylon-backend (servers) and python3-pylon (the client). docs/INSTALL.md.
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_DIR := $(CURDIR)/.build/deb
deb: release
	tools/mkdeb.sh $(VERSION) $(DEB_ARCH) $(DEB_DIR)

## Release-mode benchmarks (numbers go to docs/BENCHMARKS.md; the latest to the README).
bench: release
	.build/release/pylon-bench bus
	.build/release/pylon-bench uploader
	.build/release/pylon-bench uploader --fsync full
	.build/release/pylon-bench ma
	.build/release/pylon-bench push
	.build/release/pylon-bench gtm

## Hardening (docs/HARDENING.md). None of these take /tmp/pylon-build.lock themselves: on a
## shared machine run them as `flock /tmp/pylon-build.lock make fuzz` (and so on).

FUZZ_TARGETS ?= message manifest backend-http ma uploader segment
FUZZ_SECONDS ?= 60

## libFuzzer targets (Fuzz/): built with -sanitize=fuzzer,address in .build-fuzz, then each runs
## FUZZ_SECONDS from its seed corpus (Fuzz/corpus/<target>); prints executions and findings.
fuzz-build: deps
	@for t in $(FUZZ_TARGETS); do \
	  $(SWIFT) build -c release --scratch-path .build-fuzz --product fuzz-$$t \
	    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING || exit 1; \
	done

fuzz: fuzz-build
	FUZZ_TARGETS="$(FUZZ_TARGETS)" FUZZ_SECONDS=$(FUZZ_SECONDS) tools/fuzz.sh

## Unit and integration tests under AddressSanitizer, in their own build directory; the
## integration tests run the sanitized pylond, plugins and backend. (swiftc 6.3 refuses
## -sanitize=undefined for x86_64 Linux; Swift's own checks trap on overflow and bounds.)
ASAN_BUILD ?= .build-asan
ASAN_FLAGS := --scratch-path $(ASAN_BUILD) --sanitize=address
## Skipped: the one test that asserts a process's RSS (ASan's quarantine and shadow memory add
## hundreds of MB; `make test` runs it). Every sanitized process (tests, pylond, plugins, backend) writes its report to
## $(ASAN_BUILD)/reports/asan.PID, so one from a child process is not lost in a test's temp dir.
test-asan: deps
	$(SWIFT) build --build-tests $(ASAN_FLAGS)
	@rm -rf $(ASAN_BUILD)/reports && mkdir -p $(ASAN_BUILD)/reports
	PYLON_BIN_DIR=$(CURDIR)/$(ASAN_BUILD)/debug SWIFT_BACKTRACE=enable=no \
	ASAN_OPTIONS=detect_leaks=0:log_path=$(CURDIR)/$(ASAN_BUILD)/reports/asan \
	  $(SWIFT) test --skip-build $(ASAN_FLAGS) --no-parallel --skip pipeliningWithoutReadingKeepsMemoryBounded --skip oneUidsBatchFloodNeitherStallsNorBloatsTheHost
	@if ls $(ASAN_BUILD)/reports/asan.* >/dev/null 2>&1; then \
	  echo "AddressSanitizer reports:"; head -50 $(ASAN_BUILD)/reports/asan.*; exit 1; \
	else echo "test-asan: no AddressSanitizer report"; fi

## Chaos soak (loopback only, bounded): release build, mosquitto + backend + pylond (uploader, MA,
## push, gtm) with make run's credentials, load while every process is killed with kill -9; fails if
## an acknowledged record, push send or tag-manager hit is lost or stored twice.
SOAK_SECONDS ?= 120
soak: release
	python3 tools/soak.py --bin-dir .build/release --seconds $(SOAK_SECONDS)

# ---- Fleet (docs/FLEET.md) ------------------------------------------------------------------------
.PHONY: fleet fleet-test
FLEET_DEVICES ?= 1000
FLEET_RATE ?= 1
FLEET_DURATION ?= 120
FLEET_BACKENDS ?= 2
FLEET_PYLONDS ?= 2
## FLEET_FAULTS=1: kill -9 a broker node and a backend, restart PostgreSQL during the load.
FLEET_FAULTS ?=
## The push broker: auto (mosquitto with the pylon_auth plugin), dynsec (mosquitto with dynamic
## security) or nats (three nats-server MQTT nodes, JWT auth).
FLEET_BROKER ?= auto
## More pylon-fleet options (pylon-fleet --help), e.g. FLEET_ARGS="--push-every 2 --ramp 500".
FLEET_ARGS ?=

## Release build, then the server side (PostgreSQL, three nats-server nodes, mosquitto with
## pylon_auth, FLEET_BACKENDS pylon-backend instances behind haproxy, or the embedded default where
## a piece is missing), FLEET_PYLONDS real pylond instances and one pylon-fleet process per 5,000 of
## FLEET_DEVICES devices. Progress on stderr, the merged JSON summary on stdout; everything stops
## at the end and on Ctrl-C. The 10,000-device run: make fleet FLEET_DEVICES=10000 (docs/FLEET.md).
fleet: deps mosquitto-auth
	@# Only the summary on stdout: the build's output goes to stderr with the progress.
	@$(SWIFT) build -c release >&2
	@python3 tools/fleet/fleet.py --bin-dir $(CURDIR)/.build/release --devices $(FLEET_DEVICES) --rate $(FLEET_RATE) \
	  --duration $(FLEET_DURATION) --backends $(FLEET_BACKENDS) --pylonds $(FLEET_PYLONDS) $(if $(FLEET_FAULTS),--faults) \
	  --broker $(FLEET_BROKER) -- $(FLEET_ARGS)

## The fleet's smoke test (debug build, about a minute): 50 devices x 5 events/s for 30 s with the
## three faults, one pylond; fails on any acknowledged event lost or stored twice, a push lost or
## delivered twice. First the unit tests of how several simulator processes' summaries merge.
fleet-test: build
	python3 tools/fleet/test_fleet_merge.py
	python3 tools/fleet/fleet.py --bin-dir $(CURDIR)/.build/debug --devices 50 --rate 5 --duration 30 --pylonds 1 --faults \
	  -- --push-every 1 --broadcast-every 5 --progress 5 --drain-timeout 90 >/dev/null

## The comparison harness (docs/BENCHMARKS.md), kept outside this repository: ANCHORS=/path/to/it.
anchors:
	@test -n "$(ANCHORS)" && test -x "$(ANCHORS)/run.sh" || \
	  { echo "make anchors: set ANCHORS to the harness directory (docs/BENCHMARKS.md)" >&2; exit 2; }
	PYLON_BIN=$${PYLON_BIN:-$(CURDIR)/.build/release} "$(ANCHORS)/run.sh"

## Code style: `.swift-format` (4-space indent, 140 columns, the house rules). `make format`
## rewrites in place; `make format-check` (run by CI) fails on any difference.
SWIFT_FORMAT_PATHS = Package.swift Sources Plugins Tests Benchmarks Fuzz
format:
	$(SWIFT) format --in-place --recursive --parallel $(SWIFT_FORMAT_PATHS)

format-check:
	$(SWIFT) format lint --strict --recursive --parallel $(SWIFT_FORMAT_PATHS)

clean:
	rm -rf .build .build-fuzz .build-asan .fuzz-work $(RUN_DIR)
