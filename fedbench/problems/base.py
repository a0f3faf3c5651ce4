"""What a federated problem provides to the engine.

A problem owns its federated data, the smooth loss f (one client's minibatch loss, `minibatch_loss`:
torch.func's vmap lifts it to every client's loss at once, and the gradients and Hessian-vector products that
oracles serve are backward passes through that batched loss, the gradient's replayed from a trace of it
(`fedbench.problems.traces`); problems override `loss`/`grad`/`hvp` where a hand-written form is faster), the
regularizer h, the initial point, its declared metrics and their evaluation, and the capabilities it provides beyond
minibatch gradients (`fedbench.contract`). Parameters are flat vectors `[d]`; a batch of clients is `[S, d]`. The
engine lifts the oracles over its runs, so that an algorithm's local step calls them at `[R, S, d]`
(`fedbench.oracle`), and a problem sees clients alone unless it declares `oracles_take_runs`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from fedbench.hparams import Param, ParamError, resolve
from fedbench.metrics import Metric
from fedbench.models import MLP
from fedbench.oracle import Oracle, over_runs
from fedbench.problems.traces import SLOT, replayed
from fedbench.prox import Regularizer
from fedbench.rng import largest_keys
from fedbench.sources import Source

FULL_DATA_CHUNK = 2**24  # elements of gathered features per chunk of clients in full-data oracles
T = TypeVar("T")


def padded_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """A gather's rows `[..., b]`, padding −1 included, as flat indices into the pool `[... · b]` (padding reads row
    0) and each row's weight `[..., b]`: 1/b_valid, 0 on padding, so that a loss is each client's mean over its real
    rows (a client without any, past its last step of an epoch, weighs nothing)."""
    valid = rows >= 0
    return rows.clamp_min(0).reshape(-1), valid / valid.sum(-1, keepdim=True).clamp_min(1)


@dataclass(frozen=True)
class Layout:
    """The clients a problem instance has, as far as they are known: how many, and how many training samples the
    smallest holds where that bounds a minibatch (None: not known, or no bound, for problems that cap a batch at
    a client's samples), and the config field that sets that number, if one does. What `Federation.check` checks a
    federation against."""
    clients: int | None
    smallest: int | None = None
    smallest_field: str | None = None  # e.g. samples_per_client


class Problem:
    """A federated problem: its data split over N clients, one client's smooth minibatch loss f (from which
    every client's loss, gradient and Hessian-vector products are derived at once), the regularizer h, the
    initial point, its metrics, and the capabilities it provides (`fedbench.contract`). The objective is
    F(w) = Σ_k π_k L_k(w) + h(w), L_k client k's loss over its training samples.

    An instance is built from a resolved config (`resolve_config`), a seed and a device; a subclass's `__init__`
    calls `super().__init__(config, seed, device)`, then builds its data and sets `dim`, `regularizer`,
    `client_weights` and the clients' layout by `self._set_clients(sizes)` (`sizes` `[N]`, the samples of each
    client, whose rows are contiguous in the flat data: client k's are `client_offsets[k]` to
    `client_offsets[k + 1] − 1`). A subclass defines `name`, `params`, `init_params`, `gather`, `minibatch_loss`,
    `metrics` and `evaluate_global` (a plugin that lacks one is refused, `fedbench.plugins`); every other hook has a
    default, which its docstring states.

    Example:
        The how-to's least squares (`docs/how-to/write-a-problem.md`), in outline:

        ```python
        class DriftingLeastSquares(Problem):
            name = "drifting_lsq"
            params = (Param("clients", "int", 20, "number of clients N", low=1), ...)

            def __init__(self, config, seed, device="cpu"):
                super().__init__(config, seed, device)
                ...                                                   # x [N·n, d], y [N·n]
                self._set_clients(torch.full((n_clients,), n, dtype=torch.long))
                self.client_weights = torch.full((n_clients,), 1 / n_clients, dtype=torch.float64)
                self.regularizer = NoRegularizer()

            def gather(self, rows):                                   # [S, b] -> ([S, b, d], [S, b])
                return self.features[rows], self.labels[rows]

            def minibatch_loss(self, w, batch):                       # one client: w [d], x [b, d], y [b]
                x, y = batch
                return 0.5 * (x @ w - y).square().mean()
        ```
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
    gathered row about once (a linear model), and beyond `fedbench.planning.MEMORY_BOUND_RUN_BYTES` a run's steps
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

    num_clients: int
    """N, the number of clients (`_set_clients`)."""
    dim: int
    """d, the length of the flat parameter vector."""
    regularizer: Regularizer
    """h, the regularizer (`fedbench.prox`: `NoRegularizer`, `L1`, the nuclear norm, ...), `Algorithm.reg`."""
    client_sizes: Tensor
    """`[N]`: the training samples n_k of each client (`_set_clients`)."""
    client_offsets: Tensor
    """`[N + 1]`: client k's rows of the flat data are `client_offsets[k]` to `client_offsets[k + 1] − 1`."""
    client_weights: Tensor
    """`[N]`: π_k of the global objective Σ π_k L_k + h, summing to 1."""

    def __init__(self, config: dict[str, Any], seed: int, device: str | torch.device = "cpu"):
        """The problem of a resolved `config` (checked by `check`) and a trial `seed` on `device`."""
        self.check(config)
        self.config = config
        """The resolved config, by parameter name."""
        self.seed = seed
        """The trial seed."""
        self.data_seed = seed if config.get("data_seed") is None else config["data_seed"]
        """The seed of the data: the config's `data_seed` where it sets one, else the trial seed."""
        self.device = torch.device(device)
        """The device its data and the runs' state live on."""

    def __getstate__(self) -> dict[str, Any]:
        """Its attributes, for pickling (a Ray worker's copy, a deep copy), without the traces of its default gradient
        (`grad`), which the copy makes anew."""
        return {name: value for name, value in vars(self).items() if name != SLOT}

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

    def choices(self) -> dict[str, str]:
        """What this instance chose for itself among equivalent ways to run (the same numbers to rounding), by
        name: a run prints them when it starts and records them as tags. Default: none.

        Example:
            A deep network's layout over the clients (`fedbench/problems/vision.py`):

            ```python
            def choices(self):
                return {"layout": self.layout_name}
            ```
        """
        return {}

    def layout(self) -> Layout:
        """The clients of this instance: their number and, unless the problem `caps_batches`, the smallest one's
        samples.

        Example:
            ```python
            federation.check(problem.layout())       # refuses a batch_size above the smallest client's samples
            ```
        """
        return Layout(self.num_clients, None if self.caps_batches else int(self.client_sizes_cpu.min()))

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
        share it (`fedbench.runs`): the data do not follow the seed, and nothing else in the problem does. Default:
        where the config sets a `data_seed`.

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

    # -- the engine's needs --------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        """A run's initial point. No default: every problem defines it.

        Args:
            gen: the run's "init" stream.

        Returns:
            The initial point `[d]`, on the problem's device, in its dtype.

        Example:
            ```python
            def init_params(self, gen):
                return torch.zeros(self.dim, dtype=torch.float64, device=self.device)
            ```
        """
        raise NotImplementedError

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices into the flat data: for every step and sampled client, a minibatch drawn without
        replacement from that client's samples (as in the released code of Bao et al., ICML 2022). With
        `caps_batches`, a client with n_k < b takes all its n_k samples and the missing picks are row −1 (zero
        weight in `gather`). A problem overrides it to draw otherwise (pAUC's class-balanced batches).

        Args:
            clients: the sampled clients `[S]` (CPU).
            steps: the local steps to draw for.
            batch_size: b.
            gen: the run's "minibatches" stream.

        Returns:
            Rows `[steps, S, b]`, on the problem's device.

        Example:
            The rows of E = 10 local steps of the clients 3 and 7, 5 samples each:

            ```python
            rows = problem.draw_minibatches(torch.tensor([3, 7]), 10, 5, generator(0, "minibatches"))  # [10, 2, 5]
            ```
        """
        width = min(batch_size, self.max_size) if self.caps_batches else batch_size
        # The b largest of i.i.d. uniform keys are a uniform subset: a topk (an nth_element per row), ~4x cheaper than
        # an argsort here on fresh keys (85 µs against 370 µs at E = S = 10, n_k = 128) and most of a round's draws.
        keys = torch.rand(steps, len(clients), self.max_size, generator=gen)
        if not self.equal_sizes:  # padding positions beyond a client's n_k are never picked
            keys.masked_fill_(torch.arange(self.max_size) >= self.client_sizes_cpu[clients][:, None], -1.0)
        picks = largest_keys(keys, width)
        rows = (self.client_offsets_cpu[clients][:, None] + picks).to(self.device)
        if not self.caps_batches:
            return rows
        ends = self.client_offsets_cpu[clients + 1].to(self.device)
        rows.masked_fill_(rows >= ends[:, None], -1)  # the picks of padding positions
        return F.pad(rows, (0, batch_size - width), value=-1)

    def draw_epochs(self, clients: Tensor, epochs: int, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices of `epochs` passes over each sampled client's samples (`federation.local_steps: {epochs: E}`,
        `fedbench.participation`): client k's E·n_k picks are its passes one after another, each pass a fresh
        uniform permutation of its samples, cut into consecutive batches of b; its last batch is short and its steps
        past ⌈E·n_k / b⌉ are all padding (row −1, weighing nothing in `gather`).

        Args:
            clients: the sampled clients `[S]` (CPU).
            epochs: E.
            steps: the round's steps, at least the most any of the clients takes.
            batch_size: b.
            gen: the run's "minibatches" stream.

        Returns:
            Rows `[steps, S, b]`, on the problem's device.
        """
        sizes = self.client_sizes_cpu[clients][:, None]  # [S, 1]
        keys = torch.rand(epochs, len(clients), self.max_size, generator=gen)
        keys.masked_fill_(torch.arange(self.max_size) >= sizes, 2.0)  # a client's padding positions sort last
        orders = keys.argsort(-1)  # [E, S, n_max]: each pass, a uniform permutation of the client's positions first
        place = torch.arange(steps * batch_size)  # a pick's place in the client's sequence of passes
        passes, within = place // sizes, place % sizes  # [S, steps · b]
        picks = orders[passes.clamp_max(epochs - 1), torch.arange(len(clients))[:, None], within]
        rows = torch.where(passes < epochs, self.client_offsets_cpu[clients][:, None] + picks, -1)
        return rows.view(len(clients), steps, batch_size).transpose(0, 1).contiguous().to(self.device)

    def gather(self, rows: Tensor) -> Any:
        """The data of the rows, for `minibatch_loss` (and the problem's oracles). No default: every problem
        defines it.

        Row −1 is padding: `full_data` pads each client's rows to the largest client's n_k with −1, and
        `caps_batches` fills a short client's minibatch with it. So a problem whose clients hold different numbers
        of samples and that provides `full_data` (or `caps_batches`) must accept row −1 and give it zero weight in
        the loss; one whose clients are of equal size never sees it.

        Args:
            rows: row indices into the flat data, `[S, b]` for a local step's minibatch (`[R·S, b]` for R runs; `[R,
                S, b]` where `oracles_take_runs`), or `[C, n_max]` for the whole data of C clients (`full_data`).

        Returns:
            A tuple of tensors with the rows' leading axes, e.g. features `[S, b, d]` and labels `[S, b]`.

        Example:
            Row weights that are zero on padding, so that the loss is each client's mean over its real rows
            (`fedbench/problems/classification.py`):

            ```python
            def gather(self, rows):
                valid = rows >= 0
                flat = rows.clamp_min(0).reshape(-1)
                x = self.x_train.index_select(0, flat).view(*rows.shape, self.x_train.shape[-1])
                return x, self.y_train[flat].view(rows.shape), valid / valid.sum(-1, keepdim=True)
            ```
        """
        raise NotImplementedError

    def minibatch_noise(self, rows: Tensor, gen: torch.Generator) -> Tensor | None:
        """The random perturbation a step's minibatch `rows` `[S, b]` carries (pAUC's per-client feature noise), one
        entry per row in the rows' order, whatever their leading axes (the engine concatenates the runs' noise,
        each drawn on its run's stream); drawn on the simulation's own stream (`RoundSampler`), so that it follows
        the run's seed and not the problem instance's. `step_oracle` receives it. Default None, for problems
        without one (`noisy_minibatches`).

        Example:
            pAUC's ε ~ N(0, I) per row:

            ```python
            def minibatch_noise(self, rows, gen):
                return torch.randn(rows.numel(), self.feature_dim, generator=gen, dtype=self.dtype).to(self.device)
            ```
        """
        return None

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> Oracle:
        """The oracle of one declared minibatch of one local step, with its `minibatch_noise` (X-risk problems
        return a richer oracle). Default: an `Oracle` on `gather(rows)`.

        Args:
            rows: the step's rows `[S, b]` (`[R·S, b]` for R runs; `[R, S, b]` where `oracles_take_runs`).
            noise: the rows' `minibatch_noise`, or None.

        Returns:
            The oracle `client_step` sees as `batches.D` (lifted over the run axis by the engine).

        Example:
            Least squares serves a hand-written oracle on the rows:

            ```python
            def step_oracle(self, rows, noise=None):
                return LeastSquaresOracle(self, rows)
            ```
        """
        return Oracle(self, self.gather(rows))

    def full_data(self, clients: Tensor) -> Oracle:
        """An oracle over the whole training data of `clients` `[C]`: `gather` of rows `[C, n_max]`, each client's
        padded with row −1 to the largest client's n_k (built on the compute device, without a host
        synchronisation). For many clients use `client_loss`/`client_grad`, which bound the memory. A problem that
        provides `full_data` may override it (the block problems' oracle).

        Example:
            Every client's full-data gradient at its own point `w` `[C, d]`:

            ```python
            problem.full_data(clients).grad(w)                      # [C, d]
            ```
        """
        clients = clients.to(self.device)
        position = torch.arange(self.max_size, device=self.device)
        rows = self.client_offsets[clients][:, None] + position
        return Oracle(self, self.gather(rows.masked_fill(position >= self.client_sizes[clients][:, None], -1)))

    @over_runs
    def client_loss(self, w: Tensor, clients: Tensor) -> Tensor:
        """L_k(w_k), the smooth loss of each client on its whole training data (`minibatch_loss` of a batch of all
        its samples): h is not included (add `self.regularizer.value(w)` for the composite objective). Needs
        `full_data`.

        Args:
            w: a point per client, `[C, d]`; over runs (`over_runs`), `[R, C, d]`, or `[R, 1, d]` for every client's.
            clients: the clients `[C]`; over runs, `[R, C]` or `[C]` (the same in every run).

        Returns:
            `[C]`; over runs, `[R, C]`.

        Example:
            In a round, each sampled client's loss at the server model `[R, 1, d]`:

            ```python
            losses = self.problem.client_loss(server["w"], rnd.clients)    # [R, S]
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.loss, w))

    @over_runs
    def client_grad(self, w: Tensor, clients: Tensor) -> Tensor:
        """∇L_k(w_k), the gradient of each client's smooth loss on its whole training data (h not included). Needs
        `full_data`.

        Args:
            w: a point per client, `[C, d]`; over runs (`over_runs`), `[R, C, d]`, or `[R, 1, d]` for every client's.
            clients: the clients `[C]`; over runs, `[R, C]` or `[C]`.

        Returns:
            `[C, d]`; over runs, `[R, C, d]`.

        Example:
            SCAFFOLD's option I control variate, at the server model (Algorithm 1 line 12):

            ```python
            c_new = self.problem.client_grad(local["x"], rnd.clients)    # x [R, 1, d] -> [R, S, d]
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.grad, w))

    @over_runs
    def client_loss_and_grad(self, w: Tensor, clients: Tensor) -> tuple[Tensor, Tensor]:
        """`client_loss` and `client_grad` together, gathering each chunk of data once: `([C], [C, d])`, over runs
        `([R, C], [R, C, d])`.

        Example:
            ```python
            losses, grads = self.problem.client_loss_and_grad(points, everyone)    # points [N, d], everyone [N]
            ```
        """
        parts = self._by_chunk(clients, lambda oracle, point: (oracle.loss(point), oracle.grad(point)), w)
        return torch.cat([loss for loss, _ in parts]), torch.cat([grad for _, grad in parts])

    @over_runs
    def client_hvp(self, w: Tensor, v: Tensor, clients: Tensor) -> Tensor:
        """∇²L_k(w_k) v_k on each client's whole training data: `w`, `v` `[C, d]` (over runs, `[R, C, d]` or `[R, 1,
        d]`) -> `[C, d]` (`[R, C, d]`).

        Example:
            ```python
            products = self.problem.client_hvp(w, v, clients)
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.hvp, w, v))

    def _by_chunk(self, clients: Tensor, compute, *per_client: Tensor) -> list:
        """`compute(full-data oracle, *rows)` on chunks of clients whose gathered data stay under FULL_DATA_CHUNK
        elements; `per_client` tensors `[C, ...]` are split alongside the clients."""
        step = max(1, FULL_DATA_CHUNK // (self.max_size * (self.row_elements or self.dim)))
        return [compute(self.full_data(clients[start: start + step]), *(t[start: start + step] for t in per_client))
                for start in range(0, len(clients), step)]

    # -- the loss and its derivatives, batched over clients ---------------------------------------
    def minibatch_loss(self, w: Tensor, batch: Any) -> Tensor:
        """The smooth loss f of one client's minibatch, a scalar; torch.func's vmap lifts it to `loss` for all
        clients at once, which `grad` and `hvp` differentiate (so it must be written with torch operations on these
        tensors alone: no `.item()`, no Python branch on their values). No default: every problem defines it (or
        overrides `loss`). h is not part of it.

        Args:
            w: the client's point `[d]`.
            batch: `gather`'s tuple without its leading axes (e.g. `[b, d]` features, `[b]` labels).

        Returns:
            A scalar tensor.

        Example:
            ```python
            def minibatch_loss(self, w, batch):
                x, y = batch
                return 0.5 * (x @ w - y).square().mean()
            ```
        """
        raise NotImplementedError

    def loss(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch loss of every client at its point: `w` `[S, d]` -> `[S]`. Default: `minibatch_loss` lifted
        by `torch.func.vmap`; a problem overrides it where a batched form is faster.

        Example:
            A hand-written least-squares loss, ½ mean (⟨x, w⟩ − y)² per client:

            ```python
            def loss(self, w, batch):
                x, y = batch                                             # [S, b, d], [S, b]
                return 0.5 * (torch.einsum("sbd,sd->sb", x, w) - y).square().mean(-1)
            ```
        """
        return vmap(self.minibatch_loss)(w, batch)

    def grad(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch gradient of the smooth loss of every client at its point: `w` `[S, d]` -> `[S, d]`.
        Default: `autograd_grad` (one backward pass over the sum of the clients' losses), replayed from its trace
        (`fedbench.problems.traces`: the ATen operations it runs, recorded by make_fx for each layout of `w` and the
        batch once its untraced calls have cost as much, traced anew once any attribute of the problem is reassigned,
        the same values bit for bit; untraced where the loss draws random numbers, reads a tensor's value into
        Python or does not trace). On the least squares of the how-to "Write a problem" at S = 20, b = 50, d = 10
        (`bench/plugin_grad.py`, one thread of a loaded 2-core CPU, median of ten runs) it takes 1.2x the time of
        the hand-written einsum below, against 6.8x untraced and 9.6x for torch.func's `vmap(grad(minibatch_loss))`.
        A problem overrides it where its loss reads state that changes inside an attribute (a list's element), or
        to be fast from the first call (or overrides `loss` with a batched form, which the default goes through).

        Example:
            A hand-written least-squares gradient, (1/b) Xᵀ(Xw − y) per client:

            ```python
            def grad(self, w, batch):
                x, y = batch                                             # [S, b, d], [S, b]
                residual = torch.einsum("sbd,sd->sb", x, w) - y
                return torch.einsum("sbd,sb->sd", x, residual) / x.shape[-2]
            ```
        """
        return replayed(self, self.autograd_grad, w, batch)

    def autograd_grad(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch gradient of every client by one backward pass over the sum of their losses (`loss`: client
        k's loss depends on row k of w alone, so row k of the sum's gradient is its gradient), as `grad` computes it
        without its trace; faster than torch.func's `vmap(grad(minibatch_loss))`, which gives the same values
        (`bench/plugin_grad.py`).

        Example:
            ```python
            torch.testing.assert_close(problem.grad(w, batch), problem.autograd_grad(w, batch))
            ```
        """
        point = w.detach().requires_grad_(True)
        with torch.enable_grad():
            return torch.autograd.grad(self.loss(point, batch).sum(), point)[0]

    def hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k for every client: `w`, `v` `[S, d]` -> `[S, d]`. Default: `autograd_hvp`; problems
        with a closed form override it (and provide `exact_hvp`).

        Example:
            Least squares, (1/b) XᵀX v per client, whatever w:

            ```python
            def hvp(self, w, v, batch):
                x, _ = batch                                             # [S, b, d]
                return torch.einsum("sbd,sb->sd", x, torch.einsum("sbd,sd->sb", x, v)) / x.shape[-2]
            ```
        """
        return self.autograd_hvp(w, v, batch)

    def autograd_hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k by double backward through the batched loss: the clients' losses are
        independent, so ∇_w ⟨∇_w Σ_k f(w_k), v⟩ holds every client's product (measured 2x faster here than
        torch.func's vmapped forward-over-reverse jvp of the gradient, which gives the same values).

        Example:
            A closed form checked against it:

            ```python
            torch.testing.assert_close(problem.hvp(w, v, batch), problem.autograd_hvp(w, v, batch))
            ```
        """
        point = w.detach().requires_grad_(True)
        with torch.enable_grad():
            gradient = torch.autograd.grad(self.loss(point, batch).sum(), point, create_graph=True)[0]
            return torch.autograd.grad((gradient * v).sum(), point)[0]

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        """A metrics row: those of the global model `w` `[d]` (`evaluate_global`), then, given per-client models
        `personal` `[N, d]`, those of `evaluate_personal` with the `personal_` prefix.

        Example:
            ```python
            row = problem.evaluate(result.params, result.personal)    # {"objective": ..., "personal_...": ...}
            ```
        """
        metrics = self.evaluate_global(w)
        if personal is not None:
            metrics.update({f"personal_{k}": v for k, v in self.evaluate_personal(personal).items()})
        return metrics

    def evaluate_runs(self, ws: Tensor, personals: Tensor | None = None) -> list[dict[str, float]]:
        """The metrics of K runs' models (`ws` `[K, d]`, `personals` `[K, N, d]`), e.g. the runs of a batch
        (`fedbench.runs`). Default: one `evaluate` each; a problem overrides it to evaluate all runs in one pass
        over its data.

        Example:
            ```python
            rows = problem.evaluate_runs(torch.stack([w_seed0, w_seed1]))    # [row of seed 0, row of seed 1]
            ```
        """
        return [self.evaluate(w, None if personals is None else personals[k]) for k, w in enumerate(ws)]

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        """The values of `metrics` at the global model. No default: every problem defines it.

        Args:
            w: one run's global model `[d]` (`Algorithm.global_params`).

        Returns:
            A float per declared metric, by name.

        Example:
            ```python
            def evaluate_global(self, w):
                mse = (self.features @ w - self.labels).square().mean()
                return {"train_mse": float(mse), "distance": float(torch.linalg.vector_norm(w - self.center))}
            ```
        """
        raise NotImplementedError

    def parameters(self, w: Tensor) -> dict[str, Tensor]:
        """A model `[d]` in the problem's own shapes, by name (views of `w`; a saved model's `parameters`,
        `fedbench.saved`): the layers of its MLP (`layer1.weight` `[in, out]`, `layer1.bias` `[out]`, ...) where it
        has one, else the vector itself as `w`.

        Example:
            A problem whose model is one matrix, without an intercept:

            ```python
            def parameters(self, w):
                return {"W": w.view(*self.shape)}
            ```
        """
        model = getattr(self, "model", None)
        if not isinstance(model, MLP):
            return {"w": w}
        named = {}
        for depth, (weight, bias) in enumerate(model.layers(w), 1):
            named[f"layer{depth}.weight"] = weight
            if bias is not None:
                named[f"layer{depth}.bias"] = bias
        return named

    def evaluate_personal(self, models: Tensor) -> dict[str, float]:
        """The values of `personal_metrics`: each client's model on its own data, averaged as the problem's
        metrics are. Default: refused (NotImplementedError), for problems without `personal_evaluation`.

        Args:
            models: one run's per-client models `[N, d]` (`Algorithm.personal_params`).

        Returns:
            A float per personal metric, by name (without the `personal_` prefix).

        Example:
            Each client's model on its own rows, the squared errors pooled over all samples:

            ```python
            def evaluate_personal(self, models):
                x = self.features.view(self.num_clients, -1, self.dim)          # [N, n, d]
                residual = torch.einsum("knd,kd->kn", x, models).reshape(-1) - self.labels
                return {"train_mse": float(residual.square().mean())}
            ```
        """
        raise NotImplementedError(f"{self.name} does not evaluate personal models")

    def _set_clients(self, sizes: Tensor) -> None:
        """The clients' layout from their training samples `sizes` `[N]` (rows of a client contiguous in the flat
        data, in client order): `num_clients`, `client_sizes`, `client_offsets` (and their CPU copies), `max_size`."""
        self.client_sizes_cpu = sizes.cpu()
        self.client_offsets_cpu = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).cpu()
        self.num_clients = len(sizes)
        self.max_size = int(sizes.max())
        self.equal_sizes = bool((sizes == self.max_size).all())
        self.client_sizes = sizes.to(self.device)
        self.client_offsets = self.client_offsets_cpu.to(self.device)
