"""A fedbench plugin package: the federated least-squares problem `quadratic` (exact objective gap), registered
through this package's entry points (see pyproject.toml), and recipes that compare FedAvg and SCAFFOLD with
FedAdam and FedYogi on it (fedbench's `federation.server_optimizer`, Reddi et al., ICLR 2021, Algorithm 2)."""
