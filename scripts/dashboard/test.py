#!/usr/bin/env python3
"""make test-dashboard: the coordinator's dashboard in a real browser (headless Chromium through
Selenium and Debian's chromium-driver) against the simulated lab of `make lab`.

Starts scripts/lab.sh --serve (the air, a coordinator, three agents), then as a stranger and as
the operator: the sign-in page, a wrong credential refused, sign-in through the form, every page
loaded with no console error, no Content-Security-Policy violation and no asset from anywhere else, a live run's numbers changing on
screen while it runs (no reload: a marker set in the page survives), the matrix and the strip
filling in, the finished run's downloads (with the session; 401 without), a request without the
cookie getting nothing, the run's page as the run's home (the progress by the nodes' phase,
the thresholds, charts over run time, the coordinator's log lines, every report file linked and
report.html's links working signed in), the CSRF-protected abort button pressed (and a form without the token
refused), sign-out. Every wait has a bound; no sleep is an assertion. Screenshots of each page
(sign-in, Lab, the run's page live and finished, Runs, Trends, the studies list, a study's page)
and a summary go to results/test-dashboard/. Exit 0 when all passed, 1 otherwise.
Usage: scripts/dashboard/test.py [BIN] [OUT]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, ".build/debug/herald-lab"))
OUT = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "results/test-dashboard"))

checks = []


def check(ok, what):
    checks.append((bool(ok), what))
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    return ok


def wait(what, seconds, condition, interval=0.2):
    """Polls `condition` until it returns a true value or `seconds` pass; the value, or None."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            value = condition()
        except Exception:  # the page is between renders: try again
            value = None
        if value:
            return value
        time.sleep(interval)
    print(f"timed out after {seconds} s waiting for {what}", flush=True)
    return None


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url, cookie=None, method="GET", data=None, headers=None):
    """(status, headers, body) without following redirects."""
    h = dict(headers or {})
    if cookie:
        h["Cookie"] = cookie
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def start_lab(work):
    env = dict(os.environ, BIN=BIN, LAB_WORK=work)
    lab = subprocess.Popen([os.path.join(REPO, "scripts/lab.sh"), "--serve", "3", os.path.join(work, "results")], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    info = {}

    def read():
        for line in lab.stdout:
            lines.append(line)
            m = re.search(r"dashboard:\s+(\S+)/\s+sign in with the operator credential: (\S+)", line)
            if m:
                info["url"], info["credential"] = m.group(1), m.group(2)
    threading.Thread(target=read, daemon=True).start()
    if not wait("the lab's dashboard line", 90, lambda: "url" in info):
        print("".join(lines))
        raise SystemExit("the lab did not start")
    return lab, info["url"], info["credential"]


def submit(url, token_file, plan_file, out):
    """`herald-lab run` in the background; its dashboard line (the run's page) once printed."""
    run = subprocess.Popen([BIN, "run", plan_file, "--coordinator", url, "--token-file", token_file, "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []

    def read():
        for line in run.stdout:
            lines.append(line)
    threading.Thread(target=read, daemon=True).start()
    page = wait("herald-lab run's dashboard line", 30,
                lambda: next((m.group(1) for l in lines for m in [re.match(r"dashboard: (\S+)", l)] if m), None))
    return run, page, lines


def console_errors(driver, page):
    """No console error, and (said apart) no Content-Security-Policy violation: the pages'
    policy allows script and style from /static/ only, so an inline script, style element,
    style attribute or handler left in a page would show here. The style sheet is applied."""
    entries = driver.get_log("browser")
    errors = [e for e in entries if e.get("level") == "SEVERE"]
    csp = [e for e in entries if "Content Security Policy" in e.get("message", "")]
    check(not csp, f"{page}: no Content-Security-Policy violation" + (f": {csp}" if csp else ""))
    check(not errors, f"{page}: no console errors" + (f": {errors}" if errors else ""))
    styled = driver.execute_script(
        "return Array.from(document.styleSheets).some(s => s.href && s.href.endsWith('/static/dashboard.css') && s.cssRules.length > 0)")
    if "/files/" not in driver.current_url:
        check(styled, f"{page}: the style sheet /static/dashboard.css is applied")


def same_origin_only(driver, base, page):
    urls = driver.execute_script(
        "return Array.from(document.querySelectorAll('[src],[href]')).map(e => e.getAttribute('src') || e.getAttribute('href'))")
    foreign = [u for u in urls if re.match(r"^[a-z]+:", u) and not u.startswith(base) and not u.startswith("data:")]
    check(not foreign, f"{page}: no asset from elsewhere" + (f": {foreign}" if foreign else ""))


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".png") or f == "summary.json":
            os.remove(os.path.join(OUT, f))
    work = tempfile.mkdtemp(prefix="heraldlab-dash.")
    lab, base, credential = start_lab(work)
    token_file = os.path.join(work, "token")
    figures = {}
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000",
              "--no-first-run", "--disable-background-networking", "--disable-component-update"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    runs = []
    try:
        shot = lambda name: driver.save_screenshot(os.path.join(OUT, name))
        # A stranger: the sign-in page, nothing else.
        status, headers, body = fetch(base + "/lab")
        check(status == 303 and headers.get("Location") == "/" and b"agent1" not in body, "stranger: /lab redirects to sign-in, no data")
        driver.get(base + "/")
        check(driver.find_elements(By.ID, "credential"), "GET / serves the sign-in form")
        console_errors(driver, "sign-in")
        same_origin_only(driver, base, "sign-in")
        shot("01-signin.png")
        driver.find_element(By.ID, "credential").send_keys("not-the-credential-0123456789")
        driver.find_element(By.ID, "signin").click()
        check(wait("the refusal", 10, lambda: driver.find_elements(By.ID, "error")), "a wrong credential is refused on the form")
        driver.get_log("browser")  # the 401 of the refused form is expected
        # Sign in through the form.
        driver.find_element(By.ID, "credential").send_keys(credential)
        driver.find_element(By.ID, "signin").click()
        check(wait("the Lab page", 10, lambda: driver.current_url.endswith("/lab")), "signed in: the Lab page")
        check(wait("three alive agents", 20, lambda: len(driver.find_elements(By.CSS_SELECTOR, "#agents td.alive")) == 3), "Lab: three agents alive")
        cookie = next(c for c in driver.get_cookies() if c["name"] == "heraldlab_session")
        check(cookie["httpOnly"] and cookie.get("sameSite") == "Strict", "the session cookie is HttpOnly and SameSite=Strict")
        session = "heraldlab_session=" + cookie["value"]
        console_errors(driver, "Lab")
        same_origin_only(driver, base, "Lab")
        shot("02-lab.png")

        # A live run: its numbers change on screen without a reload.
        plan = os.path.join(work, "live.yaml")
        with open(plan, "w") as f:
            f.write("name: dashlive\ndescription: the dashboard test's live run\nduration: 40s\nwarmup: 2s\nnodes:\n"
                    "  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n  - {name: n3, position: [2, 0]}\n")
        run, page, run_lines = submit(base, token_file, plan, os.path.join(work, "fetched"))
        runs.append(run)
        check(page and page.startswith(base + "/runs/"), f"herald-lab run prints the run's dashboard URL ({page})")
        run_id = page.rsplit("/", 1)[1]
        driver.get(page)
        driver.execute_script("window.__noReload = 'kept';")
        # Issue 40: the progress follows the nodes; armed nodes waiting for the start are not "running".
        phase = wait("the progress", 10, lambda: driver.find_element(By.ID, "state").text)
        left = driver.find_element(By.ID, "left").text
        check(phase in ("arming", "armed", "running") and (phase != "armed" or ("starting" in left and "s left" not in left)),
              f"live: the progress names the phase the nodes are in ({phase} {left})")
        check(driver.find_elements(By.CSS_SELECTOR, "#steps li.current") and driver.find_elements(By.ID, "bar"), "live: the progress steps and bar")
        check("detection ≥" in driver.find_element(By.ID, "thresholds").text, "live: the plan's thresholds shown")
        reads = lambda: int(driver.find_element(By.ID, "totalreads").text)
        first = wait("reads on screen", 60, lambda: driver.find_element(By.ID, "state").text == "running" and reads() > 0 and reads())
        check(first, f"live: the run is running with reads on screen ({first})")
        later = wait("the reads to change", 30, lambda: reads() != first and reads())
        check(later and later > first, f"live: reads changed on screen while it runs ({first} -> {later})")
        check(driver.execute_script("return window.__noReload") == "kept", "live: no reload (the page's marker survived)")
        check(wait("the matrix", 30, lambda: len(driver.find_elements(By.CSS_SELECTOR, "#matrix td.y")) == 6), "live: the detection matrix filled in (6 of 6 pairs)")
        check(wait("the strip", 30, lambda: driver.find_elements(By.CSS_SELECTOR, "#strip td.y")), "live: the pairs x time strip shows windows hit")
        check(wait("the strip's time axis", 10, lambda: "0:00" in driver.find_element(By.CSS_SELECTOR, "#strip tr.axis").text), "live: the strip has a time axis (run time)")
        heads = [e.get_attribute("textContent") for e in driver.find_elements(By.CSS_SELECTOR, "#matrix th.v")]
        check(heads == ["n1", "n2", "n3"], f"live: the matrix's columns carry whole names ({heads})")
        check(wait("the charts", 30, lambda: len(driver.find_elements(By.CSS_SELECTOR, "#charts svg polyline")) >= 5),
              "live: charts of pairs detected, reads and RSSI rows per node")
        check("run time" in (driver.find_element(By.ID, "charts").get_attribute("textContent") or ""), "live: the charts' time axis is run time")
        check(wait("the run's log lines", 10, lambda: driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")), "live: the coordinator's log lines of the run")
        figures["live_reads"] = [first, later]
        console_errors(driver, "Run live")
        same_origin_only(driver, base, "Run live")
        shot("03-run-live.png")
        # The stranger again, on the run's events and files.
        for path in [f"/runs/{run_id}/events", f"/runs/{run_id}/files/report.html", f"/runs/{run_id}"]:
            status, headers, body = fetch(base + path)
            check(status in (401, 303) and run_id.encode() not in body and b"agent1" not in body, f"stranger: {path} gets {status} and nothing of the run")
        done = wait("the run to end", 150, lambda: driver.find_element(By.ID, "state").text in ("complete", "aborted", "failed") and driver.find_element(By.ID, "verdict").text)
        check(done, f"live: the run ended and its verdict is on screen ({done})")
        check(driver.execute_script("return window.__noReload") == "kept", "live: still the same page at the end")
        shot("04-run-finished.png")
        console_errors(driver, "Run finished")
        # The run's home: its page links the report, the machine-readable files and the bundle.
        names = wait("the files' links", 60, lambda: [a.get_attribute("href").rsplit("/", 1)[1] for a in driver.find_elements(By.CSS_SELECTOR, "#files a")])
        expected = ["report.html", "junit.xml", "summary.json", "pairs.csv", "formal-summary.csv", "formal-continuity.csv", "summary-discovery-pairs.csv", "bundle.tar.gz"]
        check(names == expected, f"finished: the run's page links every file ({names})")
        for name in names or []:
            status, _, body = fetch(f"{base}/runs/{run_id}/files/{name}", cookie=session)
            check(status == 200 and body, f"finished: {name} answers the session ({status}, {len(body)} bytes)")
        # report.html from the run's page: no script runs in it, its links carry the session.
        driver.find_element(By.CSS_SELECTOR, "#files a[href$='/report.html']").click()
        check(wait("the report", 10, lambda: "/files/report.html" in driver.current_url and "dashboard" in driver.page_source), "report: opened from the run's page")
        shot("04b-report.png")
        report_links = re.findall(r'href="([^"#][^"]*)"', driver.page_source)
        for name in ["summary.json", "pairs.csv", "junit.xml", "formal-summary.csv"]:
            check(name in report_links, f"report: links {name}")
        try:
            driver.find_element(By.CSS_SELECTOR, "#dashboard a").click()
            back = wait("back on the run's page", 10, lambda: driver.current_url.endswith(f"/runs/{run_id}") and driver.find_elements(By.ID, "files") and driver.current_url)
        except Exception as e:  # noqa: BLE001 - said in the check
            back = None
            print(f"the report's link back: {e}", flush=True)
        check(back, f"report: its link back reaches the run's page signed in ({driver.current_url})")
        wait("herald-lab run to exit", 60, lambda: run.poll() is not None)
        check(run.returncode in (0, 1), f"herald-lab run exited {run.returncode}")

        # Runs: the verdict and the downloads (with the session only).
        driver.get(base + "/runs")
        row = wait("the run's row", 10, lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "#runs tr") if run_id in r.text])
        # Issue 40: the list is live (its stream connected, the summary strip filled in).
        check(wait("the Runs page live", 15, lambda: driver.find_element(By.ID, "conn").text == "live"), "Runs: live (server-sent events)")
        check(driver.find_element(By.ID, "s-alive").text.isdigit(), "Runs: the summary strip's agents alive")
        check(row and ("PASS" in row[0].text or "FAIL" in row[0].text or "infra" in row[0].text), "Runs: the run with its verdict")
        links = [a.get_attribute("href") for a in row[0].find_elements(By.TAG_NAME, "a")] if row else []
        for name in ["report.html", "junit.xml", "summary.json", "bundle.tar.gz"]:
            url = next((l for l in links if l.endswith("/files/" + name)), None)
            status, _, body = fetch(url, cookie=session) if url else (0, {}, b"")
            check(status == 200 and body, f"Runs: {name} downloads with the session ({len(body)} bytes)")
            if url:
                status, _, body = fetch(url)
                check(status == 401 and run_id.encode() not in body, f"stranger: {name} gets 401")
        console_errors(driver, "Runs")
        same_origin_only(driver, base, "Runs")
        shot("05-runs.png")

        driver.get(base + "/trends")
        check(wait("a trend chart", 10, lambda: driver.find_elements(By.CSS_SELECTOR, ".trend svg")), "Trends: the plan's metrics charted")
        console_errors(driver, "Trends")
        same_origin_only(driver, base, "Trends")
        shot("06-trends.png")

        # A CSRF-protected button: abort a second run from its page; a form without the token fails.
        plan2 = os.path.join(work, "abort.yaml")
        with open(plan2, "w") as f:
            f.write("name: dashabort\nduration: 5m\nwarmup: 2s\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n")
        run2, page2, _ = submit(base, token_file, plan2, os.path.join(work, "fetched2"))
        runs.append(run2)
        id2 = page2.rsplit("/", 1)[1]
        driver.get(page2)
        check(wait("the second run running", 60, lambda: driver.find_element(By.ID, "state").text == "running"), "abort: the second run is running")
        status, _, _ = fetch(base + f"/runs/{id2}/abort", cookie=session, method="POST", data=b"csrf=wrong",
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
        check(status == 403, f"abort without the session's CSRF token: {status}")
        check(driver.find_element(By.ID, "state").text == "running", "abort: still running after the forged form")
        driver.find_element(By.ID, "abort").click()
        ended = wait("the abort", 90, lambda: driver.find_element(By.ID, "state").text in ("aborted", "complete", "failed") and driver.find_element(By.ID, "state").text)
        check(ended == "aborted", f"abort: the button stopped the run ({ended})")
        # Issue 40: an aborted run has no verdict (never the FAIL of its short logs).
        said = wait("the aborted run's verdict line", 60, lambda: driver.find_element(By.ID, "verdict").text)
        check(said and said.startswith("aborted: no verdict") and "verdict: FAIL" not in said, f"abort: no verdict on screen ({said})")
        console_errors(driver, "Run aborted")
        shot("07-run-aborted.png")
        wait("the second herald-lab run to exit", 60, lambda: run2.poll() is not None)

        # A study run on the lab (two levels, one run each): Trends lists it, its page shows the effects.
        plan3 = os.path.join(work, "study.yaml")
        with open(plan3, "w") as f:
            f.write("name: dashstudy\nduration: 10s\nwarmup: 2s\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
                    "  - {name: n3, position: [2, 0]}\nstudy:\n  factors:\n    - {path: sensor.advertInterval, levels: [100ms, 1s]}\n  repeats: 1\n")
        study = subprocess.run([BIN, "run", plan3, "--coordinator", base, "--token-file", token_file, "--out", os.path.join(work, "studies")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
        check(study.returncode == 0, f"herald-lab run STUDY on the lab (exit {study.returncode})" + ("" if study.returncode == 0 else ": " + study.stdout[-2000:]))
        driver.get(base + "/trends")
        check(wait("the study on Trends", 10, lambda: driver.find_elements(By.CSS_SELECTOR, "#studies a[href='/studies/dashstudy']")), "Trends: the study listed")
        # Issue 40: points by date that open their run's page, and the study's two series named
        # by the setting that differs.
        check(len(driver.find_elements(By.CSS_SELECTOR, ".trend svg a[href^='/runs/'] circle")) > 0, "Trends: each point opens its run's page")
        named = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "h2 .settings")]
        check(any("advertInterval=" in t for t in named), f"Trends: the study's series named by the setting that differs ({named})")
        check("recorded (UTC)" in driver.page_source, "Trends: a date axis")
        console_errors(driver, "Trends with the study")
        driver.execute_script("document.getElementById('studies').scrollIntoView()")
        shot("08a-studies.png")
        driver.get(base + "/studies/dashstudy")
        check(wait("the forest plot", 60, lambda: driver.find_elements(By.CSS_SELECTOR, ".forest svg")), "Study: the forest plot of its effects")
        check(len(driver.find_elements(By.CSS_SELECTOR, ".estimates tr")) > 1, "Study: each metric's estimates")
        console_errors(driver, "Study")
        same_origin_only(driver, base, "Study")
        shot("08b-study.png")

        # Sign out: the cookie opens nothing any more.
        driver.get(base + "/lab")
        driver.find_element(By.ID, "signout").click()
        check(wait("the sign-in page", 10, lambda: driver.find_elements(By.ID, "credential")), "signed out: back at the sign-in page")
        status, headers, _ = fetch(base + "/lab", cookie=session)
        check(status == 303, "the old cookie opens nothing after sign-out")
        console_errors(driver, "sign-out")
        shot("09-signed-out.png")
    finally:
        driver.quit()
        for r in runs:
            if r.poll() is None:
                r.kill()
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
    failed = [w for ok, w in checks if not ok]
    with open(os.path.join(OUT, "summary.json"), "w") as f:
        json.dump({"passed": len(checks) - len(failed), "failed": failed, "figures": figures,
                   "screenshots": sorted(p for p in os.listdir(OUT) if p.endswith(".png"))}, f, indent=2)
    if failed:
        print(f"test-dashboard: the lab's logs are kept in {work}/logs")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"test-dashboard: {len(checks) - len(failed)} of {len(checks)} checks passed; screenshots in {OUT}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
