"""The automation page (docs/AUTOMATION.md) in a real browser: a rule is created from the page,
paused and resumed with its buttons, and its funnel and decisions page renders."""
import json
import uuid

from conftest import ADMIN, wait_for


def test_create_pause_and_open_a_rule_from_the_page(console, stack, driver):
    from selenium.webdriver.common.by import By

    name = "console rule " + uuid.uuid4().hex[:6]
    console.login(*ADMIN)
    console.go("#/automation")
    area = console.wait_css("#rule-json")
    definition = {
        "name": name, "appKey": "consoleapp",
        "trigger": {"event": "purchase", "conditions": [{"property": "price", "op": "range", "gt": 100}]},
        "steps": [{"type": "send", "push": {"appId": "consoleapp", "title": "Thanks", "body": "{{event.price}}"}}],
    }
    # A refused definition: the page shows the field the backend names.
    area.clear()
    area.send_keys(json.dumps({**definition, "trigger": {"event": "purchase", "conditions": [{"property": "p", "op": "between"}]}}))
    driver.find_element(By.ID, "rule-create").click()
    console.wait_text("#automation-status", "trigger.conditions[0].op")
    area.clear()
    area.send_keys(json.dumps(definition))
    driver.find_element(By.ID, "rule-create").click()
    console.wait_text("#automation-status", "Created rule")
    rule = wait_for("the rule", lambda: [r for r in stack.ok("GET", "/v1/admin/automation/rules?limit=500")["items"]
                                         if r["name"] == name])[0]
    assert rule["status"] == "active" and rule["version"] == 1
    console.wait_css(f"button[data-action='pause'][data-rule='{rule['id']}']").click()
    wait_for("paused", lambda: stack.ok("GET", f"/v1/admin/automation/rules/{rule['id']}")["status"] == "paused")
    console.wait_css(f"button[data-action='resume'][data-rule='{rule['id']}']").click()
    wait_for("resumed", lambda: stack.ok("GET", f"/v1/admin/automation/rules/{rule['id']}")["status"] == "active")
    console.go(f"#/automation/{rule['id']}")
    console.wait_text("#automation-funnel", "Triggered")
    console.wait_css("#automation-decisions")
    assert not console.css("#main .msg.error"), [e.text for e in console.css("#main .msg.error")]
    actions = [e["action"] for e in stack.ok("GET", "/v1/admin/audit?limit=500")["items"]]
    assert {"automation.rule.create", "automation.rule.pause", "automation.rule.resume"} <= set(actions)
    assert not console.csp_violations()


def test_templates_segments_and_a_dry_run_from_the_page(console, stack, driver):
    """Templates and segments are created from the page (a hostile name stays text), a segment
    is counted, a refused segment shows the field, and a dry run of the rule being written
    counts the last 24 h of events."""
    import time

    from selenium.webdriver.common.by import By

    app = "dryapp" + uuid.uuid4().hex[:6]
    now = int(time.time() * 1000)
    stack.ingest(f"ma.{app}", [{"id": uuid.uuid4().hex, "ts": now,
                                "data": {"event": "purchase", "euid": f"user{i}", "time": now - 60_000,
                                         "properties": {"price": 50 + 100 * i}}} for i in range(3)])
    console.login(*ADMIN)
    console.go("#/automation")

    hostile = "<img src=x onerror=alert(1)> " + uuid.uuid4().hex[:6]
    area = console.wait_css("#template-json")
    area.clear()
    area.send_keys(json.dumps({"name": hostile, "appId": app, "title": "Hi {{profile.name|there}}", "body": "b"}))
    driver.find_element(By.ID, "template-create").click()
    console.wait_text("#templates-status", "Created template")
    console.wait_text("#automation-templates", hostile)
    assert not console.css("#automation-templates img"), "a stored name is text, never markup"

    area = console.wait_css("#segment-json")
    area.clear()
    area.send_keys(json.dumps({"name": "no days", "appKey": app, "conditions": [{"did": "purchase"}]}))
    driver.find_element(By.ID, "segment-create").click()
    console.wait_text("#segments-status", "conditions[0].days")
    area.clear()
    area.send_keys(json.dumps({"name": "buyers " + app, "appKey": app, "conditions": [{"did": "purchase", "days": 1}]}))
    driver.find_element(By.ID, "segment-create").click()
    console.wait_text("#segments-status", "Created segment")
    segment = wait_for("the segment", lambda: [s for s in stack.ok("GET", "/v1/admin/automation/segments?limit=500")["items"]
                                               if s["appKey"] == app])[0]
    console.wait_css(f"button[data-action='size'][data-segment='{segment['id']}']").click()
    # Events without an MA user row: the segment counts users, none here.
    console.wait_text(f"span[data-size='{segment['id']}']", "0")

    rule = console.wait_css("#rule-json")
    rule.clear()
    rule.send_keys(json.dumps({
        "name": "dry " + app, "appKey": app,
        "trigger": {"event": "purchase", "conditions": [{"property": "price", "op": "range", "gt": 100}]},
        "reentry": {"mode": "every"},
        "steps": [{"type": "send", "push": {"appId": app, "title": "t", "body": "b"}}]}))
    driver.find_element(By.ID, "rule-dry-run").click()
    console.wait_text("#dry-run-result", "Would trigger")
    result = console.css("#dry-run-result")[0].text
    assert "Matched\n2" in result and "Suppressed: no_binding\n2" in result, result
    assert not stack.ok("GET", "/v1/admin/automation/rules?limit=500")["items"] or all(
        r["name"] != "dry " + app for r in stack.ok("GET", "/v1/admin/automation/rules?limit=500")["items"]), "a dry run stores nothing"
    actions = [e["action"] for e in stack.ok("GET", "/v1/admin/audit?limit=500")["items"]]
    assert {"automation.template.create", "automation.segment.create"} <= set(actions)
    assert not console.csp_violations()
    console.screenshot("automation")
