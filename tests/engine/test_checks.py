"""`fedbench.engine.checks`: the build-time rules listed once. A run's record (the engine) and a recipe's validator refuse
the same faults with the same message at the same field path (`Refusal.path`), for rules of each kind: the federation
against the algorithm's uploads, its participation, the server optimizer, a registered axis's own rule
(`fedbench.axes.registry`), the federation's fields against the problem's clients, and a minibatch size an algorithm's
hyperparameter sets (at the algorithm's field)."""
from __future__ import annotations

import pytest

import fedbench
from fedbench.axes.client_dropout import ClientDropout
from fedbench.engine.checks import Refusal, check_run
from fedbench.engine.simulate import Federation, Simulation
from fedbench.hparams import resolve
from fedbench.problems import PROBLEMS
from helpers import invoke, refused
from small_problems import small_lasso

PROBLEM = "{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}"
FAULTS = {  # id: (algorithm, its hyperparameters, the federation as a recipe writes it, as the engine takes it)
    "krum with f too large": ("fedavg", {}, "{clients_per_round: 3, aggregation: krum, byzantine: 1}",
                              dict(clients_per_round=3, aggregation="krum", byzantine=1)),
    "a varying participation with a robust rule": (
        "fedavg", {}, "{aggregation: median, participation: {model: bernoulli, p: 0.5}}",
        dict(aggregation="median", participation={"model": "bernoulli", "p": 0.5})),
    "more clients a round than the problem has": ("fedavg", {}, "{clients_per_round: 9}", dict(clients_per_round=9)),
    "a batch above the smallest client": ("fedavg", {}, "{batch_size: 21}", dict(batch_size=21)),
    "dropout with a robust rule": ("fedavg", {}, "{aggregation: median, client_dropout: 0.2}",
                                   dict(aggregation="median", axes=(ClientDropout(0.2),))),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_engine_and_the_validator_refuse_a_fault_alike_at_its_path(fault, tmp_path):
    algorithm, hp, written, given = FAULTS[fault]
    problem = small_lasso()
    with pytest.raises(Refusal) as engine:
        Simulation(problem, fedbench.make_algorithm(algorithm, problem, **hp), Federation(rounds=2, **given), 0)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"problem: {PROBLEM}\nfederation: {written}\nalgorithms: {{{algorithm}: {{}}}}\n")
    line = refused(invoke("validate", recipe))
    assert line == f"error: {recipe}: {engine.value.path}: {engine.value.message}"


def test_a_minibatch_size_set_by_a_hyperparameter_is_refused_at_the_algorithms_field():
    lasso, per_fedavg = PROBLEMS["lasso"], fedbench.ALGORITHMS["per_fedavg"]
    config = lasso.resolve_config(dict(clients=8, samples_per_client=20, dim=30, support=10))
    hp = resolve(per_fedavg.hparams, {"inner_batch": 21}, per_fedavg.name, per_round=True)
    with pytest.raises(Refusal) as refusal:
        check_run(lasso, config, per_fedavg, hp, Federation(rounds=2, clients_per_round=4))
    assert refusal.value.path == "algorithms.per_fedavg.inner_batch"
    assert refusal.value.message == "found 21, expected at most problem.samples_per_client = 20"
