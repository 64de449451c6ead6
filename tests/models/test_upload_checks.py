"""Uploads that cannot touch the host: TorchScript operator allow-list, zip inflation, ONNX
external data, booster structure, .npy headers (models/adapters/torchscript_check.py, archive.py,
onnx.py, booster_check.py, lightgbm_check.py, user.load_background)."""

from __future__ import annotations

import io
import json
import typing
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from models.adapters.archive import ArchiveTooLargeError, check_inflation, check_sizes
from models.adapters.torchscript_check import check_module, check_source, denied
from models.adapters.user import _torchscript, load_background
from models.declaration import Declaration, InvalidModelError
from tests import byom_models as bm
from tests import image_models as im


def saved(module: torch.jit.ScriptModule) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    return buf.getvalue()


def decl(shape: tuple[int, ...] = (6,)) -> Declaration:
    size = int(np.prod(shape))
    return Declaration(
        name="m", format="torchscript", modality="tabular", task="regression",
        input_shape=shape, output_names=("y",), feature_names=tuple(f"f{i}" for i in range(size)),
    )  # fmt: skip


# --- hostile TorchScript modules ---------------------------------------------------------------


class ReadsFile(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_file("/etc/hostname", False, 1, dtype=torch.uint8)
        return x + t.sum().float()


class WritesFile(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.save(x, "/tmp/written-by-a-model.pt")
        return x


class Prints(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("hello from a model", x)
        return x


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class Forks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.jit._wait(torch.jit._fork(_double, x))


class Inner(nn.Module):
    def helper(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_file("/etc/hostname", False, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.helper(x)


class Outer(nn.Module):  # the operator two calls deep, in a submodule, inside an If
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 1e9):
            return self.inner(x)
        return x


class Exported(nn.Module):  # a method forward never calls
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.export
    def leak(self) -> torch.Tensor:
        return torch.from_file("/etc/hostname", False, 1)


class AtLoad(nn.Module):  # __setstate__ runs inside torch.jit.load
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.zeros(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, bool]) -> None:
        self.w = state[0] + torch.from_file("/etc/hostname", False, 1, dtype=torch.uint8).float()
        self.training = state[1]


@torch.jit.script
class Ctx:
    def __init__(self) -> None:
        self.a = 1

    def __enter__(self) -> None:
        self.a = torch.from_file("/etc/hostname", False, 1).numel()

    def __exit__(self, a: typing.Any, b: typing.Any, c: typing.Any) -> None:
        pass


class WithCtx(nn.Module):  # a class method the graphs never inline: the source check sees it
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with Ctx():
            y = x + 1
        return y


class ReadsHeap(nn.Module):
    """Issue 39's memory read: a view of caller-chosen strides over a 64-byte buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.zeros(16)
        view = torch.ops.aten._reshape_alias(buf, [4096, 256], [256, 1])
        return x + view.sum()


class Strided(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.as_strided(x, [1000, 1000], [1, 1], 0).sum()


class UncheckedSparse(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.tensor([[100000]])
        dense = torch.ops.aten._sparse_coo_tensor_unsafe(idx, torch.ones(1), [8]).to_dense()
        return x + dense.sum()


class UnsafeIndexPut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.tensor([10**9])
        return torch.ops.aten._index_put_impl_(x.clone(), [i], torch.ones(1), False, True)


HOSTILE = [
    (ReadsFile, "aten::from_file", "host files"),
    (WritesFile, "aten::save", "host files"),
    (Prints, "prim::Print", "prints"),
    (Forks, "prim::fork", "threads"),
    (Outer, "aten::from_file", "host files"),
    (Exported, "aten::from_file", "host files"),
    (AtLoad, "aten::from_file", "host files"),
    (WithCtx, "aten::from_file", "host files"),
    (ReadsHeap, "aten::_reshape_alias", "caller-chosen sizes, strides or offsets"),
    (Strided, "aten::as_strided", "caller-chosen sizes, strides or offsets"),
    (UncheckedSparse, "aten::_sparse_coo_tensor_unsafe", "invariant checks"),
    (UnsafeIndexPut, "aten::_index_put_impl_", "without bounds checks"),
]


@pytest.mark.parametrize(("cls", "op", "why"), HOSTILE, ids=[c.__name__ for c, _, _ in HOSTILE])
def test_hostile_operators_are_refused_before_loading(cls: type, op: str, why: str) -> None:
    data = saved(torch.jit.script(cls()))
    with pytest.raises(InvalidModelError, match=f"TorchScript operator {op} is not allowed") as e:
        _torchscript(decl(), data, "v")
    assert why in str(e.value)
    with pytest.raises(InvalidModelError, match=op):
        check_source(data)


GRAPH_CHECKED = [h for h in HOSTILE if h[0] not in (AtLoad, WithCtx)]


@pytest.mark.parametrize(
    ("cls", "op", "why"), GRAPH_CHECKED, ids=[c.__name__ for c, _, _ in GRAPH_CHECKED]
)
def test_the_graph_walk_refuses_them_on_its_own(cls: type, op: str, why: str) -> None:
    """The second half alone, on the loaded module (no source check)."""
    module = torch.jit.load(io.BytesIO(saved(torch.jit.script(cls()))))
    with pytest.raises(InvalidModelError, match=f"TorchScript operator {op} is not allowed"):
        check_module(module)


def _rewritten(data: bytes, body: str) -> bytes:
    """The archive with forward's body replaced by `body` (hand-written TorchScript source)."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in src.infolist():
            raw = src.read(info)
            if "/code/" in info.filename and info.filename.endswith(".py"):
                head = raw.decode().split("    x: Tensor) -> Tensor:\n")[0]
                raw = (head + "    x: Tensor) -> Tensor:\n" + body).encode()
            if info.filename.endswith(".debug_pkl"):
                continue
            zf.writestr(zipfile.ZipInfo(info.filename, info.date_time), raw)
    return out.getvalue()


@pytest.mark.parametrize(
    "body",
    [
        '    return getattr(torch, "from_file")("/etc/hostname", False, 1)\n',
        '    return getattr(ops.aten, "from_file")("/etc/hostname", False, 1)\n',
        '    return ops . aten . from_file("/etc/hostname", False, 1)\n',
        '    return torch.\\\n from_file("/etc/hostname", False, 1)\n',
        "    return torch.ops.myns.evil(x)\n",
        # issue 39: a string built from pieces is still the operator's name
        '    return getattr(torch, "from_" "file")("/etc/hostname", False, 1)\n',
        '    return getattr(torch, "from_" + "file")("/etc/hostname", False, 1)\n',
        '    return getattr(torch, f"from_{\'file\'}")("/etc/hostname", False, 1)\n',
    ],
)
def test_hand_written_source_spellings_are_refused(body: str) -> None:
    data = _rewritten(saved(torch.jit.script(bm.ConstScale())), body)
    with pytest.raises(InvalidModelError, match="TorchScript operator"):
        _torchscript(decl(), data, "v")


def test_custom_namespaces_are_refused_and_the_deny_set_comes_from_schemas() -> None:
    deny = denied()
    assert {"aten::from_file", "aten::save", "prim::Print", "prim::fork", "aten::set_"} <= set(deny)
    assert "aten::add" not in deny and "aten::conv2d" not in deny and "aten::warn" not in deny
    data = _rewritten(saved(torch.jit.script(bm.ConstScale())), "    return ops.myns.f(x)\n")
    with pytest.raises(InvalidModelError, match=r"myns::f is not allowed \(a custom operator"):
        check_source(data)


def test_sparse_tensors_are_checked_once_a_model_is() -> None:
    """A sparse tensor built by an allowed constructor with an out-of-range index is an error,
    not a write past its buffer: checking a module turns sparse invariant checks on for the
    process (a worker checks every model it loads)."""

    class Sparse(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idx = (x[:1, :1] * 0 + 100000).long().t()
            return x + torch.sparse_coo_tensor(idx, torch.ones(1), [8]).to_dense().sum()

    module = torch.jit.load(io.BytesIO(saved(torch.jit.script(Sparse()))))
    check_module(module)
    assert torch.sparse.check_sparse_tensor_invariants.is_enabled()
    with pytest.raises(RuntimeError, match=r"out of bounds|index"):
        module(torch.zeros(1, 6))


def test_the_check_can_be_skipped_only_through_the_library() -> None:
    """check_operators=False (tests of the sandbox): the module loads; its forward reads a
    file, which is what the check stops."""
    model = _torchscript(decl(), saved(torch.jit.script(ReadsFile())), "v", check_operators=False)
    out = model.torch_module()(torch.zeros(1, 6))
    assert out.shape == (1, 6)


def _real_modules() -> list[tuple[str, bytes]]:
    out = [
        ("cnn-traced", bm.torchscript_cnn().file or b""),
        ("cnn-scripted", bm.torchscript_cnn(traced=False).file or b""),
        ("linear", bm.scripted_linear().file or b""),
        ("rgb-cnn", im.torchscript_bytes(im.rgb_cnn(size=16))),
        ("resnet18", im.torchscript_bytes(im.resnet18())),
    ]
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2)).eval()
    out.append(("mlp-traced", saved(torch.jit.trace(mlp, torch.zeros(2, 6)))))
    out.append(("mlp-frozen", saved(torch.jit.freeze(torch.jit.script(mlp)))))
    for name, mod in (
        ("lstm", nn.LSTM(4, 8, batch_first=True)),
        ("transformer", nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)),
        ("layers", nn.Sequential(nn.LayerNorm(6), nn.GELU(), nn.Linear(6, 4), nn.Softmax())),
    ):
        out.append((name, saved(torch.jit.script(mod.eval()))))
    q = torch.ao.quantization.quantize_dynamic(mlp, {nn.Linear}, dtype=torch.qint8)
    out.append(("quantized", saved(torch.jit.script(q))))
    return out


def test_real_exported_models_pass_both_checks() -> None:
    for name, data in _real_modules():
        check_inflation(data)
        check_source(data)
        check_module(torch.jit.load(io.BytesIO(data)))
        assert name


# --- zip inflation -------------------------------------------------------------------------------


class Zeros(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.z = nn.Parameter(torch.zeros(n), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.z[:6]


def deflated(data: bytes) -> bytes:
    """The archive re-zipped with every member deflated (what the audit's upload did)."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in src.infolist():
            new = zipfile.ZipInfo(info.filename, info.date_time)
            new.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(new, src.read(info), compresslevel=9)
    return out.getvalue()


def test_a_deflated_zero_tensor_is_refused_with_sizes() -> None:
    stored = saved(torch.jit.script(Zeros(16 << 20)))  # 64 MiB, stored as torch.jit.save does
    bomb = deflated(stored)
    assert len(bomb) < 100_000  # ~1000:1
    loaded: typing.Any = torch.jit.load(io.BytesIO(bomb))
    assert loaded.z.numel() == 16 << 20  # torch reads it
    with pytest.raises(ArchiveTooLargeError, match=r"inflates from 6\d\.\d KiB to 64\.0 MiB"):
        _torchscript(decl(), bomb, "v")
    check_inflation(stored)  # the stored archive is its own size
    model = _torchscript(decl(), stored, "v")
    assert model.torch_module() is not None


def test_members_adding_up_beyond_the_total_are_refused() -> None:
    stored = saved(torch.jit.script(Zeros(1 << 20)))  # 4 MiB stored: 1:1
    check_inflation(stored)
    with pytest.raises(ArchiveTooLargeError, match="add up to more than"):
        check_inflation(stored, max_total=1 << 20)
    with pytest.raises(ArchiveTooLargeError, match="archive bomb"):
        check_sizes(deflated(saved(torch.jit.script(Zeros(4 << 20)))))


def test_duplicate_and_odd_members_are_refused() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("archive/code/__torch__.py", "x")
        with pytest.warns(UserWarning):
            zf.writestr("archive/code/__torch__.py", "y")
    with pytest.raises(InvalidModelError, match="appears twice"):
        check_inflation(out.getvalue())
    with pytest.raises(InvalidModelError, match="writes a zip"):
        _torchscript(decl(), b"\x00" * 64, "v")


# --- .npy headers --------------------------------------------------------------------------------


def _npy(header: str, payload: bytes) -> bytes:
    head = header.encode("latin1")
    pad = 64 - (10 + len(head) + 1) % 64
    head += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head + payload


def test_npy_header_claiming_a_trillion_floats_is_refused() -> None:
    data = _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }",
                b"\0" * 96)  # fmt: skip
    with pytest.raises(InvalidModelError, match=r"\[1000000, 1000000\].*96 bytes"):
        load_background(data, decl())


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '|O', 'fortran_order': False, 'shape': (2, 6), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 6), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 6)",
        "not a dict at all",
    ],
)
def test_bad_npy_headers_are_400s(header: str) -> None:
    with pytest.raises(InvalidModelError, match=r"background \.npy"):
        load_background(_npy(header, b"\0" * 48), decl())


def test_good_npy_backgrounds_still_load(tmp_path: Path) -> None:
    rows = np.arange(24, dtype=np.float64).reshape(4, 6)
    for arr in (rows, np.asfortranarray(rows), rows.astype(">f4")):
        buf = io.BytesIO()
        np.save(buf, arr)
        np.testing.assert_array_equal(load_background(buf.getvalue(), decl()), rows)
    assert json.dumps(1)


def test_sandbox_off_refuses_torchscript_unless_trusted() -> None:
    """MODEL_SANDBOX=off would load the file (and run its __setstate__) in the server process:
    refused before anything loads unless TRUSTED_MODEL_CODE; ONNX still loads (no code)."""
    from dataclasses import replace

    from models.sandbox import configure, current_config, sandboxed_register

    before = current_config()
    data = saved(torch.jit.script(bm.ConstScale()))
    try:
        configure(replace(before, enabled=False))
        with pytest.raises(InvalidModelError, match="TRUSTED_MODEL_CODE"):
            sandboxed_register(decl(), {"model": data})
        configure(replace(before, enabled=False, trusted_code=True))
        model, _ = sandboxed_register(decl(), {"model": data})
        assert model.predict(np.zeros((2, 6), dtype=np.float32)).shape[0] == 2
    finally:
        configure(before)
