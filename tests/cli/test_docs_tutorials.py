"""The site's tutorials, and the how-to "Write a problem", run exactly as shown: every code block of
docs/tutorials/*.md and docs/how-to/write-a-problem.md, in page order, in one fresh folder per page.

What a block is decides what the test does with it:
- a block with a title (```python title="my_method.py"```) is a file the reader writes: written as shown;
- a `bash` block is typed into a shell: run by bash (`set -e`), with the venv's `fedbench` first on PATH;
- a `python` block without a title is run by the venv's Python;
- a `text` block right after a command is what the command printed, shortened: each of its lines must appear
  in that command's output, in order, where `<...>` stands for any text and a line `...` for any lines (spaces
  and line breaks are compared as one space, since the terminal's width wraps them).
The pages shorten their runs with `--set` so that each tutorial takes about a minute; their `fedbench sweep`
commands join the session's shared Ray (RAY_ADDRESS, which `--address` defaults to) rather than each starting one,
as a reader's would where RAY_ADDRESS is set. The how-to starts no Ray.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
HOW_TO = ROOT / "docs" / "how-to"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


@dataclass
class Block:
    language: str
    title: str | None
    text: str


def blocks(page: Path) -> list[Block]:
    found = []
    for language, attributes, text in FENCE.findall(page.read_text()):
        title = re.search(r'title="([^"]+)"', attributes)
        found.append(Block(language, title.group(1) if title else None, text))
    return found


def squeeze(text: str) -> str:
    return " ".join(text.split())


def assert_printed(shown: str, output: str) -> None:
    """Each shown line in the output, in order (`<...>`: any text; a line `...`: any lines)."""
    position, printed = 0, squeeze(output)
    for line in shown.splitlines():
        if not line.strip() or line.strip() == "...":
            continue
        pattern = r"\s*".join(
            ".+?" if re.fullmatch(r"<[^>]+>", part) else re.escape(part)
            for part in re.split(r"(<[^>]+>)", squeeze(line)) if part)
        match = re.compile(pattern).search(printed, position)
        assert match, f"not printed: {line!r}\n--- after ---\n{printed[position:]}"
        position = match.end()


def run_page(page: Path, folder: Path, ray_address: str | None = None) -> list[tuple[Block, str]]:
    """Every block of the page in `folder` (its sweeps on the Ray at `ray_address`, if given); each command's block
    with its output."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the default store: ./mlflow.db
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    ran, last_output = [], None
    for block in blocks(page):
        if block.title:
            (folder / block.title).write_text(block.text)
            continue
        if block.language == "text":
            assert last_output is not None, f"{page.name}: an output block with no command before it"
            assert_printed(block.text, last_output)
            last_output = None
            continue
        command = {"bash": ["bash", "-e", "-c", block.text], "python": [sys.executable, "-c", block.text]}.get(
            block.language)
        assert command, f"{page.name}: a {block.language} block that neither runs nor is a file: {block.text[:60]!r}"
        # one stream, as a terminal shows it: an error line and what follows it stay in order
        done = subprocess.run(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{block.text}\n--- output ---\n{done.stdout}"
        last_output = done.stdout
        ran.append((block, last_output))
    return ran


def trial_runs(tracking_uri: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    return [run for run in client.search_runs([found.experiment_id], max_results=200)
            if run.data.tags.get("role") == "trial"]


@pytest.mark.ray
def test_compare_your_own_method_runs_as_shown(tmp_path, tracking_uri, ray_address):
    """The page's method file (at most 30 lines of code: one short file is the point) sweeps beside the paper's
    five methods, its grid of two step sizes included, into the paper's experiment and report."""
    run_page(TUTORIALS / "compare-your-own-method.md", tmp_path, ray_address)
    assert len((tmp_path / "my_method.py").read_text().strip().splitlines()) <= 30
    runs = trial_runs(tracking_uri, "bao2022-lasso")
    mine = sorted(run.data.params["algorithm.client_lr"] for run in runs if run.data.tags["algorithm"] == "my_method")
    assert mine == ["0.001", "0.01"], mine
    assert len(runs) == 7  # the paper's five methods and my_method's two step sizes, one seed each
    assert all(run.info.status == "FINISHED" for run in runs)
    diverged = [(run.data.tags["algorithm"], run.data.params["algorithm.client_lr"]) for run in runs
                if run.data.tags["status"] == "diverged"]
    assert diverged == [("my_method", "0.01")], diverged  # as the page says (issue 47 item 11)
    assert "my_method" in (tmp_path / "reports" / "bao2022-lasso" / "report.md").read_text()


@pytest.mark.ray
def test_reproduce_a_paper_runs_as_shown(tmp_path, tracking_uri, ray_address):
    run_page(TUTORIALS / "reproduce-a-paper.md", tmp_path, ray_address)
    assert len(trial_runs(tracking_uri, "bao2022-lasso")) == 10  # five methods, two seeds
    assert (tmp_path / "reports" / "bao2022-lasso" / "figure.png").stat().st_size > 10_000
    assert (tmp_path / "report-by-communication" / "figure.png").stat().st_size > 10_000


@pytest.mark.ray
def test_bring_your_own_network_runs_as_shown(tmp_path, tracking_uri, ray_address):
    """The page's network file runs in the shipped vision recipe (FedAvg by `fedbench run`, then both methods by
    the sweep), each run carrying the file's sha256, and its exported model loads into the
    page's class with the run's last test accuracy (the page's own block asserts it)."""
    ran = run_page(TUTORIALS / "bring-your-own-network.md", tmp_path, ray_address)
    assert any("loaded into Net" in output for _, output in ran)
    digest = hashlib.sha256((tmp_path / "my_nets.py").read_bytes()).hexdigest()
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("vision-fashion-mnist")
    runs = [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("role") != "sweep"]
    assert sorted(run.data.tags["algorithm"] for run in runs) == ["fedavg", "fedavg", "scaffold"]
    assert all(run.data.params["code.model"] == digest and run.info.status == "FINISHED" for run in runs)


def test_write_a_problem_runs_as_shown(tmp_path):
    run_page(HOW_TO / "write-a-problem.md", tmp_path)
    curves = json.loads((tmp_path / "scaffold.json").read_text())  # two seeds of the page's own problem
    assert len(curves) == 2 and all(rows[-1]["round"] == 60 for rows in curves.values())


def test_every_block_of_the_run_pages_is_run_or_written():
    """No block a reader sees is left out: each is a file, a command, a Python snippet or a command's output."""
    pages = sorted(TUTORIALS.glob("*.md"))
    assert {page.name for page in pages} == {"compare-your-own-method.md", "reproduce-a-paper.md",
                                             "bring-your-own-network.md"}
    for page in [*pages, HOW_TO / "write-a-problem.md"]:
        found = blocks(page)
        assert found, page
        for block in found:
            assert block.title or block.language in ("bash", "python", "text"), (page.name, block.language)
        # the page's text fences and the blocks found agree: a fence the pattern misses would go unrun
        assert page.read_text().count("\n```") == 2 * len(found), page.name


def test_shown_output_is_matched_line_by_line_with_placeholders():
    output = "papers/x: ok — problem lasso, algorithms a, \nb, 2 configurations\nreport: /tmp/f/index.html (9 files)"
    assert_printed("papers/x: ok — problem lasso, algorithms a, b, 2 configurations\n...\nreport: <p>/index.html "
                   "(<n> files)", output)
    with pytest.raises(AssertionError):
        assert_printed("report: <p>/index.html\npapers/x: ok", output)  # out of order
