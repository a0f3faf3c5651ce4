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
                                "    from fedbench.simulate import Simulation\n",
             "fedbench/simulate.py": "from fedbench import rng\n",
             "fedbench/saved.py": "def load():\n    from fedbench_sweeps.store import Store\n",
             "sweeps/__init__.py": "", "sweeps/store.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    done = check(tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "  fedbench.rng -> fedbench.simulate (typing-level)" in lines
    assert "  fedbench.simulate -> fedbench.rng (module-level)" in lines
    assert "upward import: fedbench.rng (foundations) -> fedbench.simulate (engine), typing-level" in lines
    assert "upward import: fedbench.saved (engine) -> sweeps.store (orchestration), function-level" in lines
