#!/usr/bin/env python3
"""A stand-in for the push plugin written with pylon.Plugin: every method of the real one,
described as the real one describes it, answering bad params with push's codes (3002, 3012),
so `pylonctl conformance --as push` passes. FAKE_PUSH_DROP=METHOD leaves a method out and
FAKE_PUSH_WRONG=METHOD answers it with a string (the tests of the check's failures)."""
import os

import pylon
from pylon import param, result

plugin = pylon.Plugin("push", version="0-fake")
drop = os.environ.get("FAKE_PUSH_DROP", "")
wrong = os.environ.get("FAKE_PUSH_WRONG", "")

CODE = param("code", "integer", True, "0 = success, else a push code")
CODE_MESSAGE = result("object", fields=[CODE, param("message", "string")])
bound = set()


def method(name, summary, params=(), res=CODE_MESSAGE, consent=None):
    """Registers `name` unless dropped; the handler checks required params as push does."""
    def register(fn):
        if name == drop:
            return fn
        required = [(p["name"], p["type"]) for p in params if p["required"]]

        def handler(p, call):
            if name == wrong:
                return "not an object"
            for n, t in required:
                v = p.get(n)
                if v is None or (t == "string" and not isinstance(v, str)) or (t == "object" and not isinstance(v, dict)):
                    return {"code": 3012 if n == "userId" else 3002, "message": f"{n} is required"}
            return fn(p, call)
        plugin.method(name, consent=consent, summary=summary, params=list(params), result=res)(handler)
        return fn
    return register


@method("register", "Register the device and get its token", [param("timeoutMs", "integer")],
        result("object", fields=[CODE, param("token", "string")]))
def register(p, call):
    return {"code": 0, "token": "00ff"}


@method("setDeviceToken", "Use a device token obtained elsewhere", [param("token", "string", True)])
def set_device_token(p, call):
    return {"code": 0, "message": ""}


@method("bind", "Bind an app user to this device", [param("userId", "string", True)])
def bind(p, call):
    bound.add(p["userId"])
    return {"code": 0, "message": ""}


@method("unbind", "Unbind an app user from this device", [param("userId", "string", True)])
def unbind(p, call):
    bound.discard(p["userId"])
    return {"code": 0, "message": ""}


@method("openLogReport", "Report that the user opened a message", [param("userInfo", "object", True)],
        consent="push:opens")
def open_log_report(p, call):
    return {"code": 0, "message": ""}


@method("liveActivityBind", "Submit a Live Activity's push token",
        [param("activityId", "string", True), param("pushToken", "string", True), param("filter", "string"),
         param("contentStateSchema", "object"), param("appId", "string")],
        result("object", fields=[CODE, param("dropped", "boolean"), param("message", "string")]))
def live_activity_bind(p, call):
    return {"code": 0}


@method("attach", "Receive an app's messages", [param("appId", "string", True), param("callback", "string", True)],
        result("object", fields=[CODE, param("pending", "integer"), param("message", "string")]))
def attach(p, call):
    return {"code": 0, "pending": 0}


@method("detach", "Stop receiving an app's messages", [param("appId", "string", True)])
def detach(p, call):
    return {"code": 0, "message": ""}


@method("status", "Connection, registration and attached apps",
        res=result("object", fields=[CODE] + [param(n, t, True) for n, t in [
            ("connection", "string"), ("lastError", "string"), ("registration", "string"),
            ("deviceRegistered", "boolean"), ("attachedApps", "array"), ("inbox", "object"), ("counters", "object"),
            ("reregistration", "object")]]))
def status(p, call):
    return {"code": 0, "connection": "fake", "lastError": None, "registration": "registered",
            "deviceRegistered": True, "attachedApps": [], "inbox": {}, "counters": {"bound": len(bound)}, "reregistration": {}}


@method("setOwner", "Admins only: hand an appId to another uid", [param("appId", "string", True), param("uid", "any", True)],
        result("object", fields=[CODE, param("appId", "string"), param("ownerUid", "any"), param("previous", "any")]))
def set_owner(p, call):
    return {"code": 0, "appId": p["appId"], "ownerUid": p["uid"], "previous": None}


plugin.run()
