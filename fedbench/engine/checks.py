"""Every rule a run is checked by when it is built, listed once: the problem's own (`Problem.check`, and
`Problem.declared_layout` where the data's index is read), the algorithm's own (`Algorithm.check`), the contract
between them (`fedbench.contract`), and the federation's against both (`check_federation`: the algorithm's uploads,
each axis of the registry `fedbench.axes.registry.AXES` by its own `check`, `Federation.check` against the problem's
clients and the algorithm's minibatches; a recipe's top-level axes, `privacy:`, by the recipe's validator). A recipe's
validator calls `check_run` on a trial's declared configuration before anything runs; a run's record calls
`check_federation` on its built problem and algorithm (whose own rules their constructors apply), so that a rule added
here is applied by both.

A refusal is a `Refusal`: a `ParamError` whose `path` is the field's path relative to a recipe (`problem.X`,
`federation.X`, `algorithms.NAME.X`, or `algorithms.NAME` for the contract), which the recipe's validator reports
(placing a field of an algorithm's own `problem:` / `federation:` entry under it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from fedbench import contract
from fedbench.axes import registry
from fedbench.axes.participation import LocalSteps
from fedbench.engine.dry_round import takes_uneven_steps
from fedbench.engine.federation import Federation, check_uploads, minibatch_sizes
from fedbench.hparams import ParamError
from fedbench.problems.base import Layout

if TYPE_CHECKING:
    from fedbench.algorithms.base import Algorithm
    from fedbench.problems.base import Problem

T = TypeVar("T")


class Refusal(ParamError):
    """A build-time rule's refusal of the field `name` of `section` (`problem`, `federation`, `algorithms.NAME`):
    its message as the rule writes it, its `path` relative to a recipe, and a `detail` line where the rule gives
    one (the contract's: what the capability is)."""

    def __init__(self, section: str, name: str, message: str, detail: str = ""):
        super().__init__(name, message, section)
        self.section, self.detail = section, detail

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}" if self.name else self.section


def at(section: str, rule: Callable[[], T]) -> T:
    """`rule()`, its ParamError refused at `section`."""
    try:
        return rule()
    except ParamError as err:
        raise Refusal(section, err.name, err.message) from None


def check_run(problem: type[Problem], config: dict[str, Any], algorithm: type[Algorithm], hp: Mapping[str, Any],
              federation: Federation, read_data: bool = False) -> Layout:
    """Refuse (`Refusal`) a run of `algorithm` with the hyperparameters `hp` on `problem` configured by `config`
    (resolved) with `federation`, by every rule building it applies, in this order: the problem's, the algorithm's,
    the contract, the problem's clients as the config declares them (with `read_data`, as the index of its data
    does), then the federation's (`check_federation`). Returns that declared layout."""
    at("problem", lambda: problem.check(config))
    own = f"algorithms.{algorithm.name}"
    at(own, lambda: algorithm.check(hp))
    try:
        contract.check(algorithm.name, algorithm.requirements(hp), problem.name, problem.capabilities(config))
    except contract.IncompatibleError as err:
        raise Refusal(own, "", str(err), err.detail) from None
    layout = at("problem", lambda: problem.declared_layout(config, read_data))
    check_federation(federation, algorithm, hp, layout)
    return layout


def check_federation(federation: Federation, algorithm: type[Algorithm] | Algorithm, hp: Mapping[str, Any],
                     layout: Layout) -> None:
    """Refuse (`Refusal`) a `federation` that cannot run `algorithm` (its class with `hp`, or a configured
    instance) on clients laid out as `layout`: what acts on its uploads (`check_uploads`), each axis of the registry
    `fedbench.axes.registry.AXES` set under `federation:` by its own rules (`check`: its chains, adversaries,
    participation model, uneven local work, server optimizer, client dropout, ...), then the federation's own fields and
    the algorithm's minibatch sizes against the problem's clients (`Federation.check`; a size set by a hyperparameter
    refused at the algorithm's field)."""
    cls = algorithm if isinstance(algorithm, type) else type(algorithm)

    def with_algorithm() -> None:
        check_uploads(federation, cls, hp, layout.clients)
        check_uneven_work(federation.local_steps, cls, hp)
        for axis in registry.in_federation():
            axis.check(federation, algorithm, hp, layout)

    at("federation", with_algorithm)
    _, batch_sizes = minibatch_sizes(algorithm.minibatches(hp), hp, federation.batch_size)
    try:
        federation.check(layout, batch_sizes)
    except ParamError as err:  # a federation field, or a minibatch size among the hyperparameters
        section = "federation" if err.name not in batch_sizes or err.name == "batch_size" else f"algorithms.{cls.name}"
        raise Refusal(section, err.name, err.message) from None


def check_uneven_work(local_steps: int | LocalSteps, algorithm: type[Algorithm], hp: Mapping[str, Any]) -> None:
    """Refuse (ParamError at `federation.local_steps`) uneven local work where the algorithm with the hyperparameters
    `hp` does not take it: where its dry round reads the round's length, last step or iterations
    (`fedbench.engine.dry_round.takes_uneven_steps`)."""
    if isinstance(local_steps, LocalSteps) and not takes_uneven_steps(algorithm, hp):
        raise ParamError("local_steps", f"found {local_steps} for {algorithm.name}, whose rounds take one number of "
                         "local steps for all its clients; expected one integer E", "federation")
