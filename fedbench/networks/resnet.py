"""ResNet-18 for 32×32 images with GroupNorm in place of BatchNorm.

He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016 (the basic block; four stages of
two blocks, 64 to 512 channels), in its CIFAR form: a 3×3 stem convolution of stride 1 and no max pooling, as
kuangliu/pytorch-cifar's `ResNet18` (11,173,962 parameters with 10 classes). Each BatchNorm is a GroupNorm (Wu and
He, ECCV 2018), as Hsieh, Phanishayee, Mutlu, Gibbons, "The Non-IID Data Quagmire of Decentralized Machine
Learning", ICML 2020, propose for non-IID clients: it has the affine parameters of the BatchNorm it replaces (a
scale and an offset per channel) and no running statistics, so the count is the same and nothing but parameters is
kept. Two groups per layer by default (`groups`).

Reddi et al., "Adaptive Federated Optimization", ICLR 2021, train a ResNet-18 with GroupNorm on CIFAR-10 and
CIFAR-100, but their released Keras network (google-research/federated, `utils/models/resnet_models.py`,
`create_resnet18`) is not this one: pre-activation blocks, a 7×7 stride-2 stem with max pooling, and TensorFlow
Addons' GroupNormalization at its default number of groups.
"""
from __future__ import annotations

import torch
from torch import nn

from fedbench.networks.convnets import Shape


class BasicBlock(nn.Module):
    """Two 3×3 convolutions, each followed by a GroupNorm, with a shortcut (a strided 1×1 convolution and a
    GroupNorm where the shape changes) added before the last ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int, groups: int):
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride, padding=1, bias=False), nn.GroupNorm(groups, outputs), nn.ReLU(),
            nn.Conv2d(outputs, outputs, 3, 1, padding=1, bias=False), nn.GroupNorm(groups, outputs))
        self.shortcut = nn.Identity() if stride == 1 and inputs == outputs else nn.Sequential(
            nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.GroupNorm(groups, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.residual(x) + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 (CIFAR form) with `groups` groups in each GroupNorm; see the module's docstring for its sources."""

    def __init__(self, input_shape: Shape = (3, 32, 32), classes: int = 10, groups: int = 2):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(input_shape[0], 64, 3, 1, padding=1, bias=False),
                                   nn.GroupNorm(groups, 64), nn.ReLU()]
        inputs = 64
        for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(inputs, outputs, stride, groups), BasicBlock(outputs, outputs, 1, groups)]
            inputs = outputs
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)
