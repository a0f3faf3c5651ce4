"""The server optimizer of a federation, its server's step on the round's mean update of the model
(`federation.server_optimizer`), for any algorithm, as Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar,
McMahan, "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, turn FedAvg into FedAdagrad, FedAdam and FedYogi.

Where it acts. An algorithm declares which of its uploads is an update of its model `w`: a new value of it
(`Upload("w", relative_to="w")`, FedAvg's, FedProx's, FedMiD's default) or a difference already
(`Upload("dy", update_of="w")`, SCAFFOLD's Δy). The engine takes the round's mean of that update with the server's
aggregation weights, Δ_t = Σ_k π̂_k Δ_k (after the uplink's transforms and a robust rule, which stands for the mean:
`fedbench.engine.links`), steps the optimizer on it, and hands the algorithm's `server_update` every client's upload as
that step s_t (a new value w + s_t, or the difference s_t), so that the server's own maths follows unchanged: FedAvg's
w + η_s s_t, SCAFFOLD's x + η_g s_t while its c moves by its own Δc, FedMiD's prox of w + η_s s_t (the optimizer
before the server's prox), a plugin's whatever it does with the mean. With `sgd` at lr = 1 the step is Δ_t itself
and nothing changes (to rounding); the algorithm's own server step (`server_lr`) multiplies the optimizer's lr.

The rules (squares, roots and divisions per coordinate; m_{-1}, v_{-1} as below, t the rounds taken):

    sgd        s_t = η Δ_t
    momentum   m_t = β1 m_{t−1} + Δ_t;  s_t = η m_t                         (optax.sgd(η, momentum=β1): heavy ball)
    adagrad    v_t = v_{t−1} + Δ_t²
    adam       v_t = β2 v_{t−1} + (1 − β2) Δ_t²
    yogi       v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)
    and for these three, `form: paper` (the default), Reddi et al.'s Algorithm 2:
               m_t = β1 m_{t−1} + (1 − β1) Δ_t;  s_t = η m_t / (√v_t + τ);   m_{−1} = 0, v_{−1} = τ², no bias
               correction (the paper asks v_{−1} ≥ τ² and has none)
    or `form: optax`, optax's optimizers of those names with eps = τ (the paper's defaults differ from optax's):
      adagrad  s_t = η Δ_t / √(v_t + τ), no momentum, v_{−1} = `initial_accumulator` (optax's
               initial_accumulator_value, 0.1; its eps sits inside the root)
      adam     m_t = β1 m_{t−1} + (1 − β1) Δ_t;  s_t = η m̂_t / (√v̂_t + τ),  m̂_t = m_t / (1 − β1^t),
               v̂_t = v_t / (1 − β2^t) (bias correction);  m_{−1} = v_{−1} = 0
      yogi     as adam, with v_{−1} = `initial_accumulator` (optax's initial_accumulator_value, 1e-6) and m_{−1} its
               negative (optax starts its first moment of the gradient −Δ there)

Defaults: lr 1 for sgd and momentum, 1e-2 for the adaptive rules; β1 0.9, β2 0.99, τ 1e-3 (Reddi et al.'s; they
tune η and τ per task). The lr may follow a schedule (`fedbench.schedules`, `lr: {schedule: cosine, init: 0.03,
final: 0.001}`): η_t is its value at the run's round t, as an algorithm's scheduled float.

Which algorithms take it: those with exactly one upload that is an update of `w` (above), not all-reduced, whose
server takes it in only through a mean (`Algorithm.uploads_averaged`); the others are refused at
`federation.server_optimizer` (a dual-averaging method's uploads are updates of its dual state, not of `w`; the block
methods all-reduce theirs). Personalized methods with such an upload take it on their global model (FedProx, Ditto,
pFedMe, Per-FedAvg).

Batched over runs (`fedbench.engine.server_steps.ServerSteps`): the state m, v `[R, 1, ...]` (as `w`) and t `[R]` is the
program's, its floats (lr or its schedule, β1, β2, τ, the initial accumulator) per run, so that a grid over them runs
as one program; runs of another rule or form are another program (`fedbench.engine.planning`). A round without
participants (`fedbench.axes.participation`) leaves a run's state as it was. The state is written at the round's end
with the links' (`commit`), and is in the program's checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fedbench.algorithms.base import Algorithm, Upload
from fedbench.axes.participation import _check_params, _given, _text
from fedbench.hparams import Param, ParamError, PerRound

RULES = ("sgd", "momentum", "adagrad", "adam", "yogi")
ADAPTIVE = ("adagrad", "adam", "yogi")
FORMS = ("paper", "optax")
FLOATS = ("lr", "beta1", "beta2", "tau", "initial_accumulator")  # per run in a program
EXAMPLE = "{name: adam, lr: 0.01}"


@dataclass(frozen=True)
class ServerOptimizer:
    """`federation.server_optimizer`: the rule (`name`) and the fields it reads (the module's docstring); a field it
    does not read is refused, one not given takes its default (`values`)."""

    name: str = "sgd"
    lr: float | PerRound | None = None
    beta1: float | None = None
    beta2: float | None = None
    tau: float | None = None
    form: str | None = None
    initial_accumulator: float | None = None

    params = (
        Param("name", "choice", "sgd", "the server's step on the mean update Δ_t: sgd, momentum (heavy ball), "
              "adagrad, adam, yogi (Reddi et al. 2021, Algorithm 2)", choices=RULES),
        Param("lr", "float", None, "server learning rate η (default 1 for sgd and momentum, 0.01 for the adaptive "
              "rules), or its schedule; it multiplies the algorithm's own server_lr", low=0, low_open=True,
              nullable=True),
        Param("beta1", "float", None, "first-moment decay β1 (momentum: the heavy-ball coefficient); default 0.9",
              low=0, high=1, high_open=True, nullable=True),
        Param("beta2", "float", None, "adam, yogi: second-moment decay β2; default 0.99", low=0, high=1,
              nullable=True),
        Param("tau", "float", None, "adagrad, adam, yogi: adaptivity τ added to √v_t (form paper: v_{-1} = τ²; form "
              "optax: optax's eps); default 1e-3", low=0, nullable=True),
        Param("form", "choice", None, "adagrad, adam, yogi: paper (Reddi et al.'s Algorithm 2, the default) or optax "
              "(optax's formulas: bias correction, its initial accumulators)", choices=FORMS, nullable=True),
        Param("initial_accumulator", "float", None, "form optax, adagrad and yogi: optax's initial_accumulator_value "
              "(default 0.1 for adagrad, 1e-6 for yogi)", low=0, nullable=True),
    )

    @classmethod
    def given(cls, spec: Any) -> ServerOptimizer:
        """From a mapping as a recipe writes it (`{name: adam, lr: 0.01}`); refused (ParamError at `server_optimizer`
        or `server_optimizer.NAME`) where it is no such mapping."""
        return _given(cls, spec, "server_optimizer", EXAMPLE)

    @property
    def optax(self) -> bool:
        """Whether it follows optax's formulas (`form: optax`, an adaptive rule)."""
        return self.name in ADAPTIVE and self.form == "optax"

    @classmethod
    def reads_of(cls, spec: dict) -> tuple[str, ...]:
        """The fields a mapping as a recipe writes it reads (none where its rule or form is none of theirs)."""
        rule, form = spec.get("name", "sgd"), spec.get("form")
        return cls(rule, form=form).reads() if rule in RULES and form in (None, *FORMS) else ()

    def reads(self) -> tuple[str, ...]:
        """The fields its rule reads beside `name`."""
        if self.name == "sgd":
            return ("lr",)
        if self.name == "momentum":
            return ("lr", "beta1")
        moments = ("beta1",) if self.name != "adagrad" or not self.optax else ()
        second = ("beta2",) if self.name != "adagrad" else ()
        initial = ("initial_accumulator",) if self.optax and self.name != "adam" else ()
        return ("lr", *moments, *second, "tau", "form", *initial)

    def values(self) -> dict[str, Any]:
        """Every field its rule reads, by name, a default where not given."""
        defaults = {"lr": 1.0 if self.name in ("sgd", "momentum") else 0.01, "beta1": 0.9, "beta2": 0.99,
                    "tau": 1e-3, "form": "paper", "initial_accumulator": 0.1 if self.name == "adagrad" else 1e-6}
        return {name: defaults[name] if getattr(self, name) is None else getattr(self, name) for name in self.reads()}

    def __str__(self) -> str:
        """As a run's configuration records it, every field its rule reads: `adam(lr=0.01, beta1=0.9, beta2=0.99,
        tau=0.001, form=paper)`."""
        return _text(self.name, self.values())

    def check(self) -> None:
        """Refuse (ParamError at `server_optimizer.NAME`) a value out of its range and a field the rule does not read;
        with τ = 0, an adaptive rule whose v may be 0 (a division by zero where Δ_t is)."""
        _check_params(self, "server_optimizer")
        for param in self.params[2:]:
            if isinstance(getattr(self, param.name), PerRound):
                raise ParamError(f"server_optimizer.{param.name}", f"found the schedule {getattr(self, param.name)}, "
                                 "expected a float: only the lr follows a schedule")
        reads = self.reads()
        for param in self.params[1:]:
            if param.name not in reads and getattr(self, param.name) is not None:
                raise ParamError(f"server_optimizer.{param.name}", f"found {getattr(self, param.name)!r} with "
                                 f"{self.name}{' form optax' if self.optax else ''}, which reads "
                                 f"{', '.join(reads)}")
        values = self.values()
        if self.name in ADAPTIVE and values["tau"] == 0 and values.get("initial_accumulator", 0) == 0:
            raise ParamError("server_optimizer.tau", f"found 0 with {self.name} form {values['form']}, whose v_t may "
                             "be 0; expected τ > 0" + (" (or form optax with an initial_accumulator > 0)"
                                                       if self.name != "adam" else ""))


def updates_of_w(uploads: Sequence[Upload]) -> list[Upload]:
    """The `uploads` (an algorithm's) that are updates of its model `w`: new values of it (`relative_to`) or
    differences (`update_of`)."""
    return [upload for upload in uploads if "w" in (upload.relative_to, upload.update_of)]


def check_algorithm(optimizer: ServerOptimizer | None, algorithm: type[Algorithm], hp: Mapping[str, Any]) -> None:
    """Refuse (ParamError at `federation.server_optimizer`) a federation's server `optimizer` for an algorithm, with the
    hyperparameters `hp` (its `routing`), it cannot act on: one without exactly one upload that is an update of `w`, or
    whose server does not take it in through a mean, or whose devices all-reduce it (the module's docstring)."""
    if optimizer is None:
        return
    name, uploads = algorithm.name, algorithm.routing(hp).uploads
    updates = updates_of_w(uploads)
    why = None
    if not updates:
        declared = ", ".join(upload.name for upload in uploads) or "none"
        why = (f"which uploads no update of its model w (uploads: {declared}; an Upload relative_to='w' or "
               "update_of='w')")
    elif len(updates) > 1:
        why = f"which uploads {len(updates)} updates of w ({', '.join(u.name for u in updates)}), not one"
    elif not algorithm.uploads_averaged:
        why = "whose server uses each client's uploads (not only their mean)"
    elif updates[0].all_reduced:
        why = f"which all-reduces its upload {updates[0].name!r} inside the round"
    if why:
        raise ParamError("server_optimizer", f"found {optimizer.name} for {name}, {why}; expected none",
                         "federation")


def check_server_optimizer(federation: Any, algorithm: type[Algorithm], hp: Mapping[str, Any], layout: Any) -> None:
    """`federation.server_optimizer`'s rules (`fedbench.axes.registry`): the algorithm's (`check_algorithm`), then its
    own (`ServerOptimizer.check`)."""
    check_algorithm(federation.server_optimizer, algorithm, hp)
    if federation.server_optimizer is not None:
        federation.server_optimizer.check()
