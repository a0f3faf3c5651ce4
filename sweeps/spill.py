"""Results a store refused (full, damaged, gone), kept in files beside it (`spill`) until the next command that opens
it for writing stores them (`Store.store_spilled`)."""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from .database import MIN_FREE_BYTES, StoreError, free_bytes, store_folder
from .recipe import Trial
from .recipe.loading import in_bytes

SPILLED = "unstored"  # the folder beside a store of results it failed to take (`spill`)


def spill_folders(uri: str) -> list[Path]:
    """Where a store's refused results are kept: beside it, else (that folder full or not writable) in the system's
    temporary folder, under a name of the store's."""
    return [store_folder(uri) / SPILLED,
            Path(tempfile.gettempdir()) / f"fedbench-{SPILLED}" / hashlib.sha256(uri.encode()).hexdigest()[:16]]


def spill(uri: str, experiment: str, headline: list[str], trial: Trial, outcome: dict[str, Any],
          tags: dict[str, str]) -> Path:
    """A run's result that the store `uri` refused (full, damaged, gone), kept in a file for `Store.store_spilled`,
    which the next command that opens the store for writing calls: the path. Kept where its disk has room for it and
    `MIN_FREE_BYTES` more: a store's disk that was full is, and filling it up helps no one; nowhere, refused in one
    line (StoreError) saying where to free space."""
    kept = pickle.dumps({"experiment": experiment, "headline": headline, "trial": trial, "outcome": outcome,
                         "tags": tags})
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{trial.config_hash}-{trial.seed}-{os.getpid()}.pickle"
    folders = spill_folders(uri)
    for folder in folders:
        try:
            if free_bytes(folder) < len(kept) + MIN_FREE_BYTES:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as file:  # whole or not at all
                file.write(kept)
            os.replace(file.name, folder / name)
            return folder / name
        except OSError:
            continue
    raise StoreError(f"{store_folder(uri)}: the run could not be kept either: no room for its {in_bytes(len(kept))} "
                     f"and {in_bytes(MIN_FREE_BYTES)} more in {folders[0]} nor {folders[1]}; free space on either "
                     "disk and run again")
