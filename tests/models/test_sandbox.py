"""User models in model worker processes (models/sandbox/): the same answers as in process,
the sandbox seen from outside (/proc), hostile files that the sandbox stops with the upload
checks switched off, native crashes, memory and time limits, restarts. Real processes."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.adapters.user import _torchscript, register
from models.base import Model, weights_hash
from models.declaration import Declaration, InvalidModelError
from models.sandbox import (
    ModelWorkerError,
    configure,
    current_config,
    sandboxed_facts,
    sandboxed_register,
)
from models.sandbox.proxy import WorkerModule, worker_group
from tests.byom_models import lightgbm_model, sklearn_onnx, xgboost_model
from tests.sandbox_models import (
    Hungry,
    Reader,
    Slow,
    Writer,
    form,
    mlp,
    poisoned_xgboost,
    scripted_bytes,
    truncated_lightgbm,
)


def declaration(fields: dict[str, str], fmt: str) -> Declaration:
    return Declaration(
        fields["name"],
        fields["modality"],
        fields["task"],
        tuple(json.loads(fields["input_shape"])),
        tuple(json.loads(fields["output_names"])),
        tuple(json.loads(fields["feature_names"])),
        format=fmt,
    )


@pytest.fixture()
def unchecked() -> Iterator[None]:
    """The upload checks off in the workers: what they would refuse meets the sandbox."""
    before = current_config()
    configure(replace(before, skip_file_checks=True))
    yield
    configure(before)


def _pid(model: Model) -> int:
    group = worker_group(model)
    assert group is not None
    pids = group.pids()
    assert len(pids) == 1
    return int(pids[0])


def _input_grads(model: Model, x: np.ndarray) -> np.ndarray:
    xt = torch.tensor(x, requires_grad=True)
    (grad,) = torch.autograd.grad(model.torch_module()(xt)[:, 1].sum(), xt)
    return grad.numpy()


def test_torchscript_matches_in_process_predict_gradients_and_weight_steps() -> None:
    data, decl = scripted_bytes(mlp(3)), declaration(form("sandbox-mlp"), "torchscript")
    local, meta = register(decl, {"model": data})
    remote, meta2 = sandboxed_register(decl, {"model": data})
    assert isinstance(remote.torch_module(), WorkerModule) and remote.differentiable
    assert remote.version == local.version == meta["version"] == meta2["version"]
    assert remote.row_bytes > 0 and remote.grad_row_bytes > 0  # measured in the worker
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    np.testing.assert_allclose(remote.predict(x), local.predict(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(_input_grads(remote, x), _input_grads(local, x), atol=1e-6)
    # A copy's weights (UNI's unlearning step, Salvage's fine-tuning) travel with its calls.
    before = weights_hash(remote.torch_module())
    twins = [copy.deepcopy(m.torch_module()) for m in (local, remote)]
    xt = torch.tensor(x[:4])
    for twin in twins:
        params = [p for p in twin.parameters() if p.requires_grad]
        grads = torch.autograd.grad(twin(xt)[:, 0].log().sum(), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.add_(g, alpha=0.5)
    with torch.no_grad():
        moved = [twin(xt).numpy() for twin in twins]
    np.testing.assert_allclose(moved[1], moved[0], atol=1e-6)
    assert not np.allclose(moved[1], remote.predict(x[:4]), atol=1e-4)  # the copy did move
    assert weights_hash(remote.torch_module()) == before  # and the model did not


@pytest.mark.parametrize("make", [xgboost_model, lightgbm_model], ids=["xgboost", "lightgbm"])
def test_boosters_match_in_process(make: object) -> None:
    um = make()  # type: ignore[operator]
    fmt = "xgboost" if make is xgboost_model else "lightgbm"
    decl = declaration(um.form, fmt)
    local, _ = register(decl, {"model": um.file})
    remote, _ = sandboxed_register(decl, {"model": um.file})
    x, bg = um.rows[:8], um.background[:16]
    assert remote.tree is not None and local.tree is not None
    assert remote.tree.library == local.tree.library and remote.tree.link == local.tree.link
    np.testing.assert_allclose(remote.predict(x), local.predict(x), rtol=1e-6)
    np.testing.assert_allclose(remote.tree.margin(x), local.tree.margin(x), rtol=1e-12)
    np.testing.assert_allclose(remote.tree.contributions(x), local.tree.contributions(x))
    a, b = remote.tree.interactions(x), local.tree.interactions(x)
    assert (a is None) == (b is None)
    if a is not None:
        np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(
        remote.tree.interventional_values(x, bg), local.tree.interventional_values(x, bg)
    )
    assert remote.tree.why_not_interventional(True) == local.tree.why_not_interventional(True)


def test_onnx_matches_in_process_and_facts_read_in_a_worker() -> None:
    um = sklearn_onnx("sandbox-onnx")
    assert sandboxed_facts("onnx", um.file).input_shape == (6,)
    decl = declaration(um.form, "onnx")
    local, _ = register(decl, {"model": um.file})
    remote, _ = sandboxed_register(decl, {"model": um.file})
    np.testing.assert_allclose(remote.predict(um.rows), local.predict(um.rows), rtol=1e-6)


def test_the_worker_is_isolated_as_seen_from_outside() -> None:
    """/proc of the live worker: user nobody, its own empty network namespace, a deleted
    empty directory as its root, the memory, file-size and core limits."""
    model, _ = sandboxed_register(declaration(form("sandbox-proc"), "torchscript"),
                                  {"model": scripted_bytes(mlp())})  # fmt: skip
    pid = _pid(model)
    status = Path(f"/proc/{pid}/status").read_text()
    uid = next(line for line in status.splitlines() if line.startswith("Uid:"))
    assert uid.split()[1:] == ["65534"] * 4
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    devices = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    assert [d.split(":")[0].strip() for d in devices] == ["lo"]
    assert os.readlink(f"/proc/{pid}/root").endswith("(deleted)")
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert f"Max address space         {current_config().memory_mb << 20}" in limits
    assert "Max file size             0" in limits and "Max core file size        0" in limits
    assert model.info["sandbox"]["network"] == "isolated"
    # the system call filter (models/sandbox/seccomp.py) is loaded in the live worker
    assert model.info["sandbox"]["syscalls"].startswith("on:"), model.info["sandbox"]
    status = Path(f"/proc/{pid}/status").read_text()
    assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status
    # no descriptor it inherited leads anywhere but its connection to the server (the server's
    # stdout, the zygote's pipes, onnxruntime's database were open in it before)
    targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert sorted(set(targets) - {"/dev/null"})[0].startswith("socket:"), targets
    assert len(set(targets) - {"/dev/null"}) == 1, targets
    environ = Path(f"/proc/{pid}/environ").read_bytes()  # the zygote got the server's
    assert b"PATH=" in Path("/proc/self/environ").read_bytes()
    assert b"PATH=" not in environ and not environ.strip(b"\0")  # wiped in the worker


def test_a_module_cannot_write_a_host_file(tmp_path: Path, unchecked: None) -> None:
    victim, control = tmp_path / "victim", tmp_path / "control"
    for path in (victim, control):
        path.write_bytes(b"original bytes")
        path.chmod(0o666)  # even a world-writable file
    decl = declaration(form("sandbox-writer"), "torchscript")
    with pytest.raises(InvalidModelError, match=r"test forward pass .* unable to open file"):
        sandboxed_register(decl, {"model": scripted_bytes(Writer(str(victim)))})
    assert victim.read_bytes() == b"original bytes"
    # The same module in process (its operator check off) does overwrite the file.
    local = _torchscript(decl, scripted_bytes(Writer(str(control))), "v", check_operators=False)
    local.torch_module()(torch.zeros(2, 3))
    assert control.read_bytes() == b"AAAAAAAA bytes"


def test_a_module_cannot_read_a_host_file(unchecked: None) -> None:
    decl = declaration(form("sandbox-reader"), "torchscript")
    data = scripted_bytes(Reader("/etc/passwd"))
    with pytest.raises(InvalidModelError, match="test forward pass"):
        sandboxed_register(decl, {"model": data})
    local = _torchscript(decl, data, "v", check_operators=False)  # in process it reads
    out = local.torch_module()(torch.zeros(1, 3)).numpy()
    assert bytes(out[0].astype(np.uint8)) == Path("/etc/passwd").read_bytes()[:2]


def test_a_booster_that_crashes_its_loader_is_refused_naming_the_signal(unchecked: None) -> None:
    data, fields = truncated_lightgbm()
    with pytest.raises(InvalidModelError, match=r"crashed \(SIG"):
        sandboxed_register(declaration(fields, "lightgbm"), {"model": data})


def test_a_native_crash_at_inference_then_a_restart(unchecked: None) -> None:
    data, fields, crash, safe = poisoned_xgboost()
    model, _ = sandboxed_register(declaration(fields, "xgboost"), {"model": data})
    first = _pid(model)
    ok = model.predict(safe[None])
    with pytest.raises(ModelWorkerError, match=r"crashed \(SIGSEGV\) while computing; it restarts"):
        model.predict(crash[None])
    np.testing.assert_allclose(model.predict(safe[None]), ok)  # a new worker answers
    assert _pid(model) != first


def test_memory_limit_then_a_restart() -> None:
    model, _ = sandboxed_register(declaration(form("sandbox-hungry"), "torchscript"),
                                  {"model": scripted_bytes(Hungry())})  # fmt: skip
    with pytest.raises(ModelWorkerError, match="ran out of memory"):
        model.predict(np.ones((1, 3), np.float32))
    assert model.predict(np.zeros((1, 3), np.float32)).shape == (1, 2)


def test_a_call_past_its_deadline_is_killed_then_restarts() -> None:
    before = current_config()
    configure(replace(before, call_timeout_s=2.0))
    try:
        model, _ = sandboxed_register(declaration(form("sandbox-slow"), "torchscript"),
                                      {"model": scripted_bytes(Slow())})  # fmt: skip
        with pytest.raises(ModelWorkerError, match="took longer than 2 s"):
            model.predict(np.ones((1, 3), np.float32))
        assert model.predict(np.zeros((1, 3), np.float32)).shape == (1, 2)
    finally:
        configure(before)


def test_at_most_max_workers_are_alive_idle_ones_stop_first() -> None:
    """MODEL_WORKERS_MEMORY_MB / MODEL_WORKER_MEMORY_MB workers at most: with room for 2, a
    third model stops the idle worker used longest ago (its model starts one again on its next
    call, which stops another); every model keeps answering the same values; while both live
    workers compute, starting a third is a 503 with Retry-After."""
    import threading
    import time

    from models.sandbox.pool import ModelWorkerRestarting, live_workers

    before = current_config()
    x = np.array([[0.1, 0.2, 0.3]], dtype=np.float32)
    configure(replace(before, max_workers=2, processes=1, call_timeout_s=4.0))
    try:
        def registered(name: str, module: torch.nn.Module) -> Model:
            files = {"model": scripted_bytes(module)}
            return sandboxed_register(declaration(form(name), "torchscript"), files)[0]

        models = [registered(f"room-{i}", mlp(seed=i)) for i in range(3)]
        assert live_workers() == 2
        groups = [worker_group(m) for m in models]
        assert groups[0] is not None and groups[2] is not None
        assert groups[0].pids() == [] and groups[2].pids() != []  # room-0's, the oldest, stopped
        first = [m.predict(x) for m in models]  # each starts again as needed, stopping another
        assert live_workers() == 2
        for a, b in zip(first, [m.predict(x) for m in models], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        slow = [registered(f"room-slow-{i}", Slow()) for i in range(2)]
        busy = np.array([[0.9, 0.0, 0.0]], dtype=np.float32)

        def compute(model: Model) -> None:
            with pytest.raises(ModelWorkerError):  # stopped at its 4 s limit
                model.predict(busy)

        threads = [threading.Thread(target=compute, args=(m,)) for m in slow]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both workers computing (until their 4 s limit)
        with pytest.raises(ModelWorkerRestarting, match="every one is computing") as refused:
            models[0].predict(x)
        assert refused.value.retry_after_s > 0 and refused.value.status == 503
        for t in threads:
            t.join(30)
        np.testing.assert_allclose(models[0].predict(x), first[0], rtol=1e-6)  # room again
        assert live_workers() <= 2
    finally:
        configure(before)
