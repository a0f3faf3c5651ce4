"""What a problem declares before it is built: its parameters and presets, the rules a config must meet, the clients
and the memory a config makes, the capabilities and metrics it provides, and the code outside fedbench it names.
`ProblemSpec` holds them as class attributes and classmethods of a resolved config, so that a recipe is validated,
planned and tracked from the class alone (`fedbench.problems.PROBLEMS[name]`), without reading data or building a
model; `fedbench.problems.base.Problem`, the built instance, inherits them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

from fedbench.hparams import Param, ParamError, resolve
from fedbench.metrics import Metric
from fedbench.sources import Source

T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """The clients a problem instance has, as far as they are known: how many, and how many training samples the
    smallest holds where that bounds a minibatch (None: not known, or no bound, for problems that cap a batch at
    a client's samples), and the config field that sets that number, if one does. What `Federation.check` checks a
    federation against."""
    clients: int | None
    smallest: int | None = None
    smallest_field: str | None = None  # e.g. samples_per_client


class ProblemSpec:
    """A problem's declarations, read before it is built: class attributes (its `name`, `params`, `presets`, what it
    provides and how the engine should run it) and classmethods of a resolved config (`resolve_config`, `check`,
    `declared_layout`, `capabilities`, `metrics`, the memory a run holds, the code it names). Of the names a problem
    writes (`fedbench.problems.base.Problem`), `name`, `params` and `metrics` are here; every other one has a
    default, which its docstring states.
    """

    name: ClassVar[str]
    """The name recipes, `fedbench list` and the registry know it by: a Python identifier, of a plugin not one a
    built-in problem or another plugin has."""
    params: ClassVar[tuple[Param, ...]]
    """Its parameters, a tuple of `Param` (type, default, range, help): what a recipe's `problem:` block may set.
    A problem with `presets` declares a choice `preset` among them."""
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    """Named sets of parameter values, by preset name (default: none); a config's `preset` chooses one, and the
    values given beside it override it (`resolve_config`)."""
    caps_batches: ClassVar[bool] = False
    """True: a client with n_k < b takes all its n_k samples (as in the code of Bao et al., ICML 2022), the missing
    picks row −1, so b may exceed the smallest client; `gather` then gives row −1 zero weight. Default False."""
    provides: ClassVar[frozenset[str]] = frozenset()
    """Capabilities it provides whatever the config (`fedbench.contract.CAPABILITIES`), beyond minibatch losses
    and gradients, which every problem gives; any collection of names does, e.g. `provides = ("full_data",)`.
    Default: none (`capabilities` adds `global_evaluation` where `evaluates_global_model`, and `one_client` for a
    single client). Providing `full_data` promises that `gather` takes row −1 where clients hold different numbers
    of samples."""
    row_elements: ClassVar[int | None] = None
    """Features per gathered sample, for memory budgets (None, the default: `dim`)."""
    compute_bound_steps: ClassVar[bool] = False
    """True: a local step computes many operations per byte of the rows it gathers (a deep network's convolutions),
    so that on the CPU its runs form one program however large the gather. False (the default): a step reads each
    gathered row about once (a linear model), and beyond `fedbench.engine.planning.MEMORY_BOUND_RUN_BYTES` a run's steps
    are bound by memory traffic, which a batch does not reduce: on the CPU its runs go one after another."""
    size_params: ClassVar[tuple[str, ...]] = ()
    """Config fields a run's memory grows with (`run_bytes`); default none."""
    evaluates_global_model: ClassVar[bool] = True
    """False: a metric row needs per-client blocks too, so the problem does not provide `global_evaluation`.
    Default True."""
    noisy_minibatches: ClassVar[bool] = False
    """True: its minibatches carry noise (`minibatch_noise`). Default False."""
    draws_by_step: ClassVar[bool] = False
    """True: `draw_minibatches` draws its steps one after another on the generator, so that drawing a + b steps
    gives the draws of a steps then those of b (iteration-wise run batches draw a run's rows ahead, by iteration).
    Default False."""
    oracles_take_runs: ClassVar[bool] = False
    """True: `step_oracle` takes the rows `[R, S, b]` of R runs' clients, and its oracle's methods take and give
    tensors with that leading run axis (`[R, S, ...]`; a point a run's clients share as `[R, 1, ...]`) by
    broadcasting, so that the engine hands them over as they are. False, the default: the engine folds the run axis
    into the clients' (`[R·S, b]` rows, `[R·S, ...]` points) around every call (`fedbench.oracle.RunOracle`), which
    costs a few µs a call, felt where a local step is a few small kernels (the one-sample coordinate steps of
    Hanzely et al., TMLR 2023)."""

    @classmethod
    def resolve_config(cls, given: dict[str, Any]) -> dict[str, Any]:
        """A config: the declared defaults, overlaid by the chosen preset (for a problem that has presets),
        overlaid by `given`; every value checked against its `Param` (an unknown name raises KeyError, a value out
        of range ValueError).

        Args:
            given: parameter values by name, as a recipe's `problem:` block gives them (with `preset`).

        Returns:
            The resolved config: every parameter's value, by name.

        Example:
            ```python
            config = Lasso.resolve_config({"clients": 32})
            problem = Lasso(config, seed=0)      # what fedbench.make_problem("lasso", clients=32) does
            ```
        """
        given = dict(given)
        if not cls.presets:
            return resolve(cls.params, given, cls.name)
        preset = given.get("preset", next((p.default for p in cls.params if p.name == "preset"), None))
        if preset not in cls.presets:
            raise ValueError(f"{cls.name}.preset: expected one of {' | '.join(cls.presets)}, found {preset!r}")
        return resolve(cls.params, {**cls.presets[preset], **given}, cls.name)

    @classmethod
    def declared_clients(cls, config: dict[str, Any]) -> int | None:
        """The number of clients a resolved config makes, where it is known without building the problem
        (synthetic data), so that a recipe is checked before anything runs; None where it is not. Default: the
        config's `clients`, if it has that field.

        Example:
            A problem whose clients are its `users`:

            ```python
            @classmethod
            def declared_clients(cls, config):
                return config["users"]
            ```
        """
        return config.get("clients")

    @classmethod
    def run_bytes(cls, config: dict[str, Any]) -> int | None:
        """About the bytes one run holds at its peak (its data and model state, in the dtype it uses), from a resolved
        config's sizes (`size_params`, which a problem that estimates declares), so that a recipe whose runs no
        machine holds is refused before anything runs; None: not estimated (data read from files, of their size).
        Default None.

        Example:
            float64 features of every client's samples, and a d × d Hessian:

            ```python
            @classmethod
            def run_bytes(cls, config):
                d, rows = config["dim"], config["clients"] * config["samples_per_client"]
                return 8 * (rows * d + d * d)
            ```
        """
        return None

    @classmethod
    def state_bytes(cls, config: dict[str, Any], kept: int, clients_per_round: int, batch_size: int) -> int | None:
        """About the bytes a run holds beyond `run_bytes` where they grow with its model rather than its data (a deep
        network's): `kept` model-sized vectors per client (the algorithm's `keeps`: SCAFFOLD's c_i), the sampled
        clients' local copies, and a local step's activations for `clients_per_round` × `batch_size` samples; what
        validation adds to `run_bytes` before refusing a run no machine holds. None (the default): not estimated
        apart from `run_bytes`.

        Example:
            A model of d float32 parameters whose activations are `width` values a sample:

            ```python
            @classmethod
            def state_bytes(cls, config, kept, clients_per_round, batch_size):
                d = config["dim"]
                return 4 * (d * (kept * config["clients"] + 4 * clients_per_round)
                            + 2 * clients_per_round * batch_size * config["width"])
            ```
        """
        return None

    @classmethod
    def check(cls, config: dict[str, Any]) -> None:
        """Refuse (ParamError) a resolved config that the problem cannot be built with, by rules that need the
        config alone; every instance is checked so, and a recipe's validator checks its configs so before anything
        runs. Rules that need the data go in `declared_layout`. Default: no rule.

        Example:
            A least squares whose optimum must be unique (`examples/fedbench-fedopt`):

            ```python
            @classmethod
            def check(cls, config):
                if config["clients"] * config["samples_per_client"] < config["dim"]:
                    raise ParamError("samples_per_client", f"found {config['samples_per_client']}, expected "
                                     f"clients × samples_per_client ≥ dim = {config['dim']}", cls.name)
            ```
        """

    @classmethod
    def declared_layout(cls, config: dict[str, Any], read_data: bool = False) -> Layout:
        """The clients a checked config makes, without building the problem: from the config alone, and with
        `read_data` also from the index of the data (labels, writers' sample counts; never the images), where the
        problem reads files. Reading them also refuses (ParamError) what building would refuse on those data: a
        missing file, a partition the data cannot give. Default: `declared_clients` clients, their sizes unknown.

        Returns:
            The `Layout` a recipe's federation is checked against (`Federation.check`).

        Example:
            Synthetic clients of `samples_per_client` samples each, so that `batch_size` is checked against it:

            ```python
            @classmethod
            def declared_layout(cls, config, read_data=False):
                return Layout(config["clients"], config["samples_per_client"], "samples_per_client")
            ```
        """
        return Layout(cls.declared_clients(config))

    @classmethod
    def code_hashes(cls, config: dict[str, Any]) -> dict[str, str]:
        """The sha256 of code outside fedbench that a resolved config names (a network's file), by the field that
        names it: a run's configuration holds them (`fedbench_sweeps`' trials), so that an edit of that code runs
        its runs again. Default: none.

        Example:
            ```python
            @classmethod
            def code_hashes(cls, config):
                return {"model": hashlib.sha256(Path(config["model_file"]).read_bytes()).hexdigest()}
            ```
        """
        return {}

    @classmethod
    def carried_code(cls, config: dict[str, Any]) -> tuple[Source, ...]:
        """The sources of code outside fedbench that a resolved config names (a researcher's network), which its
        runs record (tag `code_sha256`, artifacts `code/`) and which must reach the Ray worker that runs them: a
        file's text travels with each run (`fedbench.networks.carry`), a module that is not installed is shipped with
        the Ray job (`fedbench_sweeps.cluster.shipped_code`). Default: none."""
        return ()

    @classmethod
    def read_index(cls, config: dict[str, Any], read: Callable[..., T], *args: Any) -> T:
        """`read(*args)`, a loader of the index of the config's data files, its refusal (a missing or malformed
        file, named in the message) a ParamError of the field that chose the files.

        Example:
            In `declared_layout`, the labels of a data set read from the config's `path`:

            ```python
            train_labels, test_labels = cls.read_index(config, cifar10.load_labels, config["path"])
            ```
        """
        try:
            return read(*args)
        except ValueError as err:
            field = "path" if config.get("path") is not None or "data_dir" not in config else "data_dir"
            raise ParamError(field, str(err), cls.name) from None

    @classmethod
    def capabilities(cls, config: dict[str, Any]) -> set[str]:
        """What this problem provides with a resolved config (the contract an algorithm's `requirements` are
        checked against). Default: `provides`, `global_evaluation` unless its rows need per-client blocks
        (`evaluates_global_model`), and `one_client` where the config makes a single client.

        Example:
            pAUC's AUC task has a linear outer function (`fedbench/problems/pauc.py`):

            ```python
            @classmethod
            def capabilities(cls, config):
                return super().capabilities(config) | ({"linear_outer"} if config["task"] == "auc" else set())
            ```
        """
        return (set(cls.provides) | ({"global_evaluation"} if cls.evaluates_global_model else set())
                | ({"one_client"} if cls.declared_clients(config) == 1 else set()))

    @classmethod
    def shared_by_seeds(cls, config: dict[str, Any]) -> bool:
        """Whether one instance serves every trial seed with this config, so that runs of several seeds can
        share it (`fedbench.engine.runs`): the data do not follow the seed, and nothing else in the problem does.
        Default: where the config sets a `data_seed`.

        Example:
            A problem whose evaluation draws on the trial seed is never shared:

            ```python
            @classmethod
            def shared_by_seeds(cls, config):
                return False
            ```
        """
        return config.get("data_seed") is not None

    @classmethod
    def metrics(cls, config: dict[str, Any]) -> tuple[Metric, ...]:
        """The metrics `evaluate_global` returns for the global model, in row order, each with the direction that
        is better. No default: every problem defines it.

        Example:
            ```python
            @classmethod
            def metrics(cls, config):
                return (Metric("train_mse", "training loss (MSE)", "min"),
                        Metric("distance", "distance to the mean solution", "min"))
            ```
        """
        raise NotImplementedError

    @classmethod
    def personal_metrics(cls, config: dict[str, Any]) -> tuple[Metric, ...]:
        """The metrics of per-client models (names without the `personal_` prefix) that `evaluate_personal`
        returns, for problems that provide `personal_evaluation`. Default: none.

        Example:
            ```python
            @classmethod
            def personal_metrics(cls, config):
                return (Metric("test_accuracy", "test accuracy", "max"),)
            ```
        """
        return ()

    @classmethod
    def declared_metrics(cls, config: dict[str, Any], personal: bool = False) -> tuple[Metric, ...]:
        """Every metric of a row: the global ones, then (`personal`) the `personal_` ones.

        Example:
            ```python
            [m.name for m in Lasso.declared_metrics(Lasso.resolve_config({}), personal=True)]
            ```
        """
        extra = tuple(m.personal() for m in cls.personal_metrics(config)) if personal else ()
        return cls.metrics(config) + extra
