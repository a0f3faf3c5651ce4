"""Metric declarations (`Metric`: name, label, direction), and the ranking metrics shared by problems: AUC
and the McClish-standardised partial AUC.

`partial_auc(labels, scores, max_fpr)` is what `sklearn.metrics.roc_auc_score(y, s, max_fpr=β)` returns, and
what the FeDXL authors' released code (`FeDXL/main.py`) and LibAUC's `pauc_roc_score` compute, the scale of
the test pAUC of Guo et al. (ICML 2023), Table 2: the ROC area over FPR ∈ [0, β] (the ROC
interpolated linearly at β), standardised so that a random scorer gets 0.5 and a perfect one 1:
    pAUC = ½ (1 + (A − β²/2) / (β − β²/2)).
With β = 1 it is the plain AUC. Ties are handled as in sklearn (one ROC point per distinct score).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def roc_curve(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FPR and TPR at every distinct score threshold, from (0, 0) up to (1, 1)."""
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order].astype(float)
    last_of_tie = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    true_positives = np.cumsum(labels)[last_of_tie]
    false_positives = (last_of_tie + 1) - true_positives
    fpr = np.r_[0.0, false_positives / false_positives[-1]]
    tpr = np.r_[0.0, true_positives / true_positives[-1]]
    return fpr, tpr


def partial_auc(labels, scores, max_fpr: float = 1.0) -> float:
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=float)
    if labels.min() == labels.max():
        raise ValueError("partial_auc needs both classes among the labels")
    fpr, tpr = roc_curve(labels, scores)
    if max_fpr >= 1:
        return float(np.trapezoid(tpr, fpr))
    stop = np.searchsorted(fpr, max_fpr, side="right")
    tpr_at = np.interp(max_fpr, fpr[stop - 1: stop + 1], tpr[stop - 1: stop + 1])
    area = np.trapezoid(np.r_[tpr[:stop], tpr_at], np.r_[fpr[:stop], max_fpr])
    least, most = max_fpr**2 / 2, max_fpr
    return float(0.5 * (1 + (area - least) / (most - least)))


# -- what a problem declares about each metric it evaluates ----------------------------------------------------------

DIRECTIONS = ("min", "max", None)


@dataclass(frozen=True)
class Metric:
    """One evaluated quantity: its row key, the label plots and tables show, and which way is better
    (`min`, `max`, or None where neither is, e.g. a recovered rank or a density). A problem declares its metrics so
    (`Problem.metrics`), an algorithm the ones it adds (`Algorithm.declared_metrics`); another direction is refused
    where it is written. A report ranks configurations by a metric's direction.

    Example:
        ```python
        Metric("objective_gap", "objective gap F(w) − F*", "min")
        Metric("test_accuracy", "test accuracy", "max")
        ```
    """

    name: str
    """The key of its value in a row (`evaluate_global`'s dict)."""
    label: str
    """What plots and tables call it."""
    direction: str | None = None
    """"min" or "max", the better way; None where neither is."""

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:  # "minimize" was taken as neither way, silently
            raise ValueError(f"Metric {self.name!r}: direction {self.direction!r} is not one of 'min', 'max' or None")

    def personal(self) -> Metric:
        """The same quantity of each client's personal model on the client's own data."""
        return Metric(f"personal_{self.name}", f"personalized {self.label}", self.direction)


# Columns every row has beside the problem's metrics (the engine's bookkeeping).
ENGINE_COLUMNS = (
    Metric("comm_up", "floats sent to the server"),
    Metric("comm_down", "floats sent to clients"),
    Metric("iterations", "local iterations per client"),
    Metric("comm_up_bits", "bits sent to the server"),  # as the uplink encodes them (`fedbench.axes.transforms`)
    # as the downlink encodes them; with one, what keeps each participant's copy in sync: the messages it missed too
    # (`fedbench.engine.links.Links.catch_up`)
    Metric("comm_down_bits", "bits sent to clients"),
)
EPSILON = "epsilon"  # the rows' key of ε, where a run's uplink adds DP-FedAvg's noise (`fedbench.axes.privacy`)


def epsilon_metric(delta: float | None = None) -> Metric:
    """The rows' `epsilon` (`fedbench.axes.privacy`), labelled with its δ (without one where the recipe is not at hand);
    lower is better."""
    return Metric(EPSILON, "ε" if delta is None else f"ε (δ = {delta:g})", "min")
