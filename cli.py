"""fedbench command line: `fedbench run | list | validate`."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Declarative experiment sweeps for federated optimization research.")
console = Console()
errors = Console(stderr=True)

SetOption = typer.Option(None, "--set", "-s", help="Override a recipe field: path=value, e.g. algorithm.client_lr=1e-3")


def fail(message: str) -> None:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def load_recipe(path: Path, sets: Optional[List[str]], algorithm: Optional[str] = None):
    from sweeps.recipe import RecipeError, load

    try:
        return load(path, sets or [], algorithm)
    except RecipeError as err:
        fail(str(err))


@app.command()
def run(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help="YAML recipe"),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", "-a", help="Which of the recipe's algorithms"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Trial seed (default: the recipe's first)"),
    sets: Optional[List[str]] = SetOption,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every evaluated row to this JSON file"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: the recipe's)"),
) -> None:
    """Run one trial in-process (no Ray): one algorithm, one value per hyperparameter."""
    from sweeps.execute import build_simulation
    from sweeps.recipe import RecipeError

    recipe = load_recipe(recipe_path, sets, algorithm)
    try:
        trial = recipe.single_trial(algorithm, seed)
        simulation = build_simulation(trial, device)
    except RecipeError as err:
        fail(str(err))
    except ValueError as err:
        fail(f"{recipe_path}: {err}")

    hp = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
    console.print(f"[bold]{trial.recipe}[/]: {trial.problem} / {trial.algorithm} ({hp}), seed {trial.seed}",
                  highlight=False)
    rows = []
    start = time.perf_counter()
    with Progress(TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=False) as progress:
        task = progress.add_task("rounds", total=trial.federation.rounds)
        for row in simulation:
            rows.append(row)
            progress.update(task, completed=row["round"])
    elapsed = time.perf_counter() - start

    table = Table(title=f"round {rows[-1]['round']} ({simulation.status})", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in rows[-1].items():
        if key != "round":
            table.add_row(key, f"{value:.6g}" if math.isfinite(value) else str(value))
    console.print(table)
    console.print(f"{elapsed:.1f} s wall: {simulation.train_seconds:.1f} s training, "
                  f"{simulation.eval_seconds:.1f} s evaluation ({len(rows)} evaluations)", highlight=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(rows, indent=1))
        console.print(f"rows written to {json_path}", highlight=False)
    if simulation.status == "diverged":
        raise typer.Exit(1)


@app.command()
def validate(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE"),
    sets: Optional[List[str]] = SetOption,
) -> None:
    """Check a recipe without running anything."""
    recipe = load_recipe(recipe_path, sets)
    def size(grid: dict) -> int:
        return math.prod(len(values) for values in grid.values())

    configurations = size(recipe.problem_grid) * size(recipe.federation_grid) * sum(map(size, recipe.algorithms.values()))
    console.print(f"{recipe_path}: ok — problem {recipe.problem}, algorithms {', '.join(recipe.algorithms)}, "
                  f"{configurations} configurations × {len(recipe.seeds)} seeds", highlight=False)


@app.command("list")
def list_components() -> None:
    """Problems and algorithms, with each parameter's type, default and valid range."""
    from fedbench.algorithms import ALGORITHMS
    from fedbench.problems import PROBLEMS

    for title, registry, attribute in (("problem", PROBLEMS, "params"), ("algorithm", ALGORITHMS, "hparams")):
        for name, cls in registry.items():
            table = Table(title=f"{title} [bold]{name}[/]", title_justify="left", show_lines=False)
            table.add_column("parameter", no_wrap=True)
            table.add_column("type", no_wrap=True)
            table.add_column("default", no_wrap=True)
            table.add_column("range", overflow="fold")
            table.add_column("description", ratio=1)
            for p in getattr(cls, attribute):
                table.add_row(p.name, p.kind + (" (log)" if p.log else ""), str(p.default), p.describe_range(), p.help)
            console.print(table)
            presets = getattr(cls, "presets", None)
            if presets:
                console.print(f"  presets: {', '.join(presets)}", highlight=False)


if __name__ == "__main__":
    app()
