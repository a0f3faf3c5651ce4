"""What crosses the network in a round, as an algorithm declares it: `Upload` (an entry each client sends, and the
server entry it is a new value or an update of) and `Routing` (the downloads, uploads and kept per-client entries of
one configuration, `Algorithm.routing`), which validation and the run both read.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Upload:
    """An entry of the local state that each client sends at a round's end (`name`), and the server entry it is a
    new value of (`relative_to`, e.g. FedMiD's local model as a new `w`; None where the upload is itself an update or
    has no server counterpart, e.g. SCAFFOLD's Δy). A client sends the entry's floats beyond the run and client
    axes (`upload_floats`), which the rows' `comm_up` counts. `all_reduced`: the devices combine it by an all-reduce
    inside the round, so that the entry is `[R, 1, ...]`, the one value every device then holds, not a message per
    client (the uplink's transforms, `fedbench.axes.transforms`, cannot act on it). `update_of`: the server entry an
    upload that is an update already (a difference) moves, where the server adds it through a mean (SCAFFOLD's Δy of
    `w`), so that the federation's server optimizer (`fedbench.axes.server_optimizers`) may act on it as on a new value
    of `w`.

    Example:
        SCAFFOLD uploads two updates, Δy of the model and Δc (Karimireddy et al., ICML 2020, Algorithm 1 line 13):

        ```python
        uploads = (Upload("dy", update_of="w"), Upload("dc"))
        ```
    """

    name: str
    relative_to: str | None = None
    all_reduced: bool = False
    update_of: str | None = None


MODEL = Upload("w", relative_to="w")
"""A client's local model, a new value of the server's `w`: the default `uploads`."""


@dataclass(frozen=True)
class Routing:
    """What crosses the network with one configuration's hyperparameters (`Algorithm.routing`): the server entries
    every sampled client receives (`downloads`), the entries each client sends (`uploads`) and the per-client entries
    a client takes into its round and keeps at its end (`keeps`). Validation reads it from the class and the
    hyperparameters, the run from the instance it builds with them: one declaration, so both see the same."""

    downloads: tuple[str, ...]
    uploads: tuple[Upload, ...]
    keeps: tuple[str, ...]
