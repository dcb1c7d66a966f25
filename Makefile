# Pylon — build, run and test. Works as root on a fresh Debian 12 machine with the Swift toolchain:
# every target first installs the Debian packages it needs (`make deps`).
SHELL := /bin/bash
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
DEB_PACKAGES := pkg-config libuv1-dev libjson-c-dev libcurl4-openssl-dev libsqlite3-dev libhttp-parser-dev zlib1g-dev socat python3 libsystemd-dev python3-pip curl
RUN_DIR ?= $(CURDIR)/run
export PYLON_SOCKET ?= $(RUN_DIR)/pylon.sock

.PHONY: all deps pydeps build release run test test-install test-deb test-python install install-files deb bench clean format-check

all: build

## Install missing Debian packages (needs root; a no-op when all are present).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --static-swift-stdlib

BACKEND_LISTEN ?= 127.0.0.1:8780

## Start the reference backend on BACKEND_LISTEN and the host with every plugin, wired to it. Every
## backend URL in etc/pylon.json is rewritten to BACKEND_LISTEN (into $(RUN_DIR)/pylon.json), so a
## second `make run RUN_DIR=... BACKEND_LISTEN=...` is fully separate from the first.
run: build
	@install -d -m 700 $(RUN_DIR) $(RUN_DIR)/state
	@sed 's|http://127.0.0.1:8780|http://$(BACKEND_LISTEN)|g' etc/pylon.json > $(RUN_DIR)/pylon.json
	@.build/debug/pylon-backend --listen $(BACKEND_LISTEN) --db $(RUN_DIR)/backend.db > $(RUN_DIR)/backend.out & backend=$$!; \
	trap 'kill $$backend 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq 50); do grep -q listening $(RUN_DIR)/backend.out 2>/dev/null && break; \
	  kill -0 $$backend 2>/dev/null || break; sleep 0.1; done; \
	if ! grep -q listening $(RUN_DIR)/backend.out 2>/dev/null; then \
	  echo "make run: pylon-backend could not listen on $(BACKEND_LISTEN) (in use by another 'make run'?); choose another: make run BACKEND_LISTEN=127.0.0.1:8790 RUN_DIR=..." >&2; exit 1; fi; \
	echo "pylon-backend: http://$(BACKEND_LISTEN)   pylond: socket $(PYLON_SOCKET)"; \
	echo "use: export PYLON_SOCKET=$(PYLON_SOCKET) PATH=$(CURDIR)/.build/debug:\$$PATH   then: pylonctl status"; \
	PYLON_STATE_DIR=$(RUN_DIR)/state .build/debug/pylond --config $(RUN_DIR)/pylon.json

## pytest for the Python client tests (pip, as the issue asks; Debian's python3 needs --break-system-packages).
pydeps: deps
	@python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest 2>/dev/null \
	  || python3 -m pip install -q --break-system-packages pytest

## Every test: unit and integration tests against the real host and plugins, the Python client
## against the real host, and the installed tree (DESTDIR) end to end. The .deb test (install,
## check, remove, purge on this machine) is `make test-deb`. Measured on 2 cores: release build
## 1-3 min, the deb test 20 s (the rest of `make test` ~2 min), so `make test` runs it too when it
## can (root, dpkg, pylon not installed); PYLON_TEST_DEB=0 skips it.
test: build pydeps
	$(SWIFT) test --no-parallel
	$(MAKE) --no-print-directory test-python test-install
	@if [ "$(PYLON_TEST_DEB)" != 0 ] && [ "$$(id -u)" = 0 ] && command -v dpkg-deb >/dev/null \
	    && ! dpkg -s pylon >/dev/null 2>&1; then $(MAKE) --no-print-directory test-deb; \
	else echo "make test: .deb test skipped (not root, no dpkg, pylon installed, or PYLON_TEST_DEB=0)"; fi

test-python: build pydeps
	cd clients/python && PYLON_BUILD_DIR=$(CURDIR)/.build/debug PYTHONPATH=$(CURDIR)/clients/python/src \
	  python3 -m pytest -q -p no:cacheprovider tests

## Installs the debug build into a temporary DESTDIR and runs the installed tree end to end.
test-install: build
	Tests/install/install-test.sh $(CURDIR)/.build/debug

## Builds the .deb, dpkg -i, pylond --check-config, runs the installed service, dpkg -r / -P, and
## checks nothing is left behind. Needs root; changes this machine's /usr, /etc and users.
test-deb: deb
	Tests/install/deb-test.sh $(DEB_FILE)

# ---- Installation -----------------------------------------------------------------------------
VERSION := 0.1.0
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
BINDIR = $(PREFIX)/bin
PLUGINDIR = $(PREFIX)/lib/pylon/plugins
MANDIR = $(PREFIX)/share/man
UNITDIR ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
SYSUSERSDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/sysusers.d,$(PREFIX)/lib/sysusers.d)
BASHCOMPDIR = $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR = $(PREFIX)/share/zsh/vendor-completions
DOCDIR = $(PREFIX)/share/doc/pylon
## Where the installed configuration sends uploads and MA calls.
BACKEND_URL ?= http://127.0.0.1:8780
## Binaries to install (the release build by default).
BIN_SRC ?= .build/release

## Release build, then install-files. DESTDIR= (empty) and root also create the pylon user.
install: release install-files
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then \
	  systemd-sysusers $(SYSUSERSDIR)/pylon.conf; fi

install-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(SYSCONFDIR)/pylon $(DESTDIR)$(UNITDIR) \
	  $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
	  $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(DOCDIR)/examples
	install -m 755 $(BIN_SRC)/pylond $(BIN_SRC)/pylonctl $(BIN_SRC)/pylon-backend $(DESTDIR)$(BINDIR)/
	install -m 755 $(BIN_SRC)/pylon-uploader $(BIN_SRC)/pylon-ma $(DESTDIR)$(PLUGINDIR)/
	sed -e 's|@BACKEND_URL@|$(BACKEND_URL)|g' -e 's|@PLUGINDIR@|$(PLUGINDIR)|g' etc/pylon.prod.json > $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json.dist
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json ]; then \
	  echo "kept $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; the shipped one is pylon.json.dist"; \
	else mv $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json.dist $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; \
	  chmod 644 $(DESTDIR)$(SYSCONFDIR)/pylon/pylon.json; fi
	for u in pylond pylon-backend; do \
	  sed 's|/usr/local/bin/|$(BINDIR)/|' etc/$$u.service > $(DESTDIR)$(UNITDIR)/$$u.service; \
	  chmod 644 $(DESTDIR)$(UNITDIR)/$$u.service; done
	install -m 644 etc/pylon.sysusers $(DESTDIR)$(SYSUSERSDIR)/pylon.conf
	install -m 644 etc/mosquitto/pylon-push.conf $(DESTDIR)$(DOCDIR)/examples/mosquitto-pylon-push.conf
	gzip -9n < docs/man/pylonctl.1 > $(DESTDIR)$(MANDIR)/man1/pylonctl.1.gz
	gzip -9n < docs/man/pylon.json.5 > $(DESTDIR)$(MANDIR)/man5/pylon.json.5.gz
	gzip -9n < docs/man/pylond.8 > $(DESTDIR)$(MANDIR)/man8/pylond.8.gz
	install -m 644 etc/completion/pylonctl.bash $(DESTDIR)$(BASHCOMPDIR)/pylonctl
	install -m 644 etc/completion/_pylonctl $(DESTDIR)$(ZSHCOMPDIR)/_pylonctl

## A Debian package (dpkg-deb) of the release build: pylon_$(VERSION)_<arch>.deb in .build/deb.
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_FILE := $(CURDIR)/.build/deb/pylon_$(VERSION)_$(DEB_ARCH).deb
deb: release
	tools/mkdeb.sh $(VERSION) $(DEB_ARCH) $(DEB_FILE)

## Release-mode benchmarks (numbers go to README.md).
bench: release
	.build/release/pylon-bench bus
	.build/release/pylon-bench uploader
	.build/release/pylon-bench uploader --fsync full
	.build/release/pylon-bench ma

clean:
	rm -rf .build $(RUN_DIR)
