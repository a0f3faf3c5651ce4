"""Claims: which sweep computes which run when several sweeps of one recipe share a store.

A sweep claims each run, a (config hash, seed), before it computes it, and only writes into runs it claimed.
The claim is a param of the sweep's parent run, `claim/<config hash>/<seed>/<generation>` = the owner's id: MLflow
refuses to change a param once logged, in the store's own transaction (a primary key on SQLite and PostgreSQL,
whether reached directly or through a tracking server), so of two sweeps logging one claim exactly one succeeds.
An owner is one sweep process; it says it is alive with a heartbeat, the parent's tag `owner/<id>` (host, pid, the
time of its last beat), every `HEARTBEAT_SECONDS`. Another sweep takes over a claim only when its owner is gone:
released (the sweep ended), dead (a process of this host that no longer exists: a killed sweep is taken over at
once) or silent for `LEASE_SECONDS` (a host that went away), by logging the claim of the next generation, which
again only one succeeds in.

The parent run is closed by the last of its sweeps to end: a sweep that ends while another is going (every run it
found claimed by the other, or its own share done first) leaves it RUNNING, for the other's runs are, and that one
closes it (`sweep.close_parent`). Each releases its claims before it looks, so that of two ending at once the later
sees the other gone.

Both sweeps must use one parent run for this: `Store.open_sweep` makes a new parent, waits `SETTLE_SECONDS` for
other sweeps' to be written, and keeps the earliest. Should two parents still come to hold claims (two hosts
whose clocks disagree), a claim counts only where no live owner claims the run on another parent: both then
skip the run (run the command again) rather than compute it twice.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from mlflow.entities import Param
from mlflow.exceptions import MlflowException

from .database import StoreError, first_line

CLAIM = "claim"
OWNER = "owner"
HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = float(os.environ.get("FEDBENCH_LEASE_SECONDS", "60"))  # a silent owner's claims expire after this
PARAMS_PER_WRITE = 100  # MLflow's limit of params per log_batch call
WRITE_TRIES = 20

Run = tuple[str, int]  # (config hash, seed)


@dataclass(frozen=True)
class OwnerState:
    """What an owner's heartbeat tag says."""
    host: str
    pid: int
    beat: float  # epoch seconds of its last heartbeat
    released: bool = False

    def alive(self, now: float) -> bool:
        if self.released:
            return False
        if self.host == platform.node() and not process_exists(self.pid):
            return False  # killed: its claims are free at once
        return now - self.beat < LEASE_SECONDS

    def shown(self) -> str:
        return f"pid {self.pid} on {self.host}"


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass
class Ledger:
    """The claims and owners of the sweep parents of one recipe, as read from the store."""
    claims: dict[str, dict[Run, tuple[int, str]]] = field(default_factory=dict)  # parent -> run -> (gen, owner)
    owners: dict[str, OwnerState] = field(default_factory=dict)

    @classmethod
    def of(cls, parents: Iterable[Any]) -> Ledger:
        ledger = cls()
        for parent in parents:
            latest = ledger.claims.setdefault(parent.info.run_id, {})
            for key, owner in parent.data.params.items():
                kind, _, rest = key.partition("/")
                if kind != CLAIM:
                    continue
                config_hash, seed, generation = rest.split("/")
                run = (config_hash, int(seed))
                if int(generation) >= latest.get(run, (-1, ""))[0]:
                    latest[run] = (int(generation), owner)
            for key, value in parent.data.tags.items():
                if key.startswith(f"{OWNER}/"):
                    ledger.owners[key.partition("/")[2]] = OwnerState(**json.loads(value))
        return ledger

    def live_owner(self, owner: str, now: float) -> OwnerState | None:
        state = self.owners.get(owner)
        return state if state is not None and state.alive(now) else None


class Lease:
    """This sweep process as an owner of claims on its parent run: claims runs, beats its heart from a thread of
    its own while it lives, and releases what it holds when it ends (`release`)."""

    def __init__(self, store, experiment_id: str, parent_id: str, recipe_hash: str):
        self.store, self.experiment_id, self.parent_id, self.recipe_hash = store, experiment_id, parent_id, recipe_hash
        self.id = uuid.uuid4().hex[:12]
        self._stop = threading.Event()
        self._beat(released=False)  # alive before the first claim, so that no one takes over what it claims
        self._thread = threading.Thread(target=self._beating, name="fedbench-lease", daemon=True)
        self._thread.start()

    def _beat(self, released: bool) -> None:
        state = {"host": platform.node(), "pid": os.getpid(), "beat": time.time(), "released": released}
        self.store.client.set_tag(self.parent_id, f"{OWNER}/{self.id}", json.dumps(state))

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._beat(released=False)
            except Exception:  # a busy store: the next beat tries again, well within the lease
                continue

    def ledger(self) -> Ledger:
        return Ledger.of(self.store.sweep_parents(self.experiment_id, self.recipe_hash))

    def claim(self, runs: list[Run]) -> tuple[list[Run], dict[Run, str]]:
        """Claim `runs`: (those this sweep holds now, in the given order; those a live sweep holds, each with that
        owner's description). Claims are written `PARAMS_PER_WRITE` to a transaction; where another sweep wrote
        one of them first the transaction is refused whole, and the store is read again."""
        refused = 0
        while True:
            mine, elsewhere, wanted = self._sort(runs, self.ledger())
            if not wanted:
                return mine, elsewhere
            for start in range(0, len(wanted), PARAMS_PER_WRITE):
                try:
                    self.store.client.log_batch(self.parent_id, params=wanted[start:start + PARAMS_PER_WRITE])
                except MlflowException as error:  # another sweep claimed one of these first, or the store was busy
                    refused += 1
                    if refused == WRITE_TRIES:
                        raise StoreError(f"{self.store.uri}: the sweep's runs could not be claimed in {WRITE_TRIES} "
                                         f"tries ({first_line(error)})") from None
                    time.sleep(0.05)
                    break

    def _sort(self, runs: list[Run], ledger: Ledger) -> tuple[list[Run], dict[Run, str], list[Param]]:
        """Each run: held by this sweep, held by a live other sweep, or to claim (the claim to write)."""
        now = time.time()
        here = ledger.claims.get(self.parent_id, {})
        mine, elsewhere, wanted = [], {}, []
        for run in runs:
            generation, owner = here.get(run, (-1, ""))
            holders = [owner] + [claims[run][1] for parent, claims in ledger.claims.items()
                                 if parent != self.parent_id and run in claims]
            live = [state for holder in holders if holder != self.id and (state := ledger.live_owner(holder, now))]
            if live:
                elsewhere[run] = live[0].shown()
            elif owner == self.id:
                mine.append(run)
            else:
                wanted.append(Param(f"{CLAIM}/{run[0]}/{run[1]}/{generation + 1}", self.id))
        return mine, elsewhere, wanted

    def others_alive(self) -> list[str]:
        """The other live owners of this sweep's parent run (sweeps of the recipe still going), as described."""
        now = time.time()
        tags = self.store.client.get_run(self.parent_id).data.tags
        states = [OwnerState(**json.loads(value)) for key, value in tags.items()
                  if key.startswith(f"{OWNER}/") and key != f"{OWNER}/{self.id}"]
        return [state.shown() for state in states if state.alive(now)]

    def release(self) -> None:
        """This sweep ends: its claims are free for the next sweep at once (those of finished runs are moot). Once
        released, again: nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        # a store that fails now: the claims expire with the lease, or at once on this host
        with contextlib.suppress(Exception):
            self._beat(released=True)
