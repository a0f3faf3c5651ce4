"""Nuclear-norm prox (singular value thresholding) and the other SVD uses of `fedbench/prox.py`, for batches
of small matrices: exact options timed against `torch.linalg.svd`, and their accuracy measured.

SVT: prox_{t‖·‖_*}(X) = U diag(max(s − t, 0)) Vᵀ, timed for B in (1, 10, 100) matrices of 32×32 (the low-rank
matrix estimation of Bao, Crawshaw, Luo, Liu, ICML 2022, §4, Fig. 2: S = 10 clients, 1 at the server), 64×64 and
32×48, float64. Options:

  svd        (a) torch.linalg.svd(full_matrices=False), the implementation before this bench (the reference);
  gram       (b) eigh of the smaller Gram matrix XᵀX: s = √eig, P = (X V) diag(max(1 − t/s, 0)) Vᵀ, no check;
  embed      eigh of the symmetric (p1+p2)² embedding [[0, X], [Xᵀ, 0]] (eigenvalues ±s, backward stable in s);
  numpy_svd  numpy.linalg.svd (numpy's own LAPACK, OpenBLAS in the wheels) on the same memory, CPU only;
  fedbench   `fedbench.prox` as it is now: (b) where its a-posteriori error estimate eps·s₁²/(t‖P‖_F) is below
             1e-11, the SVD for the other matrices (batches of ≥ 4 float64 matrices on the CPU; else the SVD).

For each: the time per matrix (median over interleaved repetitions; the machine is shared, so read the
ratios to `svd`, measured in the same run), and the largest relative error ‖P − P_svd‖_F/‖P_svd‖_F over test
matrices (Gaussian, scaled by 1e±6, rank 16 exact and + 1e-8 noise, diag(1_16) + noise as the problem's truth,
singular values log-spaced down to 1e-12, clustered within 1e-9, zero columns) and thresholds (t = 0, t/s₁
from 1e-12 to 0.5, t at and between singular values, t > s₁). That error is taken over the well-posed cases,
‖P‖_F ≥ 1e-6 s₁: in the others (t inside the 1e-9 cluster) the float64 SVD itself is off by ~eps·s₁/‖P‖_F, up
to 1e-6, as every option is. With --exact, the errors are also measured, over all cases, against the true
prox of each float64 test matrix (a 40-digit SVD by mpmath; a few minutes). `numpy_svd`'s error is the
reference's own noise floor.

Then the same for the nuclear norm (svdvals, which fedbench keeps; Σ√eig of the Gram matrix, without and with
an a-posteriori check; the embedding's eigenvalues) and the dual (spectral) norm (svdvals, kept, vs √ of the
Gram matrix's largest eigenvalue), the projection onto the nuclear ball, and the subgradient's polar factor
(fedbench keeps the SVD). The accuracy tests run the fedbench options on batches. Finally, end to
end, `fedbench.engine.simulate` on the bao2022 low-rank problem (recipes/papers/bao2022_lowrank.yaml's
hyperparameters) with the old SVD code monkeypatched back into `Nuclear` versus the current code, alternated
in the same process.

Usage: OMP_NUM_THREADS=1 python bench/nuclear_prox.py [--device cpu] [--repeats 7] [--rounds 50]
       [--threads 1] [--skip-e2e] [--exact]
(LAPACK on small matrices gains nothing from threads, and spinning OpenMP threads on a shared machine make the
timings erratic: the default is one thread.)
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import fedbench
import fedbench.prox as prox
from fedbench.engine.simulate import Federation, simulate
from fedbench.prox import Nuclear, project_l1_ball

D = torch.float64
EPS = torch.finfo(D).eps


# -- the options -------------------------------------------------------------------------------------------------

def svt_svd(x, t):
    """(a), and the code of `Nuclear._prox` before this change."""
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    return (u * (s - t).clamp_min(0.0).unsqueeze(-2)) @ vh


def svt_gram(x, t):
    if x.shape[-2] < x.shape[-1]:
        return svt_gram(x.mT, t).mT
    lam, v = torch.linalg.eigh(x.mT @ x)
    s = lam.clamp_min(0.0).sqrt()
    f = 1 - (t / s.clamp_min(torch.finfo(D).tiny)).clamp(max=1.0)  # max(s − t, 0)/s; 1 when t = 0
    return ((x @ v) * f.unsqueeze(-2)) @ v.mT


def svt_embed(x, t):
    p1, p2 = x.shape[-2:]
    h = x.new_zeros(*x.shape[:-2], p1 + p2, p1 + p2)
    h[..., :p1, p1:] = x
    h[..., p1:, :p1] = x.mT
    lam, q = torch.linalg.eigh(h)  # pairs ±s with vectors [u; ±v]/√2; odd φ(λ) = sign(λ)·max(|λ| − t, 0)
    phi = lam.sign() * (lam.abs() - t).clamp_min(0.0)
    return (q[..., :p1, :] * phi.unsqueeze(-2)) @ q[..., p1:, :].mT


def svt_numpy(x, t):
    u, s, vh = np.linalg.svd(x.numpy(), full_matrices=False)
    tt = t.numpy() if isinstance(t, torch.Tensor) else t
    return torch.from_numpy((u * np.maximum(s - tt, 0.0)[..., None, :]) @ vh)


def svt_fedbench(x, t):
    return prox._singular_value_threshold(x, t)


PROX_OPTIONS = {"svd": svt_svd, "gram": svt_gram, "embed": svt_embed, "numpy_svd": svt_numpy,
                "fedbench": svt_fedbench}


def norm_svdvals(x):
    return torch.linalg.svdvals(x).sum(-1)


def norm_gram(x):
    g = x.mT @ x if x.shape[-2] >= x.shape[-1] else x @ x.mT
    return torch.linalg.eigvalsh(g).clamp_min(0.0).sqrt().sum(-1)


def norm_embed(x):
    p1, p2 = x.shape[-2:]
    h = x.new_zeros(*x.shape[:-2], p1 + p2, p1 + p2)
    h[..., :p1, p1:] = x
    h[..., p1:, :p1] = x.mT
    return torch.linalg.eigvalsh(h).abs().sum(-1) / 2


def norm_gram_checked(x):
    """Σ√eig of the Gram matrix where that is exact, else svdvals: each eigenvalue is off by δ ≈ eps·s1², so
    each s by at most min(√δ, δ/s); matrices where those bounds add up to more than 1e-11·Σs take svdvals."""
    g = x.mT @ x if x.shape[-2] >= x.shape[-1] else x @ x.mT
    lam = torch.linalg.eigvalsh(g)
    s = lam.clamp_min(0.0).sqrt()
    total = s.sum(-1)
    delta = EPS * lam[..., -1:] + 2.0 ** -1000
    ok = torch.minimum(delta.sqrt(), delta / s).sum(-1) <= 1e-11 * total
    if not bool(ok.all()):
        total[~ok] = torch.linalg.svdvals(x[~ok]).sum(-1)
    return total


def dual_svdvals(x):
    return torch.linalg.svdvals(x)[..., 0]


def dual_gram(x):
    """√ of the Gram matrix's largest eigenvalue, which eigh computes to ~eps relative."""
    g = x.mT @ x if x.shape[-2] >= x.shape[-1] else x @ x.mT
    return torch.linalg.eigvalsh(g)[..., -1].sqrt()


NORM_OPTIONS = {"norm svdvals": norm_svdvals, "norm gram": norm_gram, "norm gram+check": norm_gram_checked,
                "norm embed": norm_embed, "dual svdvals": dual_svdvals, "dual gram": dual_gram}


def project_svd(a, radius):
    """`project_nuclear_ball` before this change."""
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return (u * project_l1_ball(s, radius).unsqueeze(-2)) @ vh


def subgradient_svd(x):
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    positive = (s > s[..., :1] * max(x.shape[-2:]) * EPS).to(x.dtype)
    return (u * positive.unsqueeze(-2)) @ vh


def subgradient_gram(x):
    """The polar factor X V diag(1/s) Vᵀ over the s above the SVD's rank tolerance, from the Gram matrix."""
    lam, v = torch.linalg.eigh(x.mT @ x)
    s = lam.clamp_min(0.0).sqrt()
    inv = torch.where(s > s[..., -1:] * max(x.shape[-2:]) * EPS, 1 / s.clamp_min(torch.finfo(D).tiny), 0.0)
    return ((x @ v) * inv.unsqueeze(-2)) @ v.mT


# -- test matrices -------------------------------------------------------------------------------------------------

def orthonormal(n, k, gen):
    q, r = torch.linalg.qr(torch.randn(n, k, dtype=D, generator=gen))
    return q * r.diagonal().sign()


def with_singular_values(s, p1, p2, gen):
    k = len(s)
    return (orthonormal(p1, k, gen) * s) @ orthonormal(p2, k, gen).T


def test_matrices(p1, p2, gen):
    k, r = min(p1, p2), min(p1, p2) // 2
    randn = lambda *shape: torch.randn(*shape, dtype=D, generator=gen)  # noqa: E731
    truth = torch.zeros(p1, p2, dtype=D)
    truth.diagonal()[:r] = 1.0
    low = randn(p1, r) @ randn(r, p2)
    return {
        "gaussian": randn(p1, p2),
        "gaussian*1e6": randn(p1, p2) * 1e6,
        "gaussian*1e-6": randn(p1, p2) * 1e-6,
        "rank k/2": low,
        "rank k/2 + 1e-8": low + 1e-8 * randn(p1, p2),
        "diag(1_k/2) + 1e-8": truth + 1e-8 * randn(p1, p2),
        "diag(1_k/2) + 1e-3": truth + 1e-3 * randn(p1, p2),
        "s = logspace(0, -12)": with_singular_values(torch.logspace(0, -12, k, dtype=D), p1, p2, gen),
        "s = logspace(0, -4)": with_singular_values(torch.logspace(0, -4, k, dtype=D), p1, p2, gen),
        "s = 1 + 1e-9 i": with_singular_values(1 + 1e-9 * torch.arange(k, dtype=D), p1, p2, gen),
        "3 zero columns": torch.cat([randn(p1, p2 - 3), torch.zeros(p1, 3, dtype=D)], 1),
    }


def thresholds(x):
    s = torch.linalg.svdvals(x)
    k = len(s)
    out = {"t = 0": 0.0}
    out.update({f"t = {c:g} s1": c * s[0].item() for c in (1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.5)})
    for i in (1, k // 4, k // 2 - 1, k // 2, 3 * k // 4, k - 1):
        out[f"t = s{i + 1}"] = s[i].item()
        out[f"t = s{i + 1}(1 + 1e-9)"] = s[i].item() * (1 + 1e-9)
        if i + 1 < k:
            out[f"t = (s{i + 1} + s{i + 2})/2"] = (s[i] + s[i + 1]).item() / 2
    out["t = 1.1 s1"] = 1.1 * s[0].item()
    return out


def rel_error(p, ref, x):
    scale = ref.norm() if ref.norm() > 0 else x.norm()
    return ((p - ref).norm() / scale).item() if scale > 0 else (p - ref).norm().item()


# -- timing ----------------------------------------------------------------------------------------------------------

def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, calls, device):
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - start) / calls


def interleaved(fns: dict, repeats: int, calls: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of every function, `repeats` times, the order rotated each time."""
    for fn in fns.values():  # warm-up
        fn()
    names = list(fns)
    out = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            out[name].append(timed(fns[name], calls, device))
    return out


def ratio_to(times, name, base):
    return statistics.median(a / b for a, b in zip(times[name], times[base]))


def cells(times, name, base):
    """µs per matrix and the ratio to `base`, for every batch size."""
    return "".join(f"{statistics.median(times[b][name]) / b * 1e6:11.1f} ({ratio_to(times[b], name, base):4.2f}x)"
                   for b in BATCHES)


# -- sections --------------------------------------------------------------------------------------------------------

SHAPES = ((32, 32), (64, 64), (32, 48))
BATCHES = (1, 10, 100)


def mp_svd(x):
    """U, s, V of x to 40 digits (mpmath), U and V rounded to float64, s kept exact."""
    import mpmath
    mpmath.mp.dps = 40
    u, s, vt = mpmath.svd_r(mpmath.matrix(x.tolist()), full_matrices=False)

    def to_torch(m):
        return torch.tensor([[float(m[i, j]) for j in range(m.cols)] for i in range(m.rows)], dtype=D)
    return to_torch(u), [s[i] for i in range(len(s))], to_torch(vt)


def exact_svt(usv, t):
    """The true prox of the float64 matrix, to ~eps relative: max(s − t, 0) formed in 40 digits, then rounded."""
    import mpmath
    u, s, vt = usv
    d = torch.tensor([float(max(si - mpmath.mpf(t), 0)) for si in s], dtype=D)
    return (u * d) @ vt


def prox_section(device, repeats, exact):
    gen = torch.Generator().manual_seed(0)
    options = {k: v for k, v in PROX_OPTIONS.items() if not (k == "numpy_svd" and device != "cpu")}
    print("\n== SVT prox: time per matrix [µs] (ratio to svd); max relative error over the test set, vs svd"
          + (" and vs a 40-digit SVD (mpmath)" if exact else "") + " ==")
    redone = [0]
    by_svd = prox._svt_by_svd

    def counting(a, threshold):  # counts the matrices fedbench's check sends back to the SVD
        redone[0] += a.shape[:-2].numel()
        return by_svd(a, threshold)

    for p1, p2 in SHAPES:
        worst = {name: (0.0, "") for name in options}
        worst_exact = {name: (0.0, "") for name in options}
        total = ill_posed = 0
        prox._svt_by_svd = counting
        try:
            for mname, x in test_matrices(p1, p2, gen).items():
                usv = mp_svd(x) if exact else None
                ts = thresholds(x)
                # all thresholds at once: a batch of copies of x with a [T, 1] threshold (fedbench takes the
                # Gram route for batches of 4 matrices or more only)
                xs, tt = x.expand(len(ts), p1, p2).contiguous(), torch.tensor(list(ts.values()), dtype=D)[:, None]
                results = {name: fn(xs.to(device), tt.to(device)).cpu() for name, fn in options.items()}
                for i, (tname, t) in enumerate(ts.items()):
                    ref = results["svd"][i]
                    true = exact_svt(usv, t) if exact else None
                    total += 1
                    # ill-posed: ‖P‖ so small that the SVD's own error, ~eps·s1/‖P‖, exceeds ~1e-10
                    well_posed = ref.norm() >= 1e-6 * torch.linalg.matrix_norm(x, 2)
                    ill_posed += int(not well_posed)
                    for name in options:
                        p = results[name][i]
                        for table, against in ((worst, ref if well_posed else None), (worst_exact, true)):
                            if against is not None:
                                err = rel_error(p, against, x)
                                if err > table[name][0]:
                                    table[name] = (err, f"{mname}, {tname}")
        finally:
            prox._svt_by_svd = by_svd
        # timing: Gaussian matrices, t = 1 (~0.1 s1; the low-rank runs have t/s1 from 1e-5 to 0.05)
        times = {}
        for b in BATCHES:
            x = torch.randn(b, p1, p2, dtype=D, generator=gen).to(device)
            times[b] = interleaved({name: (lambda fn=fn: fn(x, 1.0)) for name, fn in options.items()},
                                   repeats, max(3, 300 // b), device)
        print(f"\n{p1}x{p2}: {total} (matrix, t) test cases, {ill_posed} ill-posed (‖P‖_F < 1e-6 s1); "
              f"fedbench's check sent {redone[0]} to the SVD")
        redone[0] = 0
        print(f"  {'option':10s}" + "".join(f"{'B=' + str(b):>21s}" for b in BATCHES)
              + "   max rel. error vs svd, well-posed cases (worst)"
              + ("  | vs 40 digits, all cases (worst)" if exact else ""))
        for name in options:
            line = f"  {name:10s}{cells(times, name, 'svd')}   {worst[name][0]:.1e} ({worst[name][1]})"
            if exact:
                line += f"  | {worst_exact[name][0]:.1e} ({worst_exact[name][1]})"
            print(line)


def norm_section(device, repeats):
    gen = torch.Generator().manual_seed(1)
    print("\n== nuclear norm and dual (spectral) norm: time per matrix [µs] (ratio to svdvals), max relative error ==")
    for p1, p2 in SHAPES:
        mats = test_matrices(p1, p2, gen)
        worst = {}
        for name, fn in NORM_OPTIONS.items():
            ref = norm_svdvals if name.startswith("norm") else dual_svdvals
            errs = {m: abs(fn(x.to(device)).item() - ref(x).item()) / ref(x).item() for m, x in mats.items()}
            worst[name] = max(errs.items(), key=lambda kv: kv[1])
        times = {}
        for b in BATCHES:
            x = torch.randn(b, p1, p2, dtype=D, generator=gen).to(device)
            times[b] = interleaved({name: (lambda fn=fn: fn(x)) for name, fn in NORM_OPTIONS.items()},
                                   repeats, max(3, 300 // b), device)
        print(f"\n{p1}x{p2}:")
        for name in NORM_OPTIONS:
            base = "norm svdvals" if name.startswith("norm") else "dual svdvals"
            print(f"  {name:14s}{cells(times, name, base)}   {worst[name][1]:.1e} ({worst[name][0]})")


def projection_and_subgradient_section(device, repeats):
    gen = torch.Generator().manual_seed(2)
    print("\n== projection onto the nuclear ball (svd: the old project_nuclear_ball) and subgradient polar factor ==")
    for p1, p2 in SHAPES:
        mats = test_matrices(p1, p2, gen)
        worst_p, worst_s = (0.0, ""), (0.0, "")
        for m, x in mats.items():
            nuc = torch.linalg.svdvals(x).sum().item()
            for factor in (0.01, 0.1, 0.5, 0.99, 1.5):
                ref = project_svd(x, factor * nuc)
                batch = x.expand(4, p1, p2).to(device)  # a batch, for the Gram route
                err = rel_error(prox.project_nuclear_ball(batch, factor * nuc)[0].cpu(), ref, x)
                if err > worst_p[0]:
                    worst_p = (err, f"{m}, radius {factor} ‖X‖_*")
            err = rel_error(subgradient_gram(x), subgradient_svd(x), x)
            if err > worst_s[0]:
                worst_s = (err, m)
        times = {}
        for b in BATCHES:
            x = torch.randn(b, p1, p2, dtype=D, generator=gen).to(device)
            radius = 0.5 * torch.linalg.svdvals(x[0]).sum().item()
            times[b] = interleaved({"svd": lambda: project_svd(x, radius),
                                    "fedbench": lambda: prox.project_nuclear_ball(x, radius),
                                    "subgradient svd": lambda: subgradient_svd(x),
                                    "subgradient gram": lambda: subgradient_gram(x)},
                                   repeats, max(3, 300 // b), device)
        print(f"\n{p1}x{p2}: projection fedbench max rel. error {worst_p[0]:.1e} ({worst_p[1]}); "
              f"subgradient gram max rel. error {worst_s[0]:.1e} ({worst_s[1]})")
        for name, base in (("svd", "svd"), ("fedbench", "svd"), ("subgradient svd", "subgradient svd"),
                           ("subgradient gram", "subgradient svd")):
            print(f"  {name:17s}{cells(times, name, base)}")


# -- end to end ------------------------------------------------------------------------------------------------------

RECIPE = {  # recipes/papers/bao2022_lowrank.yaml
    "fedmid": {"client_lr": 1e-3, "server_lr": 1.0, "server_threshold": "bao"},
    "fedda": {"client_lr": 1e-3, "server_lr": 1.0, "offset": "bao"},
    "fast_fedda": {"mu": 0.1, "gamma": 550, "local_order": "prox_then_grad"},
    # its first stage only, in a short run: λ 0.3 and the ball of radius 5000 (a `norm` every step)
    "mc_fedda": {"mu": 0.1, "gamma": 600, "gamma_convention": "code", "local_order": "prox_then_grad",
                 "stage_rounds": [250, 250, 1000], "stage_lams": [0.3, 0.15, 0.1], "stage_radii": [5000, 2500, 1250]},
}


def old_prox(self, x, threshold):
    return svt_svd(self._matrix(x), threshold).reshape(x.shape)


def old_project(self, x, radius):
    return project_svd(self._matrix(x), radius).reshape(x.shape)


def e2e_section(device, repeats, rounds):
    print(f"\n== end to end: simulate, lowrank bao2022, Federation({rounds}, 10, 10, 10), eval_every 10 ==")
    problem = fedbench.make_problem("lowrank", preset="bao2022", seed=0, device=device)
    new = (Nuclear._prox, Nuclear._project_norm_ball)
    old = (old_prox, old_project)

    def run(name, impl):
        Nuclear._prox, Nuclear._project_norm_ball = impl
        try:
            algorithm = fedbench.make_algorithm(name, problem, **RECIPE[name])
            sync(device)
            start = time.perf_counter()
            result = simulate(problem, algorithm, Federation(rounds, 10, 10, 10), seed=0, eval_every=10)
            sync(device)
            return time.perf_counter() - start, result
        finally:
            Nuclear._prox, Nuclear._project_norm_ball = new

    for name in RECIPE:
        times = {"old (svd)": [], "new": []}
        results = {}
        for rep in range(repeats):
            order = [("old (svd)", old), ("new", new)][:: 1 if rep % 2 == 0 else -1]
            for label, impl in order:
                seconds, results[label] = run(name, impl)
                times[label].append(seconds)
        ratio = statistics.median(a / b for a, b in zip(times["old (svd)"], times["new"]))
        a, b = results["old (svd)"].final, results["new"].final
        diff = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-300) for k in ("objective", "fro_error", "op_error"))
        old_s, new_s = statistics.median(times["old (svd)"]), statistics.median(times["new"])
        print(f"  {name:10s} old {old_s:6.2f} s  new {new_s:6.2f} s  old/new {ratio:4.2f}x   final metrics max rel. "
              f"diff {diff:.1e}, rank {a['rank']:.0f} vs {b['rank']:.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=50, help="rounds of the end-to-end runs")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--exact", action="store_true",
                        help="also measure the SVT errors against 40-digit SVDs (mpmath; a few minutes)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} thread(s), "
          f"repeats {args.repeats}")
    prox_section(args.device, args.repeats, args.exact)
    norm_section(args.device, args.repeats)
    projection_and_subgradient_section(args.device, args.repeats)
    if not args.skip_e2e:
        e2e_section(args.device, max(3, args.repeats // 2), args.rounds)


if __name__ == "__main__":
    main()
