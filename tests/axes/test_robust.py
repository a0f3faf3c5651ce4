"""Robust aggregation and adversarial clients (`fedbench.axes.robust`, applied by `fedbench.engine.links`) for any algorithm.

* each rule against per-run NumPy/SciPy transcriptions of its paper's definition: coordinate-wise median and trimmed
  mean (Yin et al., ICML 2018, Defs. 1-2; numpy.median and scipy.stats.trim_mean), Krum and Multi-Krum (Blanchard et
  al., NeurIPS 2017, §4), and each attack;
* FedAvg on a small Lasso with each rule, each attack and both with a clip on the uplink, against an independent loop
  over clients in NumPy: the server's iterate after every round to 1e-12, the gaussian attack on the same draws;
* a batch of seeds = each seed alone (round- and iteration-wise, several uploads); a checkpoint resumed bit for bit;
* without any of it, a run's streams, checkpoint and recorded configuration as before;
* recipes: grid axes, `--set` into the adversaries, hashes, `fedbench run` end to end; median against a sign-flip
  attack that breaks the mean.
Refusals through the command line are in `tests/cli/test_refusals.py`.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

import fedbench
from fedbench.axes import robust
from fedbench.engine.federation import RoundSampler
from fedbench.engine.runs import programs
from fedbench.engine.simulate import Federation, Simulation, run_seeds
from fedbench.hparams import ParamError
from fedbench.rng import generator
from helpers import SEEDS, assert_same, build, curves_alone, interrupted, invoke, np_local, np_server, pfl, rows_of
from small_problems import small_lasso
from sweeps.recipe import load


def np_krum(values: np.ndarray, f: int, keep: int) -> np.ndarray:
    """One run's Krum / Multi-Krum by the paper's loops: each client's score over its S − f − 2 nearest others."""
    s = len(values)
    scores = []
    for i in range(s):
        distances = sorted(float(np.sum((values[i] - values[j]) ** 2)) for j in range(s) if j != i)
        scores.append(sum(distances[: s - f - 2]))
    chosen = np.argsort(scores, kind="stable")[:keep]
    return values[chosen].mean(axis=0)


@pytest.fixture
def uploads():
    gen = torch.Generator().manual_seed(3)
    return torch.randn(3, 9, 4, 5, generator=gen, dtype=torch.float64)  # R = 3 runs, S = 9 clients of 4x5 entries


@pytest.mark.parametrize("clients", [9, 8])
def test_median_is_numpys_per_run(uploads, clients):
    values = uploads[:, :clients]
    got = robust.median(values)
    assert got.shape == (3, 1, 4, 5)
    for run in range(3):
        np.testing.assert_array_equal(got[run, 0].numpy(), np.median(values[run].numpy(), axis=0))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.25, 0.4])
def test_trimmed_mean_is_scipys_per_run(uploads, beta):
    got = robust.trimmed_mean(uploads, beta)
    for run in range(3):
        np.testing.assert_allclose(got[run, 0].numpy(), stats.trim_mean(uploads[run].numpy(), beta, axis=0),
                                   rtol=1e-14, atol=1e-15)


def test_trimmed_mean_is_scipys_exactly_where_their_cuts_agree():
    """β of two decimals in [0, 0.5): the engine leaves out ⌊βS⌋ of β as written at each end, scipy int(β·S) of the
    float product. Where those agree the means are equal; among S ≤ 100 they disagree only at β = 0.29, S = 100,
    where scipy keeps the 29th value from each end."""
    betas = [i / 100 for i in range(50)]
    exact = lambda beta, clients: math.floor(Fraction(str(beta)) * clients)  # noqa: E731  # ⌊βS⌋
    assert [(b, s) for s in range(1, 101) for b in betas if int(b * s) != exact(b, s)] == [(0.29, 100)]
    gen = torch.Generator().manual_seed(1)
    for clients in (1, 7, 10, 25, 99, 100):
        values = torch.randn(1, clients, 3, generator=gen, dtype=torch.float64)
        ordered = np.sort(values[0].numpy(), axis=0)
        for beta in betas:
            got = robust.trimmed_mean(values, beta)[0, 0].numpy()
            scipys = stats.trim_mean(values[0].numpy(), beta, axis=0)
            cut, theirs = exact(beta, clients), int(beta * clients)
            np.testing.assert_allclose(got, ordered[cut: clients - cut].mean(0), rtol=1e-14, atol=1e-15)
            np.testing.assert_allclose(scipys, ordered[theirs: clients - theirs].mean(0), rtol=1e-14, atol=1e-15)
            assert np.allclose(got, scipys, rtol=1e-14, atol=1e-15) == (cut == theirs)


def test_a_trim_leaving_no_client_is_refused(uploads):
    with pytest.raises(ValueError, match="leaves none"):
        robust.trimmed_mean(uploads[:, :4], 0.5)


@pytest.mark.parametrize("f", [0, 2, 3])
def test_krum_and_multi_krum_are_the_papers_loops(uploads, f):
    uploads = uploads.clone()
    uploads[:, 0] += 50.0  # an outlier Krum must never pick
    for rule, keep in (("krum", 1), ("multi_krum", 9 - f)):
        got = robust.aggregate_robustly(uploads, rule, byzantine=f)
        for run in range(3):
            np.testing.assert_allclose(got[run, 0].numpy(), np_krum(uploads[run].numpy(), f, keep), rtol=1e-14)
    assert not torch.equal(robust.krum(uploads, f), uploads[:, :1])


def test_krum_with_too_many_byzantine_clients_is_refused(uploads):
    with pytest.raises(ValueError, match=r"S > 2f \+ 2"):
        robust.krum(uploads, 4)  # S = 9 = 2·4 + 1


def test_attacks_change_the_adversaries_updates_only(uploads):
    adversarial = torch.zeros(3, 9, dtype=torch.bool)
    adversarial[0, 2] = adversarial[2, 7] = True
    noise = torch.randn(uploads.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = {"sign_flip": -2.0 * uploads, "scaled": 2.0 * uploads, "gaussian": 2.0 * noise}
    for kind, attacked in expected.items():
        got = robust.attack(uploads, adversarial, kind, 2.0, noise)
        assert torch.equal(got[adversarial], attacked[adversarial]), kind
        assert torch.equal(got[~adversarial], uploads[~adversarial]), kind


def test_adversarial_clients_are_a_seeded_fraction():
    first = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(4))
    again = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(4))
    other = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(5))
    assert int(first.sum()) == 10 and torch.equal(first, again) and not torch.equal(first, other)


def test_a_fraction_of_the_clients_is_floored_as_written():
    assert robust.floor_of(0.29, 100) == 29 and robust.floor_of(0.3, 10) == 3 and robust.floor_of(0.05, 19) == 0
    assert int(robust.adversarial_clients(100, 0.29, torch.Generator().manual_seed(0)).sum()) == 29


# -- FedAvg with each rule and attack, one client at a time in NumPy ---------------------------------------------

HP = {"client_lr": 0.05, "server_lr": 0.8}


def np_rule(received: np.ndarray, federation: Federation) -> np.ndarray:
    """What stands for the server's mean of the clients' received uploads `[S, d]`."""
    rule, f = federation.aggregation, federation.byzantine
    if rule == "uniform":
        return received.mean(axis=0)
    if rule == "median":
        return np.median(received, axis=0)
    if rule == "trimmed_mean":
        return stats.trim_mean(received, federation.trim, axis=0)
    return np_krum(received, f, 1 if rule == "krum" else len(received) - f)


def np_attack(x: np.ndarray, adversaries: robust.Adversaries, noise: np.ndarray | None) -> np.ndarray:
    if adversaries.attack == "sign_flip":
        return -adversaries.scale * x
    if adversaries.attack == "scaled":
        return adversaries.scale * x
    return adversaries.scale * noise


def np_fedavg(problem, federation: Federation, seed: int, clip: float | None = None):
    """FedAvg's server iterates after each round, each client's update attacked where it is adversarial, then clipped
    to norm `clip`, the server's step from the rule's aggregate of what it received; the draws (clients, minibatches,
    the adversaries and the gaussian attack's noise) replayed from the run's streams. Also: how many updates were
    attacked, and by which clients."""
    sampler = RoundSampler(problem, federation, seed)
    w = problem.init_params(generator(seed, "init")).numpy()
    adversaries, adversarial = federation.adversaries, set()
    if adversaries is not None:
        gen = generator(seed, "adversaries")
        count = int(adversaries.fraction * problem.num_clients)  # exact for the fractions used here
        adversarial = set(torch.randperm(problem.num_clients, generator=gen)[:count].tolist())
    iterates, attacked = [], 0
    for _ in range(federation.rounds):
        clients, rows = sampler.draw(federation.local_steps)
        noise = None
        if adversaries is not None and adversaries.attack == "gaussian":
            noise = torch.randn(len(clients), problem.dim, generator=gen, dtype=torch.float64).numpy()
        received = []
        for k, client in enumerate(clients.tolist()):
            x = np_local(problem, "fedavg", w, rows["D"][:, k].numpy(), HP) - w
            if client in adversarial:
                attacked += 1
                x = np_attack(x, adversaries, None if noise is None else noise[k])
            if clip is not None:
                x = x * min(1.0, clip / np.linalg.norm(x))
            received.append(w + x)
        w = np_server(problem, "fedavg", w, np_rule(np.array(received), federation), HP)
        iterates.append(w)
    return iterates, attacked, adversarial


ADVERSARIES = {"sign_flip": {"fraction": 0.4, "attack": "sign_flip", "scale": 3.0},
               "scaled": {"fraction": 0.4, "attack": "scaled", "scale": 5.0},
               "gaussian": {"fraction": 0.4, "attack": "gaussian", "scale": 2.0}}
RULE_CASES = {  # id: (aggregation and its parameters, adversaries, clients per round, clip on the uplink)
    "median": ({"aggregation": "median"}, None, 7, None),
    "median, even S": ({"aggregation": "median"}, None, 6, None),
    "trimmed_mean": ({"aggregation": "trimmed_mean", "trim": 0.25}, None, 8, None),
    "krum": ({"aggregation": "krum", "byzantine": 2}, None, 8, None),
    "multi_krum": ({"aggregation": "multi_krum", "byzantine": 1}, None, 7, None),
    "mean, sign_flip": ({}, "sign_flip", 7, None),
    "median, sign_flip": ({"aggregation": "median"}, "sign_flip", 7, None),
    "median, scaled": ({"aggregation": "median"}, "scaled", 7, None),
    "median, gaussian": ({"aggregation": "median"}, "gaussian", 6, None),
    "krum, gaussian": ({"aggregation": "krum", "byzantine": 2}, "gaussian", 8, None),
    "trimmed_mean, scaled, clipped": ({"aggregation": "trimmed_mean", "trim": 0.3}, "scaled", 7, 0.5),
}


@pytest.mark.parametrize("case", RULE_CASES)
def test_each_rule_and_attack_equals_a_loop_over_clients_in_numpy(case):
    rule, attack, sampled, clip = RULE_CASES[case]
    problem, seed = small_lasso(clients=10), 5
    federation = Federation(6, sampled, 3, 5, adversaries=ADVERSARIES.get(attack),
                            uplink=[{"clip": clip}] if clip else [], **rule)
    algorithm = fedbench.make_algorithm("fedavg", problem, subgradient=False, **HP)
    sim = Simulation(problem, algorithm, federation, seed)
    iterates, attacked, adversarial = np_fedavg(problem, federation, seed, clip)
    for w in iterates:
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12)
    assert set(sim.adversarial.nonzero().flatten().tolist()) == adversarial
    if attack:
        assert attacked > 0 and len(adversarial) == 4
    plain = Simulation(problem, fedbench.make_algorithm("fedavg", problem, subgradient=False, **HP),
                       Federation(6, sampled, 3, 5), seed)
    *_, = plain
    assert not np.allclose(w, plain.server["w"].numpy(), rtol=1e-6)  # the rule or the attack changed the run


# -- the run axis and checkpoints ---------------------------------------------------------------------------------

SAMPLED = Federation(9, 5, 3, 5)
GAUSSIAN = {"fraction": 0.25, "attack": "gaussian", "scale": 0.5}
BATCHED = {  # id: (problem maker, algorithm, federation, hyperparameters)
    "fedavg median, gaussian": (small_lasso, "fedavg", replace(SAMPLED, aggregation="median", adversaries=GAUSSIAN),
                                HP),
    "fedmid krum, sign_flip, rand_k": (small_lasso, "fedmid", replace(
        SAMPLED, aggregation="krum", adversaries={"fraction": 0.25, "scale": 4.0}, uplink=[{"rand_k": 0.5}]), HP),
    # two uploads, updates without a server counterpart
    "scaffold multi_krum, scaled": (small_lasso, "scaffold", replace(
        SAMPLED, aggregation="multi_krum", adversaries={"fraction": 0.25, "attack": "scaled", "scale": 3.0}), HP),
    "pfedme trimmed_mean": (small_lasso, "pfedme", replace(SAMPLED, aggregation="trimmed_mean", trim=0.2),
                            {"client_lr": 0.005}),
    # iteration-wise (coin-flip rounds, every client): the devices' w-gradients
    "ascd_pfl trimmed_mean, gaussian": (pfl, "ascd_pfl", Federation(12, 0, 1, 1, aggregation="trimmed_mean",
                                                                    adversaries=GAUSSIAN), {}),
}


@pytest.mark.parametrize("case", BATCHED)
def test_a_batch_of_seeds_gives_each_seed_its_curve_alone(case):
    make, name, federation, hp = BATCHED[case]
    problem = make()
    sims = [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, 3) for seed in SEEDS]
    assert [runs for runs, _ in programs(sims)] == [list(range(len(SEEDS)))]  # one program
    batched = run_seeds(problem, name, federation, SEEDS, eval_every=3, **hp)
    assert_same(curves_alone(problem, name, federation, hp, SEEDS), batched, 1e-12)
    plain = run_seeds(problem, name, replace(federation, aggregation="uniform", adversaries=None, uplink=()),
                      SEEDS[:1], eval_every=3, **hp)
    assert plain[0][-1]["objective"] != batched[0][-1]["objective"]  # the rule or the attack changed the runs


@pytest.mark.parametrize("case", ["fedavg median, gaussian", "ascd_pfl trimmed_mean, gaussian"])
def test_a_resumed_batch_with_adversaries_gives_the_rows_of_one_never_stopped(case):
    make, name, federation, hp = BATCHED[case]
    problem = make()
    whole = build(problem, name, federation, hp, SEEDS)
    points = []
    whole.safe_point = lambda program: points.append(program.state_dict()["runs"])
    expected = rows_of(whole)
    records = points[len(points) // 2]
    assert all(torch.equal(record["adversarial"], sim.adversarial) for record, sim in zip(records, whole.sims))
    assert len({tuple(record["adversarial"].tolist()) for record in records}) > 1  # each seed its own
    for at in (1, len(points) // 2 + 1):
        resumed, statuses = interrupted(lambda: build(problem, name, federation, hp, SEEDS), at)
        assert resumed == expected
        assert statuses == [sim.status for sim in whole.sims]


def test_without_adversaries_the_streams_and_the_checkpoint_are_as_before():
    problem = small_lasso()
    for federation in (Federation(3, 5, 3, 5), Federation(3, 5, 3, 5, aggregation="krum")):
        sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem), federation, 0)
        assert set(sim.streams()) == {"clients", "minibatches", "feature-noise", "algorithm"}
        assert "adversarial" not in sim.state_dict() and not sim.adversarial.any()
        assert "links" not in build(problem, "fedavg", federation, {}, SEEDS).state_dict()
    attacked = Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(3, 5, 3, 5, adversaries={
        "fraction": 0.5}), 0)
    assert "adversaries" in attacked.streams() and int(attacked.state_dict()["adversarial"].sum()) == 4


def test_median_resists_a_sign_flip_attack_that_breaks_the_mean():
    """30% of the clients send −10 times their update: the mean diverges, the median still descends (measured: its
    objective after 100 rounds is 7% of the start's, against 2.6% without the attack)."""
    problem = small_lasso(clients=10)
    attack = {"fraction": 0.3, "attack": "sign_flip", "scale": 10.0}
    finals = {}
    for aggregation in ("uniform", "median"):
        sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05),
                         Federation(100, 0, 5, 5, aggregation=aggregation, adversaries=attack), 0, eval_every=100)
        start, *_, last = sim
        finals[aggregation] = (sim.status, last["objective"] / start["objective"])
    assert finals["uniform"][0] == "diverged"
    assert finals["median"][0] == "finished" and finals["median"][1] < 0.1


def test_the_engine_refuses_what_cannot_act_per_client():
    problem = small_lasso()
    with pytest.raises(ParamError, match=r"federation\.byzantine: found 2 with krum on S = 6 clients a round; "
                                         r"expected S > 2f \+ 2, f ≤ 1"):
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(3, 6, 3, 5, aggregation="krum",
                                                                                   byzantine=2), 0)
    with pytest.raises(ParamError, match=r"federation\.adversaries\.fraction: expected float in \[0, 1\)"):
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(adversaries={"fraction": 1}), 0)
    with pytest.raises(ParamError, match="federation.adversaries: found adversaries for l2sgd_plus, which all-reduces"):
        Simulation(pfl(), fedbench.make_algorithm("l2sgd_plus", pfl()), Federation(
            3, 0, 1, 1, adversaries={"fraction": 0.1}), 0)


# -- recipes ------------------------------------------------------------------------------------------------------

RECIPE = """\
name: robust-lasso
problem: {name: lasso, clients: 10, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation:
  rounds: 6
  clients_per_round: 7
  local_steps: 3
  batch_size: 5
  aggregation: median
  adversaries: {fraction: 0.3, attack: gaussian, scale: 0.5}
algorithms:
  fedavg: {client_lr: 0.05}
seeds: [3]
eval_every: 3
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "robust.yaml"
    path.write_text(RECIPE)
    return path


def test_fedbench_run_of_a_recipe_with_median_and_adversaries_gives_the_engines_rows(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    problem = fedbench.make_problem("lasso", seed=3, clients=10, samples_per_client=20, dim=30, support=10, lam=0.05)
    federation = Federation(6, 7, 3, 5, aggregation="median", adversaries=robust.Adversaries(0.3, "gaussian", 0.5))
    direct = list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, 3, 3))
    assert json.loads(out.read_text()) == direct


def test_rules_and_adversaries_are_grid_axes_and_set_reaches_inside(recipe):
    grid = load(recipe, ["federation.aggregation=[uniform,median,trimmed_mean]",
                         "federation.adversaries.fraction=[0.1,0.2]"])
    trials = grid.trials()
    assert grid.runs() == len(trials) == 6 and len({t.config_hash for t in trials}) == 6
    params = trials[0].params()
    assert params["federation.aggregation"] == "uniform" and "federation.trim" not in params
    assert params["federation.adversaries"] == "gaussian(fraction=0.1, scale=0.5)"
    assert {t.params().get("federation.trim") for t in trials} == {None, 0.1}  # with the rule that reads it
    result = invoke("run", recipe, "--set", "federation.adversaries.attack=[sign_flip,gaussian]", "--no-track")
    assert result.exit_code == 2 and "federation.adversaries: found 2 values" in result.output
    assert "--set federation.adversaries.NAME=VALUE" in result.output
    assert invoke("validate", recipe, "--set", "federation.aggregation=[krum,multi_krum]",
                  "--set", "federation.byzantine=[1,2]").exit_code == 0


def test_a_recipe_without_rules_or_adversaries_records_and_hashes_its_federation_as_before(recipe):
    plain = load(recipe, ["federation.aggregation=uniform"])
    text = RECIPE.replace("  aggregation: median\n", "").replace("  adversaries: {fraction: 0.3, attack: gaussian, "
                                                                  "scale: 0.5}\n", "")
    recipe.write_text(text)
    before = load(recipe).trials()[0]
    assert before.config()["federation"] == {"rounds": 6, "clients_per_round": 7, "local_steps": 3, "batch_size": 5,
                                             "aggregation": "uniform"}
    recipe.write_text(text.replace("batch_size: 5\n", "batch_size: 5\n  aggregation: samples\n  trim: 0.1\n"
                                                     "  byzantine: 1\n"))
    weighted = load(recipe).trials()[0]
    assert weighted.config()["federation"] == {**before.config()["federation"], "aggregation": "samples"}
    assert plain.trials()[0].config()["federation"]["adversaries"] == "gaussian(fraction=0.3, scale=0.5)"
    median = replace(before.federation, aggregation="median", trim=0.3).config()
    assert median["trim"] == 0.3 and "byzantine" not in median  # a value off its default is recorded: no two alike
