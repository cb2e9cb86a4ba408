"""Where the torch backend's workers keep their tensors (the CPU under gloo, one GPU per worker under NCCL)
and how `rpeg-run --backend torch` chooses the distributed backend.

CPU only, on purpose: CI has no GPU. The CUDA path is checked through what can be checked without one:
the device choice for every launcher environment, the one-line errors when NCCL cannot work, NCCL's
receive order in the pipeline link, and the worker's own code run on the `meta` device, a second device
that, like CUDA, refuses to mix with CPU tensors, so a tensor created without the worker's device makes
those tests fail. An explicit CPU device gives exactly the single-process results.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.runtime import cli as run_cli  # noqa: E402
from rpegc.runtime.backends.base import BackendError  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.parallel import pipeline  # noqa: E402
from rpegc.runtime.backends.torch.channel.commands import Op  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import model_seed  # noqa: E402
from rpegc.runtime.backends.torch.controller.pool import WorkerPool  # noqa: E402
from rpegc.runtime.backends.torch.controller.device import (choose_dist_backend, plan_dist_backend,  # noqa: E402
                                                            rank_and_world, to_cpu, worker_device)
from rpegc.runtime.backends.torch.model.generation import expand_rollouts, generate  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout, replica_rows  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import NetOptions, build_model  # noqa: E402
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, ProcessGroups  # noqa: E402
from rpegc.runtime.backends.torch.parallel.pipeline import StageLink  # noqa: E402
from rpegc.runtime.backends.torch.parallel.schedules import infer, train_step  # noqa: E402
from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import Experience, response_forward  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import ModelSpec, Worker, WorkerSetup  # noqa: E402
from fixtures.programs import compile_example  # noqa: E402

CPU, META = torch.device("cpu"), torch.device("meta")
ARCH = lookup("tiny")
B, LP, LR, MB = 4, 4, 5, 2
SINGLE = Layout((0,), 1, 1, 1)


# ---------------------------------------------------------------------------------------------------
# The device choice


def test_gloo_workers_are_on_the_cpu_whatever_the_launcher_says():
    for env in ({}, {"LOCAL_RANK": "1"}, {"SLURM_LOCALID": "2"}):
        assert worker_device("gloo", 3, env, device_count=8) == CPU


@pytest.mark.parametrize("env, rank, expected", [
    ({"LOCAL_RANK": "2"}, 7, 2),                        # torchrun
    ({"SLURM_LOCALID": "1"}, 5, 1),                     # srun
    ({"LOCAL_RANK": "3", "SLURM_LOCALID": "0"}, 3, 3),  # torchrun inside a Slurm allocation: torchrun's wins
    ({}, 5, 1),                                         # the local launcher: rank modulo the 4 GPUs
    ({"LOCAL_RANK": ""}, 2, 2),                         # an empty variable counts as unset
])
def test_nccl_workers_take_their_local_gpu(env, rank, expected):
    assert worker_device("nccl", rank, env, device_count=4) == torch.device("cuda", expected)


def test_nccl_without_a_gpu_of_its_own_is_a_user_error():
    with pytest.raises(RpegError, match="needs a CUDA device, but torch sees none"):
        worker_device("nccl", 0, {}, device_count=0)
    with pytest.raises(RpegError, match="local rank 4 has no GPU of its own"):
        worker_device("nccl", 4, {"LOCAL_RANK": "4"}, device_count=4)
    with pytest.raises(RpegError, match="LOCAL_RANK='x1' is not an integer"):
        worker_device("nccl", 0, {"LOCAL_RANK": "x1"}, device_count=4)


def test_rank_and_world_come_from_torchrun_or_slurm():
    assert rank_and_world({"RANK": "3", "WORLD_SIZE": "8"}) == (3, 8)
    assert rank_and_world({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert rank_and_world({"RANK": "5", "SLURM_PROCID": "0", "WORLD_SIZE": "8", "SLURM_NTASKS": "2"}) == (5, 8)
    assert rank_and_world({}) == (-1, 0)


def test_auto_takes_nccl_only_when_every_worker_here_gets_a_gpu():
    assert choose_dist_backend("auto", 4, 0) == "gloo"
    assert choose_dist_backend("auto", 4, 2) == "gloo"
    assert choose_dist_backend("auto", 4, 4) == "nccl"
    assert choose_dist_backend("gloo", 4, 8) == "gloo"
    assert choose_dist_backend("nccl", 4, 8) == "nccl"
    assert choose_dist_backend("nccl", None, 0) == "nccl"  # external workers check their own nodes
    with pytest.raises(RpegError, match="needs CUDA devices, but torch sees none"):
        choose_dist_backend("nccl", 4, 0)
    with pytest.raises(RpegError, match="starts 4 workers on this host but torch sees 2"):
        choose_dist_backend("nccl", 4, 2)


def test_exports_reach_nested_tensors_and_copy_nothing_that_is_on_the_cpu_already():
    a, rng = torch.ones(2), torch.zeros(1, dtype=torch.uint8)
    out = to_cpu({"w": {"a": a}, "rng": [rng], "step": (3, a)})
    assert out["w"]["a"] is a and out["rng"][0] is rng and out["step"][0] == 3 and out["step"][1] is a
    assert isinstance(out["rng"], list) and isinstance(out["step"], tuple)


# ---------------------------------------------------------------------------------------------------
# rpeg-run


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("plans") / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    return out


@pytest.fixture
def launches(monkeypatch):
    """Worker launches attempted (none may happen when the backend is refused)."""
    calls: list = []
    monkeypatch.setattr(WorkerPool, "launch", lambda self, *a: calls.append(a))
    return calls


@pytest.mark.parametrize("gpus, message", [
    (0, "rpeg-run: error: --dist-backend nccl needs CUDA devices, but torch sees none on this host"),
    (2, "rpeg-run: error: --dist-backend nccl runs one worker per GPU: the plan starts 4 workers on this host "
        "but torch sees 2 CUDA device(s)"),
])
def test_rpeg_run_refuses_nccl_without_enough_gpus_in_one_line(plan_file, launches, monkeypatch, capsys, tmp_path,
                                                               gpus, message):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000001.pt").write_bytes(b"kept")
    code = run_cli.main([plan_file, "--backend", "torch", "--dist-backend", "nccl", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [err.strip()] and err.startswith(message), err
    assert "Traceback" not in err
    assert launches == []
    assert (run_dir / "checkpoints" / "step-000001.pt").exists()  # refused before the run dir is touched


def test_rpeg_run_auto_picks_gloo_without_gpus_and_nccl_with_one_per_worker(plan_file, monkeypatch):
    plan = load_plan(plan_file)
    backend = run_cli.make_backend(run_cli._parser().parse_args([plan_file, "--backend", "torch"]))
    assert backend.dist_backend == "auto"
    for gpus, expected in ((0, "gloo"), (len(plan.devices) - 1, "gloo"), (len(plan.devices), "nccl")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda g=gpus: g)
        assert plan_dist_backend(plan, backend.dist_backend, backend.launcher) == expected


def test_the_trace_header_records_the_workers_launched_here_their_cores_and_the_dist_backend(plan_file, monkeypatch):
    from rpegc.runtime.backends.sim import SimBackend
    from rpegc.runtime.backends.torch.controller import backend as torch_backend

    monkeypatch.setattr(torch_backend, "host_cores", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    plan = load_plan(plan_file)
    local = run_cli.make_backend(run_cli._parser().parse_args([plan_file, "--backend", "torch"]))
    facts = local.header_options(plan)
    assert (facts["local_workers"], facts["host_cores"], facts["dist_backend"]) == (len(plan.devices), 2, "gloo")
    assert {"rl", "reward", "data"} <= set(facts)
    external = TorchBackend(seed=0, launcher="external", store="127.0.0.1:1")
    assert external.header_options(plan)["local_workers"] == 0
    assert SimBackend().header_options(plan) == {}


def test_an_external_nccl_worker_without_a_gpu_says_so_and_the_run_stops(plan_file, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    secret = str(tmp_path / "secret")
    env = dict(os.environ, RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", CUDA_VISIBLE_DEVICES="", RPEG_RUN_SECRET_FILE=secret)
    worker = subprocess.Popen([sys.executable, "-m", "rpegc.runtime.backends.torch.worker.process", "--store", address],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        backend = TorchBackend(seed=0, tp_impl="torch", launcher="external", store=address, dist_backend="nccl",
                               secret_file=secret)
        with pytest.raises(BackendError, match="worker 0 .*failed in setup: the nccl backend needs a CUDA device, but "
                                               "torch sees none on this node"):
            run(load_plan(plan_file), backend)
        assert worker.wait(timeout=60) == 1, worker.stderr.read()[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()


def test_an_unknown_distributed_backend_is_a_user_error():
    with pytest.raises(RpegError, match="unknown distributed backend 'mpi'"):
        TorchBackend(dist_backend="mpi")


# ---------------------------------------------------------------------------------------------------
# The pipeline link under NCCL


def test_nccl_links_post_receives_only_when_awaited(monkeypatch):
    posted: list = []

    class Work:
        def wait(self):
            return None

    monkeypatch.setattr(pipeline.dist, "irecv", lambda x, src, group=None, tag=0: posted.append(tag) or Work())
    for backend, ahead in (("gloo", [pipeline.ACTIVATION]), ("nccl", [])):
        monkeypatch.setattr(pipeline.dist, "get_backend", lambda group=None, b=backend: b)
        posted.clear()
        link = StageLink(SimpleNamespace(pp_group=object(), device=CPU), microbatches=2)
        link.expect((2, 3), torch.float32, 0, pipeline.ACTIVATION, (0,))
        assert posted == ahead, backend  # gloo matches by tag: post ahead; NCCL matches in order: wait
        assert link.recv((2, 3), torch.float32, 0, pipeline.ACTIVATION, (0,)).shape == (2, 3)
        assert posted == [pipeline.ACTIVATION], backend


# ---------------------------------------------------------------------------------------------------
# The worker's code on a device given explicitly


def _net() -> NetOptions:
    return NetOptions(max_seq=LP + LR, positions="learned")


def _run_config() -> RunConfig:
    return RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=B, R=2, Lp=LP, Lr=LR, dtype="fp32"),
                     rl=toy_rl_config("grpo"), positions="learned")


def _worker(device) -> Worker:
    models = {"actor": ModelSpec("actor", "policy", ARCH, model_seed(0, "policy")),
              "ref": ModelSpec("ref", "reference", ARCH, model_seed(0, "reference"))}
    setup = WorkerSetup(world=1, seed=0, run=_run_config(), models=models, layouts=(), tp_impl="torch",
                        t0=time.time(), timeout_s=60.0)
    worker = Worker(setup, 0, device=device)
    for m in models:
        worker.install(f"W:{m}", m, SINGLE)
    return worker


def _op(role: str, model: str, fields: list[str]) -> Op:
    rows = replica_rows(SINGLE, 0, B * 2)
    return Op(node=role, tag=0, ranks=list(SINGLE.ranks), step=0, role=role, model=model, layout=SINGLE, mb=MB,
              rows=rows, weights=f"W:{model}", inputs=["rollouts"], outputs={"out": fields}, fields=fields, prep=[],
              output=None, version_out=None)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_stage_module_keeps_every_tensor_on_its_device(positions):
    net = NetOptions(max_seq=LP + LR, positions=positions)
    pm = ParallelModel(ARCH, "policy", net, SINGLE, 0, ProcessGroups(()), "torch", device=META)
    assert {t.device for t in list(pm.module.parameters()) + list(pm.module.buffers())} == {META}
    tokens = torch.zeros(3, LP, dtype=torch.int64, device=META)
    cache = pm.new_cache(3, LP + LR)
    link = StageLink(pm, 1)
    _, prefill = pm.stage_forward(link, (0, 0), (3, LP), tokens, cache)
    _, decoded = pm.stage_forward(link, (1, 0), (3, 1), tokens[:, :1], cache)  # attends to the cached positions
    link.close()
    assert prefill.device == decoded.device == META and decoded.shape == (3, 1, ARCH.hidden)
    assert cache.length == LP + 1 and {k.device for k in cache.keys} == {META}
    seqs = torch.zeros(3, LP + LR, dtype=torch.int64, device=META)
    out = infer(pm, [lambda v: response_forward(v, seqs, LP).logprobs], [3])
    assert out.device == META and out.shape == (3, LR)


def test_a_training_step_keeps_activations_and_gradients_on_the_device():
    cfg = _run_config()
    pm = ParallelModel(ARCH, "policy", _net(), SINGLE, 0, ProcessGroups(()), "torch", device=META)
    rows = {f: torch.zeros(B, LR, device=META) for f in ("mask", "old_logprobs", "ref_logprobs")}
    exp = Experience(sequences=torch.zeros(B, LP + LR, dtype=torch.int64, device=META), scores=torch.zeros(B, device=META),
                     **rows)
    seen: dict = {}

    class Stop(Exception):
        """Adam's step and the statistics read values, which meta tensors do not have: stop before them."""

    class Recorder:
        """Stands for the master weights: sees the gradients the step hands to the optimizer."""

        def step(self, rl, sq_total):
            seen["grads"] = {p.grad.device for p in pm.module.parameters()}
            raise Stop

    with pytest.raises(Stop):
        train_step(pm, Recorder(), lambda v, e: (response_forward(v, e.sequences, LP).logprobs.sum(), {}), exp, MB,
                   cfg.rl, ())
    assert seen == {"grads": {META}}


def test_an_explicit_cpu_device_gives_the_single_process_results():
    cfg, worker = _run_config(), _worker(CPU)
    assert worker.device == CPU and _worker(None).device == CPU  # gloo's default
    worker.execute(_op("generation", "actor", ["sequences", "mask", "old_logprobs"]))
    got = worker.entry("out").pieces[0].fields
    model = build_model(ARCH, "policy", model_seed(0, "policy"), cfg.net)
    prompts = expand_rollouts(worker.operators.inputs.prompts.prompts(B, 0, 0), 2)
    rolls = [generate(model, prompts[a:b], range(a, b), seed=0, step=0, max_new_tokens=LR,
                      sampling=cfg.rl.sampling) for a, b in ((0, B), (B, 2 * B))]
    assert torch.equal(got["sequences"], torch.cat([r.sequences for r in rolls]))
    assert torch.equal(got["mask"], torch.cat([r.mask for r in rolls]))
    assert torch.equal(got["old_logprobs"], torch.cat([r.logprobs for r in rolls]))
    worker.holdings.entries["rollouts"] = worker.holdings.entries.pop("out")
    worker.execute(_op("inference", "ref", ["ref_logprobs"]))
    ref = build_model(ARCH, "reference", model_seed(0, "reference"), cfg.net)
    with torch.no_grad():
        want = torch.cat([response_forward(ref, got["sequences"][a:b], LP, cfg.rl.temperature).logprobs
                          for a, b in ((0, B), (B, 2 * B))])
    assert torch.equal(worker.entry("out").pieces[0].fields["ref_logprobs"], want)


def test_a_worker_on_another_device_installs_computes_and_exports_there():
    worker = _worker(META)
    assert {t.device for t in worker.entry("W:ref").shards.values()} == {META}
    assert worker.transfers.empty("mask", 3).device == META
    seqs = torch.zeros(2 * B, LP + LR, dtype=torch.int64, device=META)
    worker.put_rows("rollouts", 0, 2 * B, {"sequences": seqs, "mask": worker.transfers.empty("mask", 2 * B)})
    worker.execute(_op("inference", "ref", ["ref_logprobs"]))
    out = worker.entry("out").pieces[0].fields["ref_logprobs"]
    assert out.device == META and out.shape == (2 * B, LR)
    pm, _ = worker.operators.serving_model("ref", SINGLE, "W:ref")
    assert {p.device for p in pm.module.parameters()} == {META}
