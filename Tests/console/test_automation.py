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
