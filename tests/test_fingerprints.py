"""Every metric row of the runs in `fingerprint_runs.RUNS` (bao2022 Lasso/low-rank, FeDXL pAUC/AUC with the
linear and MLP scorers, EMNIST-10) equals, to the bit, what the engine produced before the issue-12 redesign
of its interface (step oracles, minibatch declarations, algorithm streams, round lengths, shared models).
Columns added since (`iterations`) are checked for their values, not against the record. `objective_gap` is
objective − F* with F* from the reference solver (`fedbench.reference`), whose LAPACK calls may round
differently with another thread count: the objective is compared to the bit, the gap to 1e-12. The float32
EMNIST record is compared to `CPU_RTOL` (see `fingerprint_runs.CPU_DEPENDENT`)."""
from __future__ import annotations

import json

import pytest

from fingerprint_runs import CPU_DEPENDENT, CPU_RTOL, FINGERPRINTS, RUNS, rows_of

NEW_COLUMNS = {"iterations", "support_accuracy"}
SOLVER_DEPENDENT = {"objective_gap"}


@pytest.mark.parametrize("name, recipe, algorithms, overrides", RUNS, ids=[run[0] for run in RUNS])
def test_rows_are_bit_identical_to_the_record(name, recipe, algorithms, overrides):
    if "emnist" in name:
        pytest.importorskip("fedbench.data.femnist").data_root(None)  # skips nothing: the data root must exist
    recorded = json.loads((FINGERPRINTS / f"{name}.json").read_text())
    assert sorted(recorded) == sorted(algorithms)
    for algorithm in algorithms:
        rows = rows_of(recipe, algorithm, overrides)
        assert len(rows) == len(recorded[algorithm]), algorithm
        for row, old in zip(rows, recorded[algorithm]):
            assert set(row) - set(old) <= NEW_COLUMNS, algorithm
            if name in CPU_DEPENDENT:
                assert {k: row[k] for k in old} == pytest.approx(old, rel=CPU_RTOL), (algorithm, row["round"])
                continue
            assert {k: row[k] for k in old if k not in SOLVER_DEPENDENT} == {
                k: v for k, v in old.items() if k not in SOLVER_DEPENDENT}, (algorithm, row["round"])
            for key in SOLVER_DEPENDENT & set(old):
                assert row[key] == pytest.approx(old[key], rel=1e-12, abs=1e-9), (algorithm, key)
            local_steps = [o.split("=")[1] for o in overrides if o.startswith("federation.local_steps=")]
            if local_steps:
                assert row["iterations"] == row["round"] * int(local_steps[0])
