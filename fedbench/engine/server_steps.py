"""The server optimizer of a program's runs (`fedbench.axes.server_optimizers` says its rules, where it acts and which
algorithms take it): its state batched over the runs, and its step between the links' `send` and the algorithm's
`server_update` (`fedbench.engine.runs`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedbench.algorithms.base import aggregate
from fedbench.axes.server_optimizers import ADAPTIVE, FLOATS, updates_of_w
from fedbench.engine.record import RunRecord
from fedbench.hparams import PerRound

if TYPE_CHECKING:
    from fedbench.axes.slots import Slots


class ServerSteps:
    """The server optimizer of the runs `sims` of one program (one federation's rule, each run's floats), from the
    program's server state `server` `[R, 1, ...]` at its start: its state m, v `[R, 1, ...]` and the rounds t `[R]`
    each run has stepped, and `step`, which a round calls between the links' `send` and the algorithm's
    `server_update`."""

    def __init__(self, sims: list[RunRecord], server: dict[str, Tensor]):
        optimizer = sims[0].federation.server_optimizer
        assert optimizer is not None  # the program makes one only then
        self.rule, self.optax = optimizer.name, optimizer.optax
        [self.upload] = updates_of_w(sims[0].algorithm.uploads)  # one (`server_optimizers.check_algorithm`)
        w = server["w"]
        self.dtype, self.device = w.dtype, w.device
        values = [sim.federation.server_optimizer.values() for sim in sims]  # type: ignore[union-attr]  # as above
        self.sims, self.rounds = sims, sims[0].federation.rounds
        self.lrs = [v["lr"] for v in values]  # each run's: a float, or a schedule
        self.scheduled = any(isinstance(lr, PerRound) for lr in self.lrs)
        self.hp = {name: self._per_run([v[name] for v in values]) for name in values[0]
                   if name in FLOATS and not (name == "lr" and self.scheduled)}
        flat = w.flatten(2)  # [R, 1, D]: per-run values [R, 1, 1] broadcast against it whatever w's shape
        self.state: dict[str, Tensor] = {"t": torch.zeros(len(sims), dtype=w.dtype, device=w.device)}
        if self.rule != "sgd" and not (self.rule == "adagrad" and self.optax):
            # optax's yogi starts its first moment of the gradient at +initial_accumulator: of Δ = −gradient, at −
            first = -self.hp["initial_accumulator"] if self.optax and self.rule == "yogi" else 0.0
            self.state["m"] = torch.zeros_like(flat) + first
        if self.rule in ADAPTIVE:
            initial = (self.hp["initial_accumulator"] if self.rule != "adam" else 0.0) if self.optax \
                else self.hp["tau"].square()
            self.state["v"] = torch.zeros_like(flat) + initial
        self.pending: dict[str, Tensor] = {}
        self.index = torch.zeros(0, dtype=torch.long)

    def step(self, message: dict[str, Tensor], server: dict[str, Tensor], slots: Slots, ids: list[int]
             ) -> dict[str, Tensor]:
        """The message of the runs `ids`' round with every client's update of `w` replaced by the optimizer's step on
        their mean (over the heard slots of `slots`, by their weights; a run that hears no one keeping its state,
        `Slots.if_heard`); the new state pending until `commit`."""
        self.index = torch.tensor(ids, device=self.device)
        name, w = self.upload.name, server["w"]
        sent = message[name]
        update = sent if self.upload.update_of else sent - w
        delta = aggregate(update, slots.weights).flatten(2)  # Δ_t [R, 1, D]
        hp = {k: v.index_select(0, self.index) if v.shape[0] > 1 else v for k, v in self.hp.items()}
        if self.scheduled:  # each run's lr at its round, on the host as a scheduled hyperparameter's
            hp["lr"] = self._per_run([lr.value(self.sims[i].rounds_done, self.rounds) if isinstance(lr, PerRound)
                                      else lr for i, lr in ((i, self.lrs[i]) for i in ids)])
        state = {k: v.index_select(0, self.index) for k, v in self.state.items()}
        new, step = self._rule(delta, state, hp)
        new = {k: slots.if_heard(v, state[k]) for k, v in new.items()}  # a run that hears no one: as it was, no step
        step = slots.if_heard(step, 0.0)
        self.pending = new
        step = step.view(w.shape)
        return {**message, name: (step if self.upload.update_of else w + step).expand_as(sent)}

    def _per_run(self, values: list) -> Tensor:
        """Per-run values as a `[R, 1, 1]` tensor (broadcasting against the state `[R, 1, D]`)."""
        return torch.tensor(values, dtype=self.dtype, device=self.device).view(-1, 1, 1)

    def _rule(self, delta: Tensor, state: dict[str, Tensor], hp: dict[str, Tensor]) -> tuple[dict[str, Tensor],
                                                                                           Tensor]:
        """The new state and the step s_t from Δ_t `[R, 1, D]` (the module's docstring)."""
        t = state["t"] + 1
        new = {"t": t}
        lr = hp["lr"]
        if self.rule == "sgd":
            return new, lr * delta
        if self.rule == "momentum":
            new["m"] = hp["beta1"] * state["m"] + delta
            return new, lr * new["m"]
        v = state["v"]
        if self.rule == "adagrad":
            v = v + delta.square()
        elif self.rule == "adam":
            v = hp["beta2"] * v + (1 - hp["beta2"]) * delta.square()
        else:
            v = v - (1 - hp["beta2"]) * delta.square() * torch.sign(v - delta.square())
        new["v"] = v
        if self.rule == "adagrad" and self.optax:
            return new, lr * delta / (v + hp["tau"]).sqrt()
        new["m"] = m = hp["beta1"] * state["m"] + (1 - hp["beta1"]) * delta
        if self.optax:
            count = t.view(-1, 1, 1)
            m, v = m / (1 - hp["beta1"] ** count), v / (1 - hp["beta2"] ** count)
        return new, lr * m / (v.sqrt() + hp["tau"])

    def commit(self) -> None:
        """The round of the runs `step` was given has succeeded: their new state is written."""
        for key, rows in self.pending.items():
            self.state[key].index_copy_(0, self.index, rows)
        self.pending = {}

    def state_dict(self) -> dict[str, Any]:
        """The state, under `server_optimizer`, taken between rounds."""
        return {"server_optimizer": self.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = dict(state["server_optimizer"])
