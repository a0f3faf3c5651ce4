"""The GPU path, where CUDA is available (skipped elsewhere): every algorithm of `helpers.CASES` runs with its
problem's data on the device and gives the curve it gives on the CPU (the draws are made on the host, so they are
the same), and a batch of seeds on the device gives each run its curve alone there; so do robust rules and attacks,
participation models and uneven local work.
The tolerances of the CPU's identity test hold between runs alone and batched; between devices, float64 kernels
that reduce in another order (cuBLAS, CUDA reductions) are allowed 1e-9 relative over the 12 rounds, pFedFBE's
finite difference (which divides last-bit differences by τ ~ 1e-8) 1e-6, float32 the pair-score tolerances."""
from __future__ import annotations

import pytest
import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation, run_batch, run_seeds
from fedbench.reference import minimize
from helpers import CASES, FLOAT32, SEEDS, assert_same, curves_alone, rows_by_run
from small_problems import small_lasso
from sweeps.driving import drive_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def across_devices(tolerance):
    if tolerance == FLOAT32:
        return tolerance
    return 1e-6 if tolerance > 1e-12 else 1e-9


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_algorithm_runs_on_the_gpu_as_on_the_cpu(name):
    make, federation, hp, tolerance = CASES[name]
    algorithm = name.partition(":")[0]
    assert_same(curves_alone(make(), algorithm, federation, hp, SEEDS[:2]),
                curves_alone(make(device="cuda"), algorithm, federation, hp, SEEDS[:2]), across_devices(tolerance))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_batch_of_seeds_on_the_gpu_gives_each_run_its_curve_alone(name):
    make, federation, hp, tolerance = CASES[name]
    problem, algorithm = make(device="cuda"), name.partition(":")[0]
    assert_same(curves_alone(problem, algorithm, federation, hp, SEEDS),
                run_seeds(problem, algorithm, federation, SEEDS, eval_every=3, **hp), tolerance)


def test_memory_bound_runs_on_the_gpu_still_form_one_program(monkeypatch):
    """MEMORY_BOUND_RUN_BYTES is a CPU rule (a step bound by memory traffic gains nothing from a batch); a GPU step
    that size is bound by kernel launches, which the batch shares (FedMiD on Bao et al.'s Lasso, R = 16: see
    docs/how-to/gpu.md). So the runs form one program, each with its curve alone."""
    problem, federation = small_lasso(device="cuda"), Federation(6, 3, 2, 5)
    monkeypatch.setattr(fedbench.engine.planning, "MEMORY_BOUND_RUN_BYTES", 0)  # every step "memory-bound"

    def sims():
        return [Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation, seed, 2) for seed in SEEDS]

    assert [outcome.runs_in_batch for outcome in drive_batch(sims())] == [len(SEEDS)] * len(SEEDS)
    assert_same(curves_alone(problem, "fedmid", federation, {}, SEEDS, eval_every=2),
                rows_by_run(run_batch(sims()), len(SEEDS)), CASES["fedmid"][3])


ROBUST = {  # robust rules and attacks (`fedbench.axes.robust`) on the device: the gaussian attack's draws made on the host
    "median, gaussian": Federation(9, 5, 3, 5, aggregation="median", adversaries={"fraction": 0.25,
                                                                                  "attack": "gaussian"}),
    "krum, sign_flip": Federation(9, 5, 3, 5, aggregation="krum", adversaries={"fraction": 0.25, "scale": 4.0}),
}


@pytest.mark.parametrize("case", ROBUST)
def test_robust_rules_and_attacks_run_on_the_gpu_as_on_the_cpu_and_batched_as_alone(case):
    federation, hp = ROBUST[case], {"client_lr": 0.05}
    on_gpu = curves_alone(small_lasso(device="cuda"), "fedavg", federation, hp, SEEDS)
    assert_same(curves_alone(small_lasso(), "fedavg", federation, hp, SEEDS), on_gpu, 1e-9)
    assert_same(on_gpu, run_seeds(small_lasso(device="cuda"), "fedavg", federation, SEEDS, eval_every=3, **hp), 1e-12)


PARTICIPATION = {  # participation models and uneven local work (`fedbench.axes.participation`): masks drawn on the host
    "scaffold, bernoulli, uneven": ("scaffold", Federation(9, 3, {"distribution": "uniform", "low": 1, "high": 4}, 5,
                                                           participation={"model": "bernoulli", "p": 0.3})),
    "fedavg, markov": ("fedavg", Federation(9, 3, 2, 5, participation={"model": "markov", "p_on": 0.3, "p_off": 0.4})),
}


@pytest.mark.parametrize("case", PARTICIPATION)
def test_participation_models_and_uneven_work_run_on_the_gpu_as_on_the_cpu_and_batched_as_alone(case):
    name, federation = PARTICIPATION[case]
    hp = {"client_lr": 0.01}
    on_gpu = curves_alone(small_lasso(device="cuda"), name, federation, hp, SEEDS)
    assert_same(curves_alone(small_lasso(), name, federation, hp, SEEDS), on_gpu, 1e-9)
    assert_same(on_gpu, run_seeds(small_lasso(device="cuda"), name, federation, SEEDS, eval_every=3, **hp), 1e-12)


SOLVED = [("pfl_synthetic", {"preset": "s1", "sigma_h": 1.0}),  # damped Newton
          ("lasso", {"clients": 8, "samples_per_client": 20, "dim": 30, "support": 10, "lam": 0.05})]  # FISTA


@pytest.mark.parametrize("problem, config", SOLVED)
def test_the_reference_optimum_is_found_on_the_gpu_as_on_the_cpu(problem, config):
    """The objective gap's F*: the solver runs on the problem's device (its data there), to the same optimum."""
    cpu = minimize(fedbench.make_problem(problem, seed=0, **config))
    gpu = minimize(fedbench.make_problem(problem, seed=0, device="cuda", **config))
    assert gpu.w.device.type == "cuda"
    assert gpu.objective == pytest.approx(cpu.objective, rel=1e-10)
    assert (gpu.w.cpu() - cpu.w).abs().max() < 1e-6
