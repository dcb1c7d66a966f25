#!/usr/bin/env python3
"""A test plugin written with pylon.Plugin (started by the host in the tests)."""
import os
import pylon

plugin = pylon.Plugin("greeter", version="1.2")
seen = []


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


plugin.on_consent_changed = lambda key, granted: seen.append([key, granted])


def shutdown():
    marker = os.environ.get("GREETER_SHUTDOWN_MARKER")
    if marker:
        open(marker, "w").write("bye")


plugin.on_shutdown = shutdown
plugin.run()
