"""Bounded inputs (issue 44, item 5): what a recipe or a `--set` asks for is measured before it is built, and
refused in one short line, fast and without the memory it would take: an alias bomb, a file too large, a seed
count or a grid too large to list, a name MLflow or a path cannot hold, a run no machine holds; a report stays
inside its folder; a sweep above `max_runs:` runs only with `--yes`. None of this needs Ray."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import sweeps.cli
from helpers import invoke
from sweeps.recipe import RecipeError, load
from sweeps.recipe.loading import MAX_BYTES, MAX_NODES

PROBLEM = """\
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 4, clients_per_round: 4, local_steps: 2, batch_size: 5}
"""
RECIPE = PROBLEM + "algorithms: {fedavg: {}}\n"
LONGEST_LINE = 160  # a refusal's first line (as in test_refusals.py)
FAST = 2.0  # seconds within which what cannot be built is refused (a test's own imports come before)


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Recipes named as a researcher would: a relative path of a usual length (as in test_refusals.py)."""
    monkeypatch.chdir(tmp_path)


def write(folder: Path, text: str, name: str = "r.yaml") -> Path:
    (folder / name).write_text(text)
    return Path(name)


def refused_fast(*args) -> tuple[str, float]:
    """The first line of a refusal (exit 2, no traceback, short) and the seconds it took."""
    start = time.perf_counter()
    result = invoke(*args)
    seconds = time.perf_counter() - start
    assert result.exit_code == 2, result.output[:2000]
    assert "Traceback" not in result.output, result.output[-2000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    first = result.output.splitlines()[0]
    assert len(first) < LONGEST_LINE, f"{len(first)} characters: {first[:300]}"
    assert len(result.output.splitlines()) == 1, result.output[:2000]
    return first, seconds


# -- the YAML itself ------------------------------------------------------------------------------------------

def alias_bomb(levels: int) -> str:
    """`resources.pack`, a field that takes any YAML value: 10^levels strings as aliases of aliases."""
    lines = ["  pack:", "    - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return RECIPE + "resources:\n" + "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_fast_in_one_short_line(tmp_path):
    path = write(tmp_path, alias_bomb(9))  # 10^9 strings once expanded (the took 2 min and 2.7 GB)
    first, seconds = refused_fast("validate", path)
    assert first.startswith(f"error: {path}: resources.pack[4]: found "), first
    assert f"expected at most {MAX_NODES}" in first and "aliases" in first, first
    assert seconds < FAST, seconds


def test_an_alias_bomb_in_a_set_value_is_refused_fast(tmp_path):
    path = write(tmp_path, RECIPE)
    bomb = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + ["*a"] * 9) + "]"
    value = bomb
    for level in range(8):  # each level ten aliases of the one below: 10^9 strings
        value = f"[&l{level} {value}, " + ", ".join([f"*l{level}"] * 9) + "]"
    first, seconds = refused_fast("validate", path, "--set", f"resources.pack={value}")
    assert first.startswith(f"error: {path}: --set: resources.pack: found "), first
    assert seconds < FAST, seconds


def test_a_string_repeated_by_aliases_is_refused_by_its_text(tmp_path):
    path = write(tmp_path, RECIPE + f"resources: {{pack: [&s {'x' * 100_000}{', *s' * 20}]}}\n")
    first, seconds = refused_fast("validate", path)
    assert first == (f"error: {path}: resources.pack: found 2.0 MiB of text with its aliases expanded, expected at "
                     f"most 1 MiB"), first
    assert seconds < FAST, seconds


def test_a_document_of_too_many_nodes_is_refused_before_it_is_all_read(tmp_path):
    path = write(tmp_path, RECIPE + f"seeds: [{', '.join(['0'] * 150_000)}]\n")  # 450 KB
    first, _ = refused_fast("validate", path)  # after composing 100,000 nodes (~3 s in PyYAML's pure Python)
    assert first.startswith(f"error: {path}: seeds[999"), first  # where the count passed the bound (the recipe's
    assert first.endswith(f"]: found more than {MAX_NODES} nodes, expected at most {MAX_NODES}"), first  # own first)


def test_a_recursive_alias_is_refused(tmp_path):
    path = write(tmp_path, RECIPE + "resources: {pack: &a [*a]}\n")
    first, _ = refused_fast("validate", path)
    assert first.startswith(f"error: {path}: resources.pack[0]: found an alias inside its own anchor"), first


def test_deep_nesting_is_refused_in_one_line(tmp_path):
    path = write(tmp_path, RECIPE + "resources: {pack: " + "[" * 5000 + "]" * 5000 + "}\n")
    first, seconds = refused_fast("validate", path)
    assert f"{path}: resources.pack" in first and "levels deep" in first, first
    assert seconds < FAST, seconds


def test_an_integer_too_long_to_read_is_refused_in_one_line(tmp_path):
    path = write(tmp_path, RECIPE.replace("dim: 30", "dim: " + "1" * 5000))
    first, _ = refused_fast("validate", path)
    assert "an integer of 5000 digits" in first, first


def test_a_file_larger_than_the_limit_is_refused_before_parsing(tmp_path):
    path = write(tmp_path, RECIPE + "# " + "x" * MAX_BYTES + "\n")
    first, seconds = refused_fast("validate", path)
    assert first == f"error: {path}: the file holds more than 1 MiB, expected a recipe of at most 1 MiB", first
    assert seconds < FAST, seconds


def test_a_file_that_is_no_text_is_refused_in_one_line(tmp_path):
    path = Path("r.yaml")
    path.write_bytes(RECIPE.encode() + b"\xc8\xff\n")
    first, _ = refused_fast("validate", path)
    assert first == f"error: {path}: the file is not UTF-8 text (byte 0xc8 at offset {len(RECIPE)})", first


def test_a_long_found_value_is_cut_with_its_size(tmp_path):
    path = write(tmp_path, RECIPE + f"resources: {{pack: {'x' * 400_000}}}\n")
    first, _ = refused_fast("validate", path)
    assert first.startswith(f"error: {path}: resources.pack: found 'xxxx"), first
    assert "… (391 KiB), expected 'auto' or an integer >= 1" in first, first
    first, _ = refused_fast("validate", path, "--set", "resources.pack=1", "--set", f"problem.lam={'y' * 400_000}")
    assert first.startswith(f"error: {path}: problem.lam: expected float in [0, inf), found 'yyyy"), first
    assert first.endswith("… (391 KiB)"), first


# -- seeds, grid, name ----------------------------------------------------------------------------------------

def test_a_huge_seed_count_is_refused_fast(tmp_path):
    """The issue's `--set seeds=100000000` ran validate past 2 minutes at 5.4 GB."""
    path = write(tmp_path, RECIPE)
    first, seconds = refused_fast("validate", path, "--set", "seeds=100000000")
    assert first == (f"error: {path}: seeds: found 100000000, expected a count from 1 to 10000 or a list of at most "
                     f"10000 distinct integers >= 0"), first
    assert seconds < FAST, seconds


def test_a_grid_of_ten_million_runs_is_refused_fast(tmp_path):
    rates = ", ".join(f"{0.001 * (i + 1):g}" for i in range(100))
    steps = ", ".join(str(i + 1) for i in range(100))
    path = write(tmp_path, PROBLEM.replace("local_steps: 2", f"local_steps: [{steps}]")
                 + f"algorithms: {{fedavg: {{client_lr: [{rates}]}}}}\nseeds: 1000\n")
    first, seconds = refused_fast("validate", path)
    assert first == (f"error: {path}: found 10000 configurations × 1000 seeds = 10000000 runs, expected at most "
                     f"100000"), first
    assert seconds < FAST, seconds


def test_runs_are_counted_without_building_them(tmp_path):
    path = write(tmp_path, PROBLEM.replace("clients: 8", "clients: [8, 16]")
                 + "algorithms:\n  fedavg: {client_lr: [0.1, 0.2, 0.3]}\n"
                   "  fedmid: {client_lr: 0.1, problem: {clients: 8}}\nseeds: 4\n")
    recipe = load(path)
    assert recipe.runs() == len(recipe.trials()) == (2 * 3 + 1) * 4


def test_a_name_longer_than_mlflow_allows_is_refused(tmp_path):
    path = write(tmp_path, f"name: {'a' * 600}\n" + RECIPE)
    first, _ = refused_fast("validate", path)
    assert first.startswith(f"error: {path}: name: found 'aaaa"), first
    assert "… of 600 characters, expected at most 500" in first, first


@pytest.mark.parametrize("name", ["..", "/abs", "a//b", "papers/../..", "./x", "a b", "tune:x", "a/"])
def test_a_name_that_is_no_safe_relative_path_is_refused(tmp_path, name):
    path = write(tmp_path, RECIPE)
    first, _ = refused_fast("validate", path, "--set", f"name={name!r}".replace("'", '"'))
    assert first.startswith(f"error: {path}: name: found {name!r}, expected "), first
    assert "letters, digits" in first, first


def test_a_name_from_the_file_may_not_leave_its_folder_either(tmp_path):
    path = write(tmp_path, RECIPE, "...yaml")  # the name would be `..`
    first, _ = refused_fast("validate", path)
    assert first.startswith(f"error: {path}: name: found '..' (the file's name), expected "), first


@pytest.mark.parametrize("name", ["papers/bao2022-lasso", "my_sweep.v2", "é-ß/x_1"])
def test_names_of_letters_digits_and_separators_pass(tmp_path, name):
    path = write(tmp_path, f"name: {name}\n" + RECIPE)
    assert load(path).name == name


# -- a run's memory -------------------------------------------------------------------------------------------

LOWRANK = PROBLEM.replace("name: lasso", "name: lowrank").replace(", dim: 30, support: 10", "")


@pytest.mark.parametrize("text, assignment, field", [(RECIPE, "problem.dim=1e12", "problem.dim"),
                                                      (LOWRANK + "algorithms: {fedavg: {}}\n", "problem.rows=3000000",
                                                       "problem.rows")], ids=["lasso", "lowrank"])
def test_a_run_no_machine_holds_is_refused_at_validate_with_the_estimate(tmp_path, text, assignment, field):
    """The issue's `problem.dim=1e12` passed validate; `run` then died allocating 64 TB."""
    path = write(tmp_path, text)
    first, seconds = refused_fast("validate", path, "--set", assignment)
    assert first.startswith(f"error: {path}: {field}: found "), first
    assert ": a run needs ~" in first and "this machine has" in first, first
    assert seconds < FAST, seconds


def test_a_curve_no_machine_holds_is_refused_at_federation_rounds(tmp_path):
    """Issue 59 item 6: `federation.rounds: 1e12` passed validate, the estimate leaving out the curve a run keeps
    (10^11 rows of ~0.8 KB here); below what the machine holds it passes."""
    from sweeps.recipe.grid import CURVE_VALUE_BYTES, machine_memory

    path = write(tmp_path, RECIPE)
    first, seconds = refused_fast("validate", path, "--set", "federation.rounds=1e12")
    assert first.startswith(f"error: {path}: federation.rounds: found 1000000000000: a run needs ~"), first
    assert "(its curve: 100000000001 rows, one every 10 rounds), this machine has" in first, first
    assert len(first) <= LONGEST_LINE and seconds < FAST, (first, seconds)
    trial = load(path).trials()[0]
    row = 1 + len(trial.metrics())  # the round and the metrics
    fits = machine_memory() // (CURVE_VALUE_BYTES * row) // 2 * 10  # rounds of a curve of half the memory
    assert invoke("validate", path, "--set", f"federation.rounds={fits}").exit_code == 0


def test_the_curve_a_run_keeps_costs_what_the_estimate_says():
    """`CURVE_VALUE_BYTES` measured: the rows of a real run's curve, as the run keeps them, cost within 25 % of it a
    value."""
    import gc
    import tracemalloc

    import fedbench

    problem = fedbench.make_problem("lasso", clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)

    def kept(rounds: int) -> tuple[int, int]:
        sim = fedbench.Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=1e-3),
                                  fedbench.Federation(rounds, 4, 1, 5), 0, eval_every=1)
        gc.collect()
        tracemalloc.start()
        rows = list(sim)
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size, len(rows) * len(rows[0])

    (small, small_values), (large, large_values) = kept(100), kept(600)
    from sweeps.recipe.grid import CURVE_VALUE_BYTES

    assert (large - small) / (large_values - small_values) == pytest.approx(CURVE_VALUE_BYTES, rel=0.25)


def test_the_estimate_grows_with_the_declared_sizes():
    from fedbench.problems import PROBLEMS

    lasso = PROBLEMS["lasso"]
    small = lasso.run_bytes(lasso.resolve_config({}))
    assert 64 * 128 * 1024 * 8 < small < 1 << 30  # the features (64 MiB) and the objective's Hessian (8 MiB)
    assert lasso.run_bytes(lasso.resolve_config({"dim": 10**12})) > 10**24  # the Hessian alone: 8·10^24 bytes
    pauc = PROBLEMS["pauc"]
    assert pauc.run_bytes(pauc.resolve_config({"features": 10**9})) > 10**12
    assert pauc.run_bytes(pauc.resolve_config({"preset": "guo2023_femnist"})) is None  # read from files


def test_an_integral_float_is_an_integer_field(tmp_path):
    """YAML 1.2 reads 1e3 as a float: an int field takes it where it is whole, and refuses 1.5."""
    path = write(tmp_path, RECIPE)
    assert load(path, ["problem.dim=1e3"]).problem_grid["dim"] == [1000]
    with pytest.raises(RecipeError, match="problem.dim: expected an integer"):
        load(path, ["problem.dim=1.5"])


# -- reports stay inside their folder -------------------------------------------------------------------------

def test_a_report_is_never_written_outside_its_folder(tmp_path, tracking_uri):
    path = write(tmp_path, "name: confined\n" + RECIPE)
    assert invoke("run", path, "--tracking-uri", tracking_uri).exit_code == 0
    client = MlflowClient(tracking_uri)
    client.rename_experiment(client.get_experiment_by_name("confined").experiment_id, "..")
    result = invoke("report", "--experiment", "..", "--tracking-uri", tracking_uri)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"{tmp_path / 'reports' / '..'}: not inside {tmp_path / 'reports'}" in result.output, result.output
    assert "pass --out" in result.output, result.output
    assert not (tmp_path / "index.html").exists() and not (tmp_path / "table.csv").exists()
    out = tmp_path / "chosen"
    result = invoke("report", "--experiment", "..", "--tracking-uri", tracking_uri, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file() and not (tmp_path / "index.html").exists()


# -- max_runs: and --yes ---------------------------------------------------------------------------------------

@pytest.fixture
def launched(monkeypatch):
    """The recipes `fedbench sweep` would hand to Ray (none is started: the sweep itself is replaced)."""
    started = []
    monkeypatch.setattr(sweeps.cli, "sweep_one", lambda recipe, *args: started.append(recipe.name) or True)
    return started


def test_more_runs_than_max_runs_need_yes(tmp_path, launched):
    path = write(tmp_path, RECIPE + "seeds: 2001\n")
    first, _ = refused_fast("sweep", path)
    assert first == (f"error: {path}: max_runs: found 2001 runs, above 2000; pass --yes to run them all, or raise "
                     f"max_runs:"), first
    assert launched == []
    assert invoke("sweep", path, "--yes").exit_code == 0 and launched == ["r"]


def test_max_runs_raises_or_lowers_the_guard(tmp_path, launched):
    raised = write(tmp_path, RECIPE + "seeds: 2001\nmax_runs: 3000\n", "raised.yaml")
    assert invoke("sweep", raised).exit_code == 0 and launched == ["raised"]
    lowered = write(tmp_path, RECIPE + "seeds: 3\nmax_runs: 2\n", "lowered.yaml")
    first, _ = refused_fast("sweep", lowered)
    assert "max_runs: found 3 runs, above 2; pass --yes" in first, first
    assert launched == ["raised"]


def test_max_runs_is_a_field_of_the_schema_and_not_of_what_runs(tmp_path):
    base = load(write(tmp_path, RECIPE, "base.yaml"))
    assert base.max_runs == 2000
    raised = load(write(tmp_path, RECIPE + "max_runs: 50000\n", "base.yaml"))
    assert raised.max_runs == 50000 and raised.recipe_hash == base.recipe_hash  # a sweep resumes after raising it
    for value, expected in (("0", "found 0, expected"), ("many", "found 'many', expected an integer")):
        with pytest.raises(RecipeError, match=f"max_runs: {expected}"):
            load(tmp_path / "base.yaml", [f"max_runs={value}"])
