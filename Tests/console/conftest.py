"""The console's browser tests: a real pylon-backend serving clients/console (with mosquitto for
push), a real pylond with the uploader, MA, push and gtm plugins where a scenario needs a device,
and Debian's headless Chromium driven by Selenium through Debian's chromedriver. Nothing is
downloaded: the driver is given explicitly and Selenium Manager runs offline.

PYLON_BUILD_DIR: the binaries (default .build/debug). PYLON_CONSOLE_SCREENSHOTS: where the
screenshots of the main pages go (default docs/console; empty: none)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.abspath(os.environ.get("PYLON_BUILD_DIR") or os.path.join(REPO, ".build", "debug"))
CONSOLE_DIR = os.path.join(REPO, "clients", "console")
SCREENSHOTS = os.environ.get("PYLON_CONSOLE_SCREENSHOTS", os.path.join(REPO, "docs", "console"))
CHROMIUM = os.environ.get("PYLON_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PYLON_CHROMEDRIVER", "/usr/bin/chromedriver")
sys.path.insert(0, os.path.join(REPO, "clients", "python", "src"))

# Selenium Manager must never fetch a driver or a browser.
os.environ["SE_OFFLINE"] = "true"

ADMIN = ("ada", "correct-horse-battery-staple")
VIEWER = ("vic", "viewer-password-12345")
WAIT_S = 30


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(what, fn, timeout=WAIT_S, interval=0.1):
    """Polls fn() until it returns a true value (returned) or the deadline passes (fails)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - the condition is polled, its errors too
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def secret_file(path, value=None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (value if value is not None else os.urandom(32).hex()).encode())
    os.close(fd)
    return path


class Stack:
    """mosquitto (dynamic security, no anonymous clients, as `make run`) and pylon-backend with the
    console, on free loopback ports in a temporary directory."""

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.port, self.mqtt_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token_file = secret_file(os.path.join(self.tmp, "operator.token"))
        self.token = open(self.token_file).read().strip()
        self.device_key = secret_file(os.path.join(self.tmp, "device.key"))
        self.device_secret = open(self.device_key).read().strip()
        self.broker_password = secret_file(os.path.join(self.tmp, "broker.password"))
        self.db = os.path.join(self.tmp, "backend.db")
        self.procs = {}
        try:
            self._start_mosquitto()
            self._add_admin_by_cli()
            self._start_backend()
        except BaseException:
            self.stop()  # a failed start leaves no broker behind
            raise

    def _start_mosquitto(self):
        subprocess.run([os.path.join(REPO, "tools", "pylon-dynsec-init"), os.path.join(self.tmp, "dynsec.json"),
                        "pylon-backend", self.broker_password], check=True)
        plugin = next(os.path.join(d, "mosquitto_dynamic_security.so")
                      for d in sorted(os.path.join("/usr/lib", x) for x in os.listdir("/usr/lib"))
                      if os.path.exists(os.path.join(d, "mosquitto_dynamic_security.so")))
        conf = open(os.path.join(REPO, "etc", "mosquitto.conf")).read()
        conf = conf.replace("listener 1883 127.0.0.1", f"listener {self.mqtt_port} 127.0.0.1")
        conf = "\n".join(f"plugin_opt_config_file {self.tmp}/dynsec.json" if ln.startswith("plugin_opt_config_file ")
                         else f"plugin {plugin}" if ln.startswith("plugin /usr/lib/") else ln for ln in conf.split("\n"))
        with open(os.path.join(self.tmp, "mosquitto.conf"), "w") as f:
            f.write(conf)
        out = open(os.path.join(self.tmp, "mosquitto.log"), "ab")
        self.procs["mosquitto"] = subprocess.Popen(["mosquitto", "-c", os.path.join(self.tmp, "mosquitto.conf")],
                                                   cwd=self.tmp, stdout=out, stderr=out)
        wait_for("mosquitto", lambda: socket.create_connection(("127.0.0.1", self.mqtt_port), timeout=1).close() or True)

    def _add_admin_by_cli(self):
        """The walkthrough's way (docs/CONSOLE.md): `pylon-backend --db DB --add-operator ...`."""
        pw = secret_file(os.path.join(self.tmp, "ada.password"), ADMIN[1])
        r = subprocess.run([os.path.join(BIN, "pylon-backend"), "--db", self.db, "--add-operator", ADMIN[0],
                            "--role", "admin", "--password-file", pw], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"--add-operator failed: {r.stdout}{r.stderr}"

    def _start_backend(self):
        args = [os.path.join(BIN, "pylon-backend"), "--listen", f"127.0.0.1:{self.port}", "--db", self.db,
                "--console-dir", CONSOLE_DIR, "--log-level", "warn",
                "--operator-token-file", self.token_file, "--enrol-secret-file", self.device_key,
                "--mqtt", f"127.0.0.1:{self.mqtt_port}", "--mqtt-username", "pylon-backend",
                "--mqtt-password-file", self.broker_password, "--mqtt-dynsec"]
        self.log_path = os.path.join(self.tmp, "backend.log")
        out = open(self.log_path, "ab")
        b = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=out)
        line = b.stdout.readline()
        if b"listening" not in line:
            b.kill()
            raise RuntimeError(f"pylon-backend did not start: {line!r} {open(self.log_path).read()[-2000:]}")
        self.procs["backend"] = b

    # ---- the API as a script uses it (operator token) -------------------------------------------
    def api(self, method, path, body=None, token=True, headers=None):
        """(status, parsed JSON or text, headers)."""
        h = {"Accept": "application/json"}
        if token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, method=method, headers=h,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                status, raw, hdrs = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), dict(e.headers)
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text else None, hdrs
        except ValueError:
            return status, text, hdrs

    def ok(self, method, path, body=None):
        status, data, _ = self.api(method, path, body)
        assert 200 <= status < 300, f"{method} {path}: {status} {data}"
        return data

    def ingest(self, stream, records):
        """A batch as a device's uploader posts it (the enrolment secret is a device credential)."""
        status, data, _ = self.api("POST", f"/v1/batches/{stream}", {"records": records}, token=False,
                                   headers={"Authorization": "Bearer " + self.device_secret,
                                            "Idempotency-Key": uuid.uuid4().hex})
        assert status == 200, f"ingest: {status} {data}"
        return data

    def stop(self):
        for name in ("backend", "mosquitto"):
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class Device:
    """A real pylond with the uploader, MA, push and gtm plugins, wired to the stack (uploads
    flushed within half a second)."""

    def __init__(self, tmp, stack):
        self.tmp = str(tmp)
        self.socket = os.path.join(self.tmp, "pylon.sock")
        fast = {"maxCount": 50, "intervalMs": 300}
        cfg = {
            "socket": self.socket, "stateDir": os.path.join(self.tmp, "state"), "pluginDir": BIN, "logLevel": "info",
            "plugins": [
                {"name": "uploader", "exec": "pylon-uploader", "restart": "permanent", "config": {
                    "endpoint": stack.url + "/v1/batches/{stream}", "credentialFile": stack.device_key,
                    "retryInitialMs": 200, "retryMaxMs": 2000,
                    "streams": {"ma.*": fast, "push.*": fast, "pylon.*": fast, "gtm.hits": fast}}},
                {"name": "ma", "exec": "pylon-ma", "restart": "permanent", "config": {
                    "backend": stack.url, "credentialFile": stack.device_key, "retryInitialMs": 200, "retryMaxMs": 2000}},
                {"name": "push", "exec": "pylon-push", "restart": "permanent", "config": {
                    "backend": stack.url, "credentialFile": stack.device_key,
                    "broker": {"host": "127.0.0.1", "port": stack.mqtt_port, "keepaliveS": 10,
                               "backoffInitialMs": 100, "backoffMaxMs": 2000},
                    "registerRetryInitialMs": 200, "registerRetryMaxMs": 2000, "ackTimeoutMs": 5000}},
                {"name": "gtm", "exec": "pylon-gtm", "restart": "permanent", "config": {
                    "backend": stack.url, "credentialFile": stack.device_key,
                    "defaultsDir": os.path.join(REPO, "etc", "gtm")}},
            ],
        }
        self.config = os.path.join(self.tmp, "pylon.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.log_path = os.path.join(self.tmp, "pylond.log")
        out = open(self.log_path, "ab")
        env = {k: v for k, v in os.environ.items() if k not in ("PYLON_SOCKET", "PYLON_STATE_DIR", "PYLON_CONFIG")}
        self.proc = subprocess.Popen([os.path.join(BIN, "pylond"), "--config", self.config, "--socket", self.socket,
                                      "--state-dir", os.path.join(self.tmp, "state")], stdout=out, stderr=out, env=env)
        import pylon  # clients/python

        self.pylon = pylon

        def running():
            with pylon.Client(self.socket, timeout=5) as c:
                return all(p["state"] == "running" for p in c.call("bus.status")["plugins"])
        try:
            wait_for("pylond and its plugins", running, timeout=60)
        except BaseException:
            self.stop()
            raise

    def client(self):
        return self.pylon.Client(self.socket, timeout=30)

    def call(self, method, params=None):
        with self.client() as c:
            return c.call(method, params or {})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"))
    # The second account (a viewer) through the API, as an admin script would.
    s.ok("POST", "/v1/admin/operators", {"name": VIEWER[0], "role": "viewer", "password": VIEWER[1]})
    yield s
    s.stop()


@pytest.fixture(scope="session")
def device(tmp_path_factory, stack):
    d = Device(tmp_path_factory.mktemp("device"), stack)
    yield d
    d.stop()


# ---- The browser -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,860",
              "--force-device-scale-factor=1", "--disable-extensions", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--lang=en-US"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    d.set_script_timeout(20)
    yield d
    d.quit()


class Console:
    """The console in the browser: log in and out, go to a page, wait for what it shows."""

    def __init__(self, driver, stack):
        self.d, self.stack = driver, stack

    def open(self, hash_="#/login"):
        # A fresh page load (a get that changes only the fragment would not reload).
        self.d.get("about:blank")
        self.d.get(self.stack.url + "/" + hash_)

    def go(self, hash_):
        self.d.execute_script("location.hash = arguments[0]", hash_)

    def login(self, name, password):
        from selenium.webdriver.common.by import By

        self.open("#/login")
        self.wait_css("#login-name")
        for field, value in (("login-name", name), ("login-password", password)):
            e = self.d.find_element(By.ID, field)
            e.clear()
            e.send_keys(value)
        self.d.find_element(By.ID, "login-submit").click()
        self.wait_text("#who-name", name)

    def logout(self):
        self.d.delete_all_cookies()

    def css(self, sel):
        from selenium.webdriver.common.by import By

        return self.d.find_elements(By.CSS_SELECTOR, sel)

    def wait_css(self, sel, timeout=WAIT_S):
        return wait_for(f"element {sel}", lambda: self.css(sel), timeout)[0]

    def wait_text(self, sel, text, timeout=WAIT_S):
        return wait_for(f"{text!r} in {sel}", lambda: next((e for e in self.css(sel) if text in e.text), None), timeout)

    def fetch(self, method, path, body=None, csrf=True):
        """A request from the page (the session cookie goes with it); csrf=True adds the token of
        the current session as the console does."""
        return self.d.execute_async_script("""
            const [method, path, body, csrf, done] = arguments;
            (async () => {
              const s = await fetch('/v1/session', {credentials: 'same-origin'}).then((r) => r.json());
              const headers = {'Content-Type': 'application/json'};
              if (csrf) headers['X-CSRF-Token'] = s.csrfToken;
              const r = await fetch(path, {method, credentials: 'same-origin', headers,
                                           body: body === null ? undefined : JSON.stringify(body)});
              const text = await r.text();
              let data = null;
              try { data = JSON.parse(text); } catch (e) { data = text; }
              done({status: r.status, data});
            })().catch((e) => done({status: -1, data: String(e)}));
        """, method, path, body, csrf)

    def csp_violations(self):
        return [e for e in self.d.get_log("browser") if "Content Security Policy" in e.get("message", "")
                or "Refused to" in e.get("message", "")]

    def screenshot(self, name):
        if not SCREENSHOTS:
            return
        os.makedirs(SCREENSHOTS, exist_ok=True)
        self.d.execute_script("window.scrollTo(0, 0)")
        self.d.save_screenshot(os.path.join(SCREENSHOTS, f"{name}.png"))


@pytest.fixture
def console(driver, stack):
    c = Console(driver, stack)
    c.open("#/login")
    c.logout()
    driver.get_log("browser")  # start each test with an empty browser log
    yield c
    c.logout()


def pytest_collection_modifyitems(items):
    """The tour of every page runs last, so its screenshots show what the other scenarios stored."""
    items.sort(key=lambda i: i.name == "test_every_page_renders_without_a_policy_violation")
