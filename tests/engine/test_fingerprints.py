"""Every metric row of the runs in `fingerprint_runs.RUNS` (bao2022 Lasso/low-rank, FeDXL pAUC/AUC with the
linear and MLP scorers, EMNIST-10) equals what the engine produced before the issue-12 redesign of its interface
(step oracles, minibatch declarations, algorithm streams, round lengths, shared models): bit for bit on the
machine that made the records, to `fingerprint_runs.RTOL` (rounding of another CPU's kernels; measured there)
elsewhere. Columns added since (`iterations`, the bits communicated) are checked for their values, not against the
record."""
from __future__ import annotations

import json

import pytest

from fingerprint_runs import FINGERPRINTS, RTOL, RUNS, rows_of

NEW_COLUMNS = {"iterations", "support_accuracy", "comm_up_bits", "comm_down_bits"}


@pytest.mark.parametrize("name, recipe, algorithms, overrides", RUNS, ids=[run[0] for run in RUNS])
def test_rows_match_the_record(name, recipe, algorithms, overrides):
    if "emnist" in name:
        pytest.importorskip("fedbench.data.femnist").data_root(None)  # skips nothing: the data root must exist
    recorded = json.loads((FINGERPRINTS / f"{name}.json").read_text())
    assert sorted(recorded) == sorted(algorithms)
    for algorithm in algorithms:
        rows = rows_of(recipe, algorithm, overrides)
        assert len(rows) == len(recorded[algorithm]), algorithm
        for row, old in zip(rows, recorded[algorithm]):
            assert set(row) - set(old) <= NEW_COLUMNS, algorithm
            assert {k: row[k] for k in old} == pytest.approx(old, rel=RTOL[name], abs=1e-12), (algorithm, row["round"])
            local_steps = [o.split("=")[1] for o in overrides if o.startswith("federation.local_steps=")]
            if local_steps:
                assert row["iterations"] == row["round"] * int(local_steps[0])
            width = 64 if name in ("bao2022_lasso", "bao2022_lowrank") else 32  # no transform: each float at its width
            assert (row["comm_up_bits"], row["comm_down_bits"]) == (width * row["comm_up"], width * row["comm_down"])
