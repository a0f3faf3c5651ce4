"""The engine: a run's federation and random draws (`federation`), the rules it is checked by when built
(`checks`), its record (`record`), and the programs that advance R runs × S clients as one set of tensors, round by
round (`round_wise`, with `links`, `server_steps`, `narrowed_steps`, `run_axis`) or iteration by iteration
(`iteration_wise`), planned (`planning`), compiled where measured faster (`compiling`), run (`runs`, `simulate`)
and saved (`saved`).

`fedbench`'s top level re-exports what a script needs (`fedbench.run`, `run_seeds`, `Federation`, ...); the
modules at the top of the package (`hparams`, `rng`, `prox`, `metrics`, `schedules`, `contract`, `oracle`, ...) are
the foundations a plugin imports, below everything here.
"""
