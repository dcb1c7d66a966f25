#!/usr/bin/env python3
"""A test plugin written with pylon.Plugin (started by the host in the tests)."""
import os
import pylon

plugin = pylon.Plugin("greeter", version="1.2")
seen = []


def check_config(config):
    """The greeter's strict config reader (pylond --check-config runs it)."""
    g = config.get("greeting")
    if g is not None and not isinstance(g, str):
        raise ValueError("config.greeting: must be a string")
    return [f"config.{k}: unknown setting (ignored)" for k in sorted(config) if k != "greeting"]


plugin.check_config = check_config


@plugin.method("hello")
def hello(params, call):
    return {"hi": params.get("who"), "config": plugin.config}


@plugin.method("collect", consent="greeter:{appKey}")
def collect(params, call):
    return {"stored": params.get("data")}


@plugin.method("coded")
def coded(params, call):
    return {"code": params.get("code", 0), "message": "coded reply"}


@plugin.method("fail")
def fail(params, call):
    raise pylon.InvalidParams("who is required", data={"field": "who"})


@plugin.method("consent")
def consent(params, call):
    return {"switches": plugin.consent, "master": plugin.consent_master, "changes": seen}


@plugin.method("ping_host")
def ping_host(params, call):
    call.call("bus.ping", None, lambda r, e: plugin.reply(call, {"host": r}))
    return pylon.Plugin.LATER


@plugin.method("log")
def log(params, call):
    """Logs through Python's logging (pylon.Plugin's handler: sd-daemon prefixes)."""
    import logging
    logging.getLogger("greeter").warning("careful: %s", params.get("what"))
    logging.getLogger("greeter").error("broken: %s", params.get("what"))
    return {}


plugin.on_consent_changed = lambda key, granted: seen.append([key, granted])


def shutdown():
    marker = os.environ.get("GREETER_SHUTDOWN_MARKER")
    if marker:
        open(marker, "w").write("bye")


plugin.on_shutdown = shutdown
plugin.run()
