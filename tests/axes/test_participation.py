"""Participation models and uneven local work (`fedbench.axes.participation`) for any algorithm.

* FedAvg and SCAFFOLD (whose control variates sum the participants' Δc over N and divide by each client's K) on a
  small least-squares problem, under each participation model and under uneven local work, against an independent
  loop over the participants in NumPy fed the same draws (each model's availability replayed from the run's raw
  streams as the module's docstring describes it): the server's iterates, SCAFFOLD's control variates and the
  communication counted for the participants only, after every round, to 1e-12;
* the aggregation weights renormalised over the participants; cyclic groups in turn; Markov chains at their
  stationary law;
* a program of runs (seeds and a step-size grid) gives each run its rows alone, bit for bit, for every model, uneven
  local work, and an error-feedback uplink (whose absent clients keep their vectors);
* a checkpoint taken mid-run (Markov chains, drawn counts) resumed bit for bit;
* without any of it, a run's configuration, streams and checkpoint as before;
* the engine's refusals, and `rnd.local_steps` undefined in a round of uneven local work;
* recipes: grid axes inside (`--set federation.participation.p=[...]`) and lists of mappings, hashes, a file read
  from the recipe's folder, `fedbench run` end to end, `fedbench list`.
Refusals through the command line are in `tests/cli/test_refusals.py`.
"""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fedbench
from fedbench.algorithms.fedavg import FedAvg
from fedbench.axes.participation import LocalSteps, Participants, Participation
from fedbench.axes.slots import Slots
from fedbench.engine.federation import aggregation_weights
from fedbench.engine.runs import programs
from fedbench.engine.simulate import Federation, Simulation
from fedbench.hparams import ParamError
from fedbench.rng import generator
from helpers import SEEDS, build, initial_point, interrupted, invoke, np_local, refused, rows_by_run, rows_of
from small_problems import small_lasso
from sweeps.recipe import assigned, load

HP = {"client_lr": 0.05, "server_lr": 0.8, "subgradient": False}  # the smooth part: least squares
UNEVEN = {"distribution": "uniform", "low": 1, "high": 4}
COUNTS = {"counts": [1, 4, 2, 3, 1, 2, 4, 3]}  # one per client of the 8


class Replayed:
    """A run's draws replayed from its raw streams as `fedbench.axes.participation`'s docstring describes them, without the
    engine: each round's participants, the slots of its draws (the participants first, then the clients that do not
    take part, in index order), each slot's local steps and minibatch rows."""

    def __init__(self, problem, federation: Federation, seed: int):
        self.problem, self.federation = problem, federation
        self.count, self.slots = problem.num_clients, federation.clients_per_round or problem.num_clients
        self.clients, self.batches = generator(seed, "clients"), generator(seed, "minibatches")
        self.steps = generator(seed, "local-steps")
        part = federation.participation
        if part.model == "cyclic":  # the first N mod K groups one client larger, as numpy's array_split
            self.groups = np.array_split(torch.randperm(self.count, generator=self.clients).numpy(), part.groups)
        elif part.model == "bernoulli":
            if part.p is not None:
                self.p = np.full(self.count, part.p)
            elif part.p_file is not None:
                self.p = np.load(part.p_file)
            else:
                self.p = part.p_low + (part.p_high - part.p_low) * self.uniform()
        elif part.model == "markov":
            self.on = self.uniform() < part.p_on / (part.p_on + part.p_off)

    def uniform(self) -> np.ndarray:
        return torch.rand(self.count, generator=self.clients, dtype=torch.float64).numpy()

    def permutation(self, size: int) -> list[int]:
        return torch.randperm(size, generator=self.clients).tolist()

    def round(self, index: int) -> tuple[list[int], list[int], np.ndarray]:
        """The participants, each slot's local steps and the rows `[steps, S, b]` of round `index`."""
        part, slots = self.federation.participation, self.slots
        if part.model == "uniform":
            chosen = self.permutation(self.count)[:slots]
        elif part.model == "cyclic":
            group = self.groups[index % part.groups]
            chosen = [int(group[i]) for i in self.permutation(len(group))[:slots]]
        else:
            if part.model == "bernoulli":
                draws = self.uniform()
                available = [k for k in range(self.count) if draws[k] < self.p[k]]
            else:  # this round's chains, then their step
                available = [k for k in range(self.count) if self.on[k]]
                switch = self.uniform()
                self.on = np.where(self.on, switch >= part.p_off, switch < part.p_on)
            chosen = available
            if len(available) > slots:
                chosen = [available[i] for i in self.permutation(len(available))[:slots]]
        order = chosen + [k for k in range(self.count) if k not in chosen]
        order = order[:slots]
        steps = self.federation.local_steps
        if isinstance(steps, int):
            counts = [steps] * slots
        elif steps.distribution is not None:
            counts = torch.randint(steps.low, steps.high + 1, (slots,), generator=self.steps).tolist()
        else:
            table = steps.counts if steps.counts is not None else np.load(steps.file).astype(int).tolist()
            counts = [table[k] for k in order]
        rows = self.problem.draw_minibatches(torch.tensor(order), max(counts), self.federation.batch_size,
                                             self.batches).numpy()
        return chosen, counts, rows


def np_gradient(problem, w, rows):
    x, y = problem.features.numpy()[rows], problem.labels.numpy()[rows]
    return x.T @ (x @ w - y) / len(rows)


def np_rounds(problem, name: str, federation: Federation, seed: int):
    """Each round's server state after it ({"w"} for FedAvg, {"w", "c"} and the clients' c_i for SCAFFOLD's option II),
    with its participants and its length, one participant after another: FedAvg's plain gradient steps, SCAFFOLD's
    corrected ones, each client taking its own count; the server's step from the participants' mean (unchanged
    without any), SCAFFOLD's c from their Δc summed over N."""
    replayed, lr, server_lr = Replayed(problem, federation, seed), HP["client_lr"], HP["server_lr"]
    w = initial_point(problem, seed)
    c, c_i = np.zeros_like(w), np.zeros((problem.num_clients, len(w)))
    for index in range(federation.rounds):
        chosen, counts, rows = replayed.round(index)
        dy, dc = [], []
        for slot, client in enumerate(chosen):  # the participants hold the first slots
            steps = rows[:counts[slot], slot]
            if name == "fedavg":
                dy.append(np_local(problem, "fedavg", w, steps, HP) - w)
                continue
            y = w.copy()
            for step_rows in steps:
                y = y - lr * (np_gradient(problem, y, step_rows) - c_i[client] + c)
            c_new = c_i[client] - c + (w - y) / (counts[slot] * lr)
            dy.append(y - w)
            dc.append(c_new - c_i[client])
            c_i[client] = c_new
        if dy:
            w = w + server_lr * np.mean(dy, axis=0)
        if dc:
            c = c + np.sum(dc, axis=0) / problem.num_clients
        yield {"w": w, "c": c, "c_i": c_i.copy()}, len(chosen), max(counts)


LOOP_CASES = {  # id: (participation, clients per round, local steps)
    "uniform, uneven": ({}, 3, UNEVEN),
    "cyclic": ({"model": "cyclic", "groups": 3}, 2, 3),
    "cyclic, per-client counts": ({"model": "cyclic", "groups": 2}, 3, COUNTS),
    "bernoulli": ({"model": "bernoulli", "p": 0.4}, 3, 3),
    "bernoulli, rounds without anyone": ({"model": "bernoulli", "p": 0.1}, 3, 2),
    "bernoulli p_k in a range, every available one, uneven": ({"model": "bernoulli", "p_low": 0.2, "p_high": 0.9},
                                                              0, UNEVEN),
    "bernoulli from a file, per-client counts from a file": ({"model": "bernoulli", "p_file": "p.npy"}, 4,
                                                            {"file": "steps.npy"}),
    "markov, uneven": ({"model": "markov", "p_on": 0.3, "p_off": 0.4}, 3, UNEVEN),
}


def with_files(case, folder):
    """The case's federation, its files written into `folder` (availability and counts of the 8 clients)."""
    participation, sampled, steps = LOOP_CASES[case]
    if "p_file" in participation:
        np.save(folder / "p.npy", np.array([0.9, 0.1, 0.5, 0.7, 0.3, 1.0, 0.0, 0.6]))
        participation = {**participation, "p_file": str(folder / "p.npy")}
    if isinstance(steps, dict) and "file" in steps:
        np.save(folder / "steps.npy", np.array(COUNTS["counts"]))
        steps = {"file": str(folder / "steps.npy")}
    return Federation(8, sampled, steps, 5, participation=participation)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
@pytest.mark.parametrize("case", LOOP_CASES)
def test_each_model_and_uneven_work_equals_a_loop_over_the_participants_in_numpy(case, name, tmp_path):
    problem, seed = small_lasso(), 5
    federation = with_files(case, tmp_path)
    sim = Simulation(problem, fedbench.make_algorithm(name, problem, **HP), federation, seed)
    uploads = 1 if name == "fedavg" else 2  # SCAFFOLD sends Δy and Δc, and receives w and c
    taking, lengths = [], []
    for expected, participants, length in np_rounds(problem, name, federation, seed):
        sim.run_round()
        for key in ("w", "c") if name == "scaffold" else ("w",):
            np.testing.assert_allclose(sim.server[key].numpy(), expected[key], rtol=1e-12, atol=1e-12)
        if name == "scaffold":
            np.testing.assert_allclose(sim.clients["c"].numpy(), expected["c_i"], rtol=1e-12, atol=1e-12)
        taking.append(participants)
        lengths.append(length)
        assert sim.comm_up == sim.comm_down == sum(taking) * uploads * problem.dim  # the participants' messages
        assert sim.iterations == sum(lengths)
    if "without anyone" in case:
        assert 0 in taking and max(taking) > 0


def test_the_weights_are_renormalised_over_the_participants():
    """π̂ over the slots that hold a participant: 1/S' each (uniform), n_k / Σ n_j over them (by samples); zeros for
    a run without any; as before where every slot takes part."""
    problem = SimpleNamespace(client_sizes=torch.tensor([10, 20, 30, 40, 50]))
    clients = torch.tensor([[4, 1, 2], [0, 3, 1], [2, 0, 4]])
    present = torch.tensor([[True, True, False], [False, True, False], [False, False, False]])
    uniform = Slots(clients, [2, 1, 0], None, torch.float64, present).weights
    assert uniform.tolist() == [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    samples = Slots(clients, [2, 1, 0], problem.client_sizes, torch.float64, present).weights
    assert samples.tolist() == [[50 / 70, 20 / 70, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert aggregation_weights(problem, Federation(aggregation="samples"), clients, torch.float64).tolist()[0] == [
        50 / 100, 20 / 100, 30 / 100]


def test_a_model_changes_who_takes_part():
    problem = small_lasso()
    plain = list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), Federation(8, 3, 3, 5), 5))
    for participation in ({"model": "cyclic", "groups": 2}, {"model": "bernoulli", "p": 0.4},
                          {"model": "markov", "p_on": 0.3, "p_off": 0.4}):
        other = list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP),
                                Federation(8, 3, 3, 5, participation=participation), 5))
        assert other[-1]["objective"] != plain[-1]["objective"], participation


def test_cyclic_groups_take_turns():
    """Each client of a cyclic model is drawn only in the rounds of its group, r mod K, every group in turn."""
    problem = small_lasso()
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(
        12, 2, 1, 5, participation={"model": "cyclic", "groups": 4}), 0)
    groups = sim.sampler.participants.groups
    assert sorted(torch.cat(groups).tolist()) == list(range(8)) and [len(g) for g in groups] == [2] * 4
    for index in range(12):
        clients, present = sim.sampler.participants.draw(index)
        assert present is None and set(clients.tolist()) == set(groups[index % 4].tolist())


def test_markov_availability_follows_its_stationary_law():
    """Over 500 rounds of 400 clients, a client is available a fraction p_on / (p_on + p_off) = 0.25 of them from the
    first round on, and an available one stays so with probability 1 − p_off = 0.7 (within 4 standard errors: the
    chain's autocorrelation 1 − p_on − p_off = 0.6 inflates the variance of the mean (1 + 0.6) / (1 − 0.6) = 4 times)."""
    chains = Participants(Participation("markov", p_on=0.1, p_off=0.3), 400, 0, torch.Generator().manual_seed(0))
    states = []
    for index in range(500):
        clients, present = chains.draw(index)
        states.append(torch.zeros(400, dtype=torch.bool).index_fill_(0, clients[present], True))
    on = torch.stack(states).double()  # [rounds, clients]
    assert abs(on.mean() - 0.25) < 4 * (4 * 0.25 * 0.75 / on.numel()) ** 0.5
    assert abs(on[0].mean() - 0.25) < 4 * (0.25 * 0.75 / 400) ** 0.5  # started from the stationary law
    stayed = (on[1:] * on[:-1]).sum() / on[:-1].sum()
    assert abs(stayed - 0.7) < 4 * (0.7 * 0.3 / on[:-1].sum()) ** 0.5


# -- the run axis and checkpoints ---------------------------------------------------------------------------------

BATCHED = {  # id: (algorithm, federation)
    "fedavg cyclic": ("fedavg", Federation(9, 2, 3, 5, participation={"model": "cyclic", "groups": 3})),
    "fedavg bernoulli, uneven": ("fedavg", Federation(9, 3, UNEVEN, 5, participation={"model": "bernoulli",
                                                                                      "p": 0.3})),
    "scaffold markov, uneven": ("scaffold", Federation(9, 3, UNEVEN, 5, participation={
        "model": "markov", "p_on": 0.3, "p_off": 0.4})),
    "scaffold bernoulli p_k, per-client counts": ("scaffold", Federation(9, 0, COUNTS, 5, participation={
        "model": "bernoulli", "p_low": 0.1, "p_high": 0.5})),
    "ditto uniform, uneven": ("ditto", Federation(9, 3, UNEVEN, 5)),
    "fedprox markov": ("fedprox", Federation(9, 4, 2, 5, participation={"model": "markov", "p_on": 0.2,
                                                                       "p_off": 0.2})),
    "fedmid bernoulli, top_k with error feedback": ("fedmid", Federation(
        9, 3, UNEVEN, 5, participation={"model": "bernoulli", "p": 0.5},
        uplink=[{"top_k": 0.3}, {"error_feedback": "ef"}])),
}


def simulations(problem, name, federation, seeds=SEEDS):
    """Runs of `name` with `seeds`, their step sizes a grid of two values: runs a program may hold together."""
    return [Simulation(problem, fedbench.make_algorithm(name, problem, client_lr=[0.02, 0.05][i % 2]), federation,
                       seed, 3) for i, seed in enumerate(seeds)]


@pytest.mark.parametrize("case", BATCHED)
def test_a_program_of_runs_gives_each_run_its_rows_alone_bit_for_bit(case):
    name, federation = BATCHED[case]
    problem = small_lasso()
    sims = simulations(problem, name, federation)
    [(runs, program)] = programs(sims)
    assert runs == list(range(len(SEEDS)))  # one program
    batched = rows_by_run(program, len(SEEDS))
    alone = [list(sim) for sim in simulations(problem, name, federation)]
    assert batched == alone


def test_absent_clients_keep_their_error_feedback_vectors():
    """Under a bernoulli model, a round changes the error-feedback vectors of its participants alone."""
    problem, seed = small_lasso(), 2
    federation = Federation(6, 3, 2, 5, participation={"model": "bernoulli", "p": 0.4},
                            uplink=[{"top_k": 0.3}, {"error_feedback": "ef"}])
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), federation, seed)
    replayed, before = Replayed(problem, federation, seed), torch.zeros(problem.num_clients, problem.dim)
    for index in range(federation.rounds):
        sim.run_round()
        chosen, _, _ = replayed.round(index)
        kept = sim._program.links.kept["w"][0]
        changed = {k for k in range(problem.num_clients) if not torch.equal(kept[k], before[k])}
        assert changed == set(chosen)
        before = kept.clone()


def test_a_resumed_program_with_markov_chains_and_drawn_counts_gives_the_rows_of_one_never_stopped():
    problem = small_lasso()
    federation = Federation(12, 3, UNEVEN, 5, participation={"model": "markov", "p_on": 0.3, "p_off": 0.4})
    whole, records = build(problem, "scaffold", federation, {}, SEEDS), []
    whole.safe_point = lambda program: records.append(program.state_dict()["runs"])
    expected = rows_of(whole)
    middle = records[len(records) // 2]
    assert all("local-steps" in record["streams"] and record["participation"]["available"].shape == (8,)
               for record in middle)
    assert len({tuple(record["participation"]["available"].tolist()) for record in middle}) > 1  # each seed its own
    for at in (1, len(records) // 2 + 1):
        resumed, statuses = interrupted(lambda: build(problem, "scaffold", federation, {}, SEEDS), at)
        assert resumed == expected
        assert statuses == [sim.status for sim in whole.sims]
    alone, _ = interrupted(lambda: build(problem, "scaffold", federation, {}, [3]), 5)
    assert alone == rows_of(build(problem, "scaffold", federation, {}, [3]))


def test_without_a_model_or_uneven_work_the_configuration_streams_and_checkpoint_are_as_before():
    problem = small_lasso()
    federation = Federation(3, 5, 3, 5)
    assert federation.config() == {"rounds": 3, "clients_per_round": 5, "local_steps": 3, "batch_size": 5,
                                   "aggregation": "uniform"}
    assert Federation(3, 5, 3, 5, participation={"model": "uniform"}) == federation
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem), federation, 0)
    assert set(sim.streams()) == {"clients", "minibatches", "feature-noise", "algorithm"}
    assert "participation" not in sim.state_dict()
    assert replace(federation, participation={"model": "cyclic", "groups": 2}).config()["participation"] == (
        "cyclic(groups=2)")
    assert replace(federation, local_steps=UNEVEN).config()["local_steps"] == "uniform(low=1, high=4)"


def test_an_algorithm_that_reads_the_rounds_length_is_refused_uneven_work_one_that_reads_its_own_count_runs():
    """A round of uneven local work has no one length, last step or iteration count, and `rnd.client_steps` holds
    each client's own count: an algorithm whose functions read the length is refused such work where it is built (its
    dry round, `fedbench.engine.dry_round`), one that reads only its own count runs."""

    class ReadsTheLength(FedAvg):
        name = "reads_local_steps"

        def client_final(self, local, rnd, hp):
            return super().client_final(local, rnd, hp) if rnd.local_steps else None

    class ReadsItsCount(FedAvg):
        name = "reads_client_steps"

        def client_final(self, local, rnd, hp):
            assert rnd.client_steps.shape[-1] == 1 and rnd.client_steps.min() >= 1
            return super().client_final(local, rnd, hp)

    problem = small_lasso()
    with pytest.raises(ParamError, match=r"federation\.local_steps: found uniform\(low=1, high=4\) for "
                                         r"reads_local_steps, whose rounds take one number of local steps"):
        Simulation(problem, ReadsTheLength(problem), Federation(2, 3, UNEVEN, 5), 0)
    sim = Simulation(problem, ReadsItsCount(problem), Federation(2, 3, UNEVEN, 5), 0)
    sim.run_round()
    assert sim.rounds_done == 1


def test_the_engine_refuses_what_cannot_take_a_model_or_uneven_work():
    problem = small_lasso()
    with pytest.raises(ParamError, match=r"federation\.local_steps: found uniform\(low=1, high=4\) for fedda, whose "
                                         r"rounds take one number of local steps for all its clients"):
        Simulation(problem, fedbench.make_algorithm("fedda", problem), Federation(3, 3, UNEVEN, 5), 0)
    with pytest.raises(ParamError, match=r"federation\.local_steps: found .* for fedmid"):
        Simulation(problem, fedbench.make_algorithm("fedmid", problem, server_threshold="yuan"),
                   Federation(3, 3, UNEVEN, 5), 0)
    Simulation(problem, fedbench.make_algorithm("fedmid", problem), Federation(3, 3, UNEVEN, 5), 0)  # bao: fine
    with pytest.raises(ParamError, match=r"federation\.participation\.model: found markov with aggregation median"):
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(
            3, 3, 2, 5, aggregation="median", participation={"model": "markov", "p_on": 0.5, "p_off": 0.5}), 0)
    with pytest.raises(ParamError, match=r"federation\.clients_per_round: found 3 with cyclic participation, "
                                         r"expected 1 to 2"):
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(
            3, 3, 2, 5, participation={"model": "cyclic", "groups": 3}), 0)
    assert Federation(3, 3, 2, 5, participation=Participation("cyclic", groups=3)) == Federation(
        3, 3, 2, 5, participation={"model": "cyclic", "groups": 3})
    assert Federation(local_steps=LocalSteps(counts=[1, 2])) == Federation(local_steps={"counts": (1, 2)})


# -- recipes ------------------------------------------------------------------------------------------------------

RECIPE = """\
name: participation-lasso
problem: {name: lasso, clients: 10, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation:
  rounds: 6
  clients_per_round: 4
  local_steps: {distribution: uniform, low: 1, high: 4}
  batch_size: 5
  participation: {model: markov, p_on: 0.3, p_off: 0.2}
algorithms:
  scaffold: {client_lr: 0.05}
seeds: [3]
eval_every: 3
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "participation.yaml"
    path.write_text(RECIPE)
    return path


def test_fedbench_run_of_a_recipe_with_a_model_and_uneven_work_gives_the_engines_rows(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    problem = fedbench.make_problem("lasso", seed=3, clients=10, samples_per_client=20, dim=30, support=10, lam=0.05)
    federation = Federation(6, 4, LocalSteps("uniform", 1, 4), 5, participation=Participation("markov", p_on=0.3,
                                                                                                  p_off=0.2))
    direct = list(Simulation(problem, fedbench.make_algorithm("scaffold", problem, client_lr=0.05), federation, 3, 3))
    assert json.loads(out.read_text()) == direct


def test_a_models_parameters_and_the_counts_are_grid_axes_and_set_reaches_inside(recipe):
    grid = load(recipe, ["federation.participation={model: bernoulli, p: [0.1, 0.5]}",
                         "federation.local_steps.high=[4,6]"])
    trials = grid.trials()
    assert grid.runs() == len(trials) == 4 and len({t.config_hash for t in trials}) == 4
    assert {t.params()["federation.participation"] for t in trials} == {"bernoulli(p=0.1)", "bernoulli(p=0.5)"}
    assert {t.params()["federation.local_steps"] for t in trials} == {"uniform(low=1, high=4)",
                                                                      "uniform(low=1, high=6)"}
    swept = load(recipe, ["federation.participation.p_on=[0.1,0.3,0.5]"]).trials()
    assert [t.federation.participation.p_on for t in swept] == [0.1, 0.3, 0.5]
    result = invoke("run", recipe, "--set", "federation.participation.p_off=[0.2,0.4]", "--no-track")
    assert result.exit_code == 2 and "federation.participation: found 2 values" in result.output
    assert "--set federation.participation.NAME=VALUE" in result.output
    models = load(recipe, ["federation.participation=[{model: uniform}, {model: cyclic, groups: 2}]",
                           "federation.local_steps=[3, {distribution: uniform, low: 1, high: 4}]"])
    assert {(t.params().get("federation.participation"), t.params()["federation.local_steps"])
            for t in models.trials()} == {(None, 3), (None, "uniform(low=1, high=4)"), ("cyclic(groups=2)", 3),
                                          ("cyclic(groups=2)", "uniform(low=1, high=4)")}  # lists of them: grid axes
    result = invoke("run", recipe, "--set", "federation.participation=[{model: uniform}, {model: cyclic, groups: 2}]",
                    "--no-track")
    assert result.exit_code == 2 and "pick one with --set federation.participation=VALUE" in result.output
    fixed = load(recipe, ["federation.local_steps=3", "federation.participation={model: uniform}"]).trials()[0]
    assert fixed.config()["federation"] == {"rounds": 6, "clients_per_round": 4, "local_steps": 3, "batch_size": 5,
                                            "aggregation": "uniform"}  # as a recipe without either records it


def test_fedbench_list_shows_the_fields_of_a_participation_model_and_of_uneven_local_steps():
    listing = invoke("list", "federation")
    assert listing.exit_code == 0
    for name in ("federation.participation", "bernoulli | markov", "p_file", "p_on",
                 "federation.local_steps", "uneven local work", "distribution", "counts"):
        assert name in listing.output, name


def test_a_recipes_file_is_read_from_its_folder_and_recorded_by_its_contents(tmp_path, monkeypatch):
    folder = tmp_path / "recipes"
    folder.mkdir()
    np.save(folder / "p.npy", np.full(10, 0.5))
    (folder / "r.yaml").write_text(RECIPE.replace("{model: markov, p_on: 0.3, p_off: 0.2}",
                                                  "{model: bernoulli, p_file: p.npy}"))
    monkeypatch.chdir(tmp_path)  # not the recipe's folder
    first = load(folder / "r.yaml").trials()[0]
    assert first.params()["federation.participation"].startswith("bernoulli(p_file=p.npy, sha256=")
    np.save(folder / "p.npy", np.full(10, 0.4))
    edited = load(folder / "r.yaml").trials()[0]
    assert edited.config_hash != first.config_hash  # other availabilities: other runs
    folder.rename(tmp_path / "moved")
    assert load(tmp_path / "moved" / "r.yaml").trials()[0].config_hash == edited.config_hash


TUNED = RECIPE + """\
tune:
  space: {federation.participation.p_on: {uniform: [0.05, 0.5]}, federation.local_steps.high: {int: [4, 8]}}
  metric: objective
  mode: min
  trials: 4
"""


def test_tune_searches_a_models_parameter_and_the_counts_where_the_recipe_reads_them(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text(TUNED)
    recipe = load(path)
    assert [d.path("scaffold") for d in recipe.dimensions] == ["federation.participation.p_on",
                                                              "federation.local_steps.high"]
    federation = assigned(recipe, {"federation.participation.p_on": 0.1, "federation.local_steps.high": 6}
                          ).single_trial("scaffold", 0).federation
    assert federation.participation == Participation("markov", p_on=0.1, p_off=0.2)
    assert federation.local_steps == LocalSteps("uniform", 1, 6)
    for space, where, phrase in [
            ("{federation.participation.p: {uniform: [0.1, 0.5]}}", "federation.participation.p",
             "found federation.participation reading p_on, p_off, expected one that reads p"),
            ("{federation.participation.p_on: {uniform: [0.1, 1.5]}}", "federation.participation.p_on.uniform[1]",
             "expected float in [0, 1], found 1.5"),
            ("{federation.participation.pon: {uniform: [0.1, 0.5]}}", "federation.participation.pon",
             "did you mean 'p_on'"),
            ("{federation.local_steps.counts: {int: [1, 4]}}", "federation.local_steps.counts",
             "found federation.local_steps reading low, high, expected one that reads counts")]:
        refused(invoke("validate", path, "--set", f"tune.space={space}"), f"{path}: tune.space.{where}: ", phrase)
    plain = path.read_text().replace("  participation: {model: markov, p_on: 0.3, p_off: 0.2}\n", "")
    path.write_text(plain)
    refused(invoke("validate", path), "tune.space.federation.participation.p_on: found no mapping in "
            "federation.participation, expected one that reads p_on")


def replayed_epochs(problem, clients: list[int], epochs: int, batch_size: int, gen) -> list[list[np.ndarray]]:
    """Each client's minibatches of `epochs` passes as `Problem.draw_epochs` describes them, replayed from the raw
    stream: keys uniform [E, S, n_max], a client's own positions ordered by them, the passes one after another, cut
    into consecutive batches of b (the last one short)."""
    keys = torch.rand(epochs, len(clients), problem.max_size, generator=gen).numpy()
    batches = []
    for slot, client in enumerate(clients):
        n, start = int(problem.client_sizes_cpu[client]), int(problem.client_offsets_cpu[client])
        sequence = np.concatenate([start + np.argsort(keys[e, slot, :n], kind="stable") for e in range(epochs)])
        batches.append([sequence[i: i + batch_size] for i in range(0, len(sequence), batch_size)])
    return batches


def test_local_epochs_are_passes_over_each_clients_own_samples_as_a_loop_over_the_clients():
    """`local_steps: {epochs: E}`: client k takes ⌈E·n_k / b⌉ steps whose minibatches are E fresh permutations of its
    own samples cut into batches of b; FedAvg over writers of unequal sizes (its iterates by samples-weighted mean)
    against a loop over the sampled clients taking exactly those steps, from the replayed streams."""
    problem = fedbench.make_problem("emnist", seed=0, lam=0.0, min_train=10)
    epochs, batch, sampled, rounds = 2, 16, 3, 3
    federation = Federation(rounds, sampled, {"epochs": epochs}, batch, "samples")
    hp = {"client_lr": 0.005, "server_lr": 1.0, "subgradient": False}  # stable on raw pixels (‖x‖² ≈ 700)
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, **hp), federation, seed=4)
    client_gen, batch_gen = generator(4, "clients"), generator(4, "minibatches")
    w = problem.init_params(generator(4, "init")).clone()
    for _ in range(rounds):
        clients = torch.randperm(problem.num_clients, generator=client_gen)[:sampled].tolist()
        updates, sizes = [], []
        for client, batches in zip(clients, replayed_epochs(problem, clients, epochs, batch, batch_gen)):
            n = int(problem.client_sizes_cpu[client])
            assert len(batches) == -(-epochs * n // batch)  # ⌈E·n_k / b⌉ steps
            u = w.clone()
            for rows in batches:  # the problem's gradient of a client's weighted mean loss on a batch
                u = u - hp["client_lr"] * problem.grad(u[None], problem.gather(torch.as_tensor(rows)[None]))[0]
            updates.append(u - w)
            sizes.append(n)
        w = w + sum(s * d for s, d in zip(sizes, updates)) / sum(sizes)
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w.numpy(), rtol=1e-5, atol=1e-6)  # float32


def test_local_epochs_are_refused_where_a_minibatch_cannot_be_short():
    problem = small_lasso()
    with pytest.raises(ParamError, match="local_steps.epochs: found 1 for a problem whose minibatches cannot be "
                                         "short; expected counts, file or distribution"):
        Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), Federation(2, 3, {"epochs": 1}, 5), 0)
