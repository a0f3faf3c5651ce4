"""A program's uplink and downlink: the federation's chains of transforms (`fedbench.axes.transforms`, where their
maths, encodings and papers are), its adversaries' attacks and its robust aggregation rule (`fedbench.axes.robust`)
applied to R runs' rounds at once, with their state, draws and bits, outside the algorithm, which sees none of them.

A round of the runs `ids` goes through three steps of the program (`fedbench.engine.runs`):

    received = links.receive(server, ids)         # the downloads as the clients receive them (the downlink)
    ...client_init(received, ...), local steps, client_final -> message
    message = links.send(message, server, received, slots)   # each client's uploads attacked, through the uplink,
                                                  # robustly aggregated, as updates on the server's own entries
                                                  # (EF21-P): as the server receives them
    ...server_update, the per-client rows written back
    links.commit()                                # the round's new link state written

State, kept here rather than among the algorithm's entries: each client's error-feedback vector `[R, N, d]` per upload
(zeros, made at the first round that needs it: an upload's size is known only then) and the server's copy ŵ
`[R, 1, ...]` of its last broadcast per download (the initial state at the start). A round writes its new state only
at `commit`, after everything that may raise, and keeps its draws until then: a round the program replays run by
run after a failed SVD (`fedbench.engine.runs`) finds the state as it was and draws nothing anew, so that every run gets
exactly what it gets alone. The state is in the program's checkpoint (`state_dict`) where there are chains. Which
clients are adversarial is each run's own (`RunRecord.adversarial`), drawn at its start. Where the server does not
hear every slot of a round (`fedbench.axes.slots.Slots.heard`: an absent participant's), the error-feedback vectors of
the slots it does not hear stay as they were; what they send, the engine discards.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm, MessageError, Upload
from fedbench.axes.robust import RULES, aggregate_robustly, attack
from fedbench.axes.transforms import LINKS, Transform, compiled, message_bits

if TYPE_CHECKING:
    from fedbench.axes.slots import Slots
    from fedbench.engine.record import RunRecord

State = dict[str, Tensor]


def value_bits(value: Tensor) -> int:
    return value.element_size() * 8


class Links:
    """The uplink and downlink of the runs `sims` of one program (one federation, one algorithm), from the program's
    server state `server` `[R, 1, ...]` at its start."""

    def __init__(self, sims: list[RunRecord], server: State):
        first, federation = sims[0], sims[0].federation
        algorithm: Algorithm = first.algorithm
        self.name, self.all_uploads = algorithm.name, algorithm.uploads
        self.uplink = compiled(federation.uplink)
        self.downlink = compiled(federation.downlink)
        self.adversaries = federation.adversaries
        self.rule = federation.aggregation if federation.aggregation in RULES else None
        self.trim, self.byzantine = federation.trim, federation.byzantine
        self.uploads = algorithm.uploads if self.uplink or self.adversaries or self.rule else ()
        self.downloads = algorithm.downloads if self.downlink else ()
        # uploads that are new values of a compressed download: the server adds each client's update from its copy ŵ
        # to its own entry w (EF21-P), not to ŵ
        self.rebased = tuple(upload for upload in algorithm.uploads if upload.relative_to in self.downloads)
        self.chains = bool(self.uplink or self.downlink)  # link state to keep
        self.active = bool(self.chains or self.uploads)
        self.acting = ", ".join(f"federation.{field}" for field, given in (
            ("adversaries", self.adversaries), ("uplink", self.uplink), ("aggregation", self.rule),
            ("downlink", self.rebased)) if given)
        self.streams = {link: [sim.link_streams.get(link) for sim in sims] for link in LINKS}
        self.runs, self.num_clients, self.device = len(sims), first.problem.num_clients, first.problem.device
        if self.adversaries:
            self.streams["adversaries"] = [sim.adversary_gen for sim in sims]
            self.adversarial = torch.stack([sim.adversarial for sim in sims]).to(self.device)  # [R, N]
        self.kept: State = {}  # upload -> each client's error-feedback vector [R, N, d]
        self.copies: State = {name: server[name].clone() for name in self.downloads}  # download -> ŵ [R, 1, ...]
        # download -> bits of the messages broadcast so far `[R]`, and that count when each client last received
        # `[R, N]` (int64, on the host; `catch_up`)
        self.sent: State = {}
        self.synced: State = {}
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

    def send(self, message: State, server: State, received: State, slots: Slots) -> State:
        """The message of the round's clients in `slots` `[R, S]` (of the runs `receive` or `received` began it for) as
        the server receives it, from the server's entries `server` (those runs' rows, before its update). Each declared
        upload that is a new value of a server entry (`relative_to`) is the client's update x = upload −
        received[relative_to] from what it started from, which the server adds to its own entry: server[relative_to]
        + y, y the update as it arrives. With a compressed download this is EF21-P's step w + x (Gruntkowska, Tyurin,
        Richtárik 2023, Algorithm 1): the server's w is never replaced by the clients' copy ŵ, and the compression
        error w − ŵ stays for the next broadcast. y: the adversarial clients' attacked, then every client's through
        the uplink; then the robust rule's aggregate of the S clients' values in place of each (`fedbench.axes.robust`).
        Only the heard slots' error-feedback vectors change (`Slots.where_heard`)."""
        if not (self.uploads or self.rebased):
            return message
        sent = dict(message)
        for upload in self.all_uploads:
            acted = upload in self.uploads
            if not (acted or upload in self.rebased):
                continue
            value, entry = message[upload.name], upload.relative_to
            base, own = (received[entry], server[entry]) if entry else (None, None)
            self._check(upload, value, base, slots.width, acted)
            if self.adversaries or self.uplink:
                value = self._transmitted(upload.name, value, base, own, slots)
            elif entry and base is not own:  # through the downlink: ŵ is not w
                value = server[entry] + (value - received[entry])
            if self.rule:
                value = aggregate_robustly(value, self.rule, self.trim, self.byzantine).expand_as(value)
            sent[upload.name] = value
        return sent

    def _transmitted(self, upload: str, value: Tensor, base: Tensor | None, own: Tensor | None, slots: Slots) -> Tensor:
        """An upload `[R, S, ...]` as it arrives: its update x `[R, S, d]` from `base` (what the client started from)
        attacked where the client is adversarial, then through the uplink (the new error-feedback vectors of the
        heard slots pending until `commit`), added to the server's `own` entry."""
        clients = slots.clients
        x = (value if base is None else value - base).reshape(len(self.ids), slots.width, -1)
        if self.adversaries:
            x = self._attacked(upload, x, clients)
        kept = self._kept(upload, x, clients)
        y, new = self._through(self.uplink, x, kept, f"uplink.{upload}", self.streams["uplink"])
        if new is not None:
            new = slots.where_heard(new, kept)  # type: ignore[arg-type]  # kept: new is from it
            self.pending.append((self.kept, upload, (self.index[:, None], clients), new))
        return y.view(value.shape) if own is None else own + y.view(value.shape)

    def _attacked(self, upload: str, x: Tensor, clients: Tensor) -> Tensor:
        """The updates x `[R, S, d]` with the adversarial clients' attacked (the gaussian attack's draws on each run's
        adversaries stream, one `[S, d]` a round and upload)."""
        adversaries = self.adversaries
        assert adversaries is not None  # `send` calls it only then
        noise = None
        if adversaries.attack == "gaussian":
            noise = self._draws(f"adversaries.{upload}", self.streams["adversaries"],
                                lambda gen: torch.randn(x.shape[1:], dtype=x.dtype, generator=gen), x.device)
        return attack(x, self.adversarial[self.index[:, None], clients], adversaries.attack, adversaries.scale, noise)

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
            drawn = None
            if transform.random:
                drawn = self._draws(f"{what}.{j}", streams, lambda gen: transform.draw(gen, x.shape[1], x.shape[2],
                                                                                       x.dtype), x.device)
            x, changed = transform.apply(x, kept, drawn)
            new = changed if changed is not None else new
        return x, new

    def _draws(self, what: str, streams: list, sample: Callable[[torch.Generator], Tensor], device) -> Tensor:
        """This round's draws `sample(gen)` of `what` for its runs, each on its own stream (`streams`, by run) in the
        order it draws alone, stacked `[R, ...]` on `device`; kept until `commit` (a replayed round draws nothing
        anew)."""
        drawn = []
        for i in self.ids:
            mine = self.drawn.setdefault(i, {})
            if what not in mine:
                mine[what] = sample(streams[i])
            drawn.append(mine[what])
        return (drawn[0].unsqueeze(0) if len(drawn) == 1 else torch.stack(drawn)).to(device)

    def _kept(self, upload: str, x: Tensor, clients: Tensor) -> Tensor | None:
        """The error-feedback vectors `[R, S, d]` of the round's clients `clients` for `upload` (zeros at first)."""
        if not any(transform.keeps for transform in self.uplink):
            return None
        if upload not in self.kept:
            self.kept[upload] = x.new_zeros(self.runs, self.num_clients, x.shape[2])
        return self.kept[upload][self.index[:, None], clients]

    def _check(self, upload: Upload, value: Tensor, base: Tensor | None, sampled: int, acted: bool) -> None:
        """Refuse (MessageError) an upload the links cannot take: not floating point, of one value a run where a
        transform, an attack or a rule acts on it (`acted`), or of another shape than its server entry."""
        where = f"{self.acting}: {self.name}'s upload {upload.name!r}"
        if not value.is_floating_point():
            raise MessageError(f"{where} holds {value.dtype}, expected floating point values to transform")
        if acted and value.shape[1] != sampled:
            raise MessageError(f"{where} has one value a run ([R, 1, ...]), not one a client: its devices all-reduce "
                               "it (declare Upload(..., all_reduced=True)), and nothing acts on it")
        if base is not None and base.shape[2:] != value.shape[2:]:
            raise MessageError(f"{where} {list(value.shape[2:])} is declared a new value of server entry "
                               f"{upload.relative_to!r} {list(base.shape[2:])}; expected the same shape (the "
                               "transforms and attacks act on their difference)")

    # -- bits ---------------------------------------------------------------------------------------------------
    def upload_bits(self, message: State) -> int:
        """Bits one client sends: each declared upload as the uplink encodes it (without one, its values at the width
        of their dtype; an all-reduced upload is each device's share, as `upload_floats` counts it)."""
        return sum(message_bits(self.uplink if upload in self.uploads else (),
                                math.prod(message[upload.name].shape[2:]), value_bits(message[upload.name]))
                   for upload in self.all_uploads)

    def download_messages(self, server: State, downloads: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
        """Each of the server's `downloads` (entries `[R, 1, ...]`) at a round's start: (its name, the bits of its
        message as the downlink encodes it, the bits of its values whole at their width). Without a downlink, or of a
        shape not its copy's, the message is the values whole."""
        messages = []
        for name in downloads:
            value = server[name]
            numel, width = math.prod(value.shape[1:]), value_bits(value)
            through = name in self.copies and self.copies[name].shape == value.shape
            messages.append((name, message_bits(self.downlink, numel, width) if through else numel * width,
                             numel * width))
        return tuple(messages)

    def catch_up(self, ids: list[int], slots: Slots, messages: tuple[tuple[str, int, int], ...]) -> list[int]:
        """Bits each run of `ids` sends the participants of its round that has just ended (those of the slots
        `slots.present`, None: all; `slots.participants`, their number in each run) of the downloads `messages`
        (`download_messages`, at the round's start).

        A download through the downlink is one message a run and round to the clients' one shared copy ŵ, which every
        client must hold to start a round from it: a participant receives every message since the last round it took
        part in (at its first, every one since the start: ŵ⁰, the initial state, it knows from the run's seed), or ŵ
        whole where that costs fewer bits. A client receives nothing while it takes no part (it may be unreachable),
        so that a round where every client takes part costs each its one message, and under partial participation a
        client's catching up is counted when it returns. Any other download: its values whole, to each participant.
        Without a downlink nothing is read from the device (the clients are there: a sync on a GPU)."""
        whole_bits = sum(whole for name, _, whole in messages if name not in self.copies)
        if not self.copies:
            return [count * whole_bits for count in slots.participants]
        bits = torch.tensor(slots.participants, dtype=torch.int64) * whole_bits
        index, clients = torch.tensor(ids), slots.clients.cpu()
        taking = torch.ones(clients.shape, dtype=torch.bool) if slots.present is None else slots.present.cpu()
        for name, message, whole in messages:
            if name not in self.copies:
                continue
            if name not in self.sent:
                self.sent[name] = torch.zeros(self.runs, dtype=torch.int64)
                self.synced[name] = torch.zeros(self.runs, self.num_clients, dtype=torch.int64)
            sent, synced = self.sent[name], self.synced[name]
            sent[index] += message
            now = sent[index, None].expand(clients.shape)
            behind = now - synced[index[:, None], clients]  # bits of the messages each participant missed and this one
            bits += torch.where(taking, behind.clamp(max=whole), 0).sum(-1)
            synced[index[:, None], clients] = torch.where(taking, now, synced[index[:, None], clients])
        return bits.tolist()

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The link state, under `links` (nothing without chains, so that such a program's checkpoint is as it was);
        taken between rounds, where nothing is pending."""
        return {"links": {"kept": self.kept, "copies": self.copies, "sent": self.sent, "synced": self.synced}
                } if self.chains else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The link state of a program's checkpoint (`state`), and the adversarial clients of its runs' records."""
        if self.chains:
            links = state["links"]
            self.kept, self.copies = dict(links["kept"]), dict(links["copies"])
            # a checkpoint from before `catch_up` counts from here on as if every copy were in sync
            self.sent, self.synced = dict(links.get("sent", {})), dict(links.get("synced", {}))
        if self.adversaries:
            self.adversarial = torch.stack([run["adversarial"] for run in state["runs"]]).to(self.device)
