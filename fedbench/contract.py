"""What an algorithm needs from a problem, and what a problem provides (benchopt's declared contracts).

An algorithm declares `requires` (and may add to it from its hyperparameters, `Algorithm.requirements`);
a problem declares `provides` (and may add to it from its configuration, `Problem.capabilities`). A pairing
whose requirements are not all provided is refused before anything runs, naming the capability.
Every problem gives minibatch losses and gradients; the capabilities are what goes beyond that.
"""
from __future__ import annotations

CAPABILITIES = {
    "hvp": "Hessian-vector products of the minibatch loss",
    "exact_hvp": "a closed-form Hessian-vector product (quadratic losses)",
    "full_data": "each client's loss and gradient over its whole local training data",
    "personal_evaluation": "metrics of per-client (personal) models on each client's own data",
    "pair_scores": "X-risk pair oracles: positive/negative scores, a pair loss and its outer function",
    "linear_outer": "an X-risk whose outer function f is linear (AUC with a pairwise surrogate)",
    "norm_ball": "a norm regularizer h = λ·ℛ whose λ can change and whose ℛ-ball has a projection",
    "one_client": "all training data on one client (a centralized reference, e.g. pauc with pooled: true)",
    "global_evaluation": "metrics of one global model alone (every problem but those whose objective has "
                         "per-device blocks)",
    "block_objective": "an objective F(w, β) = (1/M) Σ f_m(w, β_m) with a global block and a block per device: "
                       "block gradients, and the constants μ, 𝓛^w, 𝓛^β of its parameter rules",
    "mixture": "the mixture objective (9)/(10)/(11) of Hanzely et al. (TMLR 2023, §2.4) with its penalty λ (mx2)",
    "linear_model": "a loss of a linear model's outputs: a sample's gradient is its residual (∂ℓ/∂outputs, k "
                    "numbers) times its features, so that SAGA tables can store the residuals",
}
"""Every capability by name, with what it means: the names `Algorithm.requires` and `Problem.provides` use."""


class IncompatibleError(ValueError):
    """An algorithm was paired with a problem that lacks a capability it requires: the message names both and
    the capability; `detail` says what the capability is and what the problem provides instead."""

    def __init__(self, message: str, detail: str = ""):  # the default: unpickled (from a Ray worker) it has args only
        super().__init__(message)
        self.detail = detail


def check(algorithm: str, required: set[str], problem: str, provided: set[str]) -> None:
    """Raise IncompatibleError naming the first missing capability."""
    unknown = sorted((required | provided) - set(CAPABILITIES))
    if unknown:  # a declaration's typo, not a user error
        raise KeyError(f"undeclared capability {unknown[0]!r}; known: {', '.join(CAPABILITIES)}")
    missing = sorted(required - provided)
    if missing:
        has = ", ".join(sorted(provided)) or "none beyond minibatch gradients"
        raise IncompatibleError(f"{algorithm} requires {missing[0]}, which problem {problem} does not provide here",
                                f"{missing[0]}: {CAPABILITIES[missing[0]]}; {problem} provides here: {has}")
