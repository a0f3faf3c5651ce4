"""The shipped networks (`fedbench.networks.NETWORKS`): each one's parameter count against the number its paper or
its released code states, and its layers against a transcription of that code built here from `torch.nn` layers
(the shipped module's weights copied in, the same outputs); the check that refuses a module whose forward pass
updates buffers (BatchNorm) and accepts dropout; a researcher's own network from a file or a module, hashed and
imported again from the text it carries; the networks in `fedbench list`."""
from __future__ import annotations

import dataclasses
import hashlib
import sys

import pytest
import torch
from torch import nn

from fedbench.hparams import ParamError
from fedbench.networks import NETWORKS, check_module, load_network, network_class, parameter_count
from helpers import invoke

STATED = {
    "emnist_cnn": 1_206_590,
    "mcmahan_cnn": 1_663_370,
    "resnet18_gn": 11_173_962,
}
"""Counts the sources state: the EMNIST character recognition CNN of Reddi et al., "Adaptive Federated Optimization",
ICLR 2021, Appendix (the model of their EMNIST CR task; TFF's released summary of the same network gives its layers'
counts, 320 + 18,496 + 1,179,776 + the output layer's 129 per class); McMahan et al., AISTATS 2017, §3: "a final
softmax output layer (1,663,370 total parameters)"; ResNet-18 in its CIFAR form with 10 classes, the count of
kuangliu/pytorch-cifar's `ResNet18` with BatchNorm, whose affine parameters a GroupNorm has as well (counted again in
closed form below)."""


def test_parameter_counts_are_those_their_papers_state():
    """The counts the papers state (`STATED`), as `Shipped.parameters` gives them without drawing from torch's
    generator and as the built module has them, and TFF's `create_conv_dropout_model` summary for 10 classes
    (1,199,882: the same CNN as Reddi et al.'s with a 10-way output layer)."""
    for name, stated in STATED.items():
        state, fresh = torch.get_rng_state(), dataclasses.replace(NETWORKS[name])  # its count not cached yet
        assert fresh.parameters == stated and torch.equal(torch.get_rng_state(), state), name
        assert parameter_count(NETWORKS[name].build()) == stated, name
    assert parameter_count(NETWORKS["emnist_cnn"].build(classes=10)) == 1_199_882


def test_resnet18_has_two_group_groupnorms_where_the_cifar_resnet18_has_batchnorms():
    """20 normalisation layers (one after each of the 17 convolutions of the stem and blocks, 3 on the strided
    shortcuts), each a GroupNorm of two groups; with each replaced by the BatchNorm2d it stands for, the count is
    unchanged: the 11,173,962 of the BatchNorm network. Counted again here in closed form: convolutions without
    bias, two affine parameters per channel of each normalisation, the 512 → 10 output layer."""
    module = NETWORKS["resnet18_gn"].build()
    norms = [(name, layer) for name, layer in module.named_modules() if isinstance(layer, nn.GroupNorm)]
    assert len(norms) == 20 and all(layer.num_groups == 2 for _, layer in norms)
    for name, layer in norms:
        parent, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent), child, nn.BatchNorm2d(layer.num_channels))
    assert parameter_count(module) == 11_173_962
    widths = [64, 128, 256, 512]
    convs = 3 * 9 * 64 + sum(9 * (i if j == 0 else o) * o + 9 * o * o for i, o in zip([64, *widths], widths)
                             for j in range(2))
    shortcuts = sum(i * o for i, o in zip(widths, widths[1:]))
    norm_channels = 64 + sum(4 * o for o in widths) + sum(widths[1:])
    assert convs + shortcuts + 2 * norm_channels + 512 * 10 + 10 == 11_173_962


def transcription(name: str) -> nn.Module:
    """The network as its released code writes it, layer by layer in the same order (so that a state copied by
    position lands in the same layers): TFF's `create_conv_dropout_model` and `create_original_fedavg_cnn_model`
    (Keras, 'same' padding in the latter), NIID-Bench's `SimpleCNNMNIST` and `SimpleCNN` (`model.py`, built with
    `input_dim=16*4*4` / `16*5*5`, `hidden_dims=[120, 84]`), pfl-research's `simple_cnn` (flatten size
    `((32 - 4) // 2) ** 2 * 64`)."""
    relu, pool = nn.ReLU, nn.MaxPool2d
    if name in ("emnist_cnn", "pfl_cifar10_cnn"):
        channels, classes, side = (1, 62, 28) if name == "emnist_cnn" else (3, 10, 32)
        return nn.Sequential(nn.Conv2d(channels, 32, (3, 3)), relu(), nn.Conv2d(32, 64, (3, 3)), relu(), pool((2, 2)),
                             nn.Dropout(0.25), nn.Flatten(), nn.Linear((side - 4) // 2 * ((side - 4) // 2) * 64, 128),
                             relu(), nn.Dropout(0.5), nn.Linear(128, classes))
    if name == "mcmahan_cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 5, padding="same"), relu(), pool(2), nn.Conv2d(32, 64, 5, padding="same"),
                             relu(), pool(2), nn.Flatten(), nn.Linear(7 * 7 * 64, 512), relu(), nn.Linear(512, 10))
    channels, flat = (1, 16 * 4 * 4) if name == "niid_cnn_mnist" else (3, 16 * 5 * 5)
    return nn.Sequential(nn.Conv2d(channels, 6, 5), relu(), pool(2, 2), nn.Conv2d(6, 16, 5), relu(), pool(2, 2),
                         nn.Flatten(), nn.Linear(flat, 120), relu(), nn.Linear(120, 84), relu(), nn.Linear(84, 10))


@pytest.mark.parametrize("name", ["emnist_cnn", "mcmahan_cnn", "niid_cnn_mnist", "niid_cnn_cifar", "pfl_cifar10_cnn"])
def test_each_cnn_is_its_released_definition(name):
    """Same parameter shapes in the same order as the released code's definition (transcribed here: NIID-Bench's
    and pfl-research's counts, which their papers do not state, come from it: 44,426, 62,006 and 1,626,442), and
    with the shipped weights copied in, the same logits on random images."""
    shipped, released = NETWORKS[name].build().eval(), transcription(name).eval()
    assert [p.shape for p in shipped.parameters()] == [p.shape for p in released.parameters()]
    assert NETWORKS[name].parameters == parameter_count(released)
    with torch.no_grad():
        for mine, theirs in zip(shipped.parameters(), released.parameters()):
            theirs.copy_(mine)
        images = torch.randn(3, *NETWORKS[name].input_shape, generator=torch.Generator().manual_seed(0))
        assert torch.allclose(shipped(images), released(images), atol=1e-6)


def test_the_keras_sources_initialise_glorot_uniform_with_zero_biases_and_pfl_research_keeps_torch_biases():
    """TFF's Keras layers: Glorot-uniform kernels (bound sqrt(6 / (fan_in + fan_out))), zero biases; pfl-research:
    Glorot-uniform weights (`xavier_uniform_`), torch's default biases (not zero)."""
    torch.manual_seed(0)
    for name in ("emnist_cnn", "mcmahan_cnn", "pfl_cifar10_cnn"):
        for layer in NETWORKS[name].build().modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                fan_out, fan_in = layer.weight.shape[0], layer.weight[0].numel()
                receptive = layer.weight[0, 0].numel()
                bound = (6 / (fan_in + fan_out * receptive)) ** 0.5
                assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound, (name, layer)
                assert (layer.bias == 0).all() == (name != "pfl_cifar10_cnn"), (name, layer)


def test_every_shipped_network_runs_on_its_input_and_passes_the_check():
    for name, network in NETWORKS.items():
        module = network.build()
        check_module(module, torch.zeros(2, *network.input_shape))
        assert module(torch.zeros(2, *network.input_shape)).shape == (2, network.classes), name
    assert NETWORKS["niid_cnn_cifar"].build((3, 64, 64), 100)(torch.zeros(1, 3, 64, 64)).shape == (1, 100)


# -- the check ---------------------------------------------------------------------------------------------------

def refusal(module: nn.Module, shape=(4, 3, 8, 8)) -> str:
    with pytest.raises(ParamError) as caught:
        check_module(module, torch.randn(shape))
    message = str(caught.value)
    assert message.startswith("problem.model: ") and "\n" not in message
    return message


def test_a_module_whose_forward_updates_batchnorm_statistics_is_refused_with_groupnorm_as_the_alternative():
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    mean = module[1].running_mean.clone()
    message = refusal(module)
    assert "Sequential updates buffers in its forward pass: 1.running_mean, 1.running_var, " \
           "1.num_batches_tracked (of BatchNorm2d)" in message
    assert "use GroupNorm" in message and "Hsieh et al., ICML 2020" in message
    assert torch.equal(module[1].running_mean, mean) and module.training  # the check ran on a copy


def test_any_buffer_a_forward_updates_is_refused_not_only_batchnorm_and_a_constant_buffer_is_accepted():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.ones(8))  # read, never written: accepted
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen += x.shape[0]
            return x * self.mask

    assert "Counting updates buffers in its forward pass: seen (of Counting)" in refusal(Counting(), (4, 8))
    assert "1.running_mean, 1.running_var (of InstanceNorm1d)" in refusal(
        nn.Sequential(nn.Linear(8, 8), nn.InstanceNorm1d(8, track_running_stats=True)), (4, 8, 8))
    constant = nn.Sequential(nn.Linear(8, 8))
    constant.register_buffer("scale", torch.ones(8))
    check_module(constant, torch.randn(4, 8))


def test_batchnorm_without_running_statistics_is_refused_too():
    message = refusal(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, track_running_stats=False)))
    assert "Sequential holds BatchNorm layers (1), whose outputs mix the examples of a batch" in message
    assert "use GroupNorm" in message


def test_dropout_and_groupnorm_are_accepted_and_the_check_draws_nothing_from_torchs_generator():
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Dropout(0.5))
    images = torch.randn(4, 3, 8, 8)
    state = torch.get_rng_state()
    check_module(module, images)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_module_that_does_not_run_on_the_example_is_refused_in_one_line():
    message = refusal(nn.Linear(5, 2), (4, 3))
    assert "Linear does not run on an example batch of shape [4, 3]: RuntimeError: " in message


# -- a researcher's own network ----------------------------------------------------------------------------------

WIDE = '''\
from torch import nn
from blocks import width


class WideCNN(nn.Module):
    def __init__(self, input_shape=(1, 28, 28), classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(input_shape[0], width(), 3), nn.ReLU(), nn.Flatten(),
                                    nn.LazyLinear(classes))

    def forward(self, x):
        return self.layers(x)


NOT_A_MODULE = 3
'''


def test_a_file_network_is_loaded_with_its_sibling_modules_hashed_and_imported_again_from_the_carried_text(tmp_path):
    """The class, and a source whose sha256 covers the file and the module it imports from its folder (as a file
    plugin's: the text, then each sibling's path and text); an edit of either changes it. With the files gone and
    the module forgotten (a worker on another machine), the carried text imports the same class again."""
    (tmp_path / "wide.py").write_text(WIDE)
    (tmp_path / "blocks.py").write_text("def width():\n    return 16\n")
    cls, source = load_network("wide.py:WideCNN", base=tmp_path)
    digest = hashlib.sha256(WIDE.encode())
    digest.update(b"\0blocks.py\0def width():\n    return 16\n")
    assert cls.__name__ == "WideCNN" and source.sha256 == digest.hexdigest()
    assert source.spec == f"{tmp_path / 'wide.py'}:WideCNN" and source.modules == (("blocks.py", "def width():\n"
                                                                                     "    return 16\n"),)
    (tmp_path / "blocks.py").write_text("def width():\n    return 32\n")
    edited = load_network("wide.py:WideCNN", base=tmp_path)[1]
    assert edited.sha256 != source.sha256
    for file in tmp_path.iterdir():
        file.unlink()
    for name in [source.module, edited.module, "blocks"]:
        sys.modules.pop(name, None)
    again = network_class(edited)
    module = again()
    assert module(torch.zeros(2, 1, 28, 28)).shape == (2, 10) and module.layers[0].out_channels == 32


def test_a_module_network_is_imported_by_name_and_hashed_by_its_package(tmp_path, monkeypatch):
    (tmp_path / "my_nets").mkdir()
    (tmp_path / "my_nets" / "__init__.py").write_text("")
    (tmp_path / "my_nets" / "wide.py").write_text(WIDE.replace("from blocks import width", "from my_nets.blocks "
                                                               "import width"))
    (tmp_path / "my_nets" / "blocks.py").write_text("def width():\n    return 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls, source = load_network("my_nets.wide:WideCNN")
    assert cls().layers[0].out_channels == 8 and source.text is None and source.sha256
    assert network_class(source) is cls
    with pytest.raises(ParamError, match="^problem.model: network my_nets.wide:Narrow: found nothing by that name, "
                                         "expected a subclass of torch.nn.Module$"):
        load_network("my_nets.wide:Narrow")
    for name in [n for n in sys.modules if n.startswith("my_nets")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_module_network_only_the_driver_imports_is_shipped_with_the_ray_job_and_recorded(tmp_path, monkeypatch):
    """`model: my_flat_nets.flat:Flat`, its package on the driver's sys.path alone: shipped with the Ray job as a
    module plugin is (`shipped_code`), and each trial records its source (`Trial.code`: tag `code_sha256`); a file
    network travels in the trials instead, so nothing is shipped for it."""
    from sweeps.cluster import shipped_code
    from sweeps.recipe import parse

    package = tmp_path / "pkgs" / "my_flat_nets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    flat = ("from torch import nn\n\nclass Flat(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(784, 10)\n\n    def forward(self, x):\n        return self.fc(x.flatten(-3))\n")
    (package / "flat.py").write_text(flat)
    (tmp_path / "flat_file.py").write_text(flat)
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.chdir(tmp_path)

    def recipe(model):
        return parse({"problem": {"name": "vision", "model": model, "clients": 4, "train_size": 80},
                      "federation": {"clients_per_round": 2, "batch_size": 5}, "algorithms": {"fedavg": {}}},
                     str(tmp_path / "nets.yaml"))

    module = recipe("my_flat_nets.flat:Flat")
    assert shipped_code([module]) == [str(package)]
    (source,) = module.trials()[0].code
    assert source.spec == "my_flat_nets.flat:Flat" and source.text is None
    assert source.sha256 == load_network("my_flat_nets.flat:Flat")[1].sha256
    assert shipped_code([recipe("flat_file.py:Flat")]) == []
    for name in [n for n in sys.modules if n.startswith("my_flat_nets")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("spec, expected", [
    ("wide.py", "found 'wide.py', expected a shipped network (emnist_cnn, "),
    ("missing.py:Net", "network missing.py:Net: no such file ("),
    ("wide.py:Narrow", "network wide.py:Narrow: found nothing by that name, expected a subclass of torch.nn.Module"),
    ("wide.py:NOT_A_MODULE", "network wide.py:NOT_A_MODULE: found an object of type int, expected a subclass of torch.nn.Module"),
    ("broken.py:Net", "network broken.py: does not import: SyntaxError: "),
    ("no_such_package.nets:Net", "network no_such_package.nets:Net: does not import: ModuleNotFoundError: "),
])
def test_a_network_that_cannot_be_loaded_is_refused_in_one_line_at_problem_model(tmp_path, spec, expected):
    (tmp_path / "wide.py").write_text(WIDE)
    (tmp_path / "blocks.py").write_text("def width():\n    return 16\n")
    (tmp_path / "broken.py").write_text("class Net(:\n")
    with pytest.raises(ParamError) as caught:
        load_network(spec, base=tmp_path)
    assert str(caught.value).startswith("problem.model: " + expected) and "\n" not in str(caught.value)


def test_fedbench_list_shows_each_network_with_its_parameter_count_and_source():
    listing = invoke("list", "networks")
    assert listing.exit_code == 0, listing.output
    text = " ".join(listing.output.split())
    for name, network in NETWORKS.items():
        assert f"network {name}: {network.parameters:,} parameters" in text and " ".join(network.source.split()) in text
    assert "emnist_cnn 1,206,590 parameters, 1×28×28 → 62: Reddi et al., ICLR 2021" in " ".join(invoke("list").output
                                                                                                .split())
