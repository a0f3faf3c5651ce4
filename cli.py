"""`python cli.py ...` and `python -m cli ...` in a checkout: the fedbench command line, whose code is
sweeps/cli.py (installed, `fedbench`: the package fedbench_sweeps). Its names are this module's too
(`from cli import app`, `cli.run`)."""
from __future__ import annotations

from sweeps import cli as _cli
from sweeps.cli import app

__all__ = ["app"]


def __getattr__(name: str):
    return getattr(_cli, name)


if __name__ == "__main__":
    app()
