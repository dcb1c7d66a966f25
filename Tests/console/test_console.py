"""The console in a real browser against a real backend: login, sessions, roles, CSRF, hostile
data rendered as text, every page without a Content-Security-Policy violation."""
import os
import time
import uuid

from selenium.common.exceptions import NoAlertPresentException

from conftest import ADMIN, CONSOLE_DIR, VIEWER, wait_for

HOSTILE = "<img src=x onerror=alert(1)>"
CONSOLE_BUDGET_BYTES = 300 * 1024


def code(r):
    """The machine code of an error answer ({"error": message, "code": code})."""
    data = r["data"] if isinstance(r["data"], dict) else {}
    return data.get("code") or data.get("error")


def no_alert(driver):
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def test_console_is_served_with_a_strict_policy(stack):
    status, body, headers = stack.api("GET", "/", token=False)
    assert status == 200 and "<title>Pylon console</title>" in body
    h = {k.lower(): v for k, v in headers.items()}
    csp = h.get("content-security-policy", "")
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
    assert "unsafe-inline" not in csp
    assert h.get("x-content-type-options") == "nosniff"
    # Modules load only with a JavaScript type (the browser refuses others under nosniff).
    status, _, headers = stack.api("GET", "/js/app.js", token=False)
    assert status == 200 and "javascript" in {k.lower(): v for k, v in headers.items()}["content-type"]
    for bad in ("/../etc/passwd", "/js/", "/%2e%2e/Makefile", "/js/../../README.md"):
        status, _, _ = stack.api("GET", bad, token=False)
        assert status in (400, 403, 404), f"{bad}: {status}"
    # No inline script or style anywhere in the console's files; no HTML parsing of data.
    for root, _, files in os.walk(CONSOLE_DIR):
        for f in files:
            text = open(os.path.join(root, f), encoding="utf-8").read()
            if f.endswith(".html"):
                assert "<script>" not in text and "style=" not in text and "<style" not in text, f
            if f.endswith(".js"):
                code = "\n".join(ln for ln in text.split("\n") if not ln.lstrip().startswith("//"))
                for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "localStorage",
                             "sessionStorage", "eval("):
                    assert sink not in code, f"{f} uses {sink}"


def test_console_stays_under_its_size_budget():
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(CONSOLE_DIR) for f in fs)
    assert 0 < total < CONSOLE_BUDGET_BYTES, total


def test_login_session_and_logout(console, stack, driver):
    console.open("#/dashboard")
    console.wait_css("#login-form")  # not logged in: the login page, whatever was asked for
    console.screenshot("login")
    driver.find_element("id", "login-name").send_keys(ADMIN[0])
    driver.find_element("id", "login-password").send_keys("wrong password")
    driver.find_element("id", "login-submit").click()
    console.wait_text(".status", "Wrong name or password")
    assert not console.css("#who-name")

    console.login(*ADMIN)
    console.wait_css("#dashboard-body .cards")
    assert console.css("#who-role")[0].text == "admin"
    # The session is an HttpOnly cookie: the page cannot read it, and nothing is kept in
    # browser storage or in the URL.
    assert "pylon_session" not in driver.execute_script("return document.cookie")
    cookie = driver.get_cookie("pylon_session")
    assert cookie and cookie["httpOnly"] and cookie.get("sameSite") == "Strict"
    assert driver.execute_script("return localStorage.length + sessionStorage.length") == 0
    assert "csrf" not in driver.current_url.lower() and ADMIN[1] not in driver.current_url
    assert console.fetch("GET", "/v1/session")["data"]["name"] == ADMIN[0]

    driver.find_element("id", "logout").click()
    console.wait_css("#login-form")
    # Logged out on the server: the old cookie value is refused.
    status, _, _ = stack.api("GET", "/v1/session", token=False,
                             headers={"Cookie": f"pylon_session={cookie['value']}"})
    assert status == 401


def test_a_change_without_the_csrf_token_is_refused(console, stack):
    console.login(*ADMIN)
    name = "op" + uuid.uuid4().hex[:8]
    body = {"name": name, "role": "viewer", "password": "a-long-enough-password"}
    r = console.fetch("POST", "/v1/admin/operators", body, csrf=False)
    assert r["status"] == 403 and code(r) == "csrf_required", r
    assert name not in [o["name"] for o in operators(stack)]
    # The same request with the token (as the console sends it) is accepted.
    r = console.fetch("POST", "/v1/admin/operators", body, csrf=True)
    assert 200 <= r["status"] < 300, r
    assert name in [o["name"] for o in operators(stack)]


def operators(stack):
    data = stack.ok("GET", "/v1/admin/operators")
    return data["items"] if isinstance(data, dict) else data


def test_a_viewer_cannot_send(console, stack, driver):
    console.login(*VIEWER)
    assert console.css("#who-role")[0].text == "viewer"
    console.go("#/push")
    send = console.wait_css("#push-send")
    assert not send.is_enabled() or not send.is_displayed()
    # The server refuses anyway, even with a valid CSRF token.
    before = stack.ok("GET", "/v1/admin/audit?limit=500")["items"]
    r = console.fetch("POST", "/v1/admin/push/send", {"appId": "demo", "targetType": "broadcast", "title": "no"})
    assert r["status"] == 403 and code(r) == "forbidden", r
    r = console.fetch("POST", "/v1/admin/operators", {"name": "sneaky", "role": "admin", "password": "x" * 16})
    assert r["status"] == 403 and code(r) == "forbidden", r
    assert "sneaky" not in [o["name"] for o in operators(stack)]
    after = stack.ok("GET", "/v1/admin/audit?limit=500")["items"]
    assert not [e for e in after if e not in before and e.get("actor") == VIEWER[0]
                and e.get("action", "").startswith("push")], "a refused send was recorded as a send"


def test_a_hostile_event_name_renders_as_text(console, stack, driver):
    app = "hostile" + uuid.uuid4().hex[:6]
    now = int(time.time() * 1000)
    stack.ingest(f"ma.{app}", [{"id": uuid.uuid4().hex, "ts": now,
                                "data": {"event": HOSTILE, "euid": HOSTILE, "time": now,
                                         "properties": {HOSTILE: HOSTILE}}}])
    console.login(*ADMIN)
    console.go(f"#/events?appKey={app}")
    cell = console.wait_text("#events-list td.event", HOSTILE)
    assert cell.text == HOSTILE
    main = driver.find_element("id", "main")
    assert not main.find_elements("css selector", "img"), "a stored string became an element"
    assert not driver.find_elements("css selector", "img[src='x']")
    assert no_alert(driver)
    console.screenshot("events")
    assert not console.csp_violations()


PAGES = ["dashboard", "devices", "push", "automation", "events", "analytics", "users", "containers", "privacy", "operators", "audit"]


def test_every_page_renders_without_a_policy_violation(console, driver):
    console.login(*ADMIN)
    driver.get_log("browser")  # the 401 of the session check before logging in
    for p in PAGES:
        console.go(f"#/{p}")
        wait_for(f"page {p}", lambda: console.css(f".page-root[data-page='{p}'] h1"))
        wait_for(f"page {p} loaded", lambda: not console.css(".paged .pager button:disabled")
                 and not [e for e in console.css("#main p.muted") if e.text == "Loading…"], timeout=10)
        errors = [e.text for e in console.css("#main .msg.error")]
        assert not errors, f"{p}: {errors}"
        if p in ("dashboard", "devices", "analytics", "operators", "audit"):
            console.screenshot(p)
    logs = driver.get_log("browser")
    bad = [e for e in logs if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]]
    assert not bad, bad


def test_container_diff_is_computed_in_the_browser(console):
    console.login(*ADMIN)
    r = console.d.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/js/diff.js').then((m) => {
          const a = m.canonicalText({resource: {macros: [{instance_name: 'title', value: 'one'}], version: '1'}});
          const b = m.canonicalText({resource: {version: '2', macros: [{value: 'two', instance_name: 'title'}]}});
          done(m.diffLines(a, b).filter((l) => l.op !== ' ').map((l) => l.op + l.text.trim()));
        }).catch((e) => done(String(e)));
    """)
    assert r == ['-"value": "one"', '+"value": "two"', '-"version": "1"', '+"version": "2"'], r


def test_schedule_a_send_and_cancel_it(console, stack, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    title = "later " + uuid.uuid4().hex[:6]
    console.login(*ADMIN)
    console.go("#/push")
    console.wait_css("#push-composer")
    driver.find_element(By.ID, "push-appid").send_keys("consoleapp")
    Select(driver.find_element(By.ID, "push-target-type")).select_by_value("broadcast")
    driver.find_element(By.ID, "push-title").send_keys(title)
    driver.find_element(By.ID, "push-schedule").click()  # the default time: ten minutes from now
    console.wait_text("#push-status", "Scheduled")
    row = wait_for("the scheduled send", lambda: [s for s in stack.ok("GET", "/v1/admin/push/scheduled")["items"]
                                                  if (s.get("send") or {}).get("title") == title])[0]
    assert row["status"] == "pending" and row["atMs"] > time.time() * 1000
    console.wait_css(f"button[data-cancel='{row['id']}']").click()
    wait_for("the cancellation", lambda: [s for s in stack.ok("GET", "/v1/admin/push/scheduled")["items"]
                                          if s["id"] == row["id"] and s["status"] == "cancelled"])
    actions = [e["action"] for e in stack.ok("GET", "/v1/admin/audit?limit=500")["items"]]
    assert "push.schedule" in actions


def test_log_in_with_the_operator_token(console, stack, driver):
    from selenium.webdriver.common.by import By

    console.open("#/login")
    console.wait_css("#login-form")
    driver.find_element(By.ID, "login-use-token").click()
    driver.find_element(By.ID, "login-token").send_keys(stack.token)
    driver.find_element(By.ID, "login-submit").click()
    console.wait_text("#who-name", "operator")
    assert console.css("#who-role")[0].text == "admin"
    # The token was a credential typed once: it is in no URL, storage or cookie the page can read.
    assert stack.token not in driver.current_url
    assert driver.execute_script("return localStorage.length + sessionStorage.length + document.cookie.length") == 0
    assert stack.token not in (driver.get_cookie("pylon_session") or {}).get("value", "")


def test_privacy_settings_from_the_page(console, stack, driver):
    from selenium.webdriver.common.by import By

    app = "priv" + uuid.uuid4().hex[:6]
    console.login(*ADMIN)
    console.go("#/privacy")
    console.wait_css("#settings-appkey").send_keys(app)
    driver.find_element(By.CSS_SELECTOR, "#settings-appkey").submit()
    wait_for("the setting loaded", lambda: driver.find_element(By.ID, "settings-erase").is_enabled())
    driver.find_element(By.ID, "settings-erase").click()
    driver.find_element(By.ID, "settings-save").click()
    console.wait_text(".status", "Saved: opt-outs erase")
    assert stack.ok("GET", f"/v1/admin/apps/{app}/settings")["eraseOnOptOut"] is True
    # A retention rule for that AppKey, then removed by emptying its field.
    retention = console.wait_css("#retention-save").find_element(By.XPATH, "ancestor::section")
    retention.find_element(By.CSS_SELECTOR, "input[name=name]").send_keys(app)
    retention.find_element(By.CSS_SELECTOR, "input[name=days][placeholder=days]").send_keys("30")
    driver.find_element(By.ID, "retention-save").click()
    wait_for("the rule stored", lambda: stack.ok("GET", "/v1/admin/retention")["apps"].get(app) == {"maxAgeDays": 30})
    row = console.wait_text("#retention tr", app)
    days = row.find_element(By.CSS_SELECTOR, "input")
    days.clear()
    driver.find_element(By.ID, "retention-save").click()
    wait_for("the rule removed", lambda: app not in stack.ok("GET", "/v1/admin/retention")["apps"])


CHANGE_CONTROLS = ("#push-send, #push-schedule, #push-test, #publish, #preview, [data-rollback], #user-erase, "
                   "#retention-save, #settings-save, #op-create, [data-cancel], [data-delete-operator]")


def test_a_viewer_sees_no_usable_change_control(console, stack, driver):
    cid = "GTM-V" + uuid.uuid4().hex[:6].upper()
    resource = {"macros": [{"function": "_c", "instance_name": "title", "value": "v"}], "predicates": [], "tags": [], "rules": []}
    for _ in range(2):
        stack.ok("POST", f"/v1/admin/gtm/containers/{cid}/versions", {"container": {"resource": resource}})
    console.login(*VIEWER)
    checked = 0
    for hash_, ready in (("#/push", "#push-composer"), (f"#/containers/{cid}", "#publish-content"),
                         ("#/privacy", "#retention"), ("#/operators", "#operators-list table")):
        console.go(hash_)
        console.wait_css(ready)
        controls = console.css(CHANGE_CONTROLS)
        checked += len(controls)
        usable = [c.get_attribute("id") or c.text for c in controls if c.is_displayed() and c.is_enabled()]
        assert not usable, f"{hash_}: a viewer can use {usable}"
    assert checked >= 8, "the change controls were not found on the pages"


def test_repeated_failed_logins_are_rate_limited(console, driver):
    from selenium.webdriver.common.by import By

    name = "nobody-" + uuid.uuid4().hex[:6]  # the per-name limit; the per-address one is 20 a minute
    console.open("#/login")
    console.wait_css("#login-form")
    for attempt in range(6):
        for field, value in (("login-name", name), ("login-password", f"wrong-password-{attempt}")):
            e = driver.find_element(By.ID, field)
            e.clear()
            e.send_keys(value)
        driver.find_element(By.ID, "login-submit").click()  # disables the button until the answer
        wait_for("the answer to this attempt", lambda: driver.find_element(By.ID, "login-submit").is_enabled()
                 and console.css(".status .msg"))
        if attempt < 5:
            assert "Wrong name or password" in console.css(".status .msg")[0].text
    assert "Too many failed attempts" in console.css(".status .msg")[0].text
    assert not console.css("#who-name")
