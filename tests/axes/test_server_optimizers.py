"""The server optimizer (`federation.server_optimizer`, `fedbench.axes.server_optimizers`): FedAvg, SCAFFOLD and FedProx
with each rule against loops written in NumPy on the engine's draws (the rules transcribed twice: Reddi et al. 2021,
Algorithm 2, and optax's update functions, with optax's sign convention); a grid over its floats as one program equal
to each run alone; a program resumed from a checkpoint equal to one never stopped; the refusals (engine and
`fedbench validate`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import fedbench
from fedbench.algorithms.base import CLIENT_LR, Algorithm, aggregate, coin_flips_to_success, per_client_copies
from fedbench.axes.server_optimizers import ServerOptimizer
from fedbench.engine.federation import RoundSampler
from fedbench.engine.planning import program_key, why_not_batchable
from fedbench.engine.runs import IterationProgram, programs
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.hparams import Param, ParamError, PerRound
from fedbench.rng import generator
from fedbench.schedules import Cosine
from helpers import SEEDS, build, interrupted, invoke, np_local, pauc, pfl, refused, rows_of
from small_problems import small_lasso

ROUNDS, SEED = 6, 5


class PaperRule:
    """Reddi et al. 2021, Algorithm 2, written out: m_{-1} = 0, v_{-1} = τ², no bias correction."""

    def __init__(self, name, d, lr, beta1=0.9, beta2=0.99, tau=1e-3):
        self.name, self.lr, self.b1, self.b2, self.tau = name, lr, beta1, beta2, tau
        self.m, self.v = np.zeros(d), np.full(d, tau**2)

    def step(self, delta):
        self.m = self.b1 * self.m + (1 - self.b1) * delta
        if self.name == "adagrad":
            self.v = self.v + delta**2
        elif self.name == "adam":
            self.v = self.b2 * self.v + (1 - self.b2) * delta**2
        else:
            self.v = self.v - (1 - self.b2) * delta**2 * np.sign(self.v - delta**2)
        return self.lr * self.m / (np.sqrt(self.v) + self.tau)


class OptaxRule:
    """optax's `sgd` (with `momentum`: trace), `adagrad` (scale_by_rss), `adam` (scale_by_adam) and `yogi`
    (scale_by_yogi), eps_root = 0, each then scaled by −lr, fed the pseudo-gradient g = −Δ (optax minimizes: its update
    is added to the parameters)."""

    def __init__(self, name, d, lr, beta1=0.9, beta2=0.99, tau=1e-3, initial_accumulator=None):
        self.name, self.lr, self.b1, self.b2, self.eps = name, lr, beta1, beta2, tau
        start = {"adagrad": 0.1, "yogi": 1e-6}.get(name, 0.0) if initial_accumulator is None else initial_accumulator
        self.mu = np.zeros(d) if name != "yogi" else np.full(d, start)
        self.nu = np.full(d, start)
        self.count = 0

    def step(self, delta):
        g = -delta
        if self.name == "sgd":
            updates = g
        elif self.name == "momentum":  # optax.trace(decay=β1): trace ← g + β1 trace
            self.mu = g + self.b1 * self.mu
            updates = self.mu
        elif self.name == "adagrad":
            self.nu = self.nu + g**2
            updates = np.where(self.nu > 0, g / np.sqrt(self.nu + self.eps), 0.0)
        else:
            self.mu = self.b1 * self.mu + (1 - self.b1) * g
            if self.name == "adam":
                self.nu = self.b2 * self.nu + (1 - self.b2) * g**2
            else:
                self.nu = self.nu - (1 - self.b2) * np.sign(self.nu - g**2) * g**2
            self.count += 1
            mu_hat = self.mu / (1 - self.b1**self.count)
            nu_hat = self.nu / (1 - self.b2**self.count)
            updates = mu_hat / (np.sqrt(nu_hat) + self.eps)
        return -self.lr * updates


def np_rule(spec, d):
    """The rule's transcription: Reddi et al.'s for the paper's form, optax's for its form and for sgd and momentum
    (optax.sgd, with momentum)."""
    values = spec.values()
    form = values.pop("form", "optax")
    return OptaxRule(spec.name, d, **values) if form == "optax" else PaperRule(spec.name, d, **values)


def lasso_grad(problem, u, rows):
    x, y = problem.features.numpy()[rows], problem.labels.numpy()[rows]
    return x.T @ (x @ u - y) / len(rows)


def numpy_run(problem, name, federation, hp, seed=SEED):
    """`name` (fedavg, scaffold option II, fedprox) with the federation's server optimizer on h = 0, on the engine's
    draws: the server state w after each round."""
    sampler = RoundSampler(problem, federation, seed)
    w = problem.init_params(generator(seed, "init")).numpy()
    n, d = problem.num_clients, problem.dim
    rule = np_rule(federation.server_optimizer, d)
    schedule = federation.server_optimizer.lr if isinstance(federation.server_optimizer.lr, PerRound) else None
    c, c_i = np.zeros(d), np.zeros((n, d))
    states = []
    for r in range(federation.rounds):
        if schedule is not None:
            rule.lr = schedule.value(r, federation.rounds)
        clients, rows = sampler.draw(federation.local_steps)
        updates, dc = [], np.zeros(d)
        for k, client in enumerate(clients.tolist()):
            steps = rows["D"][:, k].numpy()
            if name == "fedavg":
                u = np_local(problem, "fedavg", w, steps, hp)
            else:
                u = w.copy()
                for step_rows in steps:
                    g = lasso_grad(problem, u, step_rows)
                    g = g - c_i[client] + c if name == "scaffold" else g + hp["prox_mu"] * (u - w)
                    u = u - hp["client_lr"] * g
            if name == "scaffold":
                c_new = c_i[client] - c + (w - u) / (len(steps) * hp["client_lr"])
                dc += c_new - c_i[client]
                c_i[client] = c_new
            updates.append(u - w)
        step = rule.step(np.mean(updates, axis=0))
        w = w + hp.get("server_lr", 1.0) * step
        c = c + dc / n
        states.append(w)
    return states


def engine_run(problem, name, federation, hp, seed=SEED):
    sim = Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed)
    states = []
    for _ in range(federation.rounds):
        sim.run_round()
        states.append(sim.server["w"].numpy().copy())
    return states


RULES = [("sgd", None), ("momentum", None)] + [(rule, form) for rule in ("adagrad", "adam", "yogi")
                                               for form in ("paper", "optax")]
LR = {"sgd": 0.7, "momentum": 0.3, "adagrad": 0.05, "adam": 0.05, "yogi": 0.05}


@pytest.mark.parametrize("rule, form", RULES, ids=[f"{r}-{f}" if f else r for r, f in RULES])
def test_fedavg_with_each_rule_equals_a_numpy_loop_on_the_same_draws(rule, form):
    problem = small_lasso(lam=0.0)
    spec = {"name": rule, "lr": LR[rule], **({"form": form} if form else {})}
    federation = Federation(ROUNDS, 3, 3, 5, server_optimizer=spec)
    hp = {"client_lr": 0.05, "server_lr": 0.8, "subgradient": False}
    expected = numpy_run(problem, "fedavg", federation, hp)
    got = engine_run(problem, "fedavg", federation, hp)
    for t, (mine, want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-13, err_msg=f"round {t}")
    plain = engine_run(problem, "fedavg", Federation(ROUNDS, 3, 3, 5), hp)
    moved = np.abs(got[-1] - plain[-1]).max()
    assert (moved < 1e-12) == (rule == "sgd" and LR[rule] == 1.0) and np.abs(got[-1]).max() > 1e-2


@pytest.mark.parametrize("name, hp", [("scaffold", {"client_lr": 0.05, "server_lr": 0.9, "subgradient": False}),
                                      ("fedprox", {"client_lr": 0.05, "prox_mu": 0.1})])
def test_scaffold_and_fedprox_with_adam_equal_numpy_loops(name, hp):
    """SCAFFOLD's Δy goes through Adam (declared `update_of="w"`), its c by its own Δc; FedProx's local models."""
    problem = small_lasso(lam=0.0)
    federation = Federation(ROUNDS, 3, 3, 5, server_optimizer={"name": "adam", "lr": 0.05})
    expected = numpy_run(problem, name, federation, hp)
    for t, (mine, want) in enumerate(zip(engine_run(problem, name, federation, hp), expected)):
        np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-13, err_msg=f"round {t}")


def test_a_scheduled_lr_takes_its_value_at_each_round():
    """FedAdam with a cosine lr against NumPy, and alone as in a program beside a run of a float lr."""
    problem = small_lasso(lam=0.0)
    hp = {"client_lr": 0.05, "subgradient": False}
    scheduled = Federation(ROUNDS, 3, 3, 5, server_optimizer={"name": "adam", "lr": Cosine(init=0.1, final=0.01)})
    expected = numpy_run(problem, "fedavg", scheduled, hp)
    got = engine_run(problem, "fedavg", scheduled, hp)
    for t, (mine, want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-13, err_msg=f"round {t}")
    fixed = Federation(ROUNDS, 3, 3, 5, server_optimizer={"name": "adam", "lr": 0.1})
    assert np.abs(engine_run(problem, "fedavg", fixed, hp)[-1] - got[-1]).max() > 1e-3
    sims = [Simulation(problem, fedbench.make_algorithm("fedavg", problem, **hp), federation, SEED)
            for federation in (scheduled, fixed)]
    [(_, program)] = programs(sims)
    rows = rows_of(program)
    assert rows[0][-1] == pytest.approx(list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, **hp),
                                                        scheduled, SEED))[-1], rel=1e-12, abs=1e-14)
    assert program.sims[0].server["w"].numpy() == pytest.approx(got[-1], rel=1e-12, abs=1e-13)


def test_sgd_at_lr_1_is_the_algorithms_own_server_step():
    problem = small_lasso()
    hp = {"client_lr": 0.05, "server_lr": 0.8}
    plain = engine_run(problem, "fedavg", Federation(ROUNDS, 3, 3, 5), hp)
    sgd = engine_run(problem, "fedavg", Federation(ROUNDS, 3, 3, 5, server_optimizer={"name": "sgd"}), hp)
    np.testing.assert_allclose(sgd[-1], plain[-1], rtol=1e-12, atol=1e-14)
    adam = fedbench.run("fedavg", problem, ROUNDS, 3, 3, 5, seed=SEED, server_optimizer={"name": "adam"}, **hp)
    engine = engine_run(problem, "fedavg", Federation(ROUNDS, 3, 3, 5, server_optimizer={"name": "adam"}), hp)
    np.testing.assert_array_equal(adam.params.numpy(), engine[-1])  # fedbench.run takes it as a recipe writes it


@pytest.mark.parametrize("links", [{"aggregation": "median"}, {"downlink": [{"top_k": 0.3}]},
                                   {"uplink": [{"top_k": 0.3}, {"error_feedback": "ef21"}]}],
                         ids=["median", "compressed downlink", "ef21 uplink"])
def test_it_acts_on_the_update_as_the_server_receives_it(links):
    """After a robust rule (its aggregate stands for the mean), a compressed downlink (the update from the clients'
    copy ŵ, added to the server's own w: EF21-P) and an uplink chain: `sgd` at lr η with the algorithm's server step 1
    is the algorithm's server step η."""
    problem = small_lasso()
    optimized = engine_run(problem, "fedavg", Federation(ROUNDS, 5, 3, 5, server_optimizer={"name": "sgd", "lr": 0.4},
                                                         **links), {"client_lr": 0.05})
    own = engine_run(problem, "fedavg", Federation(ROUNDS, 5, 3, 5, **links), {"client_lr": 0.05, "server_lr": 0.4})
    np.testing.assert_allclose(optimized[-1], own[-1], rtol=1e-12, atol=1e-13)


def test_a_grid_over_its_floats_is_one_program_equal_to_each_run_alone():
    problem = small_lasso(lam=0.0)
    specs = [{"name": "yogi", "lr": 0.05}, {"name": "yogi", "lr": 0.02, "beta1": 0.5, "beta2": 0.9, "tau": 1e-2},
             {"name": "yogi", "lr": 0.1, "tau": 1e-4}]

    def sims():
        return [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05, subgradient=False),
                           Federation(ROUNDS, 3, 3, 5, server_optimizer=spec), seed, 2)
                for spec, seed in zip(specs, (0, 1, 2))]

    batch = sims()
    assert why_not_batchable(batch) is None and len(programs(batch)) == 1
    rows: list[list[dict]] = [[] for _ in specs]
    for i, row in run_batch(batch):
        rows[i].append(row)
    for i, sim in enumerate(sims()):
        alone = list(sim)
        assert len(alone) == len(rows[i]) == ROUNDS // 2 + 1
        for mine, theirs in zip(rows[i], alone):
            assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-14)  # one program's kernels: within rounding
    assert rows[0][-1]["objective"] != pytest.approx(rows[1][-1]["objective"], rel=1e-6)  # the floats differ
    other = Simulation(problem, fedbench.make_algorithm("fedavg", problem, subgradient=False), Federation(
        ROUNDS, 3, 3, 5, server_optimizer={"name": "adam"}), 0)
    assert "federation" in why_not_batchable([batch[0], other])  # another rule: another program


def test_a_resumed_program_gives_the_rows_of_one_never_stopped():
    problem = small_lasso()
    federation = Federation(9, 3, 3, 5, server_optimizer={"name": "adam", "lr": 0.05, "form": "optax"})
    hp = {"client_lr": 0.05}
    expected = rows_of(build(problem, "scaffold", federation, hp, SEEDS))
    for at in (1, 5):
        resumed, _ = interrupted(lambda: build(problem, "scaffold", federation, hp, SEEDS), at)
        assert resumed == expected


def test_a_round_without_participants_leaves_its_state():
    """Bernoulli participation with p = 0.1 on 8 clients: about 43% of the rounds have none; the state's round count
    t is the rounds with someone, and the run alone equals the run in a batch."""
    problem = small_lasso(lam=0.0)
    federation = Federation(12, 4, 2, 5, participation={"model": "bernoulli", "p": 0.1},
                            server_optimizer={"name": "adam", "lr": 0.05, "form": "optax"})
    sims = [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, seed, 3)
            for seed in (0, 1)]
    [(_, program)] = programs(sims)
    rows = rows_of(program)
    for i, seed in enumerate((0, 1)):
        sampler = RoundSampler(problem, federation, seed)
        taking = sum(bool(sampler.draw_round(2, index=r).present.any()) for r in range(federation.rounds))
        assert 0 < taking < federation.rounds
        assert int(program.server_steps.state["t"][i]) == taking
        alone = Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, seed, 3)
        for mine, theirs in zip(rows[i], alone):
            assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-14)


# -- refusals -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, make", [("fedda", small_lasso), ("fast_fedda", small_lasso), ("codasca", pauc),
                                        ("l2sgd_plus", pfl)])
def test_algorithms_without_an_update_of_w_are_refused_by_the_engine(name, make):
    """Dual averaging uploads updates of its dual state; CODASCA of its v = (w, a, b); L2SGD+ all-reduces its w."""
    problem = make()
    federation = Federation(3, 3, 2, 5, server_optimizer={"name": "adam"})
    with pytest.raises(ParamError) as err:
        Simulation(problem, fedbench.make_algorithm(name, problem), federation, 0)
    assert str(err.value).startswith(f"federation.server_optimizer: found adam for {name}, "), str(err.value)


RECIPE = """\
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 3, clients_per_round: 3, local_steps: 2, batch_size: 5, server_optimizer: SPEC}
algorithms: {ALGORITHM: {}}
"""


@pytest.mark.parametrize("algorithm, spec, path, phrase", [
    ("fedda", "{name: adam}", "federation.server_optimizer", "found adam for fedda, which uploads no update of its "
     "model w (uploads: z;"),
    ("fedavg", "{name: adamw}", "federation.server_optimizer.name", "adamw"),
    ("fedavg", "{name: sgd, beta2: 0.9}", "federation.server_optimizer.beta2", "found 0.9 with sgd, which reads lr"),
    ("fedavg", "{name: adagrad, form: optax, beta1: 0.9}", "federation.server_optimizer.beta1",
     "with adagrad form optax, which reads lr, tau, form, initial_accumulator"),
    ("fedavg", "{name: adam, tau: 0}", "federation.server_optimizer.tau", "found 0 with adam form paper"),
    ("fedavg", "{name: yogi, beta1: 1.0}", "federation.server_optimizer.beta1", "[0, 1)"),
    ("fedavg", "adam", "federation.server_optimizer", "expected a mapping, e.g. {name: adam, lr: 0.01}"),
    ("fedavg", "{name: adam, beta1: {schedule: cosine, init: 0.9, final: 0.5}}", "federation.server_optimizer.beta1",
     "found the schedule cosine(init=0.9, final=0.5), expected a float: only the lr follows a schedule"),
])
def test_validate_refuses_in_one_line_at_the_field(tmp_path, algorithm, spec, path, phrase):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("SPEC", spec).replace("ALGORITHM", algorithm))
    first = refused(invoke("validate", recipe), f"{recipe}: {path}", phrase)
    assert len(invoke("validate", recipe).output.strip().splitlines()) == 1, first


def test_validate_and_a_grid_over_the_optimizer(tmp_path):
    """A grid over the rule and its lr: one trial each, recorded with the rule's every field."""
    from sweeps.recipe import load

    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("SPEC", "[{name: sgd}, {name: adam, lr: [0.01, 0.1]}, {name: adam, lr: "
                                             "{schedule: cosine, init: 0.1, final: 0.01}}]")
                      .replace("ALGORITHM", "scaffold"))
    result = invoke("validate", recipe)
    assert result.exit_code == 0 and "4 configurations" in result.output, result.output
    trials = load(str(recipe)).trials()
    texts = [trial.params()["federation.server_optimizer"] for trial in trials]
    keys = [program_key(trial) for trial in trials]
    assert keys[1] == keys[2] == keys[3] != keys[0]  # adam's lrs (and schedule) share a program, sgd is another
    assert texts == ["sgd(lr=1.0)", "adam(lr=0.01, beta1=0.9, beta2=0.99, tau=0.001, form=paper)",
                     "adam(lr=0.1, beta1=0.9, beta2=0.99, tau=0.001, form=paper)",
                     "adam(lr=cosine(init=0.1, final=0.01), beta1=0.9, beta2=0.99, tau=0.001, form=paper)"]
    assert ServerOptimizer.given({"name": "adam", "lr": 0.01}).values()["tau"] == 1e-3


def test_the_tutorials_fedavgm_is_fedavg_with_the_momentum_rule(tmp_path):
    """The tutorial "Compare your own method" writes FedAvgM (v ← β v + Δ; w ← w + η v) as its own algorithm; FedAvg
    (server step 1) with `{name: momentum, lr: η, beta1: β}` is the same method, on the same draws."""
    import re
    from pathlib import Path

    from fedbench import plugins

    tutorial = (Path(__file__).resolve().parents[2] / "docs/tutorials/compare-your-own-method.md").read_text()
    [code] = re.findall(r'```python title="my_method.py"\n(.*?)```', tutorial, re.S)
    (tmp_path / "my_method.py").write_text(code)
    plugins.load(str(tmp_path / "my_method.py"))
    problem = small_lasso()
    federation = Federation(ROUNDS, 3, 3, 5)
    mine = engine_run(problem, "my_method", federation, {"client_lr": 0.05, "server_lr": 0.7, "beta": 0.8})
    momentum = engine_run(problem, "fedavg", Federation(ROUNDS, 3, 3, 5, server_optimizer={
        "name": "momentum", "lr": 0.7, "beta1": 0.8}), {"client_lr": 0.05})
    np.testing.assert_allclose(momentum[-1], mine[-1], rtol=1e-12, atol=1e-13)


def test_tune_searches_a_field_the_rule_reads(tmp_path):
    from sweeps.recipe import assigned, load

    path = tmp_path / "tuned.yaml"
    path.write_text(RECIPE.replace("SPEC", "{name: yogi, lr: 0.01}").replace("ALGORITHM", "fedavg") +
                    "tune: {space: {federation.server_optimizer.lr: {log_uniform: [1.0e-3, 1.0e-1]}}, "
                    "metric: objective, mode: min, trials: 3}\n")
    recipe = load(path)
    assert [d.path("fedavg") for d in recipe.dimensions] == ["federation.server_optimizer.lr"]
    federation = assigned(recipe, {"federation.server_optimizer.lr": 0.02}).single_trial("fedavg", 0).federation
    assert federation.server_optimizer == ServerOptimizer("yogi", lr=0.02)
    refused(invoke("validate", path, "--set", "tune.space={federation.server_optimizer.beta2: {uniform: [0.9, "
                   "0.999]}}", "--set", "federation.server_optimizer={name: momentum}"),
            f"{path}: tune.space.federation.server_optimizer.beta2: found federation.server_optimizer reading lr, "
            "beta1, expected one that reads beta2")


class CoinFedAvg(Algorithm):
    """A plugin's method whose rounds end when a p-coin says communicate, every client every round: its runs share an
    iteration-wise program (`fedbench.engine.iteration_wise.IterationProgram`), which applies the server optimizer at each run's own
    round ends."""

    name = "coin_fedavg"
    participation = "all"
    personalized = True  # the pFL problems evaluate per-client models: here every client's is the global one
    hparams = (CLIENT_LR, Param("p", "float", 0.4, "probability of communicating after a step", low=0, high=1,
                                low_open=True))

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.p, gen)

    def client_step(self, local, batches, rnd, hp):
        u = local["w"]
        return {"w": u - hp.client_lr * batches.D.grad(u)}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}

    def personal_params(self, server, clients):
        return per_client_copies(server["w"], self.problem.num_clients)


def test_runs_of_an_iteration_wise_program_step_as_alone():
    problem = pfl()
    federation = Federation(8, 0, 1, 5, server_optimizer={"name": "yogi", "lr": 0.05})
    specs = [{"name": "yogi", "lr": 0.05}, {"name": "yogi", "lr": 0.02, "tau": 1e-2}]

    def sims():
        return [Simulation(problem, CoinFedAvg(problem, client_lr=0.1), replace(federation, server_optimizer=spec),
                           seed, 2, compile="off") for spec, seed in zip(specs, (0, 1))]

    batch = sims()
    [(_, program)] = programs(batch)
    assert isinstance(program, IterationProgram)
    rows = rows_of(program)
    for i, sim in enumerate(sims()):
        alone = list(sim)
        assert len(alone) == len(rows[i]) == 5 and alone[-1]["iterations"] > 8  # rounds of drawn lengths
        for mine, theirs in zip(rows[i], alone):
            assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-14)
    plain = Simulation(problem, CoinFedAvg(problem, client_lr=0.1), replace(federation, server_optimizer=None), 0, 2,
                       compile="off")
    assert list(plain)[-1]["objective"] != pytest.approx(rows[0][-1]["objective"], rel=1e-6)
