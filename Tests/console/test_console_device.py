"""The console against a real pylond (uploader, MA, push, gtm) wired to the backend and broker:
a push's funnel reaches "opened", a device's event appears in the live tail, a published and
rolled-back container changes what the device's gtm.getValue answers, an erased user is gone."""
import json
import re
import socket
import threading
import time
import uuid

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from conftest import ADMIN, wait_for


class PushApp(threading.Thread):
    """An app on the device: serves `<appId>.onPush`, attaches to the push plugin, acknowledges
    each message and reports it opened (push.openLogReport), as a user tapping it would."""

    def __init__(self, device, app_id):
        super().__init__(daemon=True)
        self.device, self.app_id = device, app_id
        self.received, self.attached = [], threading.Event()
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(device.socket)
        self.sock.settimeout(0.5)
        self.start()

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def run(self):
        cb = f"{self.app_id}.onPush"
        self.send({"jsonrpc": "2.0", "id": "p", "method": "bus.provide", "params": {"method": cb}})
        self.send({"jsonrpc": "2.0", "id": "a", "method": "push.attach", "params": {"appId": self.app_id, "callback": cb}})
        buf = b""
        while not self.stop.is_set():
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                if not ln:
                    continue
                m = json.loads(ln)
                if m.get("id") == "a" and (m.get("result") or {}).get("code") == 0:
                    self.attached.set()
                if m.get("method") == cb and "id" in m:
                    msg = (m.get("params") or {}).get("message") or {}
                    self.received.append(msg)
                    self.send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
                    self.send({"jsonrpc": "2.0", "id": f"o{len(self.received)}", "method": "push.openLogReport",
                               "params": {"userInfo": msg}})

    def close(self):
        self.stop.set()
        self.join(5)
        self.sock.close()


def test_push_from_the_console_reaches_opened(console, stack, device, driver):
    app_id, user = "consoleapp", "u-" + uuid.uuid4().hex[:8]
    token = wait_for("the device's push token", lambda: (device.call("push.register", {"timeoutMs": 5000}) or {}).get("token"),
                     timeout=60)
    assert device.call("push.bind", {"userId": user})["code"] == 0
    app = PushApp(device, app_id)
    try:
        assert app.attached.wait(15), "push.attach failed"
        console.login(*ADMIN)
        console.go("#/push")
        console.wait_css("#push-composer")
        driver.find_element(By.ID, "push-appid").send_keys(app_id)
        Select(driver.find_element(By.ID, "push-target-type")).select_by_value("user")
        driver.find_element(By.ID, "push-target").send_keys(user)
        driver.find_element(By.ID, "push-title").send_keys("Hello from the console")
        driver.find_element(By.ID, "push-body").send_keys("Tap me")
        driver.find_element(By.ID, "push-data").send_keys('{"campaign": "console-test"}')
        driver.find_element(By.ID, "push-deeplink").send_keys("consoleapp://inbox")
        driver.find_element(By.ID, "push-send").click()
        # The console shows the new message's funnel; it refreshes until the device opened it.
        detail = console.wait_css("#push-detail")
        msg_id = detail.get_attribute("data-msg")
        wait_for("the app to receive the push", lambda: [m for m in app.received if m.get("id") == msg_id], timeout=60)
        opened = wait_for("the funnel to reach opened", lambda: next(
            (e for e in console.css("#push-detail .funnel-step[data-step='opened']") if e.get_attribute("data-count") == "1"),
            None), timeout=60)
        assert opened.find_element(By.CSS_SELECTOR, ".funnel-rate").text == "100.0%"
        # The device's row: opened, with times shown as times (no raw epoch milliseconds).
        row = console.wait_text("#push-detail tbody tr", "opened")
        assert not re.search(r"\b1\d{12}\b", row.text), row.text
        for step in ("sent", "delivered"):
            assert console.css(f"#push-detail .funnel-step[data-step='{step}']")[0].get_attribute("data-count") == "1"
        got = [m for m in app.received if m.get("id") == msg_id][0]
        assert got["title"] == "Hello from the console" and got["extras"] == {"campaign": "console-test"}
        console.wait_text("#push-history", msg_id)
        console.screenshot("push")
        # The why-lookup for that device says it was opened.
        install = device.call("push.status").get("installId")
        if install:
            r = stack.ok("GET", f"/v1/admin/push/why?messageId={msg_id}&installId={install}")
            assert r["state"] == "opened", r
        assert token
    finally:
        app.close()


def test_a_device_event_appears_in_the_live_tail(console, device, driver):
    app = "tail" + uuid.uuid4().hex[:6]
    console.login(*ADMIN)
    console.go(f"#/events?appKey={app}&tail=1")
    console.wait_text("#tail-state", "live")
    start = device.call("ma.start", {"appKey": app, "userID": {"userID": "tail-user"}})
    assert start["code"] == 0, start
    name = "console_tail_" + uuid.uuid4().hex[:6]
    assert device.call("ma.eventRecord", {"appKey": app, "eventName": name, "property": {"step": 1}})["code"] == 0
    row = console.wait_text("#tail-table td.event", name, timeout=30)
    assert row.text == name
    console.screenshot("events-tail")


def gtm_value(device, cid, key):
    return device.call("gtm.getValue", {"containerId": cid, "key": key, "type": "string"})["value"]


def refreshed_value(device, cid, key, want):
    """Asks the device to refresh the container until getValue answers `want` (a refresh within
    5 s of the last accepted one is ignored by the plugin, so the poll repeats it)."""
    def check():
        if gtm_value(device, cid, key) == want:
            return True
        device.call("gtm.refresh", {"containerId": cid})
        return gtm_value(device, cid, key) == want
    return wait_for(f"gtm.getValue({key}) == {want!r}", check, timeout=60, interval=1)


def container(title):
    return {"resource": {"version": "1", "macros": [{"function": "_c", "instance_name": "title", "value": title}],
                         "predicates": [], "tags": [], "rules": []}}


def test_publish_and_roll_back_a_container(console, stack, device, driver):
    cid = "GTM-C" + uuid.uuid4().hex[:6].upper()
    console.login(*ADMIN)
    console.go(f"#/containers/{cid}")
    area = console.wait_css("#publish-content")

    def publish(title):
        area = console.wait_css("#publish-content")
        area.clear()
        area.send_keys(json.dumps(container(title)))
        driver.find_element(By.ID, "publish").click()

    publish("first")
    console.wait_text("#container-summary", "Published: v1")
    opened = device.call("gtm.openContainer", {"containerId": cid, "openType": "prefer_fresh", "timeoutMs": 5000})
    assert opened["isDefault"] is False, opened
    assert gtm_value(device, cid, "title") == "first"

    publish("second")
    console.wait_text("#container-summary", "Published: v2")
    refreshed_value(device, cid, "title", "second")

    # The diff between the two versions, computed in the page.
    console.go(f"#/containers/{cid}?v=2")
    console.wait_css("#diff-against")
    Select(driver.find_element(By.ID, "diff-against")).select_by_value("1")
    driver.find_element(By.ID, "diff-show").click()
    diff = console.wait_css("#container-diff")
    assert '- ' in diff.text and '"first"' in diff.text and '"second"' in diff.text
    console.screenshot("containers")

    # Roll back: v1's content published as v3.
    console.wait_css("button[data-rollback='1']").click()
    console.wait_text("#container-summary", "Published: v3")
    refreshed_value(device, cid, "title", "first")
    versions = stack.ok("GET", f"/v1/admin/gtm/containers/{cid}/versions")["items"]
    assert sorted(int(v["version"]) for v in versions) == [1, 2, 3]
    v1, v3 = (stack.ok("GET", f"/v1/admin/gtm/containers/{cid}/versions/{n}")["content"]["resource"] for n in (1, 3))
    assert v3["macros"] == v1["macros"] == container("first")["resource"]["macros"]
    # A draft and its preview link: the device previews it, then leaves the preview.
    area = console.wait_css("#publish-content")
    area.clear()
    area.send_keys(json.dumps(container("draft")))
    driver.find_element(By.ID, "preview").click()
    link = console.wait_css("#preview-link code").text
    assert link.startswith("tagmanager.c.") and f"id={cid}" in link and "gtm_auth=" in link, link
    assert device.call("gtm.preview", {"url": link})["preview"] is True
    wait_for("the device to show the draft", lambda: gtm_value(device, cid, "title") == "draft")
    leave = link.split("&gtm_preview=")[0] + "&gtm_preview="
    device.call("gtm.preview", {"url": leave})
    wait_for("the device back on the published version", lambda: gtm_value(device, cid, "title") == "first")
    actions = [e["action"] for e in stack.ok("GET", "/v1/admin/audit?limit=500")["items"] if cid in str(e.get("target"))]
    assert any("rollback" in a for a in actions) and any("publish" in a for a in actions), actions


def test_erase_a_user_and_find_nothing_of_them(console, stack, device, driver):
    app = "erase" + uuid.uuid4().hex[:6]
    user = "gone-" + uuid.uuid4().hex[:6]
    start = device.call("ma.start", {"appKey": app, "userID": {"userID": user}})
    assert start["code"] == 0, start
    euid = start["euid"]
    for i in range(3):
        assert device.call("ma.eventRecord", {"appKey": app, "eventName": f"step_{i}", "property": {"n": i}})["code"] == 0
    wait_for("the user's events on the backend",
             lambda: len(stack.ok("GET", f"/v1/admin/events?appKey={app}&euid={euid}")["items"]) >= 3)

    console.login(*ADMIN)
    console.go(f"#/users?appKey={app}&q={user}")
    console.wait_text("#users-list", euid)
    console.go(f"#/users/{app}/{euid}")
    console.wait_css("#user-detail")
    console.wait_text("#user-detail", "step_")
    console.screenshot("users")
    console.wait_css("#user-erase").click()
    confirm = console.wait_css(".confirm input")
    go = console.css(".confirm button.danger")[0]
    assert not go.is_enabled(), "erasing needs the typed confirmation"
    confirm.send_keys(euid)
    go.click()
    console.wait_text("#user-detail", "done")

    # Nothing of them by any page or API.
    assert stack.ok("GET", f"/v1/admin/events?appKey={app}&euid={euid}")["items"] == []
    assert stack.ok("GET", f"/v1/admin/events?appKey={app}")["items"] == []
    assert stack.ok("GET", f"/v1/admin/users?appKey={app}&q={user}")["items"] == []
    assert stack.ok("GET", f"/v1/admin/users?appKey={app}&q={euid}")["items"] == []
    status, _, _ = stack.api("GET", f"/v1/admin/users/{app}/{euid}")
    assert status == 404
    for path in (f"/v1/inspect/ma/{app}/users/{euid}", f"/v1/admin/analytics/{app}/top-events?fromMs=0&toMs={int(time.time() * 1000) + 60000}"):
        status, data, _ = stack.api("GET", path)
        assert status == 404 or euid not in json.dumps(data) and "step_" not in json.dumps(data), (path, data)
    assert stack.ok("GET", f"/v1/admin/devices?q={user}")["items"] == []
    audit = json.dumps(stack.ok("GET", "/v1/admin/audit?limit=500"))
    erasures_text = json.dumps(stack.ok("GET", "/v1/admin/erasures"))
    for text in (audit, erasures_text):
        assert euid not in text and user not in text, "the audit log or the erasure record keeps the user's ids"
    console.go(f"#/events?appKey={app}")
    console.wait_css("#events-list tr.empty")
    assert user not in driver.find_element(By.ID, "main").text
    console.go(f"#/users?appKey={app}&q={user}")
    console.wait_css("#users-list tr.empty")
    # The request is kept, without the data.
    erasures = stack.ok("GET", "/v1/admin/erasures")["items"]
    mine = [e for e in erasures if e.get("appKey") == app]
    assert mine and mine[0]["status"] == "done"
    console.go("#/privacy")
    console.wait_text("#erasures", app)


def test_an_opt_out_shows_on_the_privacy_and_users_pages(console, stack, device, driver):
    """The record a device's uploader sends on stream pylon.consent when a switch is denied, posted
    with a registered install's device token (pylond does not report opt-outs by itself yet; the
    fixture's own install is not re-registered, which would replace its token)."""
    app = "optout" + uuid.uuid4().hex[:6]
    user = "quiet-" + uuid.uuid4().hex[:6]
    start = device.call("ma.start", {"appKey": app, "userID": {"userID": user}})
    assert start["code"] == 0, start
    euid = start["euid"]
    install = "console-optout-" + uuid.uuid4().hex[:8]
    status, reg, _ = stack.api("POST", "/v1/devices/register", {"installId": install}, token=False,
                               headers={"Authorization": "Bearer " + stack.device_secret})
    assert status == 200 and reg.get("token"), reg
    token = reg["token"]
    now = int(time.time() * 1000)
    status, data, _ = stack.api("POST", "/v1/batches/pylon.consent",
                                {"records": [{"id": uuid.uuid4().hex, "ts": now,
                                              "data": {"switch": f"ma:{app}", "granted": False, "euid": euid, "time": now}}]},
                                token=False, headers={"Authorization": "Bearer " + token, "Idempotency-Key": uuid.uuid4().hex})
    assert status == 200, data
    console.login(*ADMIN)
    console.go("#/privacy")
    row = console.wait_text("#optouts tr", app)
    assert f"ma:{app}" in row.text and euid in row.text and install in row.text
    console.screenshot("privacy")  # after the erasure scenario: both lists have a row
    console.go(f"#/users?appKey={app}&q={user}")
    assert "opted out" in console.wait_text("#users-list tr", euid).text
    console.go(f"#/users/{app}/{euid}")
    console.wait_text("#user-detail .msg", "Opted out")
