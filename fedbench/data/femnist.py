"""Federated EMNIST by writer (FEMNIST): loaders of three local formats, and the paper's client filter.

Formats, each read into one `WriterImages`:
* the shipped npz files `femnist_sample10.npz` / `femnist_full.npz` (see the data folder's SOURCE.md):
  uint8 pixels = 255 × intensity, writers contiguous, a per-sample `is_test` flag;
* TFF HDF5 `fed_emnist_digitsonly_{train,test}.h5` or `fed_emnist_{train,test}.h5`, groups
  `examples/<client_id>/{pixels, label}`; only the first `writers_fraction` of the sorted client ids
  are read, as Yuan et al.'s `subset_ratio`;
* LEAF JSON folders `<root>/{train,test}/*.json` with `users`, `num_samples`, `user_data`.

`select_clients` then applies `process_femnist.py` of Bao et al.'s released code (the filter behind the 367 / 379
clients of their §4, ICML 2022). Intensities are kept as stored (background ≈ 1, not inverted, as that code
keeps LEAF's pixels); float pixels that are exact grey levels k/255 (LEAF, TFF) are stored as uint8 k, a
quarter of the memory. Any missing or malformed input raises a ValueError that names the path and what was
expected. `load_index` reads the labels, writers and split alone (no images),
what checking a problem's partition before building it needs.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedbench.hparams import Param

PIXELS = 784  # 28 × 28, row-major
LABELS = 62  # 0–9 digits, 10–35 'A'–'Z', 36–61 'a'–'z' (LEAF, TFF and the npz files agree)
SOURCES = ("sample10", "full", "tff", "leaf")
DEFAULT_PATHS = {"sample10": "femnist/femnist_sample10.npz", "full": "femnist/femnist_full.npz",
                 "tff": "femnist", "leaf": "femnist"}  # relative to the data root
NPZ_KEYS = ("x", "y", "writer_offsets", "is_test")
NPZ_EXPECTED = f"an npz with keys {', '.join(NPZ_KEYS)}"
TFF_PREFIXES = ("fed_emnist_digitsonly", "fed_emnist")
TFF_EXPECTED = "a TFF HDF5 file with groups examples/<client_id>/{pixels (n,28,28), label (n,)}"
LEAF_EXPECTED = "a LEAF JSON file with users, num_samples and user_data[user] = {x: [[784 floats]], y: [ints]}"

# Where a problem reads FEMNIST from: the declarations shared by every problem built on it (emnist, pauc),
# the arguments of `load`.
SOURCE_PARAMS = (
    Param("source", "choice", "sample10", "data: the shipped npz (10% writer sample or full), TFF HDF5 "
          "or LEAF JSON", choices=SOURCES),
    Param("path", "str", None, "file or folder of the source, relative ones under the data root (None: "
          "femnist/femnist_sample10.npz, femnist/femnist_full.npz, or the folder femnist/ for tff and leaf)",
          nullable=True),
    Param("data_dir", "str", None, "data root (None: the environment variable FEDBENCH_DATA)", nullable=True),
    Param("writers_fraction", "float", 0.1, "tff only: the first fraction of the sorted writer ids kept "
          "(Yuan et al.'s subset_ratio)", low=0, low_open=True, high=1),
)


@dataclass(frozen=True)
class WriterImages:
    """What every loader returns: all samples, writer by writer."""

    x: np.ndarray | None  # [N, 784] uint8 (intensity x/255) or float32 (intensity x); None: the index alone
    y: np.ndarray  # [N] int64 labels in [0, 62)
    offsets: np.ndarray  # [W+1] int64: writer k's samples are rows offsets[k]:offsets[k+1]
    is_test: np.ndarray  # [N] bool
    writer_ids: np.ndarray  # [W] str

    @property
    def num_writers(self) -> int:
        return len(self.offsets) - 1

    @property
    def writer(self) -> np.ndarray:
        """[N] writer index of every sample."""
        return np.repeat(np.arange(self.num_writers), np.diff(self.offsets))


@dataclass(frozen=True)
class Clients:
    """The kept writers' train and test samples, each split contiguous per writer (as `process_femnist.py`)."""

    writer_ids: np.ndarray  # [K]
    x_train: np.ndarray | None  # [N_train, 784], dtype as WriterImages.x (None, as x_test, from an index alone)
    y_train: np.ndarray  # [N_train] int64
    train_sizes: np.ndarray  # [K] int64, all >= min_train
    x_test: np.ndarray | None
    y_test: np.ndarray
    test_sizes: np.ndarray  # [K] int64, all >= min_test


def white(x: np.ndarray) -> float:
    """The stored value of intensity 1 (the white background): 255 for uint8 pixels, else 1."""
    return 255.0 if x.dtype == np.uint8 else 1.0


# -- locating the files --------------------------------------------------------------------------------------

def data_root(data_dir: str | None = None, holds: str | Path = DEFAULT_PATHS["sample10"]) -> Path:
    """The folder of the real data sets; `holds`: what the caller reads under it, named where none is set."""
    root = data_dir or os.environ.get("FEDBENCH_DATA")
    if not root:
        raise ValueError("no data root: set the problem parameter data_dir or the environment variable "
                         f"FEDBENCH_DATA to the folder that holds {holds}")
    return Path(root).expanduser()


def resolve_path(source: str, path: str | None = None, data_dir: str | None = None) -> Path:
    """`path` (relative ones under the data root), else the source's default file or folder."""
    if source not in SOURCES:
        raise ValueError(f"unknown FEMNIST source {source!r}; expected one of {' | '.join(SOURCES)}")
    chosen = Path(path).expanduser() if path is not None else Path(DEFAULT_PATHS[source])
    return chosen if chosen.is_absolute() else data_root(data_dir, chosen) / chosen


def load(source: str, path: str | None = None, data_dir: str | None = None, classes: int = LABELS,
         writers_fraction: float = 0.1) -> WriterImages:
    """Read `source` (one of SOURCES) from `path` / the data root; `classes` picks the TFF file pair."""
    return read(source, resolve_path(source, path, data_dir), classes, writers_fraction)


def load_index(source: str, path: str | None = None, data_dir: str | None = None, classes: int = LABELS,
               writers_fraction: float = 0.1) -> WriterImages:
    """What `load` reads but the images (`x` None): the npz files' labels, writer offsets and split, their images
    never decompressed; TFF and LEAF files hold no index apart from the images, and are read whole."""
    location = resolve_path(source, path, data_dir)
    if source in ("tff", "leaf") or not location.is_file():
        return read(source, location, classes, writers_fraction, pixels=False)
    stat = location.stat()
    return _npz_index(location, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # the problem configs of a recipe mostly share one file; a changed file is read anew
def _npz_index(location: Path, mtime_ns: int, size: int) -> WriterImages:
    return load_npz(location, pixels=False)


def read(source: str, location: Path, classes: int, writers_fraction: float, pixels: bool = True) -> WriterImages:
    """`source`'s file or folder `location` in its format; without `pixels`, the index alone (`x` None)."""
    if source == "tff":
        images = load_tff(location, classes, writers_fraction)
    elif source == "leaf":
        images = load_leaf(location)
    else:
        return load_npz(location, pixels)
    return images if pixels else dataclasses.replace(images, x=None)


# -- the three formats ---------------------------------------------------------------------------------------

def load_npz(path: str | Path, pixels: bool = True) -> WriterImages:
    """The shipped npz files; `writer_ids` is optional (default: the writer indices). Without `pixels`, the index
    alone (`x` None, not decompressed)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; expected {NPZ_EXPECTED}")
    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and advise allow_pickle
        raise ValueError(f"{path}: expected {NPZ_EXPECTED}; it is not a zip archive")
    try:
        with np.load(path) as archive:  # allow_pickle stays False: object arrays are refused
            missing = [key for key in NPZ_KEYS if key not in archive.files]
            arrays = {key: archive[key] for key in (*NPZ_KEYS, "writer_ids")
                      if key in archive.files and (pixels or key != "x")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(f"{path}: expected {NPZ_EXPECTED}; cannot read it ({err})") from None
    if missing:
        raise ValueError(f"{path}: expected {NPZ_EXPECTED}; missing {', '.join(missing)}")
    offsets = arrays["writer_offsets"]
    ids = arrays.get("writer_ids", np.arange(max(offsets.size - 1, 0)).astype(str))
    return _checked(path, NPZ_EXPECTED, arrays.get("x"), arrays["y"], offsets, arrays["is_test"], ids)


def tff_files(path: str | Path, classes: int = LABELS) -> tuple[Path, Path]:
    """The (train, test) pair for a folder (digits-only files first when `classes` ≤ 10) or for one file."""
    path = Path(path)
    if path.is_dir():
        prefixes = TFF_PREFIXES if classes <= 10 else TFF_PREFIXES[1:]
        for prefix in prefixes:
            train, test = path / f"{prefix}_train.h5", path / f"{prefix}_test.h5"
            if train.is_file() and test.is_file():
                return train, test
        wanted = " or ".join(f"{prefix}_{{train,test}}.h5" for prefix in prefixes)
        raise ValueError(f"{path}: expected a folder holding {wanted}")
    for suffix, other in (("_train.h5", "_test.h5"), ("_test.h5", "_train.h5")):
        if path.name.endswith(suffix):
            sibling = path.with_name(path.name.removesuffix(suffix) + other)
            return (path, sibling) if suffix == "_train.h5" else (sibling, path)
    raise ValueError(f"{path}: expected a folder holding fed_emnist[_digitsonly]_{{train,test}}.h5 "
                     "or one of those files")


def load_tff(path: str | Path, classes: int = LABELS, writers_fraction: float = 0.1) -> WriterImages:
    """TFF's federated EMNIST: the first `writers_fraction` of the sorted train client ids (at least
    one), with their samples of the train and the test file."""
    if not 0 < writers_fraction <= 1:
        raise ValueError(f"writers_fraction: expected a float in (0, 1], found {writers_fraction!r}")
    train_path, test_path = tff_files(path, classes)
    train = _read_h5(train_path, writers_fraction=writers_fraction)
    test = _read_h5(test_path, client_ids=list(train))
    return _assemble(train_path, TFF_EXPECTED, list(train), train, test)


def load_leaf(root: str | Path) -> WriterImages:
    """A LEAF FEMNIST output folder `<root>/train/*.json`, `<root>/test/*.json`; writers are the train
    users, sorted by id (a user's samples spread over several files are concatenated)."""
    root = Path(root)
    splits = []
    for split in ("train", "test"):
        files = sorted((root / split).glob("*.json"))
        if not files:
            raise ValueError(f"{root / split}: expected a folder of LEAF JSON files (*.json); none found")
        per_user: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for file in files:
            for user, images in _read_leaf_json(file):
                per_user.setdefault(user, []).append(images)
        splits.append({user: _concatenate(parts) for user, parts in per_user.items()})
    train, test = splits
    return _assemble(root, LEAF_EXPECTED, sorted(train), train, test)


# -- process_femnist.py --------------------------------------------------------------------------------------

def select_clients(data: WriterImages, classes: int, min_train: int = 10, min_test: int = 1) -> Clients:
    """`process_femnist.py` of Bao et al.'s released code (ICML 2022): keep labels < `classes`, then drop writers with
    fewer than `min_train` train or `min_test` test samples left."""
    writer = data.writer
    keep = data.y < classes
    train, test = keep & ~data.is_test, keep & data.is_test
    n_train = np.bincount(writer[train], minlength=data.num_writers)
    n_test = np.bincount(writer[test], minlength=data.num_writers)
    kept = (n_train >= min_train) & (n_test >= min_test)
    train &= kept[writer]
    test &= kept[writer]
    x_train, x_test = (None, None) if data.x is None else (data.x[train], data.x[test])
    return Clients(data.writer_ids[kept], x_train, data.y[train], n_train[kept], x_test, data.y[test], n_test[kept])


# -- helpers -------------------------------------------------------------------------------------------------

def _checked(path: Path, expected: str, x, y, offsets, is_test, writer_ids) -> WriterImages:
    """WriterImages from arrays whose shapes, dtypes and ranges are checked against each other (`x` None: the
    index alone)."""
    def fail(found: str):
        raise ValueError(f"{path}: expected {expected}; {found}")

    if x is not None and (x.ndim != 2 or x.shape[1] != PIXELS
                          or not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating))):
        fail(f"x is {x.dtype} {list(x.shape)}, expected uint8 or float [N, {PIXELS}]")
    n = len(y) if x is None else len(x)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        fail(f"y is {y.dtype} {list(y.shape)}, expected integers [{n}]")
    if n and (y.min() < 0 or y.max() >= LABELS):
        fail(f"labels span [{y.min()}, {y.max()}], expected [0, {LABELS - 1}]")
    if (offsets.ndim != 1 or len(offsets) < 1 or not np.issubdtype(offsets.dtype, np.integer)
            or offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) < 0).any()):
        fail(f"writer_offsets must be non-decreasing integers from 0 to {n}")
    if is_test.shape != (n,) or is_test.dtype != np.bool_:
        fail(f"is_test is {is_test.dtype} {list(is_test.shape)}, expected bool [{n}]")
    if writer_ids.shape != (len(offsets) - 1,):
        fail(f"{writer_ids.size} writer ids for {len(offsets) - 1} writers")
    return WriterImages(x, y.astype(np.int64, copy=False), offsets.astype(np.int64, copy=False), is_test,
                        writer_ids.astype(str))


def _assemble(path: Path, expected: str, ids: list[str], train: dict, test: dict) -> WriterImages:
    """One WriterImages from per-writer (pixels, labels) of the train and the test split."""
    empty = (np.empty((0, PIXELS), np.float32), np.empty(0, np.int64))
    parts = [split.get(writer, empty) for writer in ids for split in (train, test)]
    sizes = np.array([len(labels) for _, labels in parts], dtype=np.int64)
    x = np.concatenate([pixels for pixels, _ in parts]) if parts else empty[0]
    y = np.concatenate([labels for _, labels in parts]) if parts else empty[1]
    is_test = np.repeat(np.tile([False, True], len(ids)), sizes)
    offsets = np.concatenate([[0], sizes.reshape(-1, 2).sum(1).cumsum()]).astype(np.int64)
    return _checked(path, expected, _compact(x), y, offsets, is_test, np.array(ids, dtype=str))


def _compact(x: np.ndarray) -> np.ndarray:
    """uint8 grey levels when every float value is (within float32 rounding) some k/255, else float32."""
    levels = np.rint(x * 255.0)
    if levels.size == 0 or (levels.min() >= 0 and levels.max() <= 255 and np.abs(levels / 255.0 - x).max() <= 1e-6):
        return levels.astype(np.uint8)
    return x.astype(np.float32, copy=False)


def _images(path: Path, expected: str, where: str, pixels, labels) -> tuple[np.ndarray, np.ndarray]:
    """(pixels [n, 784] float32, labels [n]) from one writer's raw arrays."""
    try:
        pixels = np.asarray(pixels, dtype=np.float32)
        labels = np.asarray(labels)
    except (TypeError, ValueError) as err:  # ragged or non-numeric lists
        raise ValueError(f"{path}: expected {expected}; {where} is not numeric ({err})") from None
    if labels.size == 0:  # an empty JSON list reads as float
        labels = labels.astype(np.int64)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: expected {expected}; {where} has {labels.dtype} labels, expected integers")
    if not (labels.ndim == 1 and pixels.size == len(labels) * PIXELS and (pixels.ndim > 1 or not len(labels))):
        raise ValueError(f"{path}: expected {expected}; {where} has pixels {list(pixels.shape)} and labels "
                         f"{list(labels.shape)}, expected [n, 28, 28] or [n, 784] and [n]")
    return pixels.reshape(len(labels), PIXELS), labels


def _concatenate(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p for p, _ in parts]), np.concatenate([labels for _, labels in parts])


def _read_h5(path: Path, writers_fraction: float = 1.0, client_ids: list[str] | None = None) -> dict:
    """{client_id: (pixels, labels)} of the first `writers_fraction` of the sorted ids, or of those of
    `client_ids` present in the file."""
    import h5py  # only this source needs it

    if not path.is_file():
        raise ValueError(f"{path}: no such file; expected {TFF_EXPECTED}")
    try:
        with h5py.File(path, "r") as file:
            examples = file.get("examples")
            if not isinstance(examples, h5py.Group):
                raise ValueError(f"{path}: expected {TFF_EXPECTED}; there is no group 'examples'")
            if client_ids is None:
                ids = sorted(examples)
                ids = ids[: max(1, int(writers_fraction * len(ids)))]
            else:
                ids = [client for client in client_ids if client in examples]
            out = {}
            for client in ids:
                group = examples[client]
                if not (isinstance(group, h5py.Group) and "pixels" in group and "label" in group):
                    raise ValueError(f"{path}: expected {TFF_EXPECTED}; examples/{client} lacks pixels or label")
                out[client] = _images(path, TFF_EXPECTED, f"examples/{client}", group["pixels"][()],
                                      group["label"][()])
    except OSError as err:  # not HDF5, truncated, unreadable
        raise ValueError(f"{path}: expected {TFF_EXPECTED}; cannot read it ({err})") from None
    return out


def _read_leaf_json(file: Path) -> list[tuple[str, tuple[np.ndarray, np.ndarray]]]:
    try:
        content = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: expected {LEAF_EXPECTED}; cannot parse it ({err})") from None
    if not (isinstance(content, dict) and isinstance(content.get("users"), list)
            and isinstance(content.get("num_samples"), list) and isinstance(content.get("user_data"), dict)):
        raise ValueError(f"{file}: expected {LEAF_EXPECTED}; a key is missing or of the wrong type")
    if len(content["num_samples"]) != len(content["users"]):
        raise ValueError(f"{file}: expected {LEAF_EXPECTED}; num_samples and users differ in length")
    out = []
    for user, count in zip(content["users"], content["num_samples"]):
        record = content["user_data"].get(user)
        if not (isinstance(record, dict) and "x" in record and "y" in record):
            raise ValueError(f"{file}: expected {LEAF_EXPECTED}; user_data[{user!r}] lacks x or y")
        images = _images(file, LEAF_EXPECTED, f"user_data[{user!r}]", record["x"], record["y"])
        if len(images[1]) != count:
            raise ValueError(f"{file}: expected {LEAF_EXPECTED}; num_samples says {count} for {user!r}, "
                             f"user_data has {len(images[1])}")
        out.append((str(user), images))
    return out
