"""Flower's simulation of FedAvg on FEMNIST's writers with Reddi et al.'s EMNIST CNN, one local epoch (ICLR 2021,
§5): the peer that `bench/emnist_round.py` times against fedbench's round. Runs in its own venv
(`bash bench/peers/setup_flower.sh`: Flower with its simulation extra, Ray, the CPU torch), never in fedbench's.

Flower's current Message API as its PyTorch quickstart writes it: a `ServerApp` whose strategy is
`flwr.serverapp.strategy.FedAvg` (the mean of the clients' models weighted by their "num-examples", no server-side
evaluation, no client evaluation; the data file, lr and b in its train config), a module-level `ClientApp` whose
`train` loads the global model into the network, takes one epoch of `torch.optim.SGD` (lr 0.1) over its writer's
training images in a `DataLoader` (batches of b = 20 in a fresh shuffled order, the last one short; dropout on) and
returns the model; run by `flwr.simulation.run_simulation` on the Ray backend: N supernodes (one per writer),
`--cpus` Ray CPUs, each client actor 1 CPU and 1 torch thread, the actors at the priority (niceness) of the process
that runs this script (Ray's default makes them 15 nicer). Ray's workers import this file as a module, so that an
actor reads the writers once and keeps them, as a Flower app's module-level cache does (a ClientApp defined in
`__main__` travels by value with every message, and read the data anew for every client: 5x slower rounds).

The network is fedbench's `ConvDropoutCNN` (the `emnist_cnn` of `fedbench.networks`, 1,206,590 parameters), loaded
from its file `fedbench/networks/convnets.py` alone (no fedbench import, none of its dependencies). The data are the
npz fedbench reads (`femnist/femnist_sample10.npz` or `femnist_full.npz`): a writer's training images (those not
flagged `is_test`), ink = 255 − pixel, standardised by the mean and standard deviation of every kept writer's
training pixels, as fedbench's `vision` problem does.

Sampling: without `--plan`, each round 10 supernodes drawn by the strategy (`fraction_train` = S/N), each training
the writer of its partition id. With `--plan FILE` (JSON: `{"rounds": [[writer, ...], ...], "warm_up": W}`, as
`bench/emnist_round.py` writes it), round r's messages name the writers of the plan's round r, one per sampled
supernode: the rounds train the same writers as the fedbench rounds they are compared with. Each round's time runs
from the strategy's `configure_train` to the end of its `aggregate_train` (sending the model, the clients' training,
the replies, the weighted mean); the first W rounds (actors starting, the data read) are left out.

Usage: bench/peers/.venv-flower/bin/python bench/peers/flower_emnist.py --data FEMNIST.npz [--rounds 5]
       [--plan plan.json] [--cpus 1] [--out times.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

CONVNETS = Path(__file__).resolve().parents[2] / "fedbench" / "networks" / "convnets.py"
SHAPE, CLASSES = (1, 28, 28), 62


def network() -> torch.nn.Module:
    """fedbench's EMNIST CNN (`emnist_cnn`), built from its file alone."""
    spec = importlib.util.spec_from_file_location("fedbench_convnets", CONVNETS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ConvDropoutCNN(SHAPE, CLASSES)


def writers(path: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each writer's training images `[n_k, 1, 28, 28]` (ink, standardised over all of them) and labels."""
    with np.load(path) as archive:
        x, y, offsets, is_test = (archive[key] for key in ("x", "y", "writer_offsets", "is_test"))
    train = ~is_test
    ink = (255 - x[train].reshape(-1, *SHAPE)).astype(np.float32) / 255
    mean = float(ink.mean(dtype=np.float64))
    std = float(np.sqrt(max(float((ink.astype(np.float64) ** 2).mean()) - mean * mean, 0.0)))
    ends = np.cumsum([train[a:b].sum() for a, b in zip(offsets[:-1], offsets[1:])])
    images = torch.from_numpy((ink - mean) / std)
    labels = torch.from_numpy(y[train].astype(np.int64))
    starts = np.concatenate([[0], ends[:-1]])
    kept = [k for k in range(len(ends)) if ends[k] > starts[k]]  # fedbench keeps writers with a training image
    return [images[starts[k]:ends[k]] for k in kept], [labels[starts[k]:ends[k]] for k in kept]


class TimedFedAvg(FedAvg):
    """FedAvg that records each round's seconds, and (with a plan) sends each sampled node the writer to train."""

    def __init__(self, plan: list[list[int]] | None, **kwargs):
        super().__init__(**kwargs)
        self.plan, self.started, self.seconds = plan, 0.0, []

    def configure_train(self, server_round, arrays, config, grid):
        self.started = time.perf_counter()
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self.plan is None:
            return messages
        chosen = self.plan[server_round - 1]
        assert len(chosen) == len(messages), "the plan's round has as many writers as clients a round"
        return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "writer": writer})}),
                        dst_node_id=message.metadata.dst_node_id, message_type=message.metadata.message_type)
                for writer, message in zip(chosen, messages)]

    def aggregate_train(self, server_round, replies):
        aggregated = super().aggregate_train(server_round, replies)
        self.seconds.append(time.perf_counter() - self.started)
        return aggregated


# The ClientApp at module level, as a Flower app writes it: Ray's workers import this module (by reference), so that
# an actor reads the writers once (`LOADED`), at its first message, and keeps them for the next ones
client_app = ClientApp()
LOADED: dict = {}


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One epoch of SGD over the writer's training images (the message's config: the data file, the writer where a
    plan names it, lr, b); the model and its number of examples back."""
    torch.set_num_threads(1)
    config = msg.content["config"]
    if LOADED.get("data") != config["data"]:
        LOADED["x"], LOADED["y"] = writers(str(config["data"]))
        LOADED["net"], LOADED["data"] = network(), config["data"]
    writer = int(config["writer"]) if "writer" in config else int(context.node_config["partition-id"])
    net = LOADED["net"]
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=float(config["lr"]))
    dataset = torch.utils.data.TensorDataset(LOADED["x"][writer], LOADED["y"][writer])
    for x, y in torch.utils.data.DataLoader(dataset, batch_size=int(config["batch-size"]), shuffle=True):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(dataset)})})
    return Message(content=content, reply_to=msg)


def server(args, plan: list[list[int]] | None, clients: int) -> tuple[ServerApp, TimedFedAvg]:
    strategy = TimedFedAvg(plan, fraction_train=args.clients / clients, fraction_evaluate=0.0,
                           min_train_nodes=args.clients, min_available_nodes=args.clients)
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(0)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(network().state_dict()),
                       train_config=ConfigRecord({"data": str(Path(args.data).resolve()), "lr": args.lr,
                                                  "batch-size": args.batch_size}),
                       num_rounds=len(plan) if plan is not None else args.rounds + args.warm_up)

    return server_app, strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="FEMNIST npz (femnist_sample10.npz or femnist_full.npz)")
    parser.add_argument("--plan", type=Path, help="JSON of each round's writers and the warm-up rounds")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (without a plan)")
    parser.add_argument("--warm-up", type=int, default=1, help="untimed first rounds (without a plan)")
    parser.add_argument("--clients", type=int, default=10, help="S, clients a round")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--cpus", type=int, default=1, help="Ray's CPUs: as many client actors, 1 CPU each")
    parser.add_argument("--out", type=Path, help="write {seconds, ...} here as JSON")
    args = parser.parse_args()
    with np.load(args.data) as archive:
        offsets, is_test = archive["writer_offsets"], archive["is_test"]
    clients = sum(int((~is_test[a:b]).sum()) > 0 for a, b in zip(offsets[:-1], offsets[1:]))
    plan, warm_up = None, args.warm_up
    if args.plan is not None:
        given = json.loads(args.plan.read_text())
        plan, warm_up = given["rounds"], given["warm_up"]
    server_app, strategy = server(args, plan, clients)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": args.cpus, "num_gpus": 0, "include_dashboard": False,
                             "object_store_memory": 2 * 10**9}}
    # Ray starts its workers `worker_niceness` (15) nicer than the process that starts it: 0 runs the clients'
    # training at this process's priority, as fedbench's runs in its own
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=clients, backend_config=backend)
    import flwr
    import ray
    timed = strategy.seconds[warm_up:]
    result = {"seconds": timed, "warm_up_seconds": strategy.seconds[:warm_up], "clients": clients,
              "flwr": flwr.__version__, "ray": ray.__version__, "torch": torch.__version__, "cpus": args.cpus}
    print(f"Flower {flwr.__version__} (Ray {ray.__version__}), {clients} supernodes, {args.cpus} CPU(s): "
          f"{len(timed)} rounds, median {statistics.median(timed) if timed else math.nan:.3f} s a round", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    import flower_emnist  # this file as the module Ray's workers import, so that its ClientApp is pickled by reference

    flower_emnist.main()
