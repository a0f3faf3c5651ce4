"""Local steps compiled with torch.compile (`fedbench.engine.compiling`, the recipe field `compile`): the same rows as eager
up to rounding, for algorithms whose steps read the round's Python values (Fast-FedDA's t, MC-FedDA's stage), a step
size scheduled by round, a batch of runs with per-run step sizes, a run leaving its batch, an iteration-wise program
and a personalized method; `auto`
deciding by the measured table; the field refused, kept out of the hashes and passed through `fedbench run` to its
MLflow tag.

Tolerances: compiled steps fuse and reorder floating-point operations, so a float64 run's rows move by ~1e-15
relative per step and stay within 1e-9 over these runs; a wrong compiled step (a stale Python value baked into a
graph, a step left out) moves them by orders of magnitude more within a round.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

import fedbench
from fedbench import schedules
from fedbench.engine import compiling
from fedbench.engine.compiling import Measured
from fedbench.engine.planning import why_not_batchable
from fedbench.engine.runs import IterationProgram, programs
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.problems.traces import SLOT
from helpers import how_to_problem, invoke
from small_problems import small_lasso

RTOL = 1e-9


def graphs() -> int:
    """Graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def rows(sims: list[Simulation]) -> list[list[dict[str, float]]]:
    curves: list[list[dict[str, float]]] = [[] for _ in sims]
    for i, row in run_batch(sims):
        curves[i].append(row)
    return curves


def assert_close(compiled, eager):
    assert len(compiled) == len(eager)
    for got, want in zip(compiled, eager):
        assert got.keys() == want.keys()
        assert got == pytest.approx(want, rel=RTOL, abs=1e-12), (got["round"], got, want)


def both(make) -> tuple[list[list[dict[str, float]]], list[list[dict[str, float]]]]:
    """The rows of the simulations `make(mode)` gives, compiled and eager; the compiled ones' steps made graphs, the
    eager ones' none."""
    before = graphs()
    compiled = rows(make("on"))
    assert graphs() > before
    before = graphs()
    eager = rows(make("off"))
    assert graphs() == before
    return compiled, eager


CASES = {
    "fedmid": ("fedmid", {"client_lr": 0.05}, Federation(12, 4, 3, 5)),
    # t = rnd.iteration + rnd.step and the last step's branch: values the compiled step reads from the round
    "fast_fedda": ("fast_fedda", {"mu": 0.1, "gamma": 50.0}, Federation(12, 4, 3, 5)),
    # a stage change every 3 rounds: its λ and ball are read from the round's index inside the compiled step
    "mc_fedda": ("mc_fedda", {"mu": 0.1, "gamma": 50.0, "stage_rounds": [3, 3, 6], "stage_lams": [0.1, 0.05, 0.02],
                              "stage_radii": [50.0, 20.0, 10.0]}, Federation(12, 4, 3, 5)),
    # a step size that changes every round (a schedule): a per-run value the compiled step must read anew each round
    "fedmid, cosine client_lr": ("fedmid", {"client_lr": schedules.make("cosine", init=0.05, final=0.005)},
                                 Federation(12, 4, 3, 5)),
    # a personalized method whose clients keep state between rounds (gathered and scattered around the steps)
    "ditto": ("ditto", {"client_lr": 0.05}, Federation(12, 4, 3, 5)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_compiled_run_gives_the_eager_rows(case):
    name, hp, federation = CASES[case]
    problem = small_lasso()
    compiled, eager = both(lambda mode: [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation,
                                                    seed=3, eval_every=2, compile=mode)])
    assert_close(compiled[0], eager[0])


def test_a_plugin_problems_default_gradient_compiles_as_eager(tmp_path, trace_at_once):
    """The how-to's problem has the default gradient: replayed from its trace in the eager steps, its backward pass
    itself in the compiled ones (`fedbench.problems.traces`); the rows agree to 1e-12."""
    problem = how_to_problem(tmp_path)
    compiled, eager = both(lambda mode: [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05),
                                                    Federation(12, 4, 3, 5), seed=3, eval_every=2, compile=mode)])
    assert any(vars(problem)[SLOT].graphs.values())  # the eager steps replayed a trace
    assert len(compiled[0]) == len(eager[0])
    for got, want in zip(compiled[0], eager[0]):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (got["round"], got, want)


def test_a_batch_of_runs_with_their_own_step_sizes_and_one_diverging_compiles_as_eager():
    """Three seeds of FedMiD on one instance, each its own client_lr, one so large that it diverges and leaves the
    batch mid-run (the compiled step then sees two runs instead of three)."""
    problem = small_lasso(data_seed=0)
    federation = Federation(30, 4, 3, 5)

    def make(mode):
        return [Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=lr), federation, seed,
                           eval_every=2, divergence_factor=10.0, compile=mode)
                for seed, lr in enumerate([0.01, 0.05, 40.0])]

    assert [len(runs) for runs, _ in programs(make("on"))] == [3]
    compiled, eager = both(make)
    for got, want in zip(compiled, eager):
        assert_close(got, want)
    assert [len(curve) for curve in compiled] == [16, 16, len(eager[2])] and len(eager[2]) < 16  # diverged early


def test_an_iteration_wise_program_compiles_as_eager():
    """ASCD-PFL's coin-flip rounds: seeds as one iteration-wise program, whose steps compile for all its runs at once
    and for the runs ending a round."""
    problem = fedbench.make_problem("pfl_synthetic", preset="s1")
    federation = Federation(20, 0, 1, 1)

    def make(mode):
        return [Simulation(problem, fedbench.make_algorithm("ascd_pfl", problem), federation, seed, eval_every=4,
                           compile=mode) for seed in (0, 1)]

    (_, program), = programs(make("on"))
    assert isinstance(program, IterationProgram) and program.compiled
    compiled, eager = both(make)
    for got, want in zip(compiled, eager):
        assert_close(got, want)


# -- auto ---------------------------------------------------------------------------------------------------------

def row(**given) -> Measured:
    values = dict(problem="lasso", algorithm="fedmid", device="cpu", runs=1, work=600, local_steps=3, eager_ms=3.0,
                  compiled_ms=1.0, compile_s=2.0, recipe="small")
    return Measured(**{**values, **given})


def auto(monkeypatch, table, rounds=4000, algorithm="fedmid", runs=1) -> bool:
    """Whether auto compiles `runs` runs of `algorithm` on the small Lasso (S·b·d = 4·5·30 = 600 a run), `rounds`
    rounds of 3 steps, by `table`."""
    monkeypatch.setattr(compiling, "table", lambda: tuple(table))
    problem = small_lasso(data_seed=0)
    sims = [Simulation(problem, fedbench.make_algorithm(algorithm, problem), Federation(rounds, 4, 3, 5), seed)
            for seed in range(runs)]
    assert compiling.step_work(sims) == runs * 600
    return compiling.compiles(sims)


def test_auto_compiles_where_the_table_measured_a_win_that_the_run_pays_back(monkeypatch):
    win = row()  # 2 ms saved a round of 3 steps, 2 s to compile: paid back twice over (PAYBACK) after 2,000 rounds
    assert auto(monkeypatch, [win])
    assert not auto(monkeypatch, [win], rounds=1900)  # 3.8 s saved
    assert auto(monkeypatch, [win], rounds=2100)
    assert not auto(monkeypatch, [row(compiled_ms=2.6)])  # 1.15x: within the timings' noise
    assert not auto(monkeypatch, [row(compiled_ms=4.0)])  # slower compiled
    assert not auto(monkeypatch, [win], algorithm="fedda")  # not measured for this algorithm: eager
    assert not auto(monkeypatch, [dataclasses.replace(win, device="cuda")])  # measured on another device only
    assert not auto(monkeypatch, [])


def test_auto_reads_the_rows_nearest_the_programs_size_and_none_beyond_their_reach(monkeypatch):
    small, large = row(work=500), row(work=5_000, compiled_ms=5.0)  # a win at 500, a loss at 5,000
    assert auto(monkeypatch, [small, large])  # one run: 600
    assert not auto(monkeypatch, [small, large], runs=8)  # eight: 4,800, the loss is nearest
    assert not auto(monkeypatch, [row(work=600 * 5)])  # 5x away: beyond SIZE_REACH
    # programs alike measured in several recipes: their medians decide (a win, a loss and a win: a win)
    assert auto(monkeypatch, [row(), row(work=610, compiled_ms=5.0), row(work=590)])
    assert not auto(monkeypatch, [row(compiled_ms=5.0), row(work=610, compiled_ms=5.0), row(work=590)])
    assert not auto(monkeypatch, [row(), row(compile_s=6.0), row(compile_s=6.0)])  # 8 s saved: not 12


def test_the_mode_on_and_off_decide_whatever_the_table(monkeypatch):
    monkeypatch.setattr(compiling, "table", lambda: (row(),))
    problem = small_lasso()
    make = lambda mode: Simulation(problem, fedbench.make_algorithm("fedmid", problem), Federation(5000, 4, 3, 5), 0,  # noqa: E731
                                   compile=mode)
    assert [compiling.compiles([make(mode)]) for mode in ("on", "off", "auto")] == [True, False, True]
    with pytest.raises(ValueError, match="compile: found 'yes', expected one of auto, on, off"):
        make("yes")


def test_the_shipped_table_holds_a_measurement_of_every_shipped_problem():
    from sweeps import shipped

    table = json.loads(compiling.TABLE.read_text())
    assert all(made["command"].startswith("python bench/compile.py") for made in table["measured"].values())
    rows = compiling.table()
    assert all(r.eager_ms > 0 and r.compiled_ms > 0 and r.compile_s >= 0 and r.work > 0 for r in rows)
    assert {r.recipe for r in rows} <= set(shipped.names())
    assert {r.problem for r in rows if r.device == "cpu"} == set(fedbench.PROBLEMS)
    assert {r.device for r in rows} <= set(table["measured"])


# -- the recipe field -----------------------------------------------------------------------------------------

SMALL = """\
name: small-lasso
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 12, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: 1e-2}
eval_every: 4
"""


@pytest.mark.parametrize("given, mode", [("", "auto"), ("compile: on\n", "on"), ("compile: off\n", "off"),
                                         ("compile: 'on'\n", "on"), ("compile: true\n", "on"),
                                         ("compile: auto\n", "auto")])
def test_the_recipe_field_reaches_every_trial_and_neither_hash(tmp_path, given, mode):
    from sweeps.recipe import load

    (tmp_path / "r.yaml").write_text(SMALL + given)
    (tmp_path / "plain.yaml").write_text(SMALL)
    recipe, plain = load(tmp_path / "r.yaml"), load(tmp_path / "plain.yaml")
    assert [trial.compile for trial in recipe.trials()] == [mode]
    assert recipe.recipe_hash == plain.recipe_hash
    assert recipe.trials()[0].config_hash == plain.trials()[0].config_hash


def test_run_with_compile_on_runs_compiled_and_logs_it(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    out = tmp_path / "rows.json"
    result = invoke("run", path, "--set", "compile=on", "--json", out, "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    assert "(local steps compiled)" in result.output
    (run,) = MlflowClient(tracking_uri).search_runs([MlflowClient(tracking_uri).get_experiment_by_name(
        "small-lasso").experiment_id])
    assert run.data.tags["compiled"] == "true" and run.data.tags["status"] == "finished"
    problem = fedbench.make_problem("lasso", clients=8, samples_per_client=20, dim=30, support=10, lam=0.05, seed=0)
    eager = fedbench.run("fedmid", problem, rounds=12, clients_per_round=4, local_steps=3, batch_size=5,
                         eval_every=4, compile="off", client_lr=1e-2)
    assert_close(json.loads(out.read_text()), eager.rows)


def test_runs_of_different_compile_modes_form_no_program():
    problem = small_lasso(data_seed=0)
    sims = [Simulation(problem, fedbench.make_algorithm("fedmid", problem), Federation(5, 4, 3, 5), seed, compile=mode)
            for seed, mode in enumerate(["on", "off"])]
    assert [runs for runs, _ in programs(sims)] == [[0], [1]]
    assert "compile mode" in why_not_batchable(sims)
