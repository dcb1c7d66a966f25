# Pylon — build, run and test. Works as root on a fresh Debian 12 machine with the Swift toolchain:
# every target first installs the Debian packages it needs (`make deps`).
SHELL := /bin/bash
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
DEB_PACKAGES := pkg-config libuv1-dev libjson-c-dev libcurl4-openssl-dev libsqlite3-dev libhttp-parser-dev zlib1g-dev socat python3 mosquitto libmosquitto-dev libpcre2-dev libplist-dev
RUN_DIR ?= $(CURDIR)/run
export PYLON_SOCKET ?= $(RUN_DIR)/pylon.sock

.PHONY: all deps build release run test bench clean format-check

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

clean:
	rm -rf .build $(RUN_DIR)
