"""What an algorithm declares, read from its class and the hyperparameters before anything is built: its name and
hyperparameters, what crosses the network (`routing`), what it requires of a problem, the minibatches its steps draw,
the metrics it adds, its rules on the hyperparameters and its caveats. A recipe's validator and `fedbench list` read
these from the class; the run (`fedbench.algorithms.base.Algorithm`, which inherits them) reads the same. Every
declaration that depends on the hyperparameters is a classmethod of them (`hp`: resolved, by name, as Python values),
so that validation and the run see the same.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

from fedbench.algorithms.messages import MODEL, Routing, Upload
from fedbench.hparams import Param
from fedbench.metrics import Metric
from fedbench.oracle import Minibatch


class AlgorithmSpec:
    """An algorithm's declarations (`Algorithm` inherits them): class attributes, and classmethods of the
    hyperparameters where they depend on them."""

    name: ClassVar[str]
    """The name recipes, `fedbench list` and the registry know it by: a Python identifier, of a plugin not one a
    built-in algorithm or another plugin has."""
    title: ClassVar[str | None] = None
    """The method's name as its paper writes it, for reports (None, the default: `name`)."""
    hparams: ClassVar[tuple[Param, ...]]
    """Its hyperparameters, a tuple of `Param` (type, default, range, help): what a recipe may set, what the engine
    checks, and what the round functions get as `hp`."""
    downloads: tuple[str, ...] = ("w",)
    """Server entries every sampled client receives at a round's start, counted in `comm_down`. Default `("w",)`:
    the model `server["w"]` alone; where a hyperparameter decides them, `routing` (Local Pair, FeDXL2)."""
    uploads: tuple[Upload, ...] = (MODEL,)
    """What each client sends at a round's end, counted in `comm_up`: the `Upload`s that `client_final`'s message
    holds (a message with other entries is refused, `MessageError`). Default `(MODEL,)`: its local `w`, a new value
    of the server's `w`."""
    keeps: tuple[str, ...] = ()
    """Per-client state (entries of `init_clients`) that the default `client_init` adds to the local state from the
    clients' `rows` and the default `client_final` writes back. Default `()`: none."""
    uploads_averaged: ClassVar[bool] = True
    """True (the default): `server_update` takes each upload in only through a mean over the round's clients (with
    `weights`, or uniform: SCAFFOLD's Σ_k Δc_k / N is (S/N) times one), so that a robust aggregation rule
    (`federation.aggregation: median`, ..., `fedbench.axes.robust`) may stand in for that mean. False where it uses the
    clients' values one by one (FeDXL's pools of scores): robust rules are then refused."""
    replicated: ClassVar[tuple[str, ...]] = ()
    """Entries of the message beyond the uploads that every device computes itself after the round's all-reduce
    (participation "all": the block methods' w-block), handed to `server_update` and not counted as sent. Default
    `()`."""
    personalized: ClassVar[bool] = False
    """True: `personal_params` gives per-client models, evaluated by the problem's `personal_` metrics (the
    algorithm then requires `personal_evaluation` instead of `global_evaluation`). Default False."""
    personal_optional: ClassVar[bool] = False
    """True (with `personalized`): the method's output is its global model and its per-client models are an
    addition (FedProx's last local iterates), so that it also runs on a problem without `personal_evaluation`, as
    a global method: no `personal_params` there, its rows the global metrics alone (`reports_personal`). Default
    False."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """Capabilities the problem must provide beyond minibatch losses and gradients (`fedbench.contract`), e.g.
    `frozenset({"hvp"})`; any collection of names does. Default: none (`requirements` adds `global_evaluation`, or
    `personal_evaluation` for a personalized method)."""
    participation: ClassVar[str] = "sampled"
    """"sampled" (the default): S clients a round, the federation's `clients_per_round`; "all": every client takes
    part in every round (S = N)."""

    @classmethod
    def check(cls, hp: Mapping[str, Any]) -> None:
        """Refuse (ParamError) resolved hyperparameters that no run can have, by rules beyond each parameter's own
        range (e.g. lists that must agree in length); every instance is checked so, and a recipe's validator checks
        its configurations so before anything runs. Default: no rule.

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Example:
            MC-FedDA's per-stage lists (`fedbench/algorithms/mc_fedda.py`):

            ```python
            @classmethod
            def check(cls, hp):
                if len(hp["stage_lams"]) != len(hp["stage_rounds"]):
                    raise ParamError("stage_lams", "expected one entry per stage as stage_rounds has", cls.name)
            ```
        """

    @classmethod
    def caveats(cls, hp: Mapping[str, Any], rounds: int) -> dict[str, str]:
        """What a run of `rounds` rounds with these hyperparameters does that they do not say, by the hyperparameter
        concerned: a recipe's validator warns of each (the run is valid: a shortened run is the first rounds of the
        full one). Default: none.

        Args:
            hp: the resolved hyperparameters by name, as Python values.
            rounds: the run's communication rounds.

        Example:
            MC-FedDA's stages that begin after the run's last round (`fedbench/algorithms/mc_fedda.py`): with
            `stage_rounds: [250, 250, 1500]` a run of 200 rounds never leaves its first stage.
        """
        return {}

    @classmethod
    def routing(cls, hp: Mapping[str, Any]) -> Routing:
        """What crosses the network with these hyperparameters: the `downloads`, `uploads` and `keeps` that a
        recipe's validator checks (uplink chains, aggregation rules, the server optimizer) and that the run built with
        them routes and counts. Default: the class's `downloads`, `uploads` and `keeps`, whatever the hyperparameters.

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Example:
            Local Pair's momentum goes down and up with the model where the server averages it
            (`fedbench/algorithms/local_pair.py`), else each client keeps its own:

            ```python
            @classmethod
            def routing(cls, hp):
                if hp["average_momentum"]:
                    return Routing(("w", "G"), (MODEL, Upload("G", relative_to="G")), keeps=("u",))
                return Routing(("w",), (MODEL,), keeps=("u", "G"))
            ```
        """
        return Routing(cls.downloads, cls.uploads, cls.keeps)

    @classmethod
    def requirements(cls, hp: Mapping[str, Any]) -> set[str]:
        """The capabilities this algorithm needs with these hyperparameters. Default: `requires`, and
        `personal_evaluation` for a personalized method, else `global_evaluation` (neither where its personal
        models are optional, `personal_optional`: it reports those a problem evaluates).

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Returns:
            Capability names (`fedbench.contract.CAPABILITIES`).

        Example:
            SCAFFOLD's option I needs each client's full-data gradient:

            ```python
            @classmethod
            def requirements(cls, hp):
                return super().requirements(hp) | ({"full_data"} if hp["control"] == "I" else set())
            ```
        """
        if cls.personalized and cls.personal_optional:  # either evaluation: personal models where it has them
            return set(cls.requires)
        return set(cls.requires) | {"personal_evaluation" if cls.personalized else "global_evaluation"}

    @classmethod
    def reports_personal(cls, capabilities: set[str]) -> bool:
        """Whether its runs on a problem that provides `capabilities` report `personal_` metrics: a personalized
        method's do, unless its personal models are optional (`personal_optional`) and the problem does not
        evaluate them.

        Example:
            ```python
            FedProx.reports_personal(Lasso.capabilities(config))    # True: lasso evaluates personal models
            FedProx.reports_personal(Vision.capabilities(config))   # False: the global model's metrics alone
            ```
        """
        return cls.personalized and (not cls.personal_optional or "personal_evaluation" in capabilities)

    @classmethod
    def declared_metrics(cls, hp: Mapping[str, Any]) -> tuple[Metric, ...]:
        """Metrics the algorithm itself adds to each row (e.g. the objective it minimizes), whose values `evaluate`
        gives. Default: none.

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Example:
            pFedFBE's forward-backward envelope:

            ```python
            @classmethod
            def declared_metrics(cls, hp):
                return (Metric("fbe_objective", "FBE objective F(w) (eq. 5)", "min"),)
            ```
        """
        return ()

    @classmethod
    def minibatches(cls, hp: Mapping[str, Any]) -> tuple[Minibatch, ...]:
        """The minibatches each local step draws with these hyperparameters (names and sizes); `client_step` gets an
        oracle per name (`batches.D`). Default: one batch `D` of the federation's `batch_size`.

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Returns:
            A `Minibatch` per name, each drawn on its own unless declared `same_as` another.

        Example:
            Per-FedAvg's inner and outer batches, sized by hyperparameters (`fedbench/algorithms/per_fedavg.py`):

            ```python
            @classmethod
            def minibatches(cls, hp):
                return (Minibatch("D", size="inner_batch"), Minibatch("D1", size="outer_batch"))
            ```
        """
        return (Minibatch("D"),)
