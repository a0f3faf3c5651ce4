"""bench/gallery.py, which times every shipped recipe shortened and extrapolates its full-size time: the shortened
budgets, the line fit and its extrapolation, the header lines it writes (and that sweeps/shipped.py reads back),
and one recipe timed end to end."""
from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.shipped import describe, names

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gallery", ROOT / "bench" / "gallery.py")
gallery = sys.modules["gallery"] = importlib.util.module_from_spec(spec)  # a dataclass looks its module up there
spec.loader.exec_module(gallery)
Budget = gallery.Budget


def evaluations(rounds: int, eval_every: int) -> int:
    """The engine's schedule (fedbench.engine.runs): round 0, every `eval_every` rounds, and the last."""
    return 1 + rounds // eval_every + (rounds % eval_every != 0)


def test_the_line_through_two_timings_gives_the_fixed_cost_and_the_cost_per_round():
    fixed, per_round = 20.0, 0.05
    timings = tuple(fixed + per_round * n for n in (250, 500))
    assert gallery.fit((250, 500), timings) == pytest.approx((20.0, 0.05))
    got_fixed, got_per_round = gallery.fit((250, 500), timings)
    assert got_fixed + got_per_round * 2000 == pytest.approx(120.0)  # the full size, 2000 rounds


def test_a_pair_whose_line_has_a_negative_intercept_is_read_as_proportional():
    assert gallery.fit((100, 200), (10.0, 30.0)) == (0.0, pytest.approx(30.0 / 200))


@pytest.mark.parametrize("timings", [(30.0, 25.0), (30.0, 30.0)])
def test_a_pair_whose_longer_sweep_was_not_the_slower_gives_no_line(timings):
    assert gallery.fit((100, 200), timings) is None


def test_a_budget_of_rounds_keeps_the_period_of_evaluations_where_that_is_the_shorter():
    budget = Budget("rounds", 2000, (1,), 10)  # papers/bao2022_lasso
    n1, n2, keep_count = budget.lengths(4)
    assert (n1, n2, keep_count) == (250, 500, False)
    assert budget.overrides(n2, keep_count) == ["federation.rounds=500"]
    # evaluations grow as the rounds do: on the line with the full size
    counts = [evaluations(n, 10) for n in (n1, n2, 2000)]
    assert (counts[1] - counts[0]) / (n2 - n1) == pytest.approx((counts[2] - counts[1]) / (2000 - n2))


def test_a_long_eval_period_keeps_the_number_of_evaluations_instead():
    budget = Budget("rounds", 75000, (1,), 750)  # papers/bao2022_emnist62: 100 evaluations after round 0
    n1, n2, keep_count = budget.lengths(500)
    assert keep_count and (n1, n2) == (100, 200)
    sets = budget.overrides(n2, keep_count)
    assert sets == ["federation.rounds=200", "eval_every=2"]
    assert evaluations(n1, 1) == evaluations(n2, 2) == evaluations(75000, 750) == 101


def test_a_budget_of_iterations_keeps_whole_rounds_in_every_configuration():
    budget = Budget("iterations", 1600, (32,), 5)  # papers/guo2023_pauc_femnist: 50 rounds of 32 steps
    n1, n2, keep_count = budget.lengths(2)
    assert (n1, n2, keep_count) == (320, 640, False)
    assert all(n % 32 == 0 and (n // 32) % 5 == 0 for n in (n1, n2))
    grid = Budget("iterations", 3072, (1, 4, 16, 32, 64, 128), 24)  # papers/guo2023_pauc_ablation_k
    n1, n2, keep_count = grid.lengths(2)  # its period of 24 rounds at K = 128 is the whole budget: the count kept
    assert (n1, n2, keep_count) == (768, 1536, True)
    eval_every = int(grid.overrides(n2, keep_count)[1].split("=")[1])
    for k in grid.steps:  # whole rounds, evaluated as often as at full size
        assert n2 % k == 0 and evaluations(n2 // k, eval_every) == evaluations(3072 // k, 24)


def test_a_budget_that_cannot_be_halved_or_a_factor_of_one_runs_at_full_size():
    assert Budget("rounds", 2000, (1,), 10).lengths(1) is None
    assert Budget("rounds", 7, (1,), 5).lengths(2) is None  # a period of 5, or 7 / gcd(7, 5): neither fits twice


def test_the_lengths_of_every_shipped_recipe_are_valid_shortened_budgets():
    for name, factor in gallery.FACTORS.items():
        path = gallery.recipe_path(name)
        budget = gallery.budget_of(path, gallery.load(path))
        lengths = budget.lengths(factor)
        if lengths is None:
            continue
        n1, n2, keep_count = lengths
        assert n2 == 2 * n1 <= budget.full, name
        gallery.load(path, budget.overrides(n1, keep_count)).trials()  # the recipe's own checks accept it


@pytest.mark.parametrize("seconds, text", [(38, "~40 s"), (7.4, "~7 s"), (130, "~2 min"), (400, "~6.5 min"),
                                           (2040, "~34 min"), (7000, "~2 h"), (90000, "~25 h")])
def test_a_time_is_written_as_the_headers_write_it(seconds, text):
    assert gallery.approx(seconds) == text
    assert gallery.stated_seconds(text) == pytest.approx(seconds, rel=0.3)


@pytest.mark.parametrize("stated, seconds", [("~34 min (15 runs, report included)", 2040), ("~40 s (9 runs)", 40),
                                             ("~4-6 min with bao2022_lasso", 300), ("~1 h (5 seeds; ...)", 3600),
                                             ("— (hours, estimated)", None), (None, None)])
def test_the_stated_time_of_a_header(stated, seconds):
    assert gallery.stated_seconds(stated) == seconds


def test_a_header_is_rewritten_where_missing_or_off_by_more_than_the_tolerance():
    assert gallery.needs_update(None, 100, 2) and gallery.needs_update("— (a day, estimated)", 100, 2)
    assert not gallery.needs_update("~2 min", 200, 2) and not gallery.needs_update("~2 min", 61, 2)
    assert gallery.needs_update("~2 min", 241, 2) and gallery.needs_update("~2 min", 59, 2)


HEADER = """\
# paper: Bao et al., ICML 2022 (Fast-FedDA)
# reproduces: Fig. 1: federated Lasso
# time on 2 cores: ~2 min (make demo)
# Bao, Crawshaw, Luo, Liu (ICML 2022) §4, Figure 1: federated sparse linear regression.

name: x
# time on 2 cores: not a header line (after the first block)
"""


def test_a_time_line_is_replaced_in_place_and_a_new_one_follows_the_header_fields(tmp_path):
    row = {"recipe": "papers/x", "device": "cuda", "accelerator": "NVIDIA H200", "runs": "15", "factor": "4",
           "budget": "rounds", "full_s": "95.0", "cores": "16", "load": "1.0"}
    gpu = gallery.with_field(HEADER, "time on one GPU", gallery.header_value(row))
    cpu = gallery.with_field(gpu, "time on 2 cores",
                             gallery.header_value({**row, "device": "cpu", "full_s": "610", "cores": "2"}))
    lines = cpu.splitlines()
    assert lines[2] == "# time on 2 cores: ~10 min (15 runs, report included; bench/gallery.py, extrapolated from " \
                       "1/4 of the rounds)"
    assert lines[3] == "# time on one GPU: ~95 s (NVIDIA H200, 15 runs, report included; bench/gallery.py, " \
                       "extrapolated from 1/4 of the rounds)"
    assert lines[4:] == HEADER.splitlines()[3:]  # the rest as it was, the later look-alike line too
    path = tmp_path / "x.yaml"
    path.write_text(cpu)
    about = describe(path)  # what `fedbench recipes` and the gallery read back
    assert about["time on 2 cores"].startswith("~10 min (") and about["time on one GPU"].startswith("~95 s (NVIDIA")
    loaded = gallery.header_value({**row, "device": "cpu", "cores": "2", "load": "6.5"})
    assert loaded.endswith("1/4 of the rounds, the cores shared by a load of 6.5: an upper bound)")
    bare = gallery.with_field("name: x\n", "time on 2 cores", "~5 s (1 runs, report included)")
    assert bare.splitlines()[0] == "# time on 2 cores: ~5 s (1 runs, report included)"


def test_every_shipped_recipe_has_a_default_factor():
    assert set(gallery.FACTORS) == set(names())


def run_gallery(monkeypatch, capsys, *args: str) -> str:
    """`python bench/gallery.py ARGS` run in this process (its `main`, as the command line reaches it): its printed
    output; its exit with an error fails the test with that output. A process of its own would only add Python's
    start and these imports, ~2 s of CPU each time."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "gallery.py"), *args])
    try:
        gallery.main()
    except SystemExit as exit:
        pytest.fail(f"bench/gallery.py {' '.join(args)} exited with {exit.code}:\n{capsys.readouterr().out}")
    return capsys.readouterr().out


@pytest.mark.ray  # two `fedbench sweep` commands, on the session's shared Ray (RAY_ADDRESS)
def test_the_gallery_times_a_recipe_end_to_end_and_writes_its_header(tmp_path, ray_address, monkeypatch, capsys):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("""\
# paper: none
# reproduces: a tiny Lasso

name: tiny
problem: {name: lasso, clients: 8, samples_per_client: 16, dim: 20, support: 5, lam: 0.05}
federation: {rounds: 48, clients_per_round: 4, local_steps: 2, batch_size: 4}
algorithms:
  fedmid: {client_lr: 1.0e-2}
seeds: 2
eval_every: 2
""")
    table = tmp_path / "gallery.csv"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", ray_address)  # its sweeps (`fedbench sweep` commands) join the shared Ray
    printed = run_gallery(monkeypatch, capsys, "--only", str(recipe), "--factor", "4", "--out", str(table),
                          "--timeout", "300")
    assert "-> 6 and 12 (factor 4; federation.rounds=12)" in printed, printed
    (row,) = gallery.read_table(table)
    assert (row["recipe"], row["device"], row["runs"], row["budget"]) == (str(recipe), "cpu", "2", "rounds")
    # 48 rounds cost little beside Python's start: under load the pair at factor 4 (or 2) can fall in the noise, and
    # the gallery measures again, twice as long, down to full size (test_a_pair_lost_in_the_noise_...)
    lengths = {"4": ("6", "12"), "2": ("12", "24"), "1": ("", "48")}
    assert (row["short"], row["long"]) == lengths[row["factor"]] and row["full"] == "48"
    assert float(row["long_s"]) > 0
    if row["factor"] != "1":
        fixed, per_round = float(row["fixed_s"]), float(row["per_unit_s"])
        assert float(row["full_s"]) == pytest.approx(fixed + per_round * 48, abs=0.2)

    def write_headers(**measured):  # the row as if measured so
        with table.open("w", newline="") as file:
            writer = csv.DictWriter(file, gallery.COLUMNS)
            writer.writeheader()
            writer.writerow({**row, **measured})
        run_gallery(monkeypatch, capsys, "--write-headers", "--out", str(table))
        return describe(recipe).get("time on 2 cores")

    assert write_headers(cores="16", load="2.0") is None  # not 2 cores
    assert write_headers(cores="2", load="9.0") is None  # the cores shared by 9 processes
    assert write_headers(cores="2", load="2.0") == gallery.header_value({**row, "cores": "2", "load": "2.0"})


def test_a_pair_lost_in_the_noise_is_measured_again_twice_as_long_down_to_full_size(monkeypatch, capsys):
    """Timings as a loaded machine gives them: the longer sweep of a pair no slower than the shorter. The recipe is
    measured again at half the factor; a second pair that separates gives the row, and one that never does ends at
    full size."""
    path = gallery.recipe_path("papers/bao2022_lasso")
    budget = gallery.budget_of(path, gallery.load(path))
    asked: list[tuple[str, ...]] = []

    def measure_with(timings: list[float]) -> dict[str, str]:
        def timed_sweep(path, sets, args):  # the sweeps' wall seconds in the order they run
            asked.append(tuple(sets))
            return timings[len(asked) - 1]

        monkeypatch.setattr(gallery, "timed_sweep", timed_sweep)
        args = gallery.argparse.Namespace(device="cpu", note="")
        return gallery.measure("papers/bao2022_lasso", path, 8, args)

    n1, n2, _ = budget.lengths(8)
    m1, m2, _ = budget.lengths(4)
    assert m2 > n2
    row = measure_with([20.0, 19.0, 20.0, 24.0])
    assert [s[0] for s in asked] == [f"federation.rounds={n}" for n in (n1, n2, m1, m2)]
    assert (row["short"], row["long"], row["factor"]) == (str(m1), str(m2), f"{budget.full / m2:g}")
    assert float(row["per_unit_s"]) == pytest.approx(4.0 / (m2 - m1))
    assert "lost in the noise; again at factor" in capsys.readouterr().out

    asked.clear()
    row = measure_with([30.0] * 6 + [55.0])  # every pair 30 s and 30 s: factors 8, 4 and 2, then full size
    assert asked[-1] == () and len(asked) == 7
    assert (row["factor"], row["long"], row["full_s"], row["fixed_s"]) == ("1", str(budget.full), "55.0", "")


def test_a_sweep_on_a_gpu_gives_each_trial_its_share(monkeypatch):
    """A sweep on cuda without `resources.gpus_per_trial` is refused before anything runs (docs/how-to/gpu.md)."""
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(gallery.subprocess, "run", run)
    path = gallery.recipe_path("papers/bao2022_lasso")
    for device in ("cuda", "cpu"):
        args = gallery.argparse.Namespace(device=device, gpus_per_trial=0.2, timeout=None)
        gallery.timed_sweep(path, ["federation.rounds=500"], args)
    on_gpu, on_cpu = commands
    assert on_gpu[on_gpu.index("--device") + 1] == "cuda"
    sets = [on_gpu[i + 1] for i, word in enumerate(on_gpu) if word == "--set"]
    assert sets == ["federation.rounds=500", "resources.gpus_per_trial=0.2"]
    assert gallery.load(path, sets).resources.gpus_per_trial == 0.2  # the recipe takes them
    assert "resources.gpus_per_trial=0.2" not in on_cpu and on_cpu[on_cpu.index("--device") + 1] == "cpu"
