"""Deep networks as torch modules for the problems that train them: the shipped ones (`NETWORKS`, each as its paper
or its authors' released code defines it, its parameter count tested against theirs), a researcher's own
(`load_network`), and the check every module passes before a run uses it (`check_module`).

A network's state is its parameters and nothing else. The engine holds S clients × R runs of them and averages
what the clients send; a buffer that the forward pass updates (BatchNorm's running mean and variance) would be
per-client state outside the update, which no aggregation rule of an algorithm covers. Such a module is refused
with the alternative, GroupNorm (Hsieh, Phanishayee, Mutlu, Gibbons, "The Non-IID Data Quagmire of Decentralized
Machine Learning", ICML 2020: BatchNorm fails under non-IID clients, GroupNorm recovers most of the loss), which
normalises each example by itself and keeps no statistics; the shipped ResNet-18 uses it. FedBN (Li, Jiang, Zhang,
Kamp, Dou, ICLR 2021: each client keeps its own BatchNorm layers, never averaged) was not taken: it makes the
normalisation layers personal state of every client across rounds, a personalized method of its own, not a
treatment the engine could apply under every algorithm without changing what each one computes. Dropout is
accepted: its masks are random draws, which the engine takes from each client's own stream.
"""
from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedbench.hparams import ParamError
from fedbench.networks.convnets import ConvDropoutCNN, McMahanCNN, Shape, SimpleCNN
from fedbench.networks.resnet import ResNet18GN
from fedbench.sources import PluginError, Source, describe, file_source, import_source, is_file, located, module_source

FIELD, OWNER = "model", "problem"  # where a recipe names a network: its refusals name `problem.model`
ALTERNATIVE = "GroupNorm (torch.nn.GroupNorm: no running statistics, Hsieh et al., ICML 2020)"


@dataclass(frozen=True)
class Shipped:
    """A shipped network: its module class, the input shape (channels, height, width) and number of classes of the
    setting its source defines it for, its source (paper and released code) in words, and constructor arguments
    beyond those (`options`); `parameters` is its number of parameters in that setting."""
    cls: type[nn.Module]
    input_shape: Shape
    classes: int
    source: str
    options: dict[str, Any] = field(default_factory=dict)

    def build(self, input_shape: Shape | None = None, classes: int | None = None) -> nn.Module:
        """The module, for its source's setting or another input shape and number of classes, its weights drawn from
        torch's global generator as its source initialises them."""
        return self.cls(input_shape or self.input_shape, classes or self.classes, **self.options)

    @functools.cached_property
    def parameters(self) -> int:
        """Its number of parameters in its source's setting (counted on a module built without drawing from torch's
        global generator)."""
        with torch.random.fork_rng(devices=[]):
            return parameter_count(self.build())


NETWORKS: dict[str, Shipped] = {
    "emnist_cnn": Shipped(ConvDropoutCNN, (1, 28, 28), 62, "Reddi et al., ICLR 2021, Appendix: the EMNIST "
                          "character recognition CNN (TFF's create_conv_dropout_model)"),
    "mcmahan_cnn": Shipped(McMahanCNN, (1, 28, 28), 10, "McMahan et al., AISTATS 2017, §3: the CNN for MNIST"),
    "niid_cnn_mnist": Shipped(SimpleCNN, (1, 28, 28), 10, "Li et al. (NIID-Bench), ICDE 2022, §5.1: the simple CNN "
                              "for MNIST-like images (SimpleCNNMNIST)"),
    "niid_cnn_cifar": Shipped(SimpleCNN, (3, 32, 32), 10, "Li et al. (NIID-Bench), ICDE 2022, §5.1: the simple CNN "
                              "for CIFAR-10 and SVHN (SimpleCNN)"),
    "pfl_cifar10_cnn": Shipped(ConvDropoutCNN, (3, 32, 32), 10, "pfl-research (Granqvist et al., 2024), "
                               "benchmarks/model/pytorch/cnn.py simple_cnn: its CIFAR-10 CNN",
                               {"zero_biases": False}),
    "resnet18_gn": Shipped(ResNet18GN, (3, 32, 32), 10, "He et al., CVPR 2016, in its CIFAR form "
                           "(kuangliu/pytorch-cifar), with two-group GroupNorm in place of BatchNorm (Hsieh et al., "
                           "ICML 2020)"),
}
"""The shipped networks by the name a recipe gives them (`model: emnist_cnn`)."""


def parameter_count(module: nn.Module) -> int:
    """The number of a module's parameters (each shared tensor once)."""
    return sum(p.numel() for p in module.parameters())


def refused(message: str) -> ParamError:
    return ParamError(FIELD, message, OWNER)


_CARRIED: dict[str, Source] = {}  # a file network's absolute spec -> the source a run carried into this process


def carry(sources: tuple[Source, ...]) -> None:
    """Make `load_network` take each file network's code from the text a run carries (the code its config hash
    covers), not from the file: in a Ray worker, maybe on another machine, where the file is absent or has changed
    since the sweep read it."""
    _CARRIED.update((source.spec, source) for source in sources if source.text is not None)


def load_network(spec: str, base: Path | None = None) -> tuple[type[nn.Module], Source]:
    """A researcher's own network: `path/to/file.py:ClassName` (relative to `base`, default the working directory)
    or `package.module:ClassName`. Returns the class and its `Source`: the sha256 of its code (for a file, with the
    modules it imports from its folder, as a plugin's), which a run's configuration records so that an edit re-runs
    its runs, and for a file the text itself, which a run carries so that a Ray worker imports the same code again
    (`network_class`). What cannot be loaded raises ParamError at `problem.model`.

    Example:
        ```python
        cls, source = load_network("my_nets.py:WideCNN")
        module = cls()
        check_module(module, torch.zeros(2, 1, 28, 28))
        ```
    """
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise refused(f"found {spec!r}, expected a shipped network ({', '.join(NETWORKS)}), "
                      "path/to/file.py:ClassName or package.module:ClassName")
    if is_file(where):
        path = Path(located(where, base))
        if f"{path}:{name}" in _CARRIED:  # carried by the run (`carry`)
            source = _CARRIED[f"{path}:{name}"]
            return network_class(source), source
        if not path.is_file():
            raise refused(f"network {spec}: no such file ({path})")
        source = file_source(f"{path}:{name}", path)
    else:
        try:
            source = module_source(spec, importlib.import_module(where))
        except Exception as err:  # the import's own message: a missing dependency, a syntax error, ...
            raise refused(f"network {spec}: does not import: {describe(err)}") from None
    return network_class(source), source


def network_class(source: Source) -> type[nn.Module]:
    """The class a network's `Source` names, imported in this process: a file's from the text the source carries
    (once per content), a module's by importing it again. ParamError at `problem.model` if it is no `nn.Module`."""
    where, _, name = source.spec.rpartition(":")
    try:
        module = import_source(source, "network") if source.text is not None else importlib.import_module(where)
    except PluginError as err:
        raise refused(str(err)) from None
    except Exception as err:
        raise refused(f"network {source.spec}: does not import: {describe(err)}") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        found = "nothing by that name" if cls is None else f"an object of type {type(cls).__name__}"
        named = source.spec if source.text is None else f"{source.shown}:{name}"  # a file by its name alone
        raise refused(f"network {named}: found {found}, expected a subclass of torch.nn.Module")
    return cls


def check_module(module: nn.Module, example_input: torch.Tensor) -> None:
    """Refuse a module whose forward pass in training mode updates a buffer (BatchNorm's running statistics: state
    outside the parameters, which clients would keep and no algorithm averages) or that holds a BatchNorm layer at
    all (without running statistics it still mixes the examples of a batch, and evaluates on the statistics of the
    evaluation batch): ParamError at `problem.model` naming what was found and the alternative, GroupNorm (Hsieh et
    al., ICML 2020). The module's own buffers are left as they were: the forward runs on a copy, on
    `example_input` (a batch of examples as the problem feeds them), and torch's global generator is left as it
    was too, so that checking a module does not change a run's draws. A module with dropout is accepted: the engine
    draws its masks from each client's own stream. See the module's docstring for why this refuses rather than
    keep BatchNorm per client (FedBN).

    Example:
        ```python
        check_module(NETWORKS["resnet18_gn"].build(), torch.zeros(2, 3, 32, 32))   # passes
        check_module(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)), torch.zeros(2, 3, 32, 32))
        # ParamError: problem.model: Sequential updates buffers in its forward pass: 1.running_mean, ...
        ```
    """
    what = type(module).__name__
    batchnorms = [name for name, layer in module.named_modules() if isinstance(layer, nn.modules.batchnorm._BatchNorm)]
    trial = copy.deepcopy(module).train()
    before = {name: buffer.clone() for name, buffer in trial.named_buffers()}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # its dropout draws leave torch's generator as it was
            trial(example_input)
    except Exception as err:
        raise refused(f"{what} does not run on an example batch of shape {list(example_input.shape)}: "
                      f"{describe(err)}") from None
    updated = [name for name, buffer in trial.named_buffers()
               if name not in before or not torch.equal(before[name], buffer)]
    if updated:
        owners = sorted({type(trial.get_submodule(name.rpartition(".")[0])).__name__ for name in updated})
        shown = ", ".join(updated[:3]) + (f", ... ({len(updated)} in all)" if len(updated) > 3 else "")
        raise refused(f"{what} updates buffers in its forward pass: {shown} (of {', '.join(owners)}), state outside "
                      f"its parameters that no algorithm averages; expected none: use {ALTERNATIVE}")
    if batchnorms:
        raise refused(f"{what} holds BatchNorm layers ({', '.join(batchnorms[:3])}), whose outputs mix the examples "
                      f"of a batch; expected none: use {ALTERNATIVE}")
