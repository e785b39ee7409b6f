#!/usr/bin/python3
"""The coordinator's dashboard in a real browser (headless Chromium through
Selenium): a live cluster trains a job; the dashboard lists it, the job's
loss curve has drawn points and more of them a few seconds later, the worker
table lists both workers, an unknown job gets a 404, and the browser console
holds no errors. Then `tally report` writes the finished job to one HTML
file that draws the same curves with no server. Saves a screenshot for the
README (docs/dashboard.png when run with --screenshot).

    dashboard_test.py BUILD_DIR [--screenshot]
Exits 77 (skipped) without chromium, chromedriver or python3-selenium."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    build = sys.argv[1]
    if not shutil.which("chromedriver") or not shutil.which("chromium"):
        print("SKIP: needs chromium and chromium-driver")
        return SKIP
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        print("SKIP: needs python3-selenium")
        return SKIP

    tmp = tempfile.mkdtemp()
    procs = []
    driver = None
    try:
        port, http = free_port(), free_port()
        addr = f"127.0.0.1:{port}"
        log = lambda name: open(os.path.join(tmp, name + ".log"), "w")
        procs.append(subprocess.Popen(
            [f"{build}/server/tally-server", "--listen=127.0.0.1", f"--port={port}",
             f"--http_port={http}"], stdout=log("server"), stderr=subprocess.STDOUT))
        tally = lambda *a: subprocess.run([f"{build}/client/tally", f"--server={addr}", *a],
                                          capture_output=True, text=True, timeout=60)
        for _ in range(100):
            if tally("health").returncode == 0:
                break
            time.sleep(0.05)
        for name in ("w1", "w2"):
            procs.append(subprocess.Popen(
                [f"{build}/worker/tally-worker", f"--server={addr}", "--devices=cpu:1",
                 f"--name={name}", "--health_port=-1"], stdout=log(name), stderr=subprocess.STDOUT))
        spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "long-synthetic.yaml")
        out = tally("submit", spec)
        assert out.returncode == 0, out.stderr
        job = out.stdout.splitlines()[0]

        options = webdriver.ChromeOptions()
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1280,1000"):
            options.add_argument(a)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        base = f"http://127.0.0.1:{http}/"

        def wait_for(check, what, seconds=30):
            deadline = time.time() + seconds
            while time.time() < deadline:
                try:
                    value = check()
                    if value:
                        return value
                except Exception:  # the page is between refreshes
                    pass
                time.sleep(0.2)
            raise AssertionError(f"timed out waiting for {what}")

        driver.get(base)
        wait_for(lambda: job in driver.find_element(By.ID, "jobs").text, "the job in the list")
        driver.get(base + "#/job/" + job)

        def points():
            return int(driver.find_element(By.CSS_SELECTOR, "svg[data-chart=loss]")
                       .get_attribute("data-points"))
        first = wait_for(lambda: points() >= 2 and points(), "loss points")
        second = wait_for(lambda: points() > first and points(), "more loss points", 20)
        workers = wait_for(lambda: driver.find_element(By.ID, "workers").text, "the worker table")
        assert "w1" in workers and "w2" in workers, workers
        # Clocks and lag per worker (the 5th and 6th cells), the slowest marked.
        def worker_rows():
            rows = driver.find_elements(By.CSS_SELECTOR, "#workers tr")[1:]
            return [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
        rows = wait_for(lambda: (lambda r: len(r) == 2 and all(c[4].isdigit() for c in r)
                                 and any("slowest" in c[9] for c in r) and r)(worker_rows()),
                        "clocks and the slowest marked")
        assert all(int(c[4]) > 0 and c[5].isdigit() for c in rows), rows
        wait_for(lambda: "joined as rank" in driver.find_element(By.ID, "events").text, "events")
        if "--screenshot" in sys.argv:
            driver.save_screenshot(os.path.join(os.path.dirname(__file__), "..", "docs",
                                                "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors

        # An unknown job: 404 from the API, and the page says so without dying.
        try:
            urllib.request.urlopen(base + "api/jobs/job-999")
            raise AssertionError("an unknown job answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 404, e.code
        try:
            urllib.request.urlopen(base + "no/such/page")
            raise AssertionError("a bad path answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 404, e.code

        # The report of the job, once cancelled: one file, no server.
        assert tally("cancel", job).returncode == 0
        report = os.path.join(tmp, "report.html")
        out = tally("report", job, f"--output={report}")
        assert out.returncode == 0, out.stderr
        driver.get("file://" + report)
        shown = wait_for(lambda: points() >= 2 and points(), "the report's loss curve", 10)
        assert job in driver.find_element(By.TAG_NAME, "h2").text
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        print(f"dashboard: {job} drew {first} then {second} loss points; workers w1 and w2 listed; "
              f"report draws {shown} points")
        return 0
    finally:
        if driver is not None:
            driver.quit()
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
