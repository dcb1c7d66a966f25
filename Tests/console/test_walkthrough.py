"""docs/CONSOLE.md's walkthrough, run literally: `make run` (on free ports, its RUN_DIR `run` in a
temporary directory), the console URL it prints, the `sh` commands of the walkthrough in one
shell from that directory, then the browser logs in with the account they created."""
import os
import re
import select
import signal
import subprocess
import time

from conftest import REPO, free_port, wait_for

WALKTHROUGH = os.path.join(REPO, "docs", "CONSOLE.md")


def session_pids(sid):
    """Every process still in session `sid` (make run's pylond, backend, broker)."""
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_gone(pids, timeout):
    """Waits on each process's pidfd (readable once it has exited) until all are gone or the
    deadline passes (the next test must not meet make run's processes)."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(int(left * 1000) + 1):
                poller.unregister(fd)
                os.close(fd)
                del fds[fd]
    finally:
        for fd in fds:
            os.close(fd)


def walkthrough_blocks():
    text = open(WALKTHROUGH, encoding="utf-8").read()
    section = text[text.index("## Walkthrough"):text.index("\n## ", text.index("## Walkthrough") + 5)]
    return re.findall(r"```sh\n(.*?)```", section, re.S), section


def test_the_walkthrough_runs_literally(tmp_path, driver):
    blocks, section = walkthrough_blocks()
    assert blocks[0].strip() == "make run", blocks
    account = re.search(r"--add-operator (\S+) .*", blocks[1])
    password = re.search(r"printf '%s' '([^']+)'", blocks[1])
    assert account and password, blocks[1]
    bport, mport = free_port(), free_port()
    run_dir = tmp_path / "run"
    log = open(tmp_path / "run.log", "w")
    make = subprocess.Popen(["make", "-C", REPO, "--no-print-directory", "run", f"RUN_DIR={run_dir}",
                             f"BACKEND_LISTEN=127.0.0.1:{bport}", f"MQTT_LISTEN=127.0.0.1:{mport}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{bport}/"
        printed = wait_for("make run to print the console URL",
                           lambda: make.poll() is None and f"console: {url}" in open(tmp_path / "run.log").read()
                           or make.poll() is not None and AssertionError(open(tmp_path / "run.log").read()[-3000:]),
                           timeout=600, interval=0.5)
        assert printed is True, printed
        # The documented line, with this run's address.
        assert re.search(r"console: http://127\.0\.0\.1:8780/ ", section)
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks[1]], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in os.environ.items() if k != "PYLON_SOCKET"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert oct(os.stat(run_dir / "ada.password").st_mode & 0o777) == "0o600"

        from selenium.webdriver.common.by import By

        driver.delete_all_cookies()
        driver.get(url + "#/login")
        wait_for("the login form", lambda: driver.find_elements(By.ID, "login-name"))
        driver.find_element(By.ID, "login-name").send_keys(account.group(1))
        driver.find_element(By.ID, "login-password").send_keys(password.group(1))
        driver.find_element(By.ID, "login-submit").click()
        wait_for("logged in", lambda: [e for e in driver.find_elements(By.ID, "who-name") if e.text == account.group(1)])
        assert driver.find_element(By.ID, "who-role").text == "admin"
        driver.delete_all_cookies()
    finally:
        try:
            os.killpg(make.pid, signal.SIGINT)
            make.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        wait_gone(session_pids(make.pid), timeout=10)
