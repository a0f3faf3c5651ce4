"""The `emnist` problem (Bao, Crawshaw, Luo, Liu, ICML 2022, §4 and App. F): batched gradient with batches capped
at n_k, the npz / TFF HDF5 / LEAF JSON loaders and the released process_femnist.py filter, pixel conventions,
data-root errors, and one round on the shipped 10% writer sample."""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedbench
from fedbench.data import femnist
from fedbench.engine.simulate import Federation, Simulation
from fedbench.hparams import Param
from helpers import grey_levels, npz_problem, write_npz

# Labels per writer, (train, test): under the defaults (min_train 10, min_test 1) EMNIST-10 keeps w3 and w4
# only (w1 has 9 train digits, w2 no test digit); EMNIST-62 keeps all four.
WRITERS = {
    "w3": (list(range(10)) + [0, 1], [1, 2]),
    "w1": (list(range(9)) + [15, 40], [3]),
    "w2": ([7] * 10, [20]),
    "w4": ([5] * 10, [5]),
}




def write_tff(folder: Path, writers: dict, prefix="fed_emnist", seed=0) -> dict:
    """TFF's layout; returns each writer's written train grey levels."""
    rng = np.random.default_rng(seed)
    levels = {}
    for split, index in (("train", 0), ("test", 1)):
        with h5py.File(folder / f"{prefix}_{split}.h5", "w") as file:
            for client, labels in writers.items():
                grey = grey_levels(rng, len(labels[index]))
                if index == 0:
                    levels[client] = grey
                group = file.create_group(f"examples/{client}")
                group["pixels"] = (grey / 255.0).astype(np.float32).reshape(-1, 28, 28)
                group["label"] = np.array(labels[index], dtype=np.int32)
    return levels


def write_leaf(root: Path, writers: dict, seed=0, pixels=None) -> dict:
    """LEAF's layout, the writers spread over two shards; `pixels(rng, n)` overrides the grey levels/255."""
    rng = np.random.default_rng(seed)
    levels = {}
    names = list(writers)
    for split, index in (("train", 0), ("test", 1)):
        (root / split).mkdir(parents=True)
        for shard, users in enumerate((names[:2], names[2:])):
            data = {}
            for user in users:
                n = len(writers[user][index])
                values = pixels(rng, n) if pixels else grey_levels(rng, n) / 255.0
                if index == 0:
                    levels[user] = values
                data[user] = {"x": values.tolist(), "y": writers[user][index]}
            content = {"users": users, "num_samples": [len(data[u]["y"]) for u in users], "user_data": data}
            (root / split / f"all_data_{shard}.json").write_text(json.dumps(content))
    return levels


def write_format(fmt: str, root: Path, writers=WRITERS) -> dict:
    if fmt == "tff":
        root.mkdir()
        return {w: v / 255.0 for w, v in write_tff(root, writers).items()}
    return write_leaf(root, writers)


# -- the batched gradient ----------------------------------------------------------------------------------------

def reference_grad(problem, w, rows):
    """Autograd of the mean per-sample cross-entropy over each client's valid rows, one client at a time."""
    c, p = problem.classes, femnist.PIXELS
    grads = []
    for wk, r in zip(w, rows):
        r = r[r >= 0]
        x = problem.x_train[r].double() / 255
        wk = wk.double().clone().requires_grad_()
        logits = x @ wk[: p * c].view(p, c) + (wk[p * c:] if problem.config["bias"] else 0)
        F.cross_entropy(logits, problem.y_train[r]).backward()
        grads.append(wk.grad.float())
    return torch.stack(grads)


@pytest.mark.parametrize("batch_size", [5, 40])  # 40 exceeds every client, even the largest
@pytest.mark.parametrize("bias", [False, True])
def test_batched_gradient_equals_autograd_with_batches_capped_at_n_k(tmp_path, bias, batch_size):
    problem = npz_problem(tmp_path, [3, 7, 12, 30], bias=bias)
    assert problem.dim == 7840 + (10 if bias else 0) and problem.regularizer.size == 7840
    clients = torch.tensor([0, 2, 3, 1])
    rows = problem.draw_minibatches(clients, 2, batch_size, torch.Generator().manual_seed(0))
    assert rows.shape == (2, 4, batch_size)
    offsets, sizes = problem.client_offsets_cpu, problem.client_sizes_cpu
    for step in rows:
        for k, r in zip(clients.tolist(), step):
            valid = r[r >= 0]
            assert len(valid) == min(batch_size, int(sizes[k]))  # capped: the other picks are padding (−1)
            assert len(set(valid.tolist())) == len(valid)  # without replacement
            assert ((valid >= offsets[k]) & (valid < offsets[k + 1])).all()
    w = 0.1 * torch.randn(4, problem.dim, generator=torch.Generator().manual_seed(1))
    for step in rows:
        torch.testing.assert_close(problem.grad(w, problem.gather(step)), reference_grad(problem, w, step),
                                   atol=1e-6, rtol=1e-4)
    # the engine accepts b above the smallest client for a problem that caps batches
    result = fedbench.run("fedmid", problem, rounds=2, clients_per_round=2, local_steps=2, batch_size=batch_size)
    assert result.status == "finished"


def test_str_param_kind():
    param = Param("path", "str", None, "a file", nullable=True)
    assert param.check("a/b.npz") == "a/b.npz" and param.check(None) is None
    assert param.describe_range() == "any string"
    with pytest.raises(ValueError, match="expected a string"):
        param.check(3)


# -- loaders and the process_femnist.py filter --------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["tff", "leaf"])
def test_tff_and_leaf_loaders_filter_labels_and_writers(tmp_path, fmt):
    root = tmp_path / fmt
    written = write_format(fmt, root)

    def load(**config):
        return fedbench.make_problem("emnist", source=fmt, path=str(root), writers_fraction=1.0, **config)

    digits = load()
    assert list(digits.writer_ids) == ["w3", "w4"]  # sorted ids; w1 (9 train), w2 (no test digit) dropped
    assert digits.client_sizes.tolist() == [12, 10] and digits.test_sizes.tolist() == [2, 1]
    assert digits.y_train.tolist() == WRITERS["w3"][0] + WRITERS["w4"][0]
    assert digits.x_train.dtype == torch.uint8  # k/255 floats are stored as grey levels, losslessly
    np.testing.assert_array_equal(digits.x_train[:12].numpy(), np.rint(written["w3"] * 255))
    assert digits.client_weights.tolist() == pytest.approx([12 / 22, 10 / 22])

    letters = load(classes=62)
    assert list(letters.writer_ids) == ["w1", "w2", "w3", "w4"]
    assert letters.client_sizes.tolist() == [11, 10, 12, 10] and letters.test_sizes.tolist() == [1, 1, 2, 1]
    assert list(load(min_train=9).writer_ids) == ["w1", "w3", "w4"]
    assert list(load(min_train=9, min_test=0).writer_ids) == ["w1", "w2", "w3", "w4"]
    assert list(load(min_train=11, classes=62).writer_ids) == ["w1", "w3"]


def test_tff_writers_fraction_and_file_choice(tmp_path):
    write_tff(tmp_path, WRITERS)
    write_tff(tmp_path, {"d1": ([1] * 10, [1])}, prefix="fed_emnist_digitsonly")
    first_half = femnist.load("tff", str(tmp_path), classes=62, writers_fraction=0.5)
    assert list(first_half.writer_ids) == ["w1", "w2"]  # the first half of the sorted ids
    assert femnist.load("tff", str(tmp_path), classes=62, writers_fraction=0.1).num_writers == 1
    assert list(femnist.load("tff", str(tmp_path), classes=10, writers_fraction=1).writer_ids) == ["d1"]
    assert femnist.tff_files(tmp_path / "fed_emnist_test.h5") == (tmp_path / "fed_emnist_train.h5",
                                                                    tmp_path / "fed_emnist_test.h5")


def write_bad_inputs(tmp_path: Path) -> dict[str, tuple[str, Path]]:
    """{case: (source, path)} of missing or malformed inputs."""
    (tmp_path / "not.npz").write_text("hello")
    write_npz(tmp_path / "no_test_flag.npz", [3], [1], drop=("is_test",))
    (tmp_path / "tff_no_examples").mkdir()
    for split in ("train", "test"):
        with h5py.File(tmp_path / "tff_no_examples" / f"fed_emnist_{split}.h5", "w") as file:
            file["pixels"] = np.zeros((1, 28, 28), np.float32)
    (tmp_path / "tff_no_test").mkdir()
    write_tff(tmp_path / "tff_no_test", {"w": ([1], [1])})
    (tmp_path / "tff_no_test" / "fed_emnist_test.h5").unlink()
    (tmp_path / "tff_not_h5").mkdir()
    for split in ("train", "test"):
        (tmp_path / "tff_not_h5" / f"fed_emnist_{split}.h5").write_text("not hdf5")
    (tmp_path / "leaf_bad_json" / "train").mkdir(parents=True)
    (tmp_path / "leaf_bad_json" / "test").mkdir()
    (tmp_path / "leaf_bad_json" / "train" / "a.json").write_text("{not json")
    (tmp_path / "leaf_bad_json" / "test" / "a.json").write_text("{}")
    write_leaf(tmp_path / "leaf_short_x", {"u": ([1, 2], [3]), "v": ([1], [1])}, pixels=lambda rng, n: np.ones((n, 5)))
    write_leaf(tmp_path / "leaf_no_user_data", {"u": ([1], [1])})
    (tmp_path / "leaf_no_user_data" / "test" / "all_data_0.json").write_text(json.dumps({"users": ["u"]}))
    return {
        "missing npz": ("sample10", tmp_path / "absent.npz"),
        "not an npz": ("sample10", tmp_path / "not.npz"),
        "npz without is_test": ("full", tmp_path / "no_test_flag.npz"),
        "tff folder without files": ("tff", tmp_path),
        "h5 without examples": ("tff", tmp_path / "tff_no_examples" / "fed_emnist_train.h5"),
        "missing h5 test file": ("tff", tmp_path / "tff_no_test" / "fed_emnist_train.h5"),
        "not hdf5": ("tff", tmp_path / "tff_not_h5"),
        "leaf folder without json": ("leaf", tmp_path / "tff_no_test"),
        "invalid json": ("leaf", tmp_path / "leaf_bad_json"),
        "leaf images not 784 pixels": ("leaf", tmp_path / "leaf_short_x"),
        "leaf json without user_data": ("leaf", tmp_path / "leaf_no_user_data"),
    }


def test_missing_or_malformed_inputs_raise_value_errors_naming_the_path(tmp_path):
    expected_words = {"npz without is_test": "missing is_test", "missing npz": "no such file",
                      "h5 without examples": "no group 'examples'", "leaf images not 784 pixels": "[n, 784]"}
    for case, (source, path) in write_bad_inputs(tmp_path).items():
        with pytest.raises(ValueError) as caught:
            fedbench.make_problem("emnist", source=source, path=str(path), writers_fraction=1.0)
        message = str(caught.value)
        assert str(tmp_path) in message and "expected" in message, (case, message)
        assert expected_words.get(case, "") in message, (case, message)


# -- pixels and the data root -------------------------------------------------------------------------------------

def test_pixels_raw_and_inverted(tmp_path):
    raw = npz_problem(tmp_path, [4, 5])
    inverted = npz_problem(tmp_path, [4, 5], pixels="inverted")
    rows = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    x_raw, x_inv = raw.gather(rows)[0], inverted.gather(rows)[0]
    stored = raw.x_train[rows.reshape(-1)].view(2, 4, -1).double()
    torch.testing.assert_close(x_raw, (stored / 255).float())
    torch.testing.assert_close(x_inv, (1 - stored / 255).float())
    zero = raw.init_params(torch.Generator())
    assert raw.evaluate(zero)["train_loss"] == pytest.approx(math.log(10), abs=1e-6)
    assert inverted.evaluate(zero)["sparsity"] == 1.0

    # pixels that are not grey levels k/255 stay float32; inversion is then 1 − value
    write_leaf(tmp_path / "leaf", WRITERS, pixels=lambda rng, n: rng.random((n, femnist.PIXELS)) * 0.999)
    floats = {mode: fedbench.make_problem("emnist", source="leaf", path=str(tmp_path / "leaf"), pixels=mode)
              for mode in ("raw", "inverted")}
    assert floats["raw"].x_train.dtype == torch.float32
    torch.testing.assert_close(floats["inverted"].gather(rows)[0], 1 - floats["raw"].gather(rows)[0])


def test_data_root_resolution_and_missing_root_message(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDBENCH_DATA", raising=False)
    advice = "set the problem parameter data_dir or the environment variable FEDBENCH_DATA"
    with pytest.raises(ValueError, match=advice):
        fedbench.make_problem("emnist")
    write_npz(tmp_path / "mini.npz", [10, 10], [1, 1])
    assert fedbench.make_problem("emnist", data_dir=str(tmp_path), path="mini.npz").num_clients == 2
    monkeypatch.setenv("FEDBENCH_DATA", str(tmp_path))
    assert fedbench.make_problem("emnist", path="mini.npz").num_clients == 2
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "femnist" / "femnist_full.npz"))):
        fedbench.make_problem("emnist", source="full")


# -- the shipped 10% writer sample --------------------------------------------------------------------------------

@pytest.fixture
def shipped_sample():
    path = Path(os.environ.get("FEDBENCH_DATA", "")) / "femnist" / "femnist_sample10.npz"
    if not os.environ.get("FEDBENCH_DATA") or not path.is_file():
        pytest.skip(f"the shipped FEMNIST sample is not at $FEDBENCH_DATA/femnist/femnist_sample10.npz ({path})")
    return path


@pytest.mark.parametrize(("classes", "clients", "train", "test"), [(10, 358, 36639, 4082), (62, 360, 72493, 8051)])
def test_shipped_sample_writer_counts(shipped_sample, classes, clients, train, test):
    problem = fedbench.make_problem("emnist", classes=classes)
    counts = (problem.num_clients, int(problem.client_sizes.sum()), int(problem.test_sizes.sum()))
    assert counts == (clients, train, test)
    assert int(problem.client_sizes.min()) >= 10 and int(problem.test_sizes.min()) >= 1
    assert float(problem.client_weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert int(problem.y_train.max()) == classes - 1


def test_one_fedmid_round_on_the_shipped_sample(shipped_sample):
    problem = fedbench.make_problem("emnist")
    federation = Federation(rounds=1, clients_per_round=36, local_steps=2, batch_size=25)
    sim = Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=0.01), federation, seed=0,
                     eval_every=1)
    start, end = list(sim)
    assert sim.status == "finished"
    assert start["train_loss"] == pytest.approx(math.log(10), abs=1e-5)
    assert start["test_loss"] == pytest.approx(math.log(10), abs=1e-5)
    assert start["sparsity"] == 1.0 and start["nonzeros"] == 0.0
    assert end["train_loss"] < start["train_loss"] and end["objective"] < start["objective"]
    assert 0 < end["nonzeros"] <= 7840


def test_full_file_keeps_all_3597_writers_each_with_its_own_split(shipped_sample):
    """FEMNIST at full size for 62 classes: every one of the 3,597 writers is a client (the paper's filter keeps all:
    each has 17+ train and 2+ test samples), its train and test samples those its `is_test` flags mark, as the
    data folder's writers.csv counts them writer by writer. From the index alone (1.3 s; the images add ~6 s and a
    1.5 GB peak)."""
    if not (shipped_sample.parent / "femnist_full.npz").is_file():
        pytest.skip("femnist_full.npz is not beside the sample")
    clients = femnist.select_clients(femnist.load_index("full"), 62)
    table = np.genfromtxt(shipped_sample.parent / "writers.csv", delimiter=",", names=True, dtype=None,
                          encoding="utf-8")
    assert len(clients.writer_ids) == len(table) == 3597
    assert clients.writer_ids.tolist() == table["writer_id"].tolist()
    np.testing.assert_array_equal(clients.test_sizes, table["n_test"])
    np.testing.assert_array_equal(clients.train_sizes, table["n_samples"] - table["n_test"])
    assert (int(clients.train_sizes.sum()), int(clients.test_sizes.sum())) == (736_119, 81_732)  # SOURCE.md


def test_full_file_loads_and_one_round_runs_with_36_writers(shipped_sample):
    """The full 3597-writer file as EMNIST-10 (3580 writers with digits; ~1.2 GB peak RSS measured)."""
    if not (shipped_sample.parent / "femnist_full.npz").is_file():
        pytest.skip("femnist_full.npz is not beside the sample")
    problem = fedbench.make_problem("emnist", source="full")
    assert problem.num_clients == 3580 and int(problem.client_sizes.sum()) == 363608
    sim = Simulation(problem, fedbench.make_algorithm("fast_fedda", problem, mu=1e-3, gamma=25.0),
                     Federation(rounds=1, clients_per_round=36, local_steps=40, batch_size=25), seed=0, eval_every=1)
    start, end = list(sim)
    assert sim.status == "finished" and math.isfinite(end["train_loss"]) and end["nonzeros"] > 0
