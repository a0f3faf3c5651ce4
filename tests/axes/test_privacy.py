"""Privacy accounting of DP-FedAvg's Gaussian uplink (`fedbench.axes.privacy`): the default (PLD) ε is the dominating
pair's, against its exact one-round ε (closed form), an own NumPy PLD composed by FFT that brackets it, and Microsoft's
`prv_accountant`, and below the RDP bound on the shipped recipes; the RDP option is dp-accounting's own for the event
of the mechanism the engine runs (built here independently); the sensitivity is replace-one's 2C/S (against the exact
ε of the Gaussian mechanism, Balle & Wang 2018, Theorem 8), the rows of a run carry ε alone, batched and resumed,
recipes refuse at the field what cannot be accounted, the noise where the server uses each client's upload, and
`fedbench run` logs ε and its accountant to MLflow."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from scipy.optimize import brentq
from scipy.stats import norm

import fedbench
from fedbench.algorithms.base import MODEL, Upload
from fedbench.axes.privacy import TOLERANCE, Accountant, Mechanism
from fedbench.engine.runs import programs
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.hparams import ParamError
from fedbench.metrics import epsilon_metric
from helpers import interrupted, invoke, refused, rows_by_run, rows_of
from small_problems import small_lasso
from sweeps.recipe import load
from sweeps.report.settings import resolve_settings

REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def library_epsilon(event, rounds: int, delta: float) -> float:
    return RdpAccountant(neighboring_relation=REPLACE_ONE).compose(event, rounds).get_epsilon(delta)


# -- ε: the library's own, for the mechanism as the engine runs it ---------------------------------------------------

CASES = {  # id: (σ, S, N, rounds, δ)
    "10 of 100": (1.0, 10, 100, 50, 1e-5),
    "5 of 20, small δ": (0.7, 5, 20, 200, 1e-6),
    "4 of 50, one round": (2.5, 4, 50, 1, 1e-4),
    "all 32": (2.0, 32, 32, 10, 1e-5),
}


@pytest.mark.parametrize("sigma, sampled, clients, rounds, delta", CASES.values(), ids=CASES)
def test_rdp_epsilon_is_the_accountants_own_for_the_sampled_gaussian_composed(sigma, sampled, clients, rounds, delta):
    """Replace-one's sensitivity 2C/S against the noise σC/S: the Gaussian event of multiplier σ/2, drawn S of N
    without replacement (all N: the Gaussian alone), composed once a round."""
    gaussian = dp_accounting.GaussianDpEvent(sigma / 2)
    event = gaussian if sampled == clients else dp_accounting.SampledWithoutReplacementDpEvent(clients, sampled,
                                                                                               gaussian)
    accountant = Accountant(Mechanism(clients, sampled, sigma), delta, "rdp")
    assert accountant.epsilon(rounds) == library_epsilon(event, rounds, delta)
    assert accountant.epsilon(0) == 0.0
    assert 0 < accountant.epsilon(1) < accountant.epsilon(2) < accountant.epsilon(rounds + 2)


@pytest.mark.parametrize("sampled", [4, 20])
def test_several_uploads_are_one_gaussian_each_a_round(sampled):
    """Each of the U uploads is clipped and noised on its own: U Gaussian events on the same sample a round."""
    uploads = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.6), 3)
    event = uploads if sampled == 20 else dp_accounting.SampledWithoutReplacementDpEvent(20, sampled, uploads)
    ours = Accountant(Mechanism(20, sampled, 1.2, uploads=3), 1e-5, "rdp").epsilon(30)
    assert ours == pytest.approx(library_epsilon(event, 30, 1e-5), rel=1e-12)
    assert ours > Accountant(Mechanism(20, sampled, 1.2), 1e-5, "rdp").epsilon(30)
    tight = Accountant(Mechanism(20, sampled, 1.2, uploads=3), 1e-5).epsilon(30)
    assert tight == pytest.approx(Accountant(Mechanism(20, sampled, 1.2 / math.sqrt(3)), 1e-5).epsilon(30), rel=1e-12)


def exact_gaussian_epsilon(ratio: float, delta: float) -> float:
    """The least ε at which the Gaussian mechanism of sensitivity over noise `ratio` is (ε, δ)-DP: Balle & Wang
    (ICML 2018), Theorem 8, δ(ε) = Φ(r/2 − ε/r) − e^ε Φ(−r/2 − ε/r), solved for ε."""
    return brentq(lambda e: norm.cdf(ratio / 2 - e / ratio) - math.exp(e) * norm.cdf(-ratio / 2 - e / ratio) - delta,
                  0, 200)


@pytest.mark.parametrize("sigma, rounds, uploads", [(1.0, 10, 1), (3.0, 50, 1), (2.0, 20, 2)])
def test_the_sensitivity_is_twice_the_clip(sigma, rounds, uploads):
    """All N clients a round: r rounds of U uploads, each mean moved by up to 2C/S when one client's data are
    replaced, under noise σC/S, are one Gaussian mechanism of ratio 2√(rU)/σ. ε never falls below that mechanism's
    exact ε (RDP's conversion is within 10% of it here), which the per-client bound C (ratio √(rU)/σ) would."""
    delta = 1e-5
    ours = Accountant(Mechanism(16, 16, sigma, uploads), delta, "rdp").epsilon(rounds)
    exact = exact_gaussian_epsilon(2 * math.sqrt(rounds * uploads) / sigma, delta)
    assert exact <= ours <= 1.1 * exact
    tight = Accountant(Mechanism(16, 16, sigma, uploads), delta).epsilon(rounds)
    assert exact <= tight <= (1 + TOLERANCE) * exact
    half = library_epsilon(dp_accounting.GaussianDpEvent(sigma / math.sqrt(uploads)), rounds, delta)
    assert half < exact  # what passing σ as the library's multiplier would claim


# -- the PLD's ε: the dominating pair's, against independent computations ------------------------------------------

def pair_loss(q: float, m: float):
    """One round's dominating pair (A, B) = (qN(1, m²) + (1 − q)N(0, m²), N(0, m²)): the privacy loss log A/B at x,
    increasing, and its inverse (the x at which it is l; l > log(1 − q))."""
    def loss(x):
        return np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * m * m))

    def at(value):
        return m * m * np.log((np.exp(value) - (1 - q)) / q) + 0.5
    return loss, at


def one_round_delta(q: float, m: float, epsilon: float) -> float:
    """The exact δ(ε) of one round, the larger of the pair's two orders: ∫(A − e^ε B)₊ = A(x > x*) − e^ε B(x > x*)
    where the loss is ε at x*, and ∫(B − e^ε A)₊ = B(x < x′) − e^ε A(x < x′) where it is −ε at x′ (none where −ε is
    below the least loss, log(1 − q))."""
    _, at = pair_loss(q, m)
    x = at(epsilon)
    remove = q * norm.sf((x - 1) / m) + (1 - q) * norm.sf(x / m) - math.exp(epsilon) * norm.sf(x / m)
    if -epsilon <= math.log1p(-q):
        return remove
    x = at(-epsilon)
    add = norm.cdf(x / m) - math.exp(epsilon) * (q * norm.cdf((x - 1) / m) + (1 - q) * norm.cdf(x / m))
    return max(remove, add)


@pytest.mark.parametrize("sigma, sampled, clients", [(1.0, 10, 100), (4.0, 100, 1000), (0.5, 9, 10), (30.0, 36, 358)])
def test_one_rounds_pld_epsilon_is_the_pairs_exact_one(sigma, sampled, clients):
    q, m, delta = sampled / clients, sigma / 2, 1e-5
    exact = brentq(lambda e: one_round_delta(q, m, e) - delta, 1e-9, 100)
    ours = Accountant(Mechanism(clients, sampled, sigma), delta).epsilon(1)
    assert exact <= ours <= (1 + TOLERANCE) * exact


def composed_epsilon(q: float, m: float, rounds: int, delta: float, grid: float, up: bool) -> float:
    """ε of `rounds` rounds of the pair by an own discretised PLD: each order's loss, l = log A/B under A and
    −l under B, its mass between grid points put on the upper one (`up`: ε above the true one) or the lower one
    (below it), the mass beyond the grid at infinity (`up`) or dropped; composed by FFT; ε the least at which both
    orders' δ(ε) = E(1 − e^(ε − L))₊ + P(L = ∞) is δ."""
    loss, at = pair_loss(q, m)
    low, high = math.log1p(-q), float(loss(1 + 9 * m))  # the least loss, and one A and B pass with mass < 1e-18
    edges = np.arange(math.floor(low / grid), math.ceil(high / grid) + 1) * grid
    xs = at(np.maximum(edges, low + 1e-12))
    # under A (remove: loss l) and under B (add: loss −l, the edges' order reversed), each cell's mass
    in_a = np.diff(q * norm.cdf(xs - 1, scale=m) + (1 - q) * norm.cdf(xs, scale=m))
    in_b = np.diff(norm.cdf(xs, scale=m))
    beyond_a = q * norm.sf(xs[-1] - 1, scale=m) + (1 - q) * norm.sf(xs[-1], scale=m)
    epsilons = []
    for mass, values, beyond in ((in_a, edges[1:] if up else edges[:-1], beyond_a),
                                 (in_b[::-1], -(edges[:-1] if up else edges[1:])[::-1], 0.0)):
        size = rounds * (len(mass) - 1) + 1
        pmf = np.fft.irfft(np.fft.rfft(mass, 2 * size) ** rounds, 2 * size)[:size].clip(0)
        composed = rounds * values[0] + grid * np.arange(size)
        infinite = 1 - (1 - beyond) ** rounds if up else 0.0

        def delta_at(e):
            return float(np.sum(pmf * -np.expm1(np.minimum(e - composed, 0)))) + infinite - delta
        epsilons.append(brentq(delta_at, 0, composed[-1]) if delta_at(0) > 0 else 0.0)
    return max(epsilons)


@pytest.mark.parametrize("sigma, sampled, clients, rounds", [(1.0, 10, 100, 20), (4.0, 100, 1000, 100),
                                                             (2.0, 36, 358, 50)])
def test_the_pld_epsilon_lies_between_an_own_pld_rounded_down_and_up(sigma, sampled, clients, rounds):
    q, m, delta, grid = sampled / clients, sigma / 2, 1e-5, 5e-4
    ours = Accountant(Mechanism(clients, sampled, sigma), delta).epsilon(rounds)
    below, above = (composed_epsilon(q, m, rounds, delta, grid, up) for up in (False, True))
    assert below <= ours <= above * (1 + TOLERANCE)
    assert above - below < 0.03 * ours  # the bracket says something


@pytest.mark.parametrize("sigma, sampled, clients", [(4.0, 100, 1000), (8.0, 36, 358), (2.0, 10, 100)])
def test_the_pld_epsilon_is_prv_accountants(sigma, sampled, clients):
    """Microsoft's PRV accountant (Gopi, Lee, Wutschitz 2021), its own discretisation of the same pair, gives ε
    within its error bounds."""
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    prv = PRVAccountant(PoissonSubsampledGaussianMechanism(sampling_probability=sampled / clients,
                                                           noise_multiplier=sigma / 2),
                        max_self_compositions=200, eps_error=0.01, delta_error=1e-10)
    low, _, high = prv.compute_epsilon(delta=1e-5, num_self_compositions=200)
    assert low <= Accountant(Mechanism(clients, sampled, sigma), 1e-5).epsilon(200) <= high


SHIPPED = {  # recipe: (N, S, its σ's, rounds)
    "privacy": (1000, 100, (1.0, 2.0, 4.0), 200),
    "privacy_emnist10": (358, 36, (1.0, 2.0, 4.0, 8.0), 200),
}


@pytest.mark.parametrize("clients, sampled, sigmas, rounds", SHIPPED.values(), ids=SHIPPED)
def test_the_pld_epsilon_is_below_the_rdp_bound_on_the_shipped_recipes(clients, sampled, sigmas, rounds):
    for sigma in sigmas:
        mechanism = Mechanism(clients, sampled, sigma)
        tight, loose = (Accountant(mechanism, 1e-5, method).epsilon(rounds) for method in ("pld", "rdp"))
        assert 2 < loose / tight < 3.6, (sigma, tight, loose)
    mechanism = Mechanism(1000, 100, 4.0)  # recipes/privacy.yaml at σ = 4
    assert Accountant(mechanism, 1e-5, "rdp").epsilon(200) == pytest.approx(7.95, abs=0.005)
    assert Accountant(mechanism, 1e-5).epsilon(200) == pytest.approx(3.36, abs=0.005)


def test_an_unknown_accountant_is_refused():
    with pytest.raises(ParamError, match=r"^privacy\.accountant: found 'moments', expected one of pld, rdp"):
        Accountant(Mechanism(10, 2, 1.0), 1e-5, "moments")


def test_the_mechanism_is_the_engines_sampling():
    uplink = Federation(uplink=[{"clip": 0.5}, {"top_k": 0.5}, {"gaussian": 1.5}]).uplink  # its steps
    one = SimpleNamespace(participation="sampled", uploads=(MODEL,))
    assert Mechanism.of(uplink, 3, one, 8) == Mechanism(8, 3, 1.5, 1)
    assert Mechanism.of(uplink, 0, one, 8) == Mechanism(8, 8, 1.5, 1)
    assert Mechanism.of(uplink, 8, one, 8) == Mechanism(8, 8, 1.5, 1)
    everyone = SimpleNamespace(participation="all", uploads=(Upload("g"), Upload("h")))
    assert Mechanism.of(uplink, 3, everyone, 8) == Mechanism(8, 8, 1.5, 2)
    problem = small_lasso()
    scaffold = fedbench.make_algorithm("scaffold", problem)
    assert Mechanism.of(uplink, 3, scaffold, 8).uploads == 2


ENGINE_REFUSALS = {  # id: (uplink, δ, the error's start)
    "no noise": ([{"clip": 1.0}], 1e-5, "federation.uplink: found no gaussian step"),
    "sigma 0": ([{"clip": 1.0}, {"gaussian": 0.0}], 1e-5, "federation.uplink.1.gaussian: found sigma 0"),
    "rand_k after the clip": ([{"clip": 1.0}, {"rand_k": 0.5}, {"gaussian": 1.0}], 1e-5,
                              "federation.uplink.1.rand_k: found rand_k between the clip and the noise"),
    "delta 1": ([{"clip": 1.0}, {"gaussian": 1.0}], 1.0, "privacy.delta: found 1.0, expected a δ in (0, 1)"),
}


@pytest.mark.parametrize("uplink, delta, message", ENGINE_REFUSALS.values(), ids=ENGINE_REFUSALS)
def test_a_simulation_refuses_what_it_cannot_account(uplink, delta, message):
    problem = small_lasso()
    with pytest.raises(ParamError) as err:
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(6, 3, 2, 5, uplink=uplink), 0,
                   delta=delta)
    assert str(err.value).startswith(message)


# -- the rows ------------------------------------------------------------------------------------------------------

DP = Federation(9, 3, 3, 5, uplink=[{"clip": 0.3}, {"gaussian": 1.2}])
SEEDS = [0, 4, 9]


def sims(delta=1e-5, seeds=SEEDS):
    problem = small_lasso()
    return [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), DP, seed, 3, delta=delta)
            for seed in seeds]


def test_every_row_carries_epsilon_alone_batched_and_resumed():
    alone = [list(sim) for sim in sims()]
    accountant = Accountant(Mechanism(8, 3, 1.2), 1e-5)
    for rows in alone:
        assert [row["round"] for row in rows] == [0, 3, 6, 9]
        assert [row["epsilon"] for row in rows] == [accountant.epsilon(row["round"]) for row in rows]
        assert all(a < b for a, b in zip([row["epsilon"] for row in rows], [row["epsilon"] for row in rows][1:]))
    batch = sims()
    [(runs, _)] = programs(batch)
    assert len(runs) == len(SEEDS)  # the seeds share one program
    assert rows_by_run(run_batch(batch), len(SEEDS)) == alone

    def program():
        [(_, made)] = programs(sims())
        return made

    resumed, statuses = interrupted(program, 2)
    assert resumed == alone and statuses == ["finished"] * len(SEEDS)
    assert rows_of(program()) == alone


def test_without_delta_the_rows_are_as_before_and_the_same_run():
    with_epsilon, without = list(sims()[0]), list(sims(delta=None)[0])
    assert [{k: v for k, v in row.items() if k != "epsilon"} for row in with_epsilon] == without


# -- recipes ------------------------------------------------------------------------------------------------------

RECIPE = """\
name: lasso-dp
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 6, clients_per_round: 3, local_steps: 3, batch_size: 5, uplink: [{clip: 0.5}, {gaussian: 1.0}]}
algorithms:
  fedavg: {client_lr: 0.05}
seeds: [3]
eval_every: 3
privacy: {delta: 1.0e-5}
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "dp.yaml"
    path.write_text(RECIPE)
    return path



REFUSALS = {  # id: (--set assignments, the field path, a phrase of the line)
    "privacy without noise": (["federation.uplink=[{clip: 0.5}]"], "privacy", "found no run with DP-FedAvg's noise"),
    "noise without privacy": (["privacy=null"], "federation.uplink.1.gaussian",
                              "expected `privacy: {delta: 1.0e-5}` at the top level"),
    "sigma 0": (["federation.uplink.1.gaussian=0.0"], "federation.uplink.1.gaussian", "found sigma 0"),
    "qsgd after the clip": (["federation.uplink=[{clip: 0.5}, {qsgd: 4}, {gaussian: 1.0}]"],
                            "federation.uplink.1.qsgd", "found qsgd between the clip and the noise"),
    "error feedback after the clip": (["federation.uplink=[{clip: 0.5}, {top_k: 0.5}, error_feedback, {gaussian: 1.0}]"],
                                      "federation.uplink.2.error_feedback", "expected only top_k or sign there"),
    "delta 0": (["privacy.delta=0"], "privacy.delta", "found 0, expected greater than 0"),
    "delta 1": (["privacy.delta=1.0"], "privacy.delta", "found 1.0, expected less than 1"),
    "no delta": (["privacy={}"], "privacy.delta", "missing required field"),
    "unknown accountant": (["privacy.accountant=moments"], "privacy.accountant", "found 'moments'"),
    "in an algorithm's own federation": (
        ["federation.uplink=[]", "algorithms.fedavg.federation={uplink: [{clip: 0.5}, {rand_k: 0.5}, {gaussian: 1.0}]}"],
        "algorithms.fedavg.federation.uplink.1.rand_k", "found rand_k between the clip and the noise"),
}


@pytest.mark.parametrize("sets, field, phrase", REFUSALS.values(), ids=REFUSALS)
def test_validate_refuses_what_cannot_be_accounted_at_its_field(recipe, sets, field, phrase):
    result = invoke("validate", recipe, *[arg for value in sets for arg in ("--set", value)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    first = result.output.splitlines()[0]
    assert f"{recipe}: {field}: " in first and phrase in first, first


@pytest.mark.parametrize("uplink", ["[{qsgd: 4}, {clip: 0.5}, {gaussian: 1.0}]",
                                    "[{top_k: 0.5}, error_feedback, {clip: 0.5}, {gaussian: 1.0}]",
                                    "[{clip: 0.5}, sign, {gaussian: 1.0}]"])
def test_what_keeps_the_clipped_norm_is_accounted(recipe, uplink):
    assert invoke("validate", recipe, "--set", f"federation.uplink={uplink}").exit_code == 0


def test_delta_and_accountant_are_in_the_config_of_runs_with_noise_only(recipe):
    """A run's rows hold ε at its δ by its accountant, so that both are part of what a stored curve is of; a run
    without noise is recorded and hashed as before."""
    trial = load(recipe).trials()[0]
    assert trial.delta == 1e-5 and trial.config()["privacy"] == {"delta": 1e-5, "accountant": "pld"}
    assert trial.params()["privacy.delta"] == 1e-5 and trial.params()["privacy.accountant"] == "pld"
    assert load(recipe, ["privacy.delta=1.0e-6"]).trials()[0].config_hash != trial.config_hash
    rdp = load(recipe, ["privacy.accountant=rdp"]).trials()[0]
    assert rdp.accountant == "rdp" and rdp.config_hash != trial.config_hash
    mixed = load(recipe, ["federation.uplink=[]", "algorithms.fedmid={client_lr: 0.05}",
                          "algorithms.fedavg.federation={uplink: [{clip: 0.5}, {gaussian: 1.0}]}"])
    plain = load(recipe, ["federation.uplink=[]", "privacy=null", "algorithms.fedmid={client_lr: 0.05}"])
    by_algorithm = {trial.algorithm: trial for trial in mixed.trials()}
    assert by_algorithm["fedavg"].delta == 1e-5 and by_algorithm["fedmid"].delta is None
    assert by_algorithm["fedmid"].config_hash == [t for t in plain.trials() if t.algorithm == "fedmid"][0].config_hash
    assert mixed.metrics()["epsilon"] == epsilon_metric(1e-5)


def test_a_report_labels_epsilon_with_delta_and_ranks_nothing_by_it(recipe):
    metric = load(recipe).metrics()["epsilon"]
    assert (metric.label, metric.direction) == ("ε (δ = 1e-05)", "min")
    settings = resolve_settings(load(recipe, ["report={metrics: [objective, epsilon]}"]), ["epsilon", "objective"],
                                None)
    assert settings.label("epsilon") == "ε (δ = 1e-05)" and settings.select.metric == "objective"
    assert resolve_settings(load(recipe), ["epsilon", "f1", "objective_gap"], None).select.metric == "objective_gap"
    assert resolve_settings(load(recipe), ["epsilon", "f1"], None).select.metric == "f1"


def test_fedbench_run_logs_epsilon_to_mlflow(recipe, tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--json", out, "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    problem = small_lasso(seed=3)
    federation = replace(DP, rounds=6, local_steps=3, uplink=[{"clip": 0.5}, {"gaussian": 1.0}])
    direct = list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, 3, 3,
                             delta=1e-5))
    assert rows == direct
    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lasso-dp").experiment_id])
    assert run.data.params["privacy.delta"] == "1e-05" and run.data.tags["accountant"] == "pld"
    history = client.get_metric_history(run.info.run_id, "epsilon")
    assert [(m.step, m.value) for m in history] == [(row["round"], row["epsilon"]) for row in rows]
    assert [row["round"] for row in rows] == [0, 3, 6] and 0 == rows[0]["epsilon"] < rows[1]["epsilon"] < rows[2]["epsilon"]


def test_fedbench_list_says_how_to_account_the_noise():
    listing = invoke("list", "privacy")
    text = " ".join(listing.output.split())  # wrapped at the terminal's width
    assert listing.exit_code == 0 and "privacy: {delta: δ, accountant: pld | rdp} at a recipe's top level" in text
    assert "PLD accountant on the dominating pair (tight; the default)" in text


# -- the noise on the mean, where the server uses each client's upload ------------------------------------------------

POOLED = """\
problem: {name: pauc, preset: guo2023_noisy_auc, clients: 4, positives_per_client: 10, negatives_per_client: 50,
          features: 6}
federation: {rounds: 2, clients_per_round: 3, batch_size: 8, uplink: [{clip: 0.5}, {gaussian: 1000.0}]}
algorithms: {fedxl2: {}}
privacy: {delta: 1.0e-5}
"""


def test_noise_is_refused_where_the_server_uses_each_clients_upload(tmp_path):
    """FeDXL2's server pools each client's scores: the one draw the clients share leaves their differences without
    noise at any σ, so that no ε bounds what the server receives."""
    path = tmp_path / "pooled.yaml"
    path.write_text(POOLED)
    result = invoke("validate", path)
    first = refused(result, f"{path}: federation.uplink.1.gaussian: found gaussian for fedxl2, whose server uses each "
                    "client's upload", "protects only their mean")
    assert result.output.strip() == first
    problem = fedbench.make_problem("pauc", preset="guo2023_noisy_auc", clients=4, positives_per_client=10,
                                    negatives_per_client=50, features=6)
    for accounted in (1e-5, None):
        with pytest.raises(ParamError, match=r"^federation\.uplink\.1\.gaussian: found gaussian for fedxl2"):
            Simulation(problem, fedbench.make_algorithm("fedxl2", problem), Federation(
                2, 3, 1, 8, uplink=[{"clip": 0.5}, {"gaussian": 1000.0}]), 0, delta=accounted)
    with pytest.raises(ParamError, match=r"^federation\.uplink\.2\.gaussian: found gaussian for fedxl1"):
        fedbench.run("fedxl1", problem, rounds=2, clients_per_round=3, local_steps=1, batch_size=8,
                     uplink=[{"clip": 0.5}, {"top_k": 0.5}, {"gaussian": 1.0}])
    averaged = POOLED.replace("name: pauc, preset: guo2023_noisy_auc, clients: 4, positives_per_client: 10, "
                              "negatives_per_client: 50,\n          features: 6",
                              "name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05")
    path.write_text(averaged.replace("fedxl2: {}", "fedavg: {client_lr: 0.05}"))
    assert invoke("validate", path).exit_code == 0
