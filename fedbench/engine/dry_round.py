"""Whether an algorithm takes uneven local work (`federation.local_steps` as a mapping, `fedbench.axes.participation`),
found by a dry round instead of declared: one round of uneven local work of the algorithm, with the hyperparameters
asked about, on a tiny stand-in problem. Such a round has no one length, last step or iteration count, and the round
an algorithm's functions see (`Round`) raises `ScheduleError` where one of them reads `rnd.local_steps`,
`rnd.is_last_step` or `rnd.iteration` there (a client's own count is `rnd.client_steps`); an algorithm whose dry
round raises, or whose rounds have a drawn length (`Algorithm.round_length`), does not take uneven local work, and is
refused at validation (`fedbench.engine.checks.check_uneven_work`).

The dry round is the engine's round pipeline without its network (`fedbench.engine.round_wise`): the clients' draws of a
`RoundSampler` (two clients, taking 1 and 2 steps), `client_init`, each local step on the slots still taking it
(`Slots.stepped`), `client_final` and `server_update`, on one run. It draws on generators of its own, never on a
run's streams, and its minibatches are of 2 rows (their sizes are the only hyperparameters it sets). Its stand-in is
the first of `STAND_INS` whose capabilities meet the algorithm's requirements: a Lasso of 4 clients, a partial-AUC
problem (pooled, or with a linear outer function), or the synthetic block problem of Hanzely, Zhao, Kolar (TMLR
2023); an algorithm none of them can run takes no uneven local work. The answer is remembered per class and
hyperparameters: a dry round took 0.1 to 60 ms (most about 1 ms) on a loaded 2-core machine, each stand-in's first
build 40 to 130 ms.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Mapping

import torch

from fedbench.algorithms.base import Algorithm
from fedbench.algorithms.maths import per_run
from fedbench.algorithms.rounds import Round
from fedbench.axes.participation import LocalSteps
from fedbench.axes.slots import Slots
from fedbench.engine.federation import Draw, Federation, RoundSampler, minibatch_sizes, step_oracles
from fedbench.hparams import HParams
from fedbench.oracle import Batches, RunOracle
from fedbench.problems import PROBLEMS, make_problem
from fedbench.rng import generator

if TYPE_CHECKING:
    from fedbench.problems.base import Problem

STAND_INS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("lasso", {"clients": 4, "samples_per_client": 8, "dim": 3, "support": 2}),
    ("pauc", {"clients": 4, "test_size": 8, "val_size": 0}),
    ("pauc", {"clients": 4, "test_size": 8, "val_size": 0, "pooled": True}),
    ("pauc", {"preset": "guo2023_noisy_auc", "clients": 4, "test_size": 8, "val_size": 0}),
    ("pfl_synthetic", {}),
)
"""The stand-in problems, by name and configuration, in the order they are tried."""
ROWS = 2  # each drawn minibatch's rows


def takes_uneven_steps(algorithm: type[Algorithm], hp: Mapping[str, Any]) -> bool:
    """Whether `algorithm` with the hyperparameters `hp` (by name, as Python values) takes uneven local work: whether
    its dry round on a stand-in problem reads nothing a round of uneven work does not define (the module's
    docstring)."""
    key = (algorithm, tuple((name, repr(value)) for name, value in hp.items()))
    if key not in _ANSWERS:
        problem = _stand_in(algorithm, hp)
        _ANSWERS[key] = problem is not None and _runs_uneven(algorithm, dict(hp), problem)
    return _ANSWERS[key]


_ANSWERS: dict[tuple, bool] = {}  # (class, its hyperparameters' reprs) -> the answer


def _stand_in(algorithm: type[Algorithm], hp: Mapping[str, Any]) -> Problem | None:
    needs = algorithm.requirements(hp)
    for index, (name, config) in enumerate(STAND_INS):
        problem_type = PROBLEMS[name]
        if needs <= problem_type.capabilities(problem_type.resolve_config(config)):
            return _built(index)
    return None


@functools.cache
def _built(index: int) -> Problem:
    name, config = STAND_INS[index]
    return make_problem(name, seed=0, **config)


def _runs_uneven(algorithm_type: type[Algorithm], hp: dict[str, Any], problem: Problem) -> bool:
    """Whether the algorithm's dry round of uneven local work on `problem` reads only what such a round defines (a
    `ScheduleError` is its answer no; any other failure under uneven work, too). An algorithm that draws its rounds'
    lengths (`Algorithm.round_length`) has no round length to give each client its own count of."""
    if algorithm_type.round_length is not Algorithm.round_length:
        return False
    try:
        _round(algorithm_type, hp, problem)
    except Exception:  # ScheduleError, or a round of uneven work it cannot take otherwise (a state without client rows)
        return False
    return True


def _round(algorithm_type: type[Algorithm], hp: dict[str, Any], problem: Problem) -> None:
    """One round of uneven local work of `algorithm_type` with `hp` on `problem`, for one run, as the engine's
    pipeline runs it: two clients (or every client, where it takes them all) taking 1 and 2 steps."""
    _, fields = minibatch_sizes(algorithm_type.minibatches(hp), hp, ROWS)
    algorithm = algorithm_type(problem, **{**hp, **dict.fromkeys(set(fields) & set(hp), ROWS)})
    everyone = algorithm.participation == "all"
    counts = tuple(1 + k % 2 for k in range(problem.num_clients))  # some clients past their count at the 2nd step
    federation = Federation(1, min(2, problem.num_clients), LocalSteps(counts=counts), ROWS)
    minibatches = algorithm.minibatches(algorithm.hp)
    sizes, _ = minibatch_sizes(minibatches, algorithm.hp, ROWS)
    _pipeline(algorithm, problem, RoundSampler(problem, federation, 0, minibatches, sizes).draw_round(None, everyone))


def _pipeline(algorithm: Algorithm, problem: Problem, draw: Draw) -> None:
    """`algorithm`'s round functions on `draw`, one run, each local step on the slots still taking it."""
    everyone, minibatches = algorithm.participation == "all", algorithm.minibatches(algorithm.hp)
    w0 = problem.init_params(generator(0, "init"))
    server = {k: v.unsqueeze(0).unsqueeze(1) for k, v in algorithm.init_server(w0).items()}
    state = {k: v.unsqueeze(0) for k, v in algorithm.init_clients(w0, problem.num_clients).items()}
    dtype = server[algorithm.downloads[0]].dtype
    assert draw.counts is not None  # uneven local work
    slots = Slots(draw.clients.unsqueeze(0), [len(draw.clients)], None, dtype,
                  counts=draw.counts.unsqueeze(0).to(problem.device), least=int(draw.counts.min()), everyone=everyone)
    scheduled = {name: schedule.value(0, 1) for name, schedule in algorithm.schedules.items()}
    hp = HParams({k: per_run([v], dtype, problem.device) for k, v in {**algorithm.hp, **scheduled}.items()})
    rnd = Round(slots.clients, 0, streams=(torch.Generator().manual_seed(0),), where="in a dry round of uneven work",
                client_steps=slots.client_steps())
    local = algorithm.client_init(server, slots.gather(state), rnd, hp)
    noise_gen = torch.Generator().manual_seed(0)
    for step in range(draw.steps):
        rows = {k: v[step].unsqueeze(0) if problem.oracles_take_runs else v[step] for k, v in draw.rows.items()}
        oracles = step_oracles(problem, minibatches, rows, lambda r: problem.minibatch_noise(r, noise_gen)
                               if problem.noisy_minibatches else None)
        if not problem.oracles_take_runs:
            oracles = {name: RunOracle(oracle, 1, slots.width) for name, oracle in oracles.items()}
        batches = Batches(oracles)  # a RunOracle answers as the Oracle it lifts
        local = slots.stepped(local, algorithm.client_step(local, batches, rnd.at(step), hp), step)
    message, _ = algorithm.client_final(local, rnd, hp)
    algorithm.server_update(server, slots.heard_uploads(message), slots.weights, rnd, hp)
