"""Regularizers h = λ·ℛ with their values, proximal maps and subgradients, batched over leading axes.

Parameters are flat vectors `[..., d]`. A regularizer penalizes the leading `size` coordinates (viewed
as a vector for ℓ1, as a `shape` matrix for the nuclear norm); trailing coordinates (an intercept) are
left free: their prox is the identity and their subgradient zero.

Proximal map convention: `prox(v, step) = argmin_w ½‖w − v‖² + step·h(w)`, i.e. prox_{step·h} as the pFedFBE
paper (ICLR 2023 submission, §1) defines prox_h. With `radius` set, the domain is the ball ‖w‖₂ ≤ radius (the
𝒲 = {w : ‖w‖ ≤ ρ} of Bao et al., ICML 2022, §3.1 and Theorem 2.1, which their released code never applies);
the exact prox is then "threshold, then rescale onto the ball", because ℓ1 and nuclear norm are positively
homogeneous.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import Tensor


def _over(numerator, denominator: Tensor) -> Tensor:
    """numerator / denominator as torch computes it for a float numerator: the reciprocal of the denominator times
    the numerator (rounded twice), for a tensor numerator (per-run values `[R, 1, 1]`) too, so that a run's value
    in a tensor gives the float's result bit for bit."""
    return denominator.reciprocal() * numerator


def _float_if_one(value):
    """A float64 tensor of one value on the CPU (a per-run step, threshold or radius of a run alone, `[1, 1, 1]`)
    as a Python float, read without a device synchronisation, so that a run alone takes the float path: the ℓ1
    prox's clamp without the negation kernel a tensor bound needs. Float64 arithmetic on it then rounds as the
    tensor's would, so that the results are the same bits; other tensors are kept (float32: Python's double
    arithmetic would round differently), and so is every tensor in a compiled step (`fedbench.engine.compiling`), whose
    graph would otherwise break at the read and be compiled again for each new value."""
    if (isinstance(value, Tensor) and value.is_cpu and value.dtype is torch.float64 and value.numel() == 1
            and not torch.compiler.is_compiling()):
        return value.item()
    return value


def project_l2_ball(u: Tensor, radius) -> Tensor:
    """Euclidean (Frobenius, for flattened matrices) projection of each row of `u` onto ‖·‖₂ ≤ radius (a float or
    a tensor broadcastable to `[..., 1]`)."""
    norms = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    return u * torch.clamp(_over(radius, norms.clamp_min(torch.finfo(u.dtype).tiny)), max=1.0)


def project_l1_ball(u: Tensor, radius) -> Tensor:
    """Projection of each row onto ‖·‖₁ ≤ radius (Duchi et al. 2008; `ProjectOntoL1Ball.m` of Bao et al.'s code); the
    radius is a float or a tensor broadcastable to `[..., 1]`."""
    magnitude = u.abs()
    inside = magnitude.sum(-1, keepdim=True) <= radius
    sorted_desc = magnitude.sort(dim=-1, descending=True).values
    cumsum = sorted_desc.cumsum(-1)
    j = torch.arange(1, u.shape[-1] + 1, dtype=u.dtype, device=u.device)
    active = sorted_desc > (cumsum - radius) / j
    rho = active.to(u.dtype).mul(j).argmax(-1, keepdim=True)  # last index where the condition holds
    theta = ((cumsum.gather(-1, rho) - radius) / (rho + 1).to(u.dtype)).clamp_min(0.0)
    projected = u.sign() * (magnitude - theta).clamp_min(0.0)
    return torch.where(inside, u, projected)


# -- singular value thresholding ------------------------------------------------------------------------------
#
# The nuclear-norm prox and ball projection are both U diag(max(σ − τ, 0)) Vᵀ (for the projection, τ is the
# capped-simplex threshold of the σ's). On the CPU `torch.linalg.svd` runs LAPACK's gesdd one matrix at a time
# (~150 µs for 32×32, most of the low-rank problem's run time); the symmetric eigensolver on the Gram matrix
# AᵀA = V diag(σ²) Vᵀ costs about half, and the result needs no U:
#     U diag(max(σ − τ, 0)) Vᵀ = (A V) diag(f) Vᵀ,   f = max(σ − τ, 0)/σ = max(1 − τ/σ, 0)
# (f = 1 for τ = 0, f = 0 for σ ≤ τ: tiny or zero σ's are harmless). `bench/nuclear_prox.py` measures it.
#
# Why that is exact enough. eigh is backward stable: its V and σ² are exact for AᵀA + E, ‖E‖ ≈ eps·σ₁²
# (σ's below √eps·σ₁ are lost: Gram *values* are unfit where small σ's matter, as in the nuclear norm or the
# rank decision of the subgradient, which keep the SVD). But the result depends on σ only through f, which is 0
# below τ and has slope τ/σ² ≤ 1/τ above it; by the Daleckii–Krein formula the first-order error of A·f(AᵀA)
# is then ‖E‖/τ at most, i.e.
#     ‖P_gram − P‖_F / ‖P‖_F  ≲  eps·σ₁² / (τ·‖P‖_F)   (the estimate that `_GRAM_TOL` bounds).
# On 20 000 random, clustered, rank-deficient and ill-conditioned 32×32 matrices with thresholds at, near and
# between their σ's, every result whose estimate was ≤ 1e-11 agreed with the SVD's to 1e-10, and the worst of
# them, checked against 40-digit SVDs (mpmath), were within 1.3e-11 of the truth (the float64 SVD, there,
# within 1e-10). Over 300 rounds of the bao2022 low-rank recipe the estimate is ≤ 8e-12 for every call of
# fedmid, fedda, fast_fedda, c_fedda and mc_fedda. The matrices whose estimate is larger (τ tiny against
# σ₁²/‖P‖_F, or P ≈ 0) are redone by the SVD — τ = 0 needs no check: f ≡ 1 and the result is A V Vᵀ = A to
# eps — and so are those whose Gram matrix overflows (the estimate is then inf or NaN; σ₁ ≳ 1e154) or
# underflows (`_GRAM_FLOOR`; σ₁ ≲ 1e-142). A non-finite matrix (an overflowed iterate) thus gets the SVD's
# own outcome, as before — LinAlgError for NaN, which the engine reads as a diverged run, NaNs for ±inf: eigh
# raising sends the whole batch to the SVD, a NaN estimate that matrix.
#
# Only batches of float64 matrices on the CPU take this route: the 1e-10 guarantee is a float64 one; for one
# to three matrices the extra small tensor operations eat the gain (on the bench's CPU); and the fallback
# decision reads the estimate on the host, which on a GPU would be a synchronisation per prox (and GPU
# solvers, with other relative costs, were not measured), so other devices and dtypes keep the plain SVD.

_GRAM_TOL = 1e-11  # largest accepted eps·σ₁²/(τ·‖P‖_F); the measured error stays below ~1.3× this
_GRAM_FLOOR = 2.0 ** -1000  # added to eps·σ₁²: Gram entries that underflow lose this much, and far less
_GRAM_MIN_BATCH = 4  # fewer matrices: the route's ~15 extra small tensor operations cost what eigh saves


def _use_gram(a: Tensor) -> bool:
    return a.device.type == "cpu" and a.dtype == torch.float64 and a.shape[:-2].numel() >= _GRAM_MIN_BATCH


def _svt_by_svd(a: Tensor, threshold, rows: Tensor | None = None) -> Tensor:
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    tau = threshold(s, rows) if callable(threshold) else threshold
    return (u * (s - tau).clamp_min(0.0).unsqueeze(-2)) @ vh


def _singular_value_threshold(a: Tensor, threshold) -> Tensor:
    """U diag(max(σ − τ, 0)) Vᵀ for each matrix of `a` `[..., p1, p2]`. `threshold` τ is a float, a tensor
    broadcastable to `[..., 1]`, or a function `threshold(s, rows)` of the singular values `[..., k]` (in any
    order) returning τ `[..., 1]`: `rows` None for every matrix of `a`, else the flat indices (into `a`'s batch)
    of the matrices whose singular values `s` `[n, k]` are (those redone by the SVD). See the comment above for
    the method and its accuracy."""
    if not _use_gram(a):
        return _svt_by_svd(a, threshold)
    if a.shape[-2] < a.shape[-1]:  # the smaller Gram matrix; the map commutes with transposition
        return _singular_value_threshold(a.mT, threshold).mT
    try:
        lam, v = torch.linalg.eigh(a.mT @ a)  # ascending: σ²
    except torch.linalg.LinAlgError:  # a non-finite matrix: whatever the SVD does with it
        return _svt_by_svd(a, threshold)
    s = lam.clamp_min(torch.finfo(a.dtype).tiny).sqrt()
    tau = threshold(s, None) if callable(threshold) else threshold
    f = 1 - _over(tau, s).clamp(max=1.0)  # max(σ − τ, 0)/σ
    out = ((a @ v) * f.unsqueeze(-2)) @ v.mT
    # the error estimate; inf, NaN or overflowed Gram matrices fail it
    error = (torch.finfo(a.dtype).eps * lam[..., -1:] + _GRAM_FLOOR) / (
        tau * torch.linalg.vector_norm(s * f, dim=-1, keepdim=True))
    ok = (error <= _GRAM_TOL) | ((tau == 0) & (lam[..., -1:] <= torch.finfo(a.dtype).max))  # τ = 0: A V Vᵀ
    if not bool(ok.all()):  # redo those matrices by the SVD
        batch = out.shape[:-2]
        redo = (~ok).expand(*batch, 1).reshape(-1).nonzero().squeeze(-1)
        if not callable(threshold):
            threshold = torch.as_tensor(threshold, dtype=a.dtype).expand(*batch, 1).reshape(-1, 1)[redo]
        flat = out.view(-1, *out.shape[-2:])
        flat[redo] = _svt_by_svd(a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])[redo], threshold, redo)
    return out


def project_nuclear_ball(a: Tensor, radius) -> Tensor:
    """Projection of each matrix `[..., p1, p2]` onto ‖·‖_nuc ≤ radius (a float or a tensor broadcastable to
    `[..., 1]`, one radius per matrix): its singular values onto the capped simplex {σ ≥ 0, Σσ ≤ radius}
    (`nuc_prox_cs.m` + `ProjectOntoSimplex.m` of Bao et al.'s code), i.e. singular value thresholding at that simplex
    projection's threshold (0 inside the ball)."""
    batch = a.shape[:-2]

    def simplex_threshold(s, rows):  # σ − proj(σ) is θ on the kept σ's and σ ≤ θ on the others
        r = radius
        if rows is not None and isinstance(radius, Tensor):  # the radii of the matrices redone by the SVD
            r = radius.expand(*batch, 1).reshape(-1, 1)[rows]
        return (s - project_l1_ball(s, r)).amax(-1, keepdim=True)
    return _singular_value_threshold(a, simplex_threshold)


class Regularizer:
    """h(w) = lam · ℛ(w[..., :size]); see the module docstring for the conventions."""

    name = "none"

    def __init__(self, lam: float, size: int, radius: float | None = None):
        self.lam = float(lam)
        self.size = int(size)
        self.radius = radius

    # -- to be specialised: the penalized block only -------------------------------------------
    def _norm(self, x: Tensor) -> Tensor:
        return x.new_zeros(x.shape[:-1])

    def _dual_norm(self, x: Tensor) -> Tensor:
        return x.new_zeros(x.shape[:-1])

    def _prox(self, x: Tensor, threshold) -> Tensor:
        return x

    def _subgradient(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)

    # -- public, handles the free trailing coordinates and the optional ball ------------------
    def value(self, w: Tensor) -> Tensor:
        return self.lam * self._norm(w[..., : self.size])

    def norm(self, w: Tensor) -> Tensor:
        return self._norm(w[..., : self.size])

    def dual_norm(self, g: Tensor) -> Tensor:
        return self._dual_norm(g[..., : self.size])

    def prox(self, v: Tensor, step) -> Tensor:
        """argmin_w ½‖w − v‖² + step·h(w) (over the ball if `radius`). `step` is a float or a tensor
        broadcastable to `[..., 1]`."""
        threshold = _float_if_one(step) * self.lam
        if self.size == v.shape[-1]:
            out = self._prox(v, threshold)
        else:
            out = v.clone()
            out[..., : self.size] = self._prox(v[..., : self.size], threshold)
        return out if self.radius is None else project_l2_ball(out, self.radius)

    def subgradient(self, w: Tensor) -> Tensor:
        """An element of ∂h(w): the one of minimum norm's sign pattern (0 where ℓ1 has a kink)."""
        out = torch.zeros_like(w)
        out[..., : self.size] = self.lam * self._subgradient(w[..., : self.size])
        return out

    def with_lam(self, lam: float) -> Regularizer:
        """The same regularizer with another λ (MC-FedDA's per-stage λ_m)."""
        other = copy.copy(self)
        other.lam = float(lam)
        return other

    def project_norm_ball(self, u: Tensor, radius) -> Tensor:
        """Projection of the penalized block onto ℛ(·) ≤ radius (trailing coordinates unchanged); the radius is a
        float or a tensor broadcastable to `[..., 1]`."""
        out = u.clone()
        out[..., : self.size] = self._project_norm_ball(u[..., : self.size], radius)
        return out

    def _project_norm_ball(self, x: Tensor, radius) -> Tensor:
        raise NotImplementedError(f"no {self.name} ball projection")

    def prox_in_ball(self, v: Tensor, step, anchor: Tensor, radius, exact: bool = False) -> Tensor:
        """argmin_w ½‖w − v‖² + step·h(w) s.t. ℛ(w − anchor) ≤ radius: the constrained prox CProx of C-/MC-FedDA
        (Bao et al., ICML 2022, §3.3). Default: their released code's sequential approximation (`l1_soft_cs`,
        `nuc_prox_cs`): prox, then, if outside the ball, project onto it around the anchor. Exact
        (ℓ1 only): `L1.exact_prox_in_ball`. Without a radius (None), the plain prox. `step` and `radius` are
        floats or tensors broadcastable to `[..., 1]` (per-run values `[R, 1, 1]`)."""
        step = _float_if_one(step)
        if radius is None:
            return self.prox(v, step)
        radius = _float_if_one(radius)
        if exact:
            return self.exact_prox_in_ball(v, step, anchor, radius)
        u = self.prox(v, step)
        outside = self.norm(u - anchor).unsqueeze(-1) > radius
        if not outside.any():  # the usual case: Bao et al.'s released radii never bind in their synthetic runs
            return u
        return torch.where(outside, anchor + self.project_norm_ball(u - anchor, radius), u)

    def exact_prox_in_ball(self, v: Tensor, step, anchor: Tensor, radius) -> Tensor:
        raise NotImplementedError(f"no exact constrained prox for {self.name}; use the sequential one")


class NoRegularizer(Regularizer):
    name = "none"

    def __init__(self, lam: float = 0.0, size: int = 0, radius: float | None = None):
        super().__init__(0.0, 0, radius)


class L1(Regularizer):
    """λ‖w‖₁; prox = soft-thresholding sign(v)·max(|v| − τ, 0), written v − clamp(v, −τ, τ)."""

    name = "l1"

    def _norm(self, x):
        return x.abs().sum(-1)

    def _dual_norm(self, x):
        return x.abs().amax(-1)

    def _prox(self, x, threshold):
        return x - x.clamp(-threshold, threshold)  # a per-run threshold `[R, 1, 1]` broadcasts in the one clamp

    def _subgradient(self, x):
        return x.sign()

    def _project_norm_ball(self, x, radius):
        return project_l1_ball(x, radius)

    def exact_prox_in_ball(self, v, step, anchor, radius, iterations: int = 100):
        """Exact ℓ1 constrained prox (an option; Bao et al.'s code has only the sequential one). With a multiplier β ≥ 0
        the problem separates into 1-D convex pieces ½(w − v)² + τ|w| + β|w − a|, each minimized over the
        kinks {0, a} and the stationary points v − τs₁ − βs₂ that lie where sign(w) = s₁ and
        sign(w − a) = s₂. ‖w(β) − a‖₁ is non-increasing in β: bisect on β until it equals the radius. `step` and
        `radius` are floats or tensors broadcastable to `[..., 1]`."""
        tau, radius = _float_if_one(step) * self.lam, _float_if_one(radius)
        block, a = v[..., : self.size], anchor[..., : self.size]

        def solve(beta):
            kinks = [torch.zeros_like(block), a.expand_as(block)]
            stationary = [block - tau * s1 - beta * s2 for s1 in (1, -1) for s2 in (1, -1)]
            valid = [(s1 * w >= 0) & (s2 * (w - a) >= 0) for w, (s1, s2) in
                     zip(stationary, [(1, 1), (1, -1), (-1, 1), (-1, -1)])]
            candidates = torch.stack(kinks + stationary)
            cost = 0.5 * (candidates - block) ** 2 + tau * candidates.abs() + beta * (candidates - a).abs()
            cost[2:] = torch.where(torch.stack(valid), cost[2:], torch.full_like(cost[2:], math.inf))
            return candidates.gather(0, cost.argmin(0, keepdim=True)).squeeze(0)

        free = solve(torch.zeros_like(block[..., :1]))
        feasible = (free - a).abs().sum(-1, keepdim=True) <= radius
        low = torch.zeros_like(block[..., :1])
        high = (block - a).abs().amax(-1, keepdim=True) + tau + 1.0  # w = a for every β above this
        for _ in range(iterations):
            middle = (low + high) / 2
            too_far = (solve(middle) - a).abs().sum(-1, keepdim=True) > radius
            low, high = torch.where(too_far, middle, low), torch.where(too_far, high, middle)
        out = v.clone()
        out[..., : self.size] = torch.where(feasible, free, solve(high))
        return out if self.radius is None else project_l2_ball(out, self.radius)


class Nuclear(Regularizer):
    """λ‖W‖_nuc of the `shape` matrix stored row-major in the penalized block; prox = singular value
    thresholding U diag(max(σ − τ, 0)) Vᵀ (`_singular_value_threshold`: a Gram eigendecomposition where
    that is exact to ~1e-11, float64 on the CPU, else a batched SVD)."""

    name = "nuclear"

    def __init__(self, lam: float, shape: tuple[int, int], radius: float | None = None):
        super().__init__(lam, math.prod(shape), radius)
        self.shape = tuple(shape)

    def _matrix(self, x: Tensor) -> Tensor:
        return x.reshape(*x.shape[:-1], *self.shape)

    def _norm(self, x):
        # svdvals, not the Gram eigenvalues: those lose the σ's below √eps·σ₁ (rank-deficient matrices: 1e-8
        # relative error), and a checked Gram route gained only 10-30% at B ≥ 10 (bench/nuclear_prox.py).
        return torch.linalg.svdvals(self._matrix(x)).sum(-1)

    def _dual_norm(self, x):
        # √λ_max of the Gram matrix would be exact (its largest eigenvalue is relatively accurate) and 30-45%
        # faster at B ≥ 10, but no faster for the one matrix that its only caller (fedbench.reference) passes,
        # once per solve, and it would need the overflow handling of `_singular_value_threshold`.
        return torch.linalg.svdvals(self._matrix(x))[..., 0]

    def _prox(self, x, threshold):
        out = _singular_value_threshold(self._matrix(x), threshold)
        return out.reshape(*out.shape[:-2], x.shape[-1])

    def _project_norm_ball(self, x, radius):
        return project_nuclear_ball(self._matrix(x), radius).reshape(x.shape)

    def _subgradient(self, x):
        # Stays an SVD: the rank decision σ > max(p1, p2)·eps·σ₁ cannot be read off Gram eigenvalues, whose
        # absolute error is eps·σ₁² (bench/nuclear_prox.py measures the Gram polar factor's error).
        u, s, vh = torch.linalg.svd(self._matrix(x), full_matrices=False)
        tol = s[..., :1] * max(self.shape) * torch.finfo(x.dtype).eps
        positive = (s > tol).to(x.dtype)
        return ((u * positive.unsqueeze(-2)) @ vh).reshape(x.shape)


class GroupL2(Regularizer):
    """λ Σ_g ‖w_g‖₂, the non-squared Euclidean norm of each group (the MNIST MLP's h, pFedFBE paper §4.3). A group
    is a list of index blocks (start, end) of the flat vector, so that it may span non-contiguous coordinates
    (all weight matrices of an MLP, with the biases between them left out); coordinates in no group are free.
    prox = block soft-thresholding max(0, 1 − τ/‖v_g‖)·v_g per group (τ = step·λ), exactly 0 when ‖v_g‖ ≤ τ
    (the public pFedFBE code's "l2" prox, `prox_map.py` of github.com/wlsgus3396/pFedFBE, zeroes but never
    scales: not followed);
    subgradient λ w_g/‖w_g‖ (0 at w_g = 0); dual norm max_g ‖g_g‖₂. The base class's `size` is one past the
    last penalized coordinate (every coordinate from there on is free); no ℛ-ball projection."""

    name = "group_l2"

    def __init__(self, lam: float, groups):
        self.groups = [[(int(start), int(end)) for start, end in group] for group in groups]
        if not self.groups or not all(self.groups):
            raise ValueError(f"group_l2: expected a non-empty list of non-empty groups of blocks, found {groups!r}")
        super().__init__(lam, max(end for group in self.groups for _, end in group))

    def group_norms(self, w: Tensor) -> Tensor:
        """‖w_g‖₂ of every group, `[..., d]` -> `[..., G]`."""
        return torch.stack([torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(w[..., start:end], dim=-1) for start, end in group], -1), dim=-1)
            for group in self.groups], -1)

    def _scaled(self, w: Tensor, factors: Tensor, free: float) -> Tensor:
        """w with group g's coordinates multiplied by factors[..., g] and the free ones by `free` (0 or 1)."""
        out = w * free
        for g, group in enumerate(self.groups):
            for start, end in group:
                out[..., start:end] = w[..., start:end] * factors[..., g: g + 1]
        return out

    def value(self, w):
        return self.lam * self.norm(w)

    def norm(self, w):
        return self.group_norms(w).sum(-1)

    def dual_norm(self, g):
        return self.group_norms(g).amax(-1)

    def prox(self, v, step):
        """argmin_w ½‖w − v‖² + step·h(w). `step` is a float or a tensor broadcastable to `[..., 1]`."""
        norms = self.group_norms(v)
        # A zero group has τ/tiny = inf: its factor is 0, and 0 · v_g = 0 (its exact prox).
        threshold = _float_if_one(step) * self.lam
        shrink = (1 - _over(threshold, norms.clamp_min(torch.finfo(v.dtype).tiny))).clamp_min(0.0)
        return self._scaled(v, shrink, 1.0)

    def subgradient(self, w):
        norms = self.group_norms(w)
        direction = torch.where(norms > 0, self.lam / norms.clamp_min(torch.finfo(w.dtype).tiny),
                                torch.zeros_like(norms))
        return self._scaled(w, direction, 0.0)
