"""The small convolutional networks of the federated-learning literature, each as its paper or its authors' released
code defines it. Every one takes images as `[batch, channels, height, width]` floats and returns one logit per class
(the softmax is the loss's); its input shape and number of classes are constructor arguments, so that the same
definition serves another dataset of the same kind (EMNIST-10 beside EMNIST-62).
"""
from __future__ import annotations

import torch
from torch import nn

Shape = tuple[int, int, int]  # (channels, height, width) of one example


def glorot(module: nn.Module, zero_biases: bool = True) -> None:
    """Glorot-uniform weights, Keras' default initialisation, which the TensorFlow sources use; with `zero_biases`
    Keras' zero biases too (else torch's default ones, kept)."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)
            if zero_biases and layer.bias is not None:
                nn.init.zeros_(layer.bias)


class ConvDropoutCNN(nn.Module):
    """Two 3×3 convolutions (32, 64 channels, no padding, ReLU), 2×2 max pooling, dropout 0.25, a dense layer of
    128 (ReLU), dropout 0.5 and the output layer.

    Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Appendix (the EMNIST character recognition model's
    table: 1,206,590 parameters with 62 classes), released as TensorFlow Federated's `create_conv_dropout_model`
    (1,199,882 with 10 classes). pfl-research's `simple_cnn` (apple/pfl-research,
    `benchmarks/model/pytorch/cnn.py`, Granqvist et al., 2024) is the same network, which its CIFAR-10 benchmark
    runs on 32×32×3 images (1,626,442 parameters). Initialised as both sources do: Glorot-uniform weights (Keras'
    default in TFF, set explicitly by pfl-research) and zero biases as Keras', or torch's default ones as
    pfl-research's (`zero_biases=False`).
    """

    def __init__(self, input_shape: Shape = (1, 28, 28), classes: int = 62, zero_biases: bool = True):
        super().__init__()
        channels, height, width = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(channels, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
            nn.Linear(64 * ((height - 4) // 2) * ((width - 4) // 2), 128), nn.ReLU(),
            nn.Dropout(0.5), nn.Linear(128, classes))
        glorot(self, zero_biases)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


class McMahanCNN(nn.Module):
    """Two 5×5 convolutions (32, 64 channels, 'same' padding, ReLU), each followed by 2×2 max pooling, a fully
    connected layer of 512 (ReLU) and the output layer.

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017, §3
    (the CNN for MNIST, "1,663,370 total parameters"), as TensorFlow Federated's `create_original_fedavg_cnn_model`
    writes it (whose 'same' padding the stated count requires). Glorot-uniform weights and zero biases, Keras'
    default there.
    """

    def __init__(self, input_shape: Shape = (1, 28, 28), classes: int = 10):
        super().__init__()
        channels, height, width = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(64 * (height // 4) * (width // 4), 512), nn.ReLU(),
            nn.Linear(512, classes))
        glorot(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


class SimpleCNN(nn.Module):
    """Two 5×5 convolutions (6, 16 channels, no padding, ReLU), each followed by 2×2 max pooling, fully connected
    layers of 120 and 84 (ReLU) and the output layer: LeNet-5's shape.

    NIID-Bench: Li, Diao, Chen, He, "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022,
    §5.1, released as `SimpleCNN` (CIFAR-10 and SVHN, 3×32×32: 62,006 parameters) and `SimpleCNNMNIST` (MNIST,
    FMNIST, FEMNIST, 1×28×28: 44,426) in Xtra-Computing/NIID-Bench's `model.py`, built there with
    `hidden_dims=[120, 84]`. torch's default initialisation, as there.
    """

    def __init__(self, input_shape: Shape = (3, 32, 32), classes: int = 10):
        super().__init__()
        channels, height, width = input_shape
        height, width = (((side - 4) // 2 - 4) // 2 for side in (height, width))  # after each conv and pooling
        self.layers = nn.Sequential(
            nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * height * width, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)
