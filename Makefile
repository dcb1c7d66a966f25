# Pylon — build, run and test. Works as root on a fresh Debian 12 machine with the Swift toolchain:
# every target first installs the Debian packages it needs (`make deps`).
SHELL := /bin/bash
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
DEB_PACKAGES := pkg-config libuv1-dev libjson-c-dev libcurl4-openssl-dev libsqlite3-dev libhttp-parser-dev zlib1g-dev socat python3 mosquitto libmosquitto-dev libpcre2-dev libplist-dev
RUN_DIR ?= $(CURDIR)/run
export PYLON_SOCKET ?= $(RUN_DIR)/pylon.sock

.PHONY: all deps build release run test bench clean format-check fuzz fuzz-build test-asan soak

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
MQTT_LISTEN ?= 127.0.0.1:1883

## Start the MQTT broker and the reference backend on loopback and the host with every plugin, wired to them.
run: build
	@install -d -m 700 $(RUN_DIR) $(RUN_DIR)/state
	@echo "mosquitto: $(MQTT_LISTEN)   pylon-backend: http://$(BACKEND_LISTEN)   pylond: socket $(PYLON_SOCKET)"
	@echo "try: socat - UNIX-CONNECT:$(PYLON_SOCKET)   or: PYLON_SOCKET=$(PYLON_SOCKET) .build/debug/pylonctl status"
	@(cd $(RUN_DIR) && exec mosquitto -c $(CURDIR)/etc/mosquitto.conf 2>>$(RUN_DIR)/mosquitto.log) & broker=$$!; \
	.build/debug/pylon-backend --listen $(BACKEND_LISTEN) --db $(RUN_DIR)/backend.db --mqtt $(MQTT_LISTEN) & backend=$$!; \
	trap 'kill $$backend $$broker 2>/dev/null' EXIT INT TERM; \
	PYLON_STATE_DIR=$(RUN_DIR)/state .build/debug/pylond --config etc/pylon.json

## Every test: unit tests and integration tests that start the real host and plugins.
test: build
	$(SWIFT) test --no-parallel

## Release-mode benchmarks (numbers go to README.md).
bench: release
	.build/release/pylon-bench bus
	.build/release/pylon-bench uploader
	.build/release/pylon-bench uploader --fsync full
	.build/release/pylon-bench ma
	.build/release/pylon-bench push
	.build/release/pylon-bench gtm

## Hardening (docs/HARDENING.md). None of these take /tmp/pylon-build.lock themselves: on a
## shared machine run them as `flock /tmp/pylon-build.lock make fuzz` (and so on).

FUZZ_TARGETS ?= message manifest backend-http ma uploader
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
	  $(SWIFT) test --skip-build $(ASAN_FLAGS) --no-parallel --skip pipeliningWithoutReadingKeepsMemoryBounded
	@if ls $(ASAN_BUILD)/reports/asan.* >/dev/null 2>&1; then \
	  echo "AddressSanitizer reports:"; head -50 $(ASAN_BUILD)/reports/asan.*; exit 1; \
	else echo "test-asan: no AddressSanitizer report"; fi

## Chaos soak (loopback only, bounded): release build, backend + pylond with uploader and MA,
## pipelined load while processes are killed with kill -9; fails if an acknowledged record is lost.
SOAK_SECONDS ?= 120
soak: release
	python3 tools/soak.py --bin-dir .build/release --seconds $(SOAK_SECONDS)

clean:
	rm -rf .build .build-fuzz .build-asan .fuzz-work $(RUN_DIR)
