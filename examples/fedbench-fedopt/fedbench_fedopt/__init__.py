"""fedbench plugins: FedAdam and FedYogi (Reddi et al., ICLR 2021, Algorithm 2) and the federated least-squares
problem `quadratic`, registered through this package's entry points (see pyproject.toml)."""
