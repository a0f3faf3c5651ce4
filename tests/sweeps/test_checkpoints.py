"""Mid-run checkpoints of the engine's programs (`RoundProgram.state_dict`, `IterationProgram.state_dict`): a program
stopped at a safe point and rebuilt from its saved state (through `torch.save`, as a checkpoint file holds it)
yields the rest of its rows bit for bit as the program that never stopped, for every algorithm's batch of seeds and
for a run alone."""
from __future__ import annotations

import pytest
import torch

from helpers import CASES, HUNG, SEEDS, build, interrupted, rows_of


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resumed_batch_gives_the_rows_of_one_never_stopped(name):
    make, federation, hp, _ = CASES[name]
    problem, algorithm = make(), name.partition(":")[0]
    whole, points = build(problem, algorithm, federation, hp, SEEDS), [0]
    whole.safe_point = lambda program: points.__setitem__(0, points[0] + 1)
    expected = rows_of(whole)
    for at in (1, points[0] // 2 + 1):  # after the first round (iteration), and midway (runs may diverge early)
        resumed, statuses = interrupted(lambda: build(problem, algorithm, federation, hp, SEEDS), at)
        assert resumed == expected
        assert statuses == [sim.status for sim in whole.sims]


@pytest.mark.parametrize("name", ["fedmid", "ascd_pfl", "fedxl2"])
def test_a_resumed_run_alone_gives_its_rows(name):
    make, federation, hp, _ = CASES[name]
    problem, algorithm = make(), name.partition(":")[0]
    expected = rows_of(build(problem, algorithm, federation, hp, [3]))
    resumed, _ = interrupted(lambda: build(problem, algorithm, federation, hp, [3]), 4)
    assert resumed == expected


def test_a_checkpoint_from_before_the_bit_counters_resumes_with_the_bits_its_floats_make():
    """Checkpoints saved before `comm_up_bits`/`comm_down_bits` existed (no transforms then) resume: each counter
    is its float count at the dtype's width, and the rows go on as the never-stopped program's."""
    make, federation, hp, _ = CASES["fedmid"]
    problem = make()
    expected = rows_of(build(problem, "fedmid", federation, hp, SEEDS))

    def without_bits(state):
        for run in state["runs"]:
            del run["comm_up_bits"], run["comm_down_bits"]

    resumed, _ = interrupted(lambda: build(problem, "fedmid", federation, hp, SEEDS), 3, without_bits)
    assert resumed == expected
    assert expected[0][-1]["comm_up_bits"] == 64 * expected[0][-1]["comm_up"] > 0  # float64: the width it assumes


# -- fedbench run: checkpoints, --resume; the sweep's progress line -----------------------------------------------
RUN_RECIPE = """\
name: resumable
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05, data_seed: 0}
federation: {rounds: 4000, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: 1.0e-2}
seeds: 3
eval_every: 200
checkpoints: {every_seconds: 0, every_rounds: 1000}
"""


def test_run_killed_then_resumed_gives_the_rows_of_one_never_stopped(tmp_path):
    """`fedbench run` of three seeds as one program, killed (SIGKILL) once it has saved a checkpoint, then run again
    with --resume: the rows written are those of the run never stopped. With neither --resume nor --restart, a run
    that finds the checkpoint is refused (nothing dropped); with --restart it starts anew."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "resumable.yaml"
    path.write_text(RUN_RECIPE)
    base = [sys.executable, "-m", "cli", "run", str(path), "--all-seeds", "--no-track",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]

    def run(*extra):
        done = subprocess.run(base + list(extra), cwd=root, capture_output=True, text=True, timeout=HUNG)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("--json", str(tmp_path / "clean.json"))
    folder = tmp_path / "checkpoints" / "resumable"
    killed = subprocess.Popen(base, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + HUNG
    while not list(folder.glob("*.pt")):
        assert killed.poll() is None and time.monotonic() < deadline, "no checkpoint saved"
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    saved = next(folder.glob("*.pt"))
    checkpoint = torch.load(saved, weights_only=True)
    assert 0 < checkpoint["program"]["rounds_done"] < 4000  # killed between its first checkpoint and its end
    kept = {path: path.read_bytes() for path in folder.iterdir()}
    refused = subprocess.run(base, cwd=root, capture_output=True, text=True, timeout=HUNG)  # neither flag: refused
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (f"an interrupted run of these runs saved a checkpoint at round {checkpoint['program']['rounds_done']:,} "
            f"({saved}); expected --resume to go on from it or --restart to start at round 0") in " ".join(
                (refused.stdout + refused.stderr).split())
    run("--resume", "--json", str(tmp_path / "resumed.json"))
    assert json.loads((tmp_path / "resumed.json").read_text()) == json.loads((tmp_path / "clean.json").read_text())
    assert not list(folder.glob("*.pt"))  # the program ended: its checkpoint removed
    for path, data in kept.items():  # the interrupted run's checkpoint again, this time dropped
        path.write_bytes(data)
    run("--restart", "--json", str(tmp_path / "restarted.json"))
    assert json.loads((tmp_path / "restarted.json").read_text()) == json.loads((tmp_path / "clean.json").read_text())
    assert not list(folder.glob("*.pt"))
    assert "no checkpoint of these runs" in run("--resume", "--set", "federation.rounds=1000")


def test_the_progress_line_counts_in_flight_runs_by_their_rounds():
    from sweeps.display import sweep_progress

    counts = {"finished": 2, "diverged": 1, "failed": 0, "running": 4,
              "in_flight": {3: (500.0, 1000), 4: (250.0, 1000), 5: (0, 1000), 6: (100.0, 200)}}
    done, line = sweep_progress(counts)
    assert done == pytest.approx(3 + 0.5 + 0.25 + 0 + 0.5)
    assert line == "running 4 (r500/1000, r250/1000, r0/1000 …) · diverged 1 · failed 0"
    assert sweep_progress({**counts, "running": 0, "in_flight": {}}) == (3, "running 0 · diverged 1 · failed 0")
