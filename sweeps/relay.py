"""The Ray Tune callback of sweeps and tuning sessions (imported where Ray Tune is: it imports Ray)."""
from __future__ import annotations

from typing import Any, Callable

from ray import tune


class Relay(tune.Callback):
    """Hands what Ray Tune's trials report to the driver: `on_result(trial, result)` for each result a trial
    reports, `on_end(trial, failed)` once it has ended, `failed` when its actor raised or died."""

    def __init__(self, on_result: Callable[[Any, dict[str, Any]], None], on_end: Callable[[Any, bool], None]):
        self.on_result, self.on_end = on_result, on_end

    def __reduce__(self):  # Tune pickles its callbacks for restoring, which we never use
        return tune.Callback, ()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.on_result(trial, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.on_end(trial, False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.on_end(trial, True)
