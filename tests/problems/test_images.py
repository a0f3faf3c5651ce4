"""CIFAR's crop-and-flip augmentation batched over clients (`fedbench.data.images`; He et al., CVPR 2016, §4.2): each
image the window of its zero-padded copy at its drawn offsets, mirrored by torch.flip where drawn; offsets uniform
over the (2·padding + 1)² positions and flips fair (χ² and binomial tests); `normalize` as torchvision's
ToTensor + Normalize."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedbench.data import images


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("padding", [4, 2])
def test_crop_is_a_window_of_the_padded_image_and_flip_is_torch_flip(padding):
    x = torch.randint(0, 256, (3, 5, 3, 32, 30), generator=gen(1), dtype=torch.uint8)  # [S, b, C, H, W], H ≠ W
    draws = images.crop_flip_draws((3, 5), gen(2), padding)
    out = images.crop_flip(x, draws, padding)
    assert out.shape == x.shape and out.dtype == torch.uint8
    assert draws[..., 2].any() and not draws[..., 2].all()  # both branches are exercised
    for s in range(3):
        for b in range(5):
            dy, dx, flip = draws[s, b].tolist()
            padded = torch.zeros(3, 32 + 2 * padding, 30 + 2 * padding, dtype=torch.uint8)
            padded[:, padding:padding + 32, padding:padding + 30] = x[s, b]
            window = padded[:, dy:dy + 32, dx:dx + 30]
            assert torch.equal(out[s, b], torch.flip(window, dims=[-1]) if flip else window)


def test_random_crop_flip_draws_one_per_image_in_the_rows_order():
    x = torch.randint(0, 256, (4, 6, 1, 28, 28), generator=gen(3), dtype=torch.uint8)
    out = images.random_crop_flip(x, gen(4))
    flat = images.crop_flip(x.reshape(24, 1, 28, 28), images.crop_flip_draws((24,), gen(4)))
    assert torch.equal(out.reshape(24, 1, 28, 28), flat)
    assert torch.equal(images.random_crop_flip(x, gen(4)), out)
    assert not torch.equal(images.random_crop_flip(x, gen(5)), out)


def test_offsets_are_uniform_and_flips_fair():
    draws = images.crop_flip_draws((200, 50), gen(7), padding=4).reshape(-1, 3)
    m = len(draws)
    positions = torch.bincount(draws[:, 0] * 9 + draws[:, 1], minlength=81).numpy()  # the joint (dy, dx): 81 cells
    assert len(positions) == 81 and stats.chisquare(positions).pvalue > 1e-3
    assert stats.binomtest(int(draws[:, 2].sum()), m, 0.5).pvalue > 1e-3


def test_a_centred_unflipped_crop_is_the_image():
    x = torch.randint(0, 256, (2, 3, 8, 8), generator=gen(0), dtype=torch.uint8)
    centred = torch.tensor([[4, 4, 0], [0, 0, 0]])
    out = images.crop_flip(x, centred)
    assert torch.equal(out[0], x[0])
    assert (out[1, :, :4, :] == 0).all() and (out[1, :, :, :4] == 0).all()  # the zero border, top-left corner
    assert torch.equal(out[1, :, 4:, 4:], x[1, :, :4, :4])


def test_normalize_is_to_tensor_then_normalize():
    x = torch.tensor([[[[0, 255]], [[51, 102]]]], dtype=torch.uint8)  # [1, 2, 1, 2]
    out = images.normalize(x, (0.5, 0.25), (0.5, 0.125))
    want = np.array([[[[(0 - 0.5) / 0.5, (1 - 0.5) / 0.5]], [[(0.2 - 0.25) / 0.125, (0.4 - 0.25) / 0.125]]]])
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    assert out.dtype == torch.float32
    assert images.normalize(x, (0.5, 0.25), (0.5, 0.125), torch.float64).dtype == torch.float64


def test_unknown_data_set_is_refused():
    with pytest.raises(ValueError, match=r"^unknown image data set 'mnist'; expected one of fashion_mnist \| cifar10$"):
        images.load("mnist")
