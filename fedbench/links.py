"""A program's uplink and downlink: the federation's chains of transforms (`fedbench.transforms`, where their maths,
encodings and papers are) applied to R runs' rounds at once, with their state, draws and bits, outside the
algorithm, which sees neither.

A round of the runs `ids` goes through three steps of the program (`fedbench.runs`):

    received = links.receive(server, ids)         # the downloads as the clients receive them (the downlink)
    ...client_init(received, ...), local steps, client_final -> message
    message = links.send(message, received, clients)   # each client's uploads through the uplink
    ...server_update, the per-client rows written back
    links.commit()                                # the round's new link state written

State, kept here rather than among the algorithm's entries: each client's error-feedback vector `[R, N, d]` per upload
(zeros, made at the first round that needs it: an upload's size is known only then) and the server's copy ŵ
`[R, 1, ...]` of its last broadcast per download (the initial state at the start). A round writes its new state only
at `commit`, after everything that may raise, and keeps its draws until then: a round the program replays run by
run after a failed SVD (`fedbench.runs`) finds the state as it was and draws nothing anew, so that every run gets
exactly what it gets alone. The state is in the program's checkpoint (`state_dict`) where there are chains.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm, MessageError, Upload
from fedbench.federation import Federation
from fedbench.hparams import ParamError
from fedbench.transforms import Transform, compiled, message_bits

if TYPE_CHECKING:
    from fedbench.simulate import Simulation

State = dict[str, Tensor]


def check_uploads(federation: Federation, uploads: Sequence[Upload], algorithm: str) -> None:
    """Refuse (ParamError of the federation's `uplink`) an uplink chain on an algorithm whose uploads include one its
    devices all-reduce inside the round (`Upload.all_reduced`): the engine sees their sum, not a message per client."""
    reduced = [upload.name for upload in uploads if upload.all_reduced]
    if federation.uplink and reduced:
        raise ParamError("uplink", f"found a chain for {algorithm}, which all-reduces its upload {reduced[0]!r} (no "
                         "message per client); expected none", "federation")


def value_bits(value: Tensor) -> int:
    return value.element_size() * 8


class Links:
    """The uplink and downlink of the runs `sims` of one program (one federation, one algorithm), from the program's
    server state `server` `[R, 1, ...]` at its start."""

    def __init__(self, sims: list[Simulation], server: State):
        first = sims[0]
        algorithm: Algorithm = first.algorithm
        self.name, self.all_uploads = algorithm.name, algorithm.uploads
        self.uplink = compiled(first.federation.uplink)
        self.downlink = compiled(first.federation.downlink)
        self.uploads = algorithm.uploads if self.uplink else ()
        self.downloads = algorithm.downloads if self.downlink else ()
        self.active = bool(self.uplink or self.downlink)
        self.streams = {link: [sim.link_streams.get(link) for sim in sims] for link in ("uplink", "downlink")}
        self.runs, self.num_clients, self.device = len(sims), first.problem.num_clients, first.problem.device
        self.kept: State = {}  # upload -> each client's error-feedback vector [R, N, d]
        self.copies: State = {name: server[name].clone() for name in self.downloads}  # download -> ŵ [R, 1, ...]
        self.drawn: dict[int, dict[str, Tensor]] = {}  # run -> this round's draws, by what drew them
        self.pending: list[tuple[State, str, tuple[Tensor, ...], Tensor]] = []  # (state, entry, index, rows): `commit`
        self.ids: list[int] = []  # the runs of the round in progress
        self.index = torch.zeros(0, dtype=torch.long)  # the same on the device

    # -- a round ----------------------------------------------------------------------------------------------------
    def receive(self, server: State, ids: list[int]) -> State:
        """What the clients of the runs `ids` start their round from: the server's entries `server` (those runs'
        rows), each download as the downlink delivers it: ŵ + C(w − ŵ), the new copy (written at `commit`). A download
        whose shape is not its copy's (FeDXL's score pools while they fill) goes whole (`download_bits`)."""
        self._begin(ids)
        if not self.downloads:
            return server
        received = dict(server)
        for name in self.downloads:
            copy, value = self.copies[name].index_select(0, self.index), server[name]
            if copy.shape == value.shape:
                step, _ = self._through(self.downlink, (value - copy).reshape(len(ids), 1, -1), None,
                                        f"downlink.{name}", self.streams["downlink"])
                received[name] = copy + step.view(value.shape)
            self.pending.append((self.copies, name, (self.index,), received[name]))
        return received

    def received(self, server: State, ids: list[int]) -> State:
        """What the clients of the runs `ids` started the round that is ending from (the copies as `receive` left
        them): an iteration-wise program's runs end their rounds at other iterations than they opened them."""
        self._begin(ids)
        if not self.downloads:
            return server
        return {**server, **{name: self.copies[name].index_select(0, self.index) for name in self.downloads}}

    def send(self, message: State, received: State, clients: Tensor) -> State:
        """The message of the round's clients `clients` `[R, S]` (of the runs `receive` or `received` began it for) as
        the server receives it: each declared upload through the uplink, on the update `upload − received[relative_to]`
        where it declares one (added back after)."""
        if not self.uploads:
            return message
        count, sampled = len(self.ids), clients.shape[1]
        sent = dict(message)
        for upload in self.uploads:
            value = message[upload.name]
            base = received[upload.relative_to] if upload.relative_to else None
            self._check(upload, value, base, sampled)
            x = (value if base is None else value - base).reshape(count, sampled, -1)
            kept = self._kept(upload.name, x, clients)
            y, new = self._through(self.uplink, x, kept, f"uplink.{upload.name}", self.streams["uplink"])
            if new is not None:
                self.pending.append((self.kept, upload.name, (self.index[:, None], clients), new))
            sent[upload.name] = y.view(value.shape) if base is None else base + y.view(value.shape)
        return sent

    def commit(self) -> None:
        """The round of the runs `ids` has succeeded: its new link state is written (an entry whose rows changed shape
        made anew, the other runs' rows zeros until their own round writes them), its draws dropped."""
        for state, name, index, rows in self.pending:
            held = state[name]
            if held.shape[len(index):] != rows.shape[len(index):]:
                held = state[name] = rows.new_zeros(*held.shape[:len(index)], *rows.shape[len(index):])
            held.index_put_(index, rows)
        self.pending.clear()
        if self.drawn:
            for i in self.ids:
                self.drawn.pop(i, None)

    def _begin(self, ids: list[int]) -> None:
        self.pending.clear()  # what a failed computation of these runs left
        if self.active:
            self.ids, self.index = ids, torch.tensor(ids, device=self.device)

    def _through(self, transforms: list[Transform], x: Tensor, kept: Tensor | None, what: str,
                 streams: list) -> tuple[Tensor, Tensor | None]:
        """The round's messages x `[R, S, d]` through a compiled chain, with the clients' kept vectors: (y, the new
        ones)."""
        new = None
        for j, transform in enumerate(transforms):
            drawn = self._draws(transform, x, f"{what}.{j}", streams) if transform.random else None
            x, changed = transform.apply(x, kept, drawn)
            new = changed if changed is not None else new
        return x, new

    def _draws(self, transform: Transform, x: Tensor, what: str, streams: list) -> Tensor:
        """This round's draws of `transform` for its runs, each on its own stream in the order it draws alone,
        stacked `[R, ...]` on the device; kept until `commit` (a replayed round draws nothing anew)."""
        drawn = []
        for i in self.ids:
            mine = self.drawn.setdefault(i, {})
            if what not in mine:
                mine[what] = transform.draw(streams[i], x.shape[1], x.shape[2], x.dtype)
            drawn.append(mine[what])
        return (drawn[0].unsqueeze(0) if len(drawn) == 1 else torch.stack(drawn)).to(x.device)

    def _kept(self, upload: str, x: Tensor, clients: Tensor) -> Tensor | None:
        """The error-feedback vectors `[R, S, d]` of the round's clients `clients` for `upload` (zeros at first)."""
        if not any(transform.keeps for transform in self.uplink):
            return None
        if upload not in self.kept:
            self.kept[upload] = x.new_zeros(self.runs, self.num_clients, x.shape[2])
        return self.kept[upload][self.index[:, None], clients]

    def _check(self, upload: Upload, value: Tensor, base: Tensor | None, sampled: int) -> None:
        where = f"federation.uplink: {self.name}'s upload {upload.name!r}"
        if not value.is_floating_point():
            raise MessageError(f"{where} holds {value.dtype}, expected floating point values to transform")
        if value.shape[1] != sampled:
            raise MessageError(f"{where} has one value a run ([R, 1, ...]), not one a client: its devices all-reduce "
                               "it (declare Upload(..., all_reduced=True)), and no transform acts on it")
        if base is not None and base.shape[2:] != value.shape[2:]:
            raise MessageError(f"{where} {list(value.shape[2:])} is declared a new value of server entry "
                               f"{upload.relative_to!r} {list(base.shape[2:])}; expected the same shape (the "
                               "transforms act on their difference)")

    # -- bits ---------------------------------------------------------------------------------------------------
    def upload_bits(self, message: State) -> int:
        """Bits one client sends: each declared upload as the uplink encodes it (without one, its values at the width
        of their dtype; an all-reduced upload is each device's share, as `upload_floats` counts it)."""
        return sum(message_bits(self.uplink if upload in self.uploads else (),
                                math.prod(message[upload.name].shape[2:]), value_bits(message[upload.name]))
                   for upload in self.all_uploads)

    def download_bits(self, server: State, downloads: Sequence[str]) -> int:
        """Bits one participant receives of the server's `downloads` (entries `[R, 1, ...]`) at a round's start: as the
        downlink encodes each, else (no downlink, or a shape not its copy's) its values at their width."""
        return sum(message_bits(self.downlink if name in self.copies and self.copies[name].shape == server[name].shape
                                else (), server[name][0].numel(), value_bits(server[name])) for name in downloads)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The link state, under `links` (nothing without chains, so that such a program's checkpoint is as it was);
        taken between rounds, where nothing is pending."""
        return {"links": {"kept": self.kept, "copies": self.copies}} if self.active else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.active:
            self.kept, self.copies = dict(state["links"]["kept"]), dict(state["links"]["copies"])
