"""What a person looks at, opened in a real browser: the report's index.html, and `fedbench ui`'s page of a
sweep's runs in MLflow's UI, both in headless Chromium (Debian's `chromium` package, which `.ci/run` installs).

The browser is driven by Playwright's Python client with `executable_path` set to that Chromium (Playwright
downloads no browser of its own then). Chosen over the bare DevTools protocol because MLflow's UI is a
single-page app that renders everything client-side after several API calls: Playwright's waits for a selector
or a text, its in-page evaluation (images' natural sizes) and its screenshots replace a hand-written event loop
over a websocket. Each test writes a screenshot into its tmp dir and prints the path (`pytest -s` shows it).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.browser, pytest.mark.ray]  # Chromium, on the pages of a sweep on Ray

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MISSING = ("playwright is not installed (pip install -e '.[test]')" if importlib.util.find_spec("playwright") is None
           else None if Path(CHROMIUM).exists()
           else "no Chromium at /usr/bin/chromium or on PATH: install Debian's `chromium` package (.ci/run does)")
if MISSING:  # CI (FEDBENCH_REQUIRE_BROWSER=1, set by .ci/run) must run these tests, not skip them
    if os.environ.get("FEDBENCH_REQUIRE_BROWSER") == "1":
        raise RuntimeError(MISSING)
    pytest.skip(MISSING, allow_module_level=True)
from playwright import sync_api  # noqa: E402

from conftest import joined_env  # noqa: E402
from sweeps.recipe import load  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "papers" / "bao2022_lasso.yaml"
SHORT = ["--set", "federation.rounds=20", "--set", "eval_every=5", "--set", "seeds=2"]  # 5 methods x 2 seeds
ALGORITHMS = ("fedmid", "fedda", "fast_fedda", "c_fedda", "mc_fedda")
# The flags of a quiet, self-contained headless Chromium on a machine with no network beyond localhost.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def store(folder: Path) -> list[str]:
    return ["--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}"]


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory, ray_address) -> Path:
    """A real sweep (on the session's shared Ray, SQLite MLflow store, report) of a shipped paper recipe, shortened:
    10 runs."""
    folder = tmp_path_factory.mktemp("sweep")
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "sweep", str(RECIPE), *SHORT, *store(folder)],
                          cwd=folder, env=joined_env(ray_address), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    # Quiet by default: no MLflow/Alembic INFO line (a new store prints two), and the command that opens the runs.
    assert not re.search(r"\bINFO\b", output), output
    assert f"browse the runs: fedbench ui {RECIPE} --tracking-uri {store(folder)[1]} --open" in output, output
    return folder


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 900})
        yield context
        context.close()


def screenshot(page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    print(f"\nscreenshot: {path}")


def test_report_page_shows_every_figure_and_the_table(sweep_folder, browser, tmp_path):
    index = sweep_folder / "reports" / "bao2022-lasso" / "index.html"
    page = browser.new_page()
    page.goto(index.as_uri(), wait_until="load")
    images = page.evaluate("""() => Array.from(document.images).map(
        image => ({src: image.getAttribute('src'), complete: image.complete, width: image.naturalWidth,
                   height: image.naturalHeight}))""")
    assert len(images) >= 2 and "figure.png" in {image["src"] for image in images}
    undecoded = [image["src"] for image in images if not (image["complete"] and image["width"] > 0
                                                          and image["height"] > 0)]
    assert undecoded == [], f"images that did not decode: {undecoded}"
    rows = page.locator("table tbody tr")
    assert rows.count() >= len(ALGORITHMS)  # a best-configuration row per algorithm at least
    table = page.locator("table").first.inner_text()
    for label in ("FedMiD", "FedDA", "Fast-FedDA", "C-FedDA", "MC-FedDA"):
        assert label in table
    screenshot(page, tmp_path / "report.png")
    page.close()


@pytest.fixture
def ui_server(sweep_folder, free_tcp_port):
    """`fedbench ui RECIPE` on the sweep's store: its printed URLs, once it serves."""
    port = free_tcp_port
    server = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "ui", str(RECIPE), "--port", str(port),
                               *store(sweep_folder)],
                              cwd=sweep_folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "COLUMNS": "80"})
    urls: dict[str, str] = {}
    try:
        for line in server.stdout:
            if match := re.match(r"(runs|charts):\s+(\S+)", line):
                urls[match.group(1)] = match.group(2)
            if line.startswith("serving") or line.startswith("error"):
                assert line.startswith("serving"), line + server.stdout.read()
                break
        assert set(urls) == {"runs", "charts"}, urls
        yield urls
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_mlflow_ui_lists_the_sweep_runs_and_charts_their_curves(sweep_folder, ui_server, browser, tmp_path):
    page = browser.new_page()
    page.goto(ui_server["runs"])
    # The model-training runs view, every run of the sweep listed (grouped by configuration, seeds inside).
    page.get_by_text("Group by: configuration").wait_for(timeout=60_000)
    names = [f"{algorithm} (" for algorithm in ALGORITHMS]
    page.get_by_text(re.compile(r"^fedmid \(.* seed 1$")).first.wait_for(timeout=60_000)
    body = page.inner_text("body")
    for name in names:
        for seed in (0, 1):
            assert re.search(rf"^{re.escape(name)}.* seed {seed}$", body, re.M), (name, seed)
    assert "matching runs" in body
    assert "telemetry" not in body.lower()
    screenshot(page, tmp_path / "mlflow_runs.png")

    page.set_viewport_size({"width": 1400, "height": 3000})  # every chart in view: the UI renders only those
    page.goto(ui_server["charts"])
    page.get_by_text("Model metrics").first.wait_for(timeout=60_000)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and page.locator(".js-plotly-plot .scatterlayer .trace").count() == 0:
        page.wait_for_timeout(500)
    assert page.locator(".js-plotly-plot .scatterlayer .trace").count() > 0, "no curve drawn"
    # One chart per metric of the sweep's runs and none more (the parent's counts are tags): first the panels of
    # the report's figure (the recipe's `report.metrics`), in their order, then the others (in the order of the
    # runs' metrics: MLflow's), the communication counters among them.
    charts = page.evaluate("document.body.textContent")
    client = MlflowClient(store(sweep_folder)[1])
    runs = client.search_runs([client.get_experiment_by_name("bao2022-lasso").experiment_id], "tags.role = 'trial'")
    metrics = sorted({key for run in runs for key in run.data.metrics})
    assert len(runs) == 2 * len(ALGORITHMS) and "objective_gap" in metrics
    assert re.search(r"Model metrics\s*\((\d+)\)", charts).group(1) == str(len(metrics))
    titles = page.locator("[data-testid=experiment-view-compare-runs-card]").evaluate_all(
        "cards => cards.map(card => card.innerText.split('\\n')[0])")
    headline = load(RECIPE).report.metrics
    assert headline and set(headline) < set(metrics)
    assert titles[:len(headline)] == headline and sorted(titles) == metrics, titles
    assert {"comm_up", "comm_down"} < set(titles[len(headline):])
    screenshot(page, tmp_path / "mlflow_charts.png")
    page.close()
