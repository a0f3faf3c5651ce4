"""The layers of docs/design.md held by the imports (`.ci/import_cycles.py`, which `make lint` runs): no import cycle
and no import from a lower layer up to a higher one, type-only (`if TYPE_CHECKING:`) and function-level imports
counted, the installed name fedbench_sweeps read as sweeps."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / ".ci" / "import_cycles.py"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True, check=False)


def test_the_project_has_no_import_cycle_and_no_import_up_a_layer():
    done = check(ROOT)
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("no import cycle and no upward import among fedbench, sweeps, cli"), done.stdout


def test_type_only_and_function_level_imports_close_cycles_and_go_up_layers(tmp_path):
    files = {"fedbench/__init__.py": "",
             "fedbench/rng.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                "    from fedbench.engine.simulate import Simulation\n",
             "fedbench/engine/simulate.py": "from fedbench import rng\n",
             "fedbench/engine/saved.py": "def load():\n    from fedbench_sweeps.store import Store\n",
             "sweeps/__init__.py": "", "sweeps/store.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    done = check(tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "  fedbench.rng -> fedbench.engine.simulate (typing-level)" in lines
    assert "  fedbench.engine.simulate -> fedbench.rng (module-level)" in lines
    assert "upward import: fedbench.rng (foundations) -> fedbench.engine.simulate (engine), typing-level" in lines
    assert "upward import: fedbench.engine.saved (engine) -> sweeps.store (orchestration), function-level" in lines


def test_no_module_over_500_lines_and_no_function_over_60_in_the_package():
    """Issue 61's size rule over fedbench/, sweeps/ and cli.py: a module does one job, a function reads at once."""
    import ast

    sizes, long_functions = {}, []
    for path in sorted([*(ROOT / "fedbench").rglob("*.py"), *(ROOT / "sweeps").rglob("*.py"), ROOT / "cli.py"]):
        text, name = path.read_text(), str(path.relative_to(ROOT))
        sizes[name] = len(text.splitlines())
        long_functions += [f"{name}:{node.name}" for node in ast.walk(ast.parse(text))
                           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and node.end_lineno - node.lineno + 1 > 60]
    assert {name: lines for name, lines in sizes.items() if lines > 500} == {}
    assert long_functions == []
