"""Deep networks as federated models (`fedbench.networks.module_model`, the `vision` problem): every layout equals an
independent loop written with `torch.nn` and `torch.optim.SGD` on the same draws (FedAvg, FedAdam, SCAFFOLD,
FedProx, Per-FedAvg; on the built-in `cnn` and on Reddi et al.'s EMNIST CNN with its dropout off), batched seeds equal
each seed alone, dropout follows each client's seed, and the layout is chosen, recorded and printed."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import fedbench
from fedbench.algorithms import ALGORITHMS
from fedbench.data import images
from fedbench.engine.federation import Federation
from fedbench.engine.simulate import Simulation, simulate
from fedbench.hparams import ParamError
from fedbench.networks import NETWORKS
from fedbench.networks.module_model import ModuleModel, choose_layout
from fedbench.problems.vision import SmallCNN
from fedbench.rng import generator

SMALL = {"clients": 6, "train_size": 240, "test_size": 60}  # 40 images a client


# Reddi et al.'s EMNIST CNN (`emnist_cnn`, 1,206,590 parameters on FEMNIST's 62 classes) with its dropout off, so
# that a torch.nn loop can follow it draw for draw: its layers and initialisation as shipped, Identity for Dropout
EMNIST_CNN_WITHOUT_DROPOUT = """import torch.nn as nn
from fedbench.networks.convnets import ConvDropoutCNN

class EmnistCNN(ConvDropoutCNN):
    def __init__(self):
        super().__init__((1, 28, 28), 62)
        for i, layer in enumerate(self.layers):
            if isinstance(layer, nn.Dropout):
                self.layers[i] = nn.Identity()
"""
# the step size of the equality tests: at 0.1 the EMNIST CNN on FEMNIST's mostly blank images turns an ulp of
# difference in a step (w − η g as the engine rounds it, torch.optim.SGD's add_ as it does) into 1e-3 in six steps
# (a ReLU or a max-pool tie flips); at 0.03 both stay within float32 rounding of each other
def lr_of(layout):
    return 0.03 if layout.startswith("emnist_cnn") else 0.1


LAYOUTS = ["loop", "vmap", "emnist_cnn-loop", "emnist_cnn-vmap"]


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """A small Fashion-MNIST problem with the built-in `cnn` in each layout (one read of the files each), and
    FEMNIST writers with the EMNIST CNN (dropout off) in each layout, built when a test asks for them."""
    built = {layout: fedbench.make_problem("vision", seed=3, layout=layout, **SMALL) for layout in ("loop", "vmap")}
    nets = tmp_path_factory.mktemp("nets") / "emnist_nets.py"
    nets.write_text(EMNIST_CNN_WITHOUT_DROPOUT)

    class Problems(dict):
        def __missing__(self, key):
            layout = key.removeprefix("emnist_cnn-")
            self[key] = fedbench.make_problem("vision", seed=3, layout=layout, data="femnist", partition="writers",
                                              clients=4, model=f"{nets}:EmnistCNN")
            assert self[key].dim == NETWORKS["emnist_cnn"].parameters == 1_206_590
            return self[key]

    return Problems(built)


def reference_net(problem, w):
    """The problem's network as a plain `nn.Module` holding the flat point `w`."""
    net = problem.model.factory()
    vector_to_parameters(w.clone(), net.parameters())
    return net


def batch_of(problem, rows):
    return problem._features(problem.x_train[rows]), problem.y_train[rows]


def draws(problem, algorithm, federation, seed):
    """The clients and minibatch rows of every round, from a sampler seeded as the engine's."""
    sampler = Simulation(problem, algorithm, federation, seed).sampler
    return [sampler.draw_round(federation.local_steps) for _ in range(federation.rounds)]


def federation(rounds=2, steps=3, batch=8):
    return Federation(rounds=rounds, clients_per_round=3, local_steps=steps, batch_size=batch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fedavg_in_each_layout_equals_a_torch_nn_sgd_loop(problems, layout):
    problem, fed, lr = problems[layout], federation(), lr_of(layout)
    algorithm = ALGORITHMS["fedavg"](problem, client_lr=lr)
    result = simulate(problem, algorithm, fed, seed=5, eval_every=fed.rounds)
    w = problem.init_params(generator(5, "init"))
    for draw in draws(problem, algorithm, fed, 5):
        w = sgd_clients(problem, w, draw, lr).mean(0)
    torch.testing.assert_close(result.params, w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(w, problem.init_params(generator(5, "init")))


def sgd_clients(problem, w, draw, lr):
    """Every client of the round `draw` from `w`: torch.optim.SGD on its minibatches, its last point."""
    uploads = []
    for k in range(len(draw.clients)):
        net = reference_net(problem, w)
        optimizer = torch.optim.SGD(net.parameters(), lr=lr)
        for step_rows in draw.rows["D"][:, k]:
            x, y = batch_of(problem, step_rows)
            optimizer.zero_grad()
            F.cross_entropy(net(x), y).backward()
            optimizer.step()
        uploads.append(parameters_to_vector(net.parameters()).detach())
    return torch.stack(uploads)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fedadam_in_each_layout_equals_a_torch_nn_loop(problems, layout):
    """FedAdam (Reddi et al., ICLR 2021, Algorithm 2): FedAvg's clients, then the server's Adam on the mean update
    Δ_t: m_t = β1 m_{t−1} + (1 − β1) Δ_t, v_t = β2 v_{t−1} + (1 − β2) Δ_t², x ← x + η m_t / (√v_t + τ), with
    m_{−1} = 0, v_{−1} = τ² and no bias correction."""
    # client lr 0.03: at 0.1, m/(√v + τ) near Δ ≈ τ turns the rounding of the cnn's Δ into 4e-4 by round 3
    problem, lr, eta, beta1, beta2, tau = problems[layout], 0.03, 0.03, 0.9, 0.99, 1e-3
    fed = Federation(rounds=3, clients_per_round=3, local_steps=2, batch_size=8,
                     server_optimizer={"name": "adam", "lr": eta, "beta1": beta1, "beta2": beta2, "tau": tau})
    algorithm = ALGORITHMS["fedavg"](problem, client_lr=lr)
    result = simulate(problem, algorithm, fed, seed=4, eval_every=fed.rounds)
    x = problem.init_params(generator(4, "init"))
    m, v = torch.zeros_like(x), torch.full_like(x, tau**2)
    for draw in draws(problem, algorithm, fed, 4):
        delta = (sgd_clients(problem, x, draw, lr) - x).mean(0)
        m = beta1 * m + (1 - beta1) * delta
        v = beta2 * v + (1 - beta2) * delta**2
        x = x + eta * m / (v.sqrt() + tau)
    torch.testing.assert_close(result.params, x, rtol=1e-5, atol=1e-6)
    fedavg = simulate(problem, algorithm, Federation(rounds=3, clients_per_round=3, local_steps=2, batch_size=8),
                      seed=4, eval_every=3)
    assert not torch.allclose(fedavg.params, x, rtol=1e-3, atol=1e-4)  # the server's Adam moved it elsewhere


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scaffold_in_each_layout_equals_a_torch_nn_sgd_loop(problems, layout):
    """Option II (Karimireddy et al., ICML 2020, Algorithm 1 lines 10-17): each SGD step's gradient corrected by
    c − c_i before `optimizer.step()`."""
    # a third of the step: c_i = c_i − c + (x − y_i)/(Kη) divides the rounding of y_i by Kη
    problem, fed, lr = problems[layout], federation(rounds=3), lr_of(layout) / 3
    algorithm = ALGORITHMS["scaffold"](problem, client_lr=lr)
    result = simulate(problem, algorithm, fed, seed=2, eval_every=fed.rounds)
    x = problem.init_params(generator(2, "init"))
    c, c_clients = torch.zeros_like(x), torch.zeros(problem.num_clients, x.numel())
    for draw in draws(problem, algorithm, fed, 2):
        dys, dcs = [], []
        for k, client in enumerate(draw.clients.tolist()):
            net = reference_net(problem, x)
            optimizer = torch.optim.SGD(net.parameters(), lr=lr)
            for step_rows in draw.rows["D"][:, k]:
                inputs, y = batch_of(problem, step_rows)
                optimizer.zero_grad()
                F.cross_entropy(net(inputs), y).backward()
                correction = c - c_clients[client]
                for p, part in zip(net.parameters(), correction.split([p.numel() for p in net.parameters()])):
                    p.grad += part.view_as(p)
                optimizer.step()
            y_k = parameters_to_vector(net.parameters()).detach()
            c_new = c_clients[client] - c + (x - y_k) / (fed.local_steps * lr)
            dys.append(y_k - x)
            dcs.append(c_new - c_clients[client])
            c_clients[client] = c_new
        x = x + torch.stack(dys).mean(0)
        c = c + torch.stack(dcs).sum(0) / problem.num_clients
    torch.testing.assert_close(result.params, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fedprox_in_each_layout_equals_a_torch_nn_sgd_loop_on_its_proximal_problem(problems, layout):
    """Li et al. (MLSys 2020), Algorithm 2: each client takes SGD steps on f_k(w) + μ/2 ‖w − w_t‖² from the global
    w_t (the proximal term's gradient by autograd), the server averages the local models; the global model is what
    a run reports (`vision` evaluates no personal models, so FedProx keeps none)."""
    problem, fed, lr, mu = problems[layout], federation(), lr_of(layout), 0.5
    algorithm = ALGORITHMS["fedprox"](problem, client_lr=lr, prox_mu=mu)
    sim = Simulation(problem, algorithm, fed, seed=5, eval_every=fed.rounds)
    rows = list(sim)
    w = problem.init_params(generator(5, "init"))
    for draw in draws(problem, algorithm, fed, 5):
        uploads = []
        for k in range(len(draw.clients)):
            net = reference_net(problem, w)
            anchor = [p.detach().clone() for p in net.parameters()]
            optimizer = torch.optim.SGD(net.parameters(), lr=lr)
            for step_rows in draw.rows["D"][:, k]:
                x, y = batch_of(problem, step_rows)
                proximal = sum(((p - p_t) ** 2).sum() for p, p_t in zip(net.parameters(), anchor))
                optimizer.zero_grad()
                (F.cross_entropy(net(x), y) + mu / 2 * proximal).backward()
                optimizer.step()
            uploads.append(parameters_to_vector(net.parameters()).detach())
        w = torch.stack(uploads).mean(0)
    torch.testing.assert_close(algorithm.global_params(sim.server), w, rtol=1e-5, atol=1e-6)
    fedavg = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=lr), fed, seed=5, eval_every=fed.rounds)
    assert not torch.allclose(fedavg.params, w, rtol=1e-3, atol=1e-4)  # the pull toward w_t moved it elsewhere
    assert set(rows[-1]) >= {"test_loss", "test_accuracy"} and not any(k.startswith("personal") for k in rows[-1])
    assert sim.clients == {} and sim.personal_params() is None


def test_fedprox_with_zero_mu_is_fedavg_on_a_network(problems):
    problem, fed = problems["loop"], federation(rounds=3)
    prox = simulate(problem, ALGORITHMS["fedprox"](problem, client_lr=0.1, prox_mu=0.0), fed, seed=2, eval_every=1)
    avg = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed=2, eval_every=1)
    # FedAvg's server step w + 1·(mean − w) rounds where FedProx's plain mean does not: equal to float32 rounding
    torch.testing.assert_close(prox.params, avg.params, rtol=1e-5, atol=1e-7)
    assert [row["test_loss"] for row in prox.rows] == pytest.approx([row["test_loss"] for row in avg.rows], rel=1e-5)
    assert prox.personal is None and prox.rows[-1]["test_loss"] < prox.rows[0]["test_loss"]


def nn_gradient(net, x, y, create_graph=False):
    return torch.autograd.grad(F.cross_entropy(net(x), y), list(net.parameters()), create_graph=create_graph)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_fedavg_exact_in_each_layout_equals_a_torch_nn_loop(problems, layout):
    """Fallah et al. (NeurIPS 2020), eq. (8): w̃ = w − α∇f(w; D), v = ∇f(w̃; D′), w ← w − β(v − α∇²f(w; D″)v),
    the Hessian-vector product by double backward through the nn.Module."""
    problem, fed = problems[layout], federation(rounds=2, steps=2, batch=6)
    hp = {"variant": "exact", "alpha": 0.05, "client_lr": lr_of(layout), "inner_batch": 6, "outer_batch": 6,
          "hessian_batch": 6}
    algorithm = ALGORITHMS["per_fedavg"](problem, **hp)
    result = simulate(problem, algorithm, fed, seed=1, eval_every=fed.rounds)
    w = problem.init_params(generator(1, "init"))
    for draw in draws(problem, algorithm, fed, 1):
        uploads = []
        for k in range(len(draw.clients)):
            net = reference_net(problem, w)
            optimizer = torch.optim.SGD(net.parameters(), lr=hp["client_lr"])
            for step in range(fed.local_steps):
                adapted = copy.deepcopy(net)
                for p, g in zip(adapted.parameters(), nn_gradient(net, *batch_of(problem, draw.rows["D"][step, k]))):
                    p.data -= hp["alpha"] * g
                v = nn_gradient(adapted, *batch_of(problem, draw.rows["D1"][step, k]))
                gradient = nn_gradient(net, *batch_of(problem, draw.rows["D2"][step, k]), create_graph=True)
                hv = torch.autograd.grad(sum((g * v_i).sum() for g, v_i in zip(gradient, v)), list(net.parameters()))
                for p, v_i, hv_i in zip(net.parameters(), v, hv):
                    p.grad = v_i - hp["alpha"] * hv_i
                optimizer.step()
            uploads.append(parameters_to_vector(net.parameters()).detach())
        w = torch.stack(uploads).mean(0)
    torch.testing.assert_close(result.params, w, rtol=1e-5, atol=1e-6)


def test_the_layouts_give_the_same_losses_gradients_and_hessian_vector_products(problems):
    loop, vmap = problems["loop"], problems["vmap"]
    rows = torch.arange(40).view(4, 10) * 3
    w = torch.stack([loop.init_params(generator(seed, "init")) for seed in range(4)])
    v = torch.randn(w.shape, generator=torch.Generator().manual_seed(0))
    one, other = loop.step_oracle(rows), vmap.step_oracle(rows)
    torch.testing.assert_close(one.loss(w), other.loss(w), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one.grad(w), other.grad(w), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one.hvp(w, v), other.hvp(w, v), rtol=1e-4, atol=1e-5)
    # client k's gradient is its own network's, alone
    net = reference_net(loop, w[2])
    alone = parameters_to_vector(nn_gradient(net, *batch_of(loop, rows[2])))
    torch.testing.assert_close(one.grad(w)[2], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_the_loop_layouts_gradient_step_is_w_minus_lr_times_its_gradient_bit_for_bit(problems, dropout):
    """`ModuleModel.descend`, the loop layout's step on the CPU (each client's gradient written into its new rows,
    never gathered into `[S, d]`), gives `w - lr * grad(w)` bit for bit: per-client and shared step sizes, a client
    with a short batch (padding rows) and one with none (it keeps its point), dropout's masks, and over the run axis
    (`RunOracle`)."""
    from fedbench.oracle import RunOracle

    problem = problems["loop"] if not dropout else fedbench.make_problem("vision", seed=3, layout="loop",
                                                                         dropout=dropout, **SMALL)
    rows = torch.arange(40).view(4, 10) * 3
    rows[1, 6:], rows[3] = -1, -1
    noise = problem.minibatch_noise(rows, torch.Generator().manual_seed(1)) if dropout else None
    w = torch.stack([problem.init_params(generator(seed, "init")) for seed in range(4)])
    oracle = problem.step_oracle(rows, noise)
    for lr in (torch.tensor([[0.1], [0.2], [0.3], [0.05]]), torch.tensor([[0.1]]), 0.1):
        stepped = oracle.descend(w, lr)
        assert torch.equal(stepped, w - lr * oracle.grad(w))
        assert torch.equal(stepped[3], w[3]) and not torch.equal(stepped[1], w[1])
    runs, lr = RunOracle(oracle, 2, 2), torch.tensor([0.1, 0.3]).view(2, 1, 1)
    assert torch.equal(runs.descend(w.view(2, 2, -1), lr), w.view(2, 2, -1) - lr * runs.grad(w.view(2, 2, -1)))


def test_batched_seeds_equal_each_seed_alone(problems):
    problem = problems["loop"]
    fed = federation(rounds=2)
    batched = fedbench.run_seeds(problem, "fedavg", fed, [0, 1, 2], eval_every=1, client_lr=0.1)
    for seed, rows in zip([0, 1, 2], batched):
        alone = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed=seed, eval_every=1).rows
        assert rows == alone
    assert batched[0] != batched[1]


def test_seeds_of_a_network_form_one_program_on_the_cpu_however_much_a_step_gathers(problems, monkeypatch):
    """A network's step is compute-bound (`Problem.compute_bound_steps`): the CPU's memory-bound rule of linear models
    (a gather above MEMORY_BOUND_RUN_BYTES runs its seeds one after another) does not apply; NIID-Bench's CNN at
    10 clients × b = 64 gathers 2 MB a step and measured 0.97-1.05x alone over batched (`fedbench.engine.planning`)."""
    import fedbench.engine.planning
    from fedbench.engine.planning import groups, step_bytes

    problem, fed = problems["loop"], federation()

    def sims():
        return [Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed, 1) for seed in (0, 1)]

    monkeypatch.setattr(fedbench.engine.planning, "MEMORY_BOUND_RUN_BYTES", step_bytes(sims()[0]) - 1)
    assert groups(sims()) == [[0, 1]]
    monkeypatch.setattr(type(problem), "compute_bound_steps", False)  # a linear model's step: each run alone
    assert groups(sims()) == [[0], [1]]


def test_dropout_masks_follow_each_clients_seed():
    """With dropout, client k's loss in the loop layout depends on its own seed alone (not on the clients beside it);
    the vmap layout draws every client's own masks too, reproducibly; evaluation runs without dropout."""
    model = ModuleModel(lambda: SmallCNN((1, 28, 28), 10, dropout=0.5))
    assert model.has_dropout
    gen = torch.Generator().manual_seed(0)
    w = model.init(gen).expand(3, -1)
    x = torch.randn(3, 5, 1, 28, 28, generator=gen)
    seeds = torch.tensor([11, 12, 13])
    together = model.forward(w, x, "loop", seeds)
    alone = model.forward(w[1:2], x[1:2], "loop", seeds[1:2])
    assert torch.equal(together[1], alone[0])
    assert not torch.equal(model.forward(w, x, "loop", seeds + 1), together)
    same_input = x[:1].expand(3, -1, -1, -1, -1)
    for layout in ("loop", "vmap"):
        masked = model.forward(w, same_input, layout, seeds)
        assert torch.equal(masked, model.forward(w, same_input, layout, seeds))  # reproducible
        assert not torch.equal(masked[0], masked[1])  # every client its own masks
    plain = model.forward(w, same_input, "loop")
    assert torch.equal(plain[0], plain[1])
    torch.testing.assert_close(model.evaluate(w[0], x[0]), model.forward(w[:1], x[:1], "loop")[0])


def test_a_run_with_dropout_gives_the_same_rows_batched_as_alone():
    problem = fedbench.make_problem("vision", seed=0, layout="loop", dropout=0.3, **SMALL)
    assert problem.noisy_minibatches
    fed = federation(rounds=2)
    batched = fedbench.run_seeds(problem, "fedavg", fed, [0, 1], eval_every=1, client_lr=0.1)
    alone = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed=1, eval_every=1).rows
    assert batched[1] == alone
    without = fedbench.make_problem("vision", seed=0, layout="loop", **SMALL)  # the same network but its dropout
    assert simulate(without, ALGORITHMS["fedavg"](without, client_lr=0.1), fed, seed=1, eval_every=1).rows != alone


def test_init_is_the_modules_own_drawn_from_the_run_stream():
    model = ModuleModel(lambda: SmallCNN((1, 28, 28), 10))
    w = model.init(generator(4, "init"))
    assert torch.equal(w, model.init(generator(4, "init")))
    assert not torch.equal(w, model.init(generator(5, "init")))
    seed = int(torch.randint(2**62, (1,), generator=generator(4, "init")))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        assert torch.equal(w, parameters_to_vector(SmallCNN((1, 28, 28), 10).parameters()))
    assert torch.equal(model.flatten(model.unflatten(w)), w)


def test_a_models_state_dict_loads_into_the_module_and_gives_its_outputs(problems):
    problem = problems["loop"]
    w = problem.init_params(generator(0, "init"))
    net = SmallCNN(problem.shape, problem.classes)
    net.load_state_dict(problem.model.state_dict(w))
    x = problem._features(problem.x_test[:7])
    torch.testing.assert_close(net.eval()(x), problem.model.evaluate(w, x))
    assert set(problem.parameters(w)) == set(net.state_dict())


def test_a_shipped_network_by_name():
    problem = fedbench.make_problem("vision", seed=0, model="mcmahan_cnn", **SMALL)
    assert problem.dim == 1_663_370  # McMahan et al. (AISTATS 2017)'s CNN for 28×28 images, 10 classes
    result = fedbench.run("fedavg", problem, rounds=1, clients_per_round=2, local_steps=1, batch_size=4, eval_every=1)
    assert result.status == "finished"


def test_a_model_from_a_file(tmp_path, monkeypatch):
    (tmp_path / "nets.py").write_text("import torch.nn as nn\n\nclass Tiny(nn.Module):\n"
                                      "    def __init__(self):\n        super().__init__()\n"
                                      "        self.fc = nn.Linear(784, 10)\n\n"
                                      "    def forward(self, x):\n        return self.fc(x.flatten(-3))\n")
    monkeypatch.chdir(tmp_path)
    problem = fedbench.make_problem("vision", seed=0, model="nets.py:Tiny", **SMALL)
    assert problem.dim == 7850 and list(problem.parameters(torch.zeros(7850))) == ["fc.weight", "fc.bias"]
    with pytest.raises(ParamError, match="model: network nets.py:Nope: found nothing by that name"):
        fedbench.make_problem("vision", seed=0, model="nets.py:Nope", **SMALL)
    # its source is part of a run's configuration: an edit of the file runs its runs again
    from sweeps.recipe import parse

    def config_hash():
        recipe = parse({"problem": {"name": "vision", "model": "nets.py:Tiny", **SMALL},
                        "federation": {"clients_per_round": 2, "batch_size": 5}, "algorithms": {"fedavg": {}}},
                       "deep.yaml")
        return recipe.trials()[0].config_hash

    before = config_hash()
    (tmp_path / "nets.py").write_text((tmp_path / "nets.py").read_text() + "# edited\n")
    assert config_hash() != before


def test_auto_reads_the_measured_table(monkeypatch, tmp_path):
    table = tmp_path / "deep_layouts.json"
    rows = [{"model": "cnn", "dim": 30000, "device": "cpu", "batch_size": 20, "ratios": {"vmap": 0.9, "loop": 1.1}},
            {"model": "cnn", "dim": 30000, "device": "cpu", "batch_size": 50, "ratios": {"vmap": 1.2, "loop": 1.6}},
            {"model": "cnn", "dim": 35000, "device": "cpu", "batch_size": 20, "ratios": {"vmap": 1.3, "loop": 1.0}}]
    table.write_text(json.dumps({"measured": {}, "rows": rows}))
    monkeypatch.setattr("fedbench.networks.module_model.TABLE", table)
    assert choose_layout("cnn", 30000, "cpu") == "vmap"  # the rows of its size: medians 1.05 and 1.35
    assert choose_layout("cnn", 36000, "cpu") == "loop"  # the same model on other data: another size
    assert choose_layout("other", 31000, "cpu") == "vmap"  # another model of about its size
    assert choose_layout("other", 10**7, "cpu") == "loop"  # none near: the device's default
    assert choose_layout("cnn", 30000, "cuda") == "vmap"


def test_the_layout_is_printed_and_tagged_on_the_run(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from sweeps.cli import app

    path = tmp_path / "deep.yaml"
    path.write_text("problem: {name: vision, clients: 4, train_size: 80, test_size: 20, layout: vmap}\n"
                    "federation: {rounds: 1, clients_per_round: 2, local_steps: 1, batch_size: 5}\n"
                    "algorithms: {fedavg: {client_lr: 0.1}}\n")
    result = CliRunner().invoke(app, ["run", str(path), "--tracking-uri", tracking_uri], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "layout: vmap\n" in result.output
    experiment = MlflowClient(tracking_uri).get_experiment_by_name("deep")
    (run,) = MlflowClient(tracking_uri).search_runs([experiment.experiment_id])
    assert run.data.tags["layout"] == "vmap"


@pytest.mark.parametrize("broken", ["nan", "inf"])
def test_a_model_with_non_finite_outputs_evaluates_to_nan_in_every_metric(broken):
    """Not the share of the class that argmax of NaN (or +inf) logits names, which a diverged run reported as its
    accuracy (0.099 on niid_bench_fmnist's test images: class 0's share)."""
    problem = fedbench.make_problem("vision", seed=0, train_metrics=True, **SMALL)
    w = problem.init_params(generator(0, "init"))
    assert all(np.isfinite(value) for value in problem.evaluate(w * 1e3).values())  # large but finite outputs
    w[-1] = float(broken)  # the last layer's last bias: one class's logit
    row = problem.evaluate(w)
    assert set(row) == {"train_loss", "train_accuracy", "test_loss", "test_accuracy"}
    assert all(np.isnan(value) for value in row.values()), row


def test_a_diverged_run_stores_nan_for_its_loss_and_accuracy(tmp_path, tracking_uri):
    """FedAvg at client lr 20 diverges at round 2: its last row, and MLflow's history of it, are NaN in both metrics
    (MLflow's SQL table holds a NaN as 0 with is_nan set: read raw, `test_loss = 0.0`), and the run is diverged."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from sweeps.cli import app

    path = tmp_path / "diverging.yaml"
    path.write_text("problem: {name: vision, clients: 6, train_size: 240, test_size: 60, layout: loop}\n"
                    "federation: {rounds: 4, clients_per_round: 3, local_steps: 3, batch_size: 8}\n"
                    "algorithms: {fedavg: {client_lr: 20.0}}\neval_every: 1\n")
    result = CliRunner().invoke(app, ["run", str(path), "--tracking-uri", tracking_uri], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "round 2 (diverged)" in result.output, result.output  # `run`: 1 if diverged
    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("diverging").experiment_id])
    assert run.data.tags["status"] == "diverged"
    for metric in ("test_loss", "test_accuracy"):
        history = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
        assert [m.step for m in history] == [0, 1, 2] and np.isnan(history[-1].value), (metric, history)
        assert np.isfinite(history[0].value) and np.isnan(run.data.metrics[metric])


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_resumed_batch_gives_the_rows_of_one_never_stopped(dropout):
    """A program of two seeds stopped after its second round and rebuilt from its checkpoint (the dropout seeds'
    stream included) yields the rows of the program that never stopped, bit for bit."""
    from helpers import build, interrupted, rows_of

    problem = fedbench.make_problem("vision", seed=0, layout="loop", dropout=dropout, **SMALL)
    fed, hp = federation(rounds=3, steps=2), {"client_lr": 0.1}
    expected = rows_of(build(problem, "scaffold", fed, hp, [0, 1]))
    resumed, _ = interrupted(lambda: build(problem, "scaffold", fed, hp, [0, 1]), 2)
    assert resumed == expected


@pytest.mark.parametrize("config, field", [({"clients": 300, "train_size": 200}, "clients"),
                                           ({"clients": 70000}, "clients"),
                                           ({"path": "nowhere"}, "path"),
                                           ({"partition": "dirichlet"}, "alpha"),
                                           ({"partition": "iid", "alpha": 0.5}, "alpha"),
                                           ({"data": "femnist"}, "partition"),
                                           ({"data": "femnist", "partition": "writers", "test_size": 5}, "test_size"),
                                           ({"model": "resnet"}, "model"),
                                           ({"augment": "crop_flip"}, "augment")])
def test_what_validation_refuses_building_refuses(config, field):
    cls = fedbench.PROBLEMS["vision"]
    resolved = cls.resolve_config(config)
    with pytest.raises(ParamError) as refused:
        cls.check(resolved)
        cls.declared_layout(resolved, read_data=True)
        fedbench.make_problem("vision", seed=0, **config)
    assert refused.value.name == field
    with pytest.raises(ParamError, match=rf"\.{field}: "):
        fedbench.make_problem("vision", seed=0, **config)


@pytest.mark.parametrize("partition", [{"partition": "iid"}, {"partition": "dirichlet", "alpha": 0.3},
                                       {"partition": "label_quantity", "classes_per_client": 2, "clients": 10},
                                       {"partition": "shards", "shards_per_client": 2}])
def test_the_split_is_the_partitions_and_validation_draws_the_built_one(partition):
    from fedbench.data import idx
    from fedbench.data.partitions import split

    config = {"clients": 7, "train_size": 300, "test_size": 10, "data_seed": 4, **partition}
    problem = fedbench.make_problem("vision", seed=0, **config)
    assert problem.declared_layout(problem.config, read_data=True).clients == problem.num_clients
    labels = idx.train_labels(problem.folder(problem.config))
    rows, sizes = problem.split(problem.config, labels, 4)
    assert torch.equal(torch.from_numpy(sizes), problem.client_sizes_cpu)
    assert torch.equal(torch.from_numpy(labels[rows]), problem.y_train)
    kept = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator(4, "data")))).permutation(
        len(labels))[:300]
    scheme = {k: v for k, v in partition.items() if k not in ("partition", "clients")}
    parts = split(torch.from_numpy(labels[kept]), problem.num_clients, partition["partition"],
                  generator(4, "partition"), **scheme)
    assert [len(part) for part in parts] == sizes.tolist()


def test_a_network_with_running_statistics_is_refused_at_validate(tmp_path, monkeypatch):
    (tmp_path / "bn.py").write_text("import torch.nn as nn\n\nclass Net(nn.Sequential):\n    def __init__(self):\n"
                                    "        super().__init__(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), "
                                    "nn.Linear(4 * 26 * 26, 10))\n")
    monkeypatch.chdir(tmp_path)
    cls = fedbench.PROBLEMS["vision"]
    with pytest.raises(ParamError, match="model: Net updates buffers in its forward pass: 1.running_mean.*GroupNorm"):
        cls.check(cls.resolve_config({"model": "bn.py:Net"}))


def test_the_exported_model_loads_into_the_module_and_gives_the_runs_last_test_accuracy(problems):
    from fedbench.engine.saved import load_model, model_bytes

    problem = problems["loop"]
    sim = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), federation(rounds=2), seed=0,
                     eval_every=2)
    last = list(sim)[-1]
    net = SmallCNN(problem.shape, problem.classes)
    net.load_state_dict(load_model(model_bytes(sim))["parameters"])
    with torch.no_grad():
        predicted = net.eval()(problem._features(problem.x_test)).argmax(-1)
    assert (predicted == problem.y_test).double().mean().item() == last["test_accuracy"]


@pytest.mark.parametrize("config, shape, classes", [
    ({"data": "cifar10", "clients": 4, "train_size": 80, "test_size": 20}, (3, 32, 32), 10),
    ({"data": "femnist", "partition": "writers", "clients": 4}, (1, 28, 28), 62)])
def test_cifar10_and_femnist_writers_train(config, shape, classes):
    problem = fedbench.make_problem("vision", seed=0, **config)
    assert (problem.shape, problem.classes, problem.num_clients) == (shape, classes, 4)
    assert problem.declared_layout(problem.config, read_data=True).clients == 4
    if config["data"] == "femnist":  # standardised by its kept writers' own statistics
        mean = problem._features(problem.x_train).mean((0, 2, 3))
        torch.testing.assert_close(mean, torch.zeros(shape[0]), atol=1e-4, rtol=0)
    else:  # by CIFAR-10's full training split's (fedbench.data.images)
        assert (problem.pixel_mean, problem.pixel_std) == images.DATASETS["cifar10"][2:]
    result = fedbench.run("fedavg", problem, rounds=1, clients_per_round=2, local_steps=1, batch_size=5, eval_every=1,
                          client_lr=0.1)
    assert 0 <= result.final["test_accuracy"] <= 1 and result.status == "finished"


def test_the_shipped_layout_table_is_measured_and_says_where_it_has_no_gpu_rows():
    from fedbench.networks.module_model import LAYOUTS, TABLE

    table = json.loads(TABLE.read_text())
    assert all(made["command"].startswith("python bench/deep_layouts.py") for made in table["measured"]["cpu"])
    rows = table["rows"]
    assert all(set(row["ratios"]) == set(LAYOUTS) and min(row["ms"].values()) > 0 for row in rows)
    assert {"cnn"} <= {row["model"] for row in rows if row["device"] == "cpu"}
    gpu_rows = any(row["device"] == "cuda" for row in rows)
    assert gpu_rows != ("note" in table["measured"]["cuda"][0])


def test_validation_refuses_a_network_whose_per_client_state_no_machine_holds(tmp_path, monkeypatch):
    """SCAFFOLD keeps a control variate of the network's size per client: 2,000 clients × 20 M float32 parameters
    (160 GB) are refused at problem.clients; FedAvg, which keeps none, is not."""
    from sweeps.recipe import parse
    from sweeps.recipe.grid import machine_memory
    from sweeps.recipe.loading import RecipeError

    assert machine_memory() < 160e9
    (tmp_path / "wide.py").write_text("import torch\nimport torch.nn as nn\n\nclass Wide(nn.Module):\n"
                                      "    def __init__(self):\n        super().__init__()\n"
                                      "        self.w = nn.Parameter(torch.zeros(20_000_000))\n\n"
                                      "    def forward(self, x):\n        return x.flatten(-3)[..., :10] * self.w[:10]\n")
    monkeypatch.chdir(tmp_path)

    def recipe(algorithm):
        return parse({"problem": {"name": "vision", "model": "wide.py:Wide", "clients": 2000, "train_size": 4000},
                      "federation": {"batch_size": 2}, "algorithms": {algorithm: {}}}, "wide.yaml")

    recipe("fedavg").check_builds()
    with pytest.raises(RecipeError, match=r"problem.clients: found 2000: a run needs ~1\d\d GiB"):
        recipe("scaffold").check_builds()


def test_a_client_smaller_than_the_batch_takes_all_its_images():
    problem = fedbench.make_problem("vision", seed=0, clients=6, train_size=120, test_size=10, partition="dirichlet",
                                    alpha=0.05, data_seed=1)
    smallest = int(problem.client_sizes.min())
    assert smallest < 20 and problem.layout().smallest is None
    rows = problem.draw_minibatches(torch.tensor([int(problem.client_sizes.argmin())]), 1, 20, generator(0, "b"))
    assert int((rows >= 0).sum()) == smallest  # every image of it, the rest padding of weight 0
    result = fedbench.run("fedavg", problem, rounds=2, clients_per_round=6, local_steps=2, batch_size=20,
                          eval_every=2, client_lr=0.1)
    assert result.status == "finished"


def test_fashion_mnist_is_read_by_data_images_and_standardised_by_its_full_training_split():
    """The kept images are `fedbench.data.images.load`'s rows of the drawn split, and their features (x/255 − mean)/std
    with Fashion-MNIST's full-split constants (0.2860, 0.3530), not the kept subset's statistics."""
    problem = fedbench.make_problem("vision", seed=3, **SMALL)
    data = images.load("fashion_mnist")
    assert (problem.pixel_mean, problem.pixel_std) == ((0.2860,), (0.3530,)) == (data.mean, data.std)
    rows, _ = problem.split(problem.config, data.y_train.numpy(), problem.data_seed)
    assert torch.equal(problem.x_train, data.x_train[torch.from_numpy(rows)])
    x = problem.x_train[:5]
    torch.testing.assert_close(problem._features(x), (x.double() / 255 - 0.2860).float() / 0.3530)


@pytest.fixture(scope="module")
def small_cifar(tmp_path_factory):
    """A CIFAR-10 folder of five small training batches and a test batch, of random pixels."""
    from fedbench.data import cifar10

    folder, rng = tmp_path_factory.mktemp("cifar"), np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", 12) for i in range(1, 6)), ("test_batch", 10)]:
        pixels, labels = rng.integers(0, 256, (n, cifar10.PIXELS), dtype=np.uint8), rng.integers(0, 10, n)
        np.column_stack([labels.astype(np.uint8), pixels]).tofile(folder / f"{name}.bin")
    return {"data": "cifar10", "path": str(folder), "clients": 3}


def crop_flip_numpy(image, dy, dx, flip, padding=4):
    """He et al. (2016, §4.2): the image zero-padded by 4, its 32×32 window at (dy, dx), mirrored left-right."""
    _, height, width = image.shape
    window = np.pad(image, ((0, 0), (padding, padding), (padding, padding)))[:, dy: dy + height, dx: dx + width]
    return window[:, :, ::-1] if flip else window


def test_augmented_minibatches_are_crop_flip_of_the_stored_images_under_the_drawn_offsets(small_cifar):
    plain = fedbench.make_problem("vision", seed=0, **small_cifar)
    problem = fedbench.make_problem("vision", seed=0, augment="crop_flip", **small_cifar)
    rows = torch.tensor([[0, 3, 5, 7, 1], [20, 21, 22, 23, 24], [40, 41, 42, 43, -1]])
    assert not plain.noisy_minibatches and plain.minibatch_noise(rows, generator(7, "feature-noise")) is None
    assert problem.noisy_minibatches
    noise = problem.minibatch_noise(rows, generator(7, "feature-noise"))
    # one (dy, dx, flip) per row on the run's stream, in the rows' order
    assert torch.equal(noise, images.crop_flip_draws((rows.numel(),), generator(7, "feature-noise"), 4))
    assert {int(v) for v in noise[:, 2]} == {0, 1} and int(noise[:, :2].max()) <= 8
    x, y, weight = problem.gather(rows, noise.view(*rows.shape, 3))
    stored = problem.x_train[rows.clamp_min(0)].numpy()
    expected = np.stack([[crop_flip_numpy(image, *map(int, draw)) for image, draw in zip(client, draws)]
                         for client, draws in zip(stored, noise.view(*rows.shape, 3))])
    torch.testing.assert_close(x, problem._features(torch.from_numpy(expected)))
    plain_batch = plain.gather(rows)
    assert torch.equal(y, plain_batch[1]) and torch.equal(weight, plain_batch[2])
    assert not torch.equal(x, plain_batch[0])
    # the step's oracle trains on the augmented images; the full-data oracle and evaluation on the stored ones
    w = problem.init_params(generator(0, "init")).expand(3, -1)
    torch.testing.assert_close(problem.step_oracle(rows, noise).loss(w), problem.loss(w, (x, y, weight)))
    torch.testing.assert_close(problem.step_oracle(rows).loss(w), plain.step_oracle(rows).loss(w))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_an_augmented_run_gives_the_same_rows_batched_as_alone(small_cifar, dropout):
    problem = fedbench.make_problem("vision", seed=0, augment="crop_flip", dropout=dropout, **small_cifar)
    fed = Federation(rounds=2, clients_per_round=2, local_steps=2, batch_size=4)
    batched = fedbench.run_seeds(problem, "fedavg", fed, [0, 1], eval_every=1, client_lr=0.1)
    alone = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed=1, eval_every=1).rows
    assert batched[1] == alone and batched[0] != batched[1]
    plain = fedbench.make_problem("vision", seed=0, dropout=dropout, **small_cifar)
    assert simulate(plain, ALGORITHMS["fedavg"](plain, client_lr=0.1), fed, seed=1, eval_every=1).rows != alone


@pytest.mark.parametrize("settings", [[], ["problem.partition=iid", "problem.alpha=null"],
                                      ["problem.partition=label_quantity", "problem.alpha=null",
                                       "problem.classes_per_client=2"]])
def test_the_niid_bench_recipe_validates_in_each_of_its_label_skews(settings):
    """recipes/papers/niid_bench_fmnist.yaml as shipped (Dirichlet β = 0.5) and with its header's --set lines for
    IID and #C = 2 (Li et al., ICDE 2022, §V): NIID-Bench's CNN over 10 parties, all in every round; FedAvg, FedProx
    (its global model's metrics) and SCAFFOLD."""
    from pathlib import Path

    from typer.testing import CliRunner

    from sweeps.cli import app
    from sweeps.recipe import load

    path = str(Path(__file__).resolve().parents[2] / "recipes/papers/niid_bench_fmnist.yaml")
    assert all(f"--set {setting}" in Path(path).read_text() for setting in settings)  # as its header says
    result = CliRunner().invoke(app, ["validate", path, *[arg for s in settings for arg in ("--set", s)]])
    assert result.exit_code == 0 and ": ok — " in result.output, result.output
    trials = load(path, settings).trials()
    config = trials[0].problem_config
    assert (config["model"], config["clients"]) == ("niid_cnn_mnist", 10)
    assert [trial.algorithm for trial in trials] == ["fedavg", "fedprox", "scaffold"]
    (fedprox,) = [trial for trial in trials if trial.algorithm == "fedprox"]  # the global model's metrics alone
    assert {"test_loss", "test_accuracy"} <= {m.name for m in fedprox.metrics()}
    assert not any(m.name.startswith("personal_") for m in fedprox.metrics())
    assert config["partition"] == (settings[0].split("=")[1] if settings else "dirichlet")


@pytest.mark.parametrize("layout, dropout", [("loop", 0.5), ("vmap", 0.0)])
def test_a_client_without_rows_weighs_nothing_and_the_others_are_theirs_alone(layout, dropout):
    """A step past a client's epoch (`local_steps: {epochs: E}`) gives it only padding rows: its loss and gradient
    are zeros (the loop layout on the CPU skips its network) and every other client's are those of the clients
    without it, in the loop layout with dropout too (each client's masks from its own seed; vmap's one draw
    depends on the clients drawn together)."""
    problem = fedbench.make_problem("vision", seed=3, layout=layout, dropout=dropout, **SMALL)
    rows = torch.arange(30).view(3, 10) * 4
    rows[1] = -1
    rows[2, 6:] = -1  # a short last batch
    w = torch.stack([problem.init_params(generator(seed, "init")) for seed in range(3)])
    noise = problem.minibatch_noise(rows, generator(0, "feature-noise"))
    oracle = problem.step_oracle(rows, noise)
    loss, grad = oracle.loss(w), oracle.grad(w)
    assert loss[1] == 0 and not grad[1].any()
    kept = torch.tensor([0, 2])
    others = problem.step_oracle(rows[kept], None if noise is None else noise.view(3, 10, -1)[kept].flatten(0, 1))
    torch.testing.assert_close(loss[kept], others.loss(w[kept]), rtol=1e-6, atol=0)
    torch.testing.assert_close(grad[kept], others.grad(w[kept]), rtol=1e-6, atol=1e-9)


def test_a_loop_step_past_a_clients_epoch_copies_no_point_builds_no_zero_subgradient_nor_stack_traces():
    """The loop layout's FedAvg step on the CPU, some clients past their epoch: the finished clients' points are
    neither gathered nor put back each step (a client's rows are copied out of the round's working state once, as it
    leaves it: at most one `[.., d]` index copy per client, and no `[S, d]` torch.where), h = 0 adds no zero
    subgradient (no `[S, d]` zeros_like) and dropout's seeding formats no stack trace (`torch.manual_seed` queues one
    per call for the GPUs CUDA has not started): the per-step work that made a round of Reddi et al.'s EMNIST CNN
    1.35x the plain torch loop (bench/emnist_round.py)."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    problem = fedbench.make_problem("vision", seed=0, layout="loop", dropout=0.5, data="femnist", partition="writers",
                                    clients=6)
    fed = Federation(rounds=2, clients_per_round=4, local_steps={"epochs": 1}, batch_size=20, aggregation="samples")
    sim = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=0.1), fed, seed=0, compile="off")
    sizes = problem.client_sizes_cpu
    assert int(sizes.min()) + 20 <= int(sizes.max())  # writers whose epochs end at different steps
    calls = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as ops:
        calls.runcall(sim.run_round)
    d = problem.dim
    point_sized = [event.name for event in ops.events()
                   if event.name in ("aten::index", "aten::zeros_like", "aten::where")
                   and any(shape[-1:] == [d] and len(shape) > 1 for shape in event.input_shapes)]
    assert point_sized.count("aten::index") < fed.clients_per_round  # as the slots that finish first leave
    assert [name for name in point_sized if name != "aten::index"] == []
    formatted = [fn for fn in pstats.Stats(calls).stats if fn[2] == "format_stack"]
    assert formatted == []
