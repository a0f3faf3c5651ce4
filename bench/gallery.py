"""Every shipped recipe timed: each runs end to end through `fedbench sweep` (Python and Ray start, every run, MLflow
logging, the report) in a fresh directory with its own SQLite store, shortened by a factor it prints, and its
full-size time is extrapolated. The table it writes (`--out`, default bench/gallery.csv: one row per recipe and
device, a new measurement replacing the old) is where the recipes' `# time on 2 cores:` and `# time on one GPU:`
lines, and so the gallery's time columns, come from (`--write-headers`).

Method. A recipe's budget B is its `federation.rounds`, or `federation.iterations` (local iterations; each
configuration's rounds are B / local_steps). Shortened by f, the recipe runs twice, with budgets n and 2n, 2n ≈ B / f,
its seeds and grid as shipped: each run is the first rounds of its full-size run (no algorithm reads the number of
rounds; a stage schedule is cut, not squeezed). The line through the two wall times, t = fixed + per_unit · budget,
separates what does not grow with the budget (Python and Ray start, building the data, the store's migrations, each
run's set-up and logging, the report: `fixed`) from what does; the full-size time is fixed + per_unit · B. So that the
evaluations fall on that line too, the shortened schedules keep either
  - the recipe's `eval_every` (evaluations per round kept): n a multiple of `eval_every` rounds in every configuration;
  - or the number of evaluations (`eval_every` scaled by n / B, the evaluations' cost then in `fixed`): n a multiple
    of B / gcd(B, eval_every) and of every local_steps;
whichever allows the shorter n (f: FACTORS per recipe, about a minute a sweep on 2 cores, or --factor). A pair whose
line would give a negative fixed cost (noise on a shared machine) is read as proportional, t = t(2n) · budget / 2n;
one whose longer sweep was not the slower (the budget's cost lost in the noise of the fixed cost) is measured again
at half the factor, twice as long, down to full size. A recipe that cannot be halved on either schedule, or asked for
at f = 1, runs once at full size, and that is its time.

Timings on a shared machine are inflated by whatever else runs; the table records the cores this process could use,
the accelerator, the machine's load (its 5-minute load average when the recipe's sweeps ended), the commit and a
note (`--note`). `--write-headers` writes a recipe's `# time on 2 cores:` line only from a cpu row measured with 2
cores, its `# time on one GPU:` line from a cuda row, neither from a row measured under a load above `--max-load`, and
only where the header has none, or one that differs from the measurement by more than `--tolerance` times either way.
Usage: FEDBENCH_DATA=../shared/data python bench/gallery.py [--only NAME|FILE ...] [--factor F] [--device cuda]
       python bench/gallery.py --merge GPU_SESSION_OUT/gallery.csv   (bench/gpu_session.sh's table)
       python bench/gallery.py --write-headers [--tolerance 2]
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's sweeps/ (installed: fedbench_sweeps)

from sweeps.recipe import load, read_yaml  # noqa: E402
from sweeps.shipped import describe, find, name_of, names  # noqa: E402

TABLE = ROOT / "bench" / "gallery.csv"
COLUMNS = ("recipe", "device", "accelerator", "cores", "runs", "budget", "full", "short", "long", "factor",
           "evaluations", "short_s", "long_s", "fixed_s", "per_unit_s", "full_s", "load", "commit", "date", "note")
CPU_FIELD, GPU_FIELD = "time on 2 cores", "time on one GPU"
# Default factors, from the headers' times on 2 cores: each shortened sweep takes about a minute there, Ray's start
# and the report included (a recipe not listed runs at full size). `--factor` overrides them.
FACTORS = {
    "lasso": 1, "lowrank": 1, "compression": 4, "compression_emnist10": 5, "privacy": 1, "privacy_emnist10": 4,
    "participation": 1, "server_optimizers": 2, "vision_fashion_mnist": 1, "papers/bao2022_lasso": 4,
    "papers/bao2022_lowrank": 6,
    "papers/bao2022_emnist10": 100, "papers/bao2022_emnist10_cpu": 20, "papers/bao2022_emnist62": 500,
    "papers/bao2022_emnist62_cpu": 50, "papers/fallah2020_c1": 50, "papers/fallah2020_c2": 25,
    "papers/fallah2020_c3": 25, "papers/fallah2020_c4": 25, "papers/fallah2020_m1": 50, "papers/fallah2020_m2": 25,
    "papers/guo2023_auc_noisy": 1, "papers/guo2023_pauc_ablation_k": 1, "papers/guo2023_pauc_ablation_n": 1,
    "papers/guo2023_pauc_cifar10_cnn": 3, "papers/guo2023_pauc_femnist": 2, "papers/guo2023_pauc_synthetic": 1,
    "papers/hanzely2023_r1_digits": 4,
    "papers/hanzely2023_r1_fashion_mnist": 4, "papers/hanzely2023_r2_pw": 2, "papers/hanzely2023_r3_reparam": 1,
    "papers/hanzely2023_r4_lambda": 1, "papers/hanzely2023_s1": 10, "papers/hanzely2023_s2": 4,
    "papers/pfedfbe_digits": 5, "papers/pfedfbe_lasso1": 4, "papers/pfedfbe_lasso2": 4, "papers/pfedfbe_matrix": 10,
    "papers/niid_bench_fmnist": 1, "papers/reddi2021_emnist_cr": 100,
}


@dataclasses.dataclass(frozen=True)
class Budget:
    """A recipe's budget and what shortening it must respect: `field` rounds or iterations, `full` B, `steps` the
    local steps of each configuration (iterations per round; 1 for a budget of rounds), `eval_every`."""
    field: str
    full: int
    steps: tuple[int, ...]
    eval_every: int

    def quantum(self, keep_count: bool) -> int:
        """The step of the shortened budgets n: every configuration's rounds n / local_steps a multiple of
        `eval_every` (the period kept); or whole rounds and `eval_every` · n / B a whole number, n a multiple of
        B / gcd(B, eval_every) and of every local_steps, so that each configuration evaluates as many times as at full
        size (the count kept)."""
        if keep_count:
            return math.lcm(self.full // math.gcd(self.full, self.eval_every), *self.steps)
        return math.lcm(*(k * self.eval_every for k in self.steps))

    def lengths(self, factor: float) -> tuple[int, int, bool] | None:
        """The two shortened budgets (n, 2n) with 2n about B / factor, and whether they keep the count of
        evaluations (else the period); None where the budget runs at full size (factor 1, or no n ≤ B / 2)."""
        if factor <= 1:
            return None
        options = [(q, keep_count) for keep_count in (False, True) if 2 * (q := self.quantum(keep_count)) <= self.full]
        if not options:
            return None
        quantum, keep_count = min(options, key=lambda option: option[0])  # the period first on a tie
        n = max(1, round(self.full / (2 * factor * quantum))) * quantum
        n = min(n, self.full // 2 // quantum * quantum)
        return n, 2 * n, keep_count

    def overrides(self, budget: int, keep_count: bool) -> list[str]:
        """The `--set`s of a sweep shortened to `budget`."""
        sets = [f"federation.{self.field}={budget}"]
        if keep_count:
            sets.append(f"eval_every={self.eval_every * budget // self.full}")
        return sets


def budget_of(path: Path, recipe) -> Budget:
    """The budget of the recipe (of that file): its federation's rounds or iterations, each configuration's local
    steps."""
    federation = read_yaml(path).get("federation") or {}
    field = "iterations" if "iterations" in federation else "rounds"
    steps = tuple(sorted({t.federation.local_steps for t in recipe.trials()})) if field == "iterations" else (1,)
    return Budget(field, int(federation[field]), steps, recipe.eval_every)


def fit(lengths: tuple[int, int], seconds: tuple[float, float]) -> tuple[float, float] | None:
    """(fixed, per_unit) of the line t = fixed + per_unit · budget through the two timings; proportional
    (fixed 0) where that line would have a negative intercept (the longer more than twice the shorter); None where
    the longer sweep was not the slower: the budget's cost is lost in the noise of the fixed cost, and a smaller
    factor (longer sweeps) is needed."""
    (n1, n2), (t1, t2) = lengths, seconds
    if t2 <= t1:
        return None
    per_unit = (t2 - t1) / (n2 - n1)
    fixed = t2 - per_unit * n2
    if fixed < 0:
        return 0.0, t2 / n2
    return fixed, per_unit


def approx(seconds: float) -> str:
    """A duration as a header gives it: ~7 s, ~40 s, ~3 min, ~12 min, ~1.5 h, ~20 h."""
    if seconds < 100:
        return f"~{round(seconds) if seconds < 20 else 5 * round(seconds / 5)} s"
    minutes = seconds / 60
    if minutes < 100:
        return f"~{round(minutes)} min" if minutes >= 10 else f"~{round(minutes * 2) / 2:g} min"
    hours = minutes / 60
    return f"~{round(hours)} h" if hours >= 10 else f"~{round(hours * 2) / 2:g} h"


DURATION = re.compile(r"(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*(s|min|h)\b")
UNIT_SECONDS = {"s": 1, "min": 60, "h": 3600}


def stated_seconds(text: str | None) -> float | None:
    """The seconds a header's time states (the middle of a range: ~4-6 min is 300 s); None where it states none
    (`—`, "hours, estimated")."""
    match = DURATION.search(text or "")
    if match is None:
        return None
    low, high, unit = match.groups()
    value = (float(low) + float(high)) / 2 if high else float(low)
    return value * UNIT_SECONDS[unit]


def needs_update(stated: str | None, measured: float, tolerance: float) -> bool:
    """Whether a header's time is missing, states no duration, or is off the measured seconds by more than
    `tolerance` times."""
    seconds = stated_seconds(stated)
    return seconds is None or not 1 / tolerance <= measured / seconds <= tolerance


def header_value(row: dict[str, str]) -> str:
    """The header's text of a row: the time, then the runs, what the time includes and where it was measured."""
    factor = float(row["factor"])
    how = "full size" if factor == 1 else f"extrapolated from 1/{factor:g} of the {row['budget']}"
    machine = f"{row['accelerator']}, " if row["device"] != "cpu" else ""
    if float(row["load"]) > int(row["cores"]):  # written only with --max-load above the default
        how += f", the cores shared by a load of {row['load']}: an upper bound"
    return f"{approx(float(row['full_s']))} ({machine}{row['runs']} runs, report included; bench/gallery.py, {how})"


def with_field(text: str, field: str, value: str) -> str:
    """The recipe's text with its header line `# field: value`: the line replaced where the first comment block has
    one, else added after the block's last `# paper:`/`# reproduces:`/`# time on ...:` line (first if none)."""
    lines = text.splitlines(keepends=True)
    new = f"# {field}: {value}\n"
    last_field = -1
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        if re.match(rf"#\s*{re.escape(field)}\s*:", line):
            lines[i] = new
            return "".join(lines)
        if re.match(r"#\s*(paper|reproduces|time on [^:]+)\s*:", line):
            last_field = i
    lines.insert(last_field + 1, new)
    return "".join(lines)


def commit() -> str:
    """The checkout's commit, `+dirty` when its tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def accelerator(args: argparse.Namespace) -> str:
    """What the sweeps ran on: the cores, or the GPU and each Ray trial's share of it."""
    if args.device == "cpu":
        return f"{len(os.sched_getaffinity(0))} CPU cores"
    import torch

    return f"{torch.cuda.get_device_name(torch.device(args.device))} ({args.gpus_per_trial:g} GPU a trial)"


def load_average() -> str:
    """The machine's 5-minute load average: how many processes shared its cores while the sweeps ran."""
    return f"{os.getloadavg()[1]:.1f}"


def timed_sweep(path: Path, sets: list[str], args: argparse.Namespace) -> float:
    """Wall seconds of one `fedbench sweep` of the recipe with `sets`, on `args.device` (on a GPU, each trial with
    its share), in a fresh directory with its own store; a sweep that fails raises, with the end of its output."""
    if args.device != "cpu":  # a sweep on cuda needs a GPU share per trial (docs/how-to/gpu.md)
        sets = [*sets, f"resources.gpus_per_trial={args.gpus_per_trial:g}"]
    with tempfile.TemporaryDirectory(prefix="fedbench-gallery-") as workdir:
        command = [sys.executable, str(ROOT / "cli.py"), "sweep", str(path.resolve()), "--device", args.device,
                   "--tracking-uri", f"sqlite:///{workdir}/mlflow.db", "--yes"]
        for item in sets:
            command += ["--set", item]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=args.timeout,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"exit code {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return seconds


def needs_data(path: Path) -> bool:
    """Whether the recipe reads real data (its header says so, as the gallery's command column reads it)."""
    return "real data" in describe(path).get("reproduces", "")


def measure(name: str, path: Path, factor: float, args: argparse.Namespace) -> dict[str, str]:
    """The table's row of one recipe: its shortened sweeps timed and its full-size time extrapolated; where the
    budget's cost is lost in the noise, measured again at half the factor (down to full size)."""
    recipe = load(path)
    budget, runs = budget_of(path, recipe), len(recipe.trials())
    row = {"recipe": name, "device": args.device, "accelerator": accelerator(args),
           "cores": str(len(os.sched_getaffinity(0))), "runs": str(runs), "budget": budget.field,
           "full": str(budget.full), "commit": commit(), "date": datetime.date.today().isoformat(), "note": args.note}
    while (lengths := budget.lengths(factor)) is not None:
        n1, n2, keep_count = lengths
        print(f"{name}: {budget.field} {budget.full} -> {n1} and {n2} (factor {budget.full / n2:g}; "
              f"{' '.join(budget.overrides(n2, keep_count))}), {runs} runs", flush=True)
        seconds = tuple(timed_sweep(path, budget.overrides(n, keep_count), args) for n in (n1, n2))
        line = fit((n1, n2), seconds)
        if line is None:
            factor = min(factor, budget.full / n2) / 2  # halves each time: ends at full size
            print(f"    {seconds[0]:7.1f} s, {seconds[1]:7.1f} s: the {budget.field}' cost is lost in the noise; "
                  f"again at factor {max(factor, 1):g}", flush=True)
            continue
        fixed, per_unit = line
        full_s = fixed + per_unit * budget.full
        print(f"    {seconds[0]:7.1f} s, {seconds[1]:7.1f} s: fixed {fixed:.1f} s + {per_unit:.4g} s per "
              f"{budget.field[:-1]} -> full size {full_s:.0f} s ({approx(full_s)})", flush=True)
        return {**row, "short": str(n1), "long": str(n2), "factor": f"{budget.full / n2:g}",
                "evaluations": "count kept" if keep_count else "period kept", "short_s": f"{seconds[0]:.1f}",
                "long_s": f"{seconds[1]:.1f}", "fixed_s": f"{fixed:.1f}", "per_unit_s": f"{per_unit:.6g}",
                "full_s": f"{full_s:.1f}", "load": load_average()}
    print(f"{name}: {budget.field} {budget.full}, at full size (factor 1), {runs} runs", flush=True)
    seconds = timed_sweep(path, [], args)
    print(f"    {seconds:7.1f} s", flush=True)
    return {**row, "short": "", "long": str(budget.full), "factor": "1", "evaluations": "as shipped",
            "short_s": "", "long_s": f"{seconds:.1f}", "fixed_s": "", "per_unit_s": "", "full_s": f"{seconds:.1f}",
            "load": load_average()}


def read_table(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def write_table(path: Path, rows: list[dict[str, str]]) -> None:
    """The table with `rows` replacing the rows of the same recipe and device, sorted by device then recipe."""
    fresh = {(row["recipe"], row["device"]) for row in rows}
    kept = [row for row in read_table(path) if (row["recipe"], row["device"]) not in fresh]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, COLUMNS)
        writer.writeheader()
        writer.writerows(sorted(kept + rows, key=lambda row: (row["device"], row["recipe"])))


def recipe_path(name: str) -> Path | None:
    """The file of a table's recipe: a shipped name, or a file's path as given."""
    found = find(name)
    return found if found is not None else Path(name) if Path(name).is_file() else None


def write_headers(table: Path, tolerance: float, max_load: float) -> None:
    """Each recipe's time lines from the table, where missing or off by more than `tolerance` times, from the rows
    measured on 2 cores (cpu) or one GPU under a load of at most `max_load`."""
    for row in read_table(table):
        path, measured = recipe_path(row["recipe"]), float(row["full_s"])
        if row["device"] == "cpu" and row["cores"] != "2":
            print(f"{row['recipe']}: left as it is (measured on {row['cores']} cores, not 2)")
            continue
        if float(row["load"]) > max_load:
            print(f"{row['recipe']}: left as it is (measured under a load of {row['load']}, above {max_load:g})")
            continue
        if path is None:
            print(f"{row['recipe']}: no such recipe")
            continue
        field = CPU_FIELD if row["device"] == "cpu" else GPU_FIELD
        stated = describe(path).get(field)
        if not needs_update(stated, measured, tolerance):
            print(f"{row['recipe']}: {field}: {stated!r} kept (measured {approx(measured)})")
            continue
        path.write_text(with_field(path.read_text(), field, header_value(row)))
        print(f"{row['recipe']}: {field}: {stated!r} -> {header_value(row)!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="RECIPE", help="shipped names or recipe files (default: all)")
    parser.add_argument("--factor", type=float, help="shorten every recipe by this (default: FACTORS, else 1)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (as fedbench sweep --device)")
    parser.add_argument("--gpus-per-trial", type=float, default=0.2, help="on a GPU: each Ray trial's share of it "
                        "(resources.gpus_per_trial; 0.2: five trials share it)")
    parser.add_argument("--out", type=Path, default=TABLE, help="the table (CSV), updated by recipe and device")
    parser.add_argument("--timeout", type=float, help="seconds one sweep may take before it counts as failed")
    parser.add_argument("--note", default="", help="recorded in the table, e.g. what else ran on the machine")
    parser.add_argument("--merge", type=Path, metavar="TABLE", help="add another table's rows (a GPU session's) to "
                        "--out, replacing those of the same recipe and device, and run nothing")
    parser.add_argument("--write-headers", action="store_true", help="rewrite the recipes' time lines from --out")
    parser.add_argument("--tolerance", type=float, default=2.0, help="--write-headers: rewrite a stated time only "
                        "where it is off by more than this many times")
    parser.add_argument("--max-load", type=float, default=2.5, help="--write-headers: only from rows measured under "
                        "a 5-minute load average of at most this (2 cores busy, and a little more)")
    args = parser.parse_args()
    if args.merge:
        merged = read_table(args.merge)
        write_table(args.out, merged)
        print(f"{len(merged)} row(s) of {args.merge} merged into {args.out}")
        return
    if args.write_headers:
        write_headers(args.out, args.tolerance, args.max_load)
        return
    chosen = args.only or names()
    rows, not_run = [], []
    print(f"fedbench sweep of each recipe on {args.device} ({accelerator(args)}), commit {commit()}")
    for given in chosen:
        name = name_of(given) if find(given) is not None else given
        path = recipe_path(name)
        if path is None:
            not_run.append(f"{given}: neither a shipped recipe nor a file")
            continue
        if needs_data(path) and not os.environ.get("FEDBENCH_DATA"):
            not_run.append(f"{name}: reads real data; FEDBENCH_DATA is not set")
            continue
        factor = args.factor if args.factor is not None else FACTORS.get(name, 1)
        try:
            rows.append(measure(name, path, factor, args))
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            not_run.append(f"{name}: failed ({str(err).splitlines()[0]})")
            print(f"    failed: {err}", flush=True)
        write_table(args.out, rows)  # after each recipe: an interrupted gallery keeps what it measured
    print(f"{len(rows)} recipe(s) measured, written to {args.out}")
    if not_run:
        print("not run:\n  " + "\n  ".join(not_run))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
