"""Hugging Face checkpoints: safe unpacking, what config.json makes of a checkpoint, and the four
model kinds against transformers and sentence-transformers run directly on the same folder."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from models.adapters.archive import ArchiveTooLargeError, check_sizes, unpack
from models.adapters.checkpoint import Checkpoint, archive_checkpoint, hf_facts, kind
from models.adapters.hf import declare
from models.adapters.user import register
from models.base import RankerModel, TextModel
from models.declaration import InvalidModelError
from tests.models import hf_fixtures as fx

CONFIG = {"architectures": ["BertForSequenceClassification"], "model_type": "bert"}


def tar(members: dict[str, bytes], links: dict[str, tuple[bytes, str]] | None = None) -> bytes:
    """A .tar.gz of files, plus links {name: (tarfile type, target)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, (kind_, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind_, target
            tf.addfile(info)
    return buf.getvalue()


def folder(
    config: dict[str, object] | None = None, extra: dict[str, bytes] | None = None
) -> dict[str, bytes]:
    files = {
        "m/config.json": json.dumps(config or CONFIG).encode(),
        "m/model.safetensors": b"\0" * 64,
        "m/tokenizer.json": b"{}",
    }
    return {**files, **{f"m/{k}": v for k, v in (extra or {}).items()}}


def refused(data: bytes, tmp: Path, match: str) -> None:
    with pytest.raises(InvalidModelError, match=match):
        unpack(data, tmp)
    assert not [p for p in tmp.rglob("*") if p.is_file()], "nothing may be written"


@pytest.mark.parametrize(
    "name", ["../evil.txt", "/etc/evil.txt", "m/../../evil.txt", "m\\..\\evil.txt", "C:evil"]
)
def test_traversal_paths_are_refused(tmp_path: Path, name: str) -> None:
    refused(tar({**folder(), name: b"x"}), tmp_path, "relative paths|'..'")


@pytest.mark.parametrize("kind_", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_links_are_refused(tmp_path: Path, kind_: bytes) -> None:
    data = tar(folder(), {"m/vocab.txt": (kind_, "/etc/passwd")})
    refused(data, tmp_path, "link")


def test_devices_and_zip_symlinks_are_refused(tmp_path: Path) -> None:
    refused(tar(folder(), {"m/dev": (tarfile.CHRTYPE, "")}), tmp_path, "regular file")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("m/config.json", json.dumps(CONFIG))
        link = zipfile.ZipInfo("m/tokenizer.json")
        link.external_attr = 0o120777 << 16  # a symbolic link
        zf.writestr(link, "/etc/passwd")
    refused(buf.getvalue(), tmp_path, "link")


def test_bombs_and_member_counts_are_refused(tmp_path: Path) -> None:
    bomb = tar(folder(extra={"weights": b"\0" * (64 << 20)}))  # 64 MiB of zeros: ~65 KB packed
    assert len(bomb) < 200_000
    with pytest.raises(ArchiveTooLargeError, match="archive bomb"):
        check_sizes(bomb)
    with pytest.raises(ArchiveTooLargeError):
        unpack(bomb, tmp_path)
    many = tar({f"m/f{i}": b"" for i in range(1001)})
    refused(many, tmp_path / "many", "more than 1000 members")


def claiming(kind_: bytes, size: int, payload: int = 1 << 20) -> bytes:
    """A .tar.gz whose first header (`kind_`: PAX 'x' or GNU long-name 'L') claims `size`
    bytes of metadata, followed by `payload` zero bytes (about 1 KB once compressed)."""
    header = bytearray(512)
    header[0:9] = b"././@Long"
    header[100:108] = b"0000644\0"
    header[124:136] = f"{size:011o}\0".encode()
    header[156:157] = kind_
    header[257:263] = b"ustar\0"
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return gzip.compress(bytes(header) + bytes(payload))


@pytest.mark.parametrize("kind_", [b"x", b"L"])
def test_a_header_claiming_a_gigabyte_is_refused_before_it_is_read(
    tmp_path: Path, kind_: bytes
) -> None:
    """Issue 39: tarfile reads a PAX or GNU long-name header's data whole (a 1 MB upload
    claiming 1 GB took +1 GB before the 400); the header walk refuses it from its size."""
    data = claiming(kind_, 1 << 30)
    assert len(data) < 20_000
    peak = tracemalloc_peak(lambda: refused(data, tmp_path, "claims 1073741824 bytes"))
    assert peak < 16 << 20, peak


def tracemalloc_peak(fn: Callable[[], None]) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_member_under_a_file_is_refused(tmp_path: Path) -> None:
    """A file `x` and then `x/y` (an OSError when unpacking, which was a 500) is a 400."""
    refused(tar({**folder(), "m/x": b"1", "m/x/y": b"2"}), tmp_path, "lies under 'm/x'")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in {**folder(), "m/x": b"1", "m/x/y": b"2"}.items():
            zf.writestr(name, data)
    refused(buf.getvalue(), tmp_path / "zip", "lies under 'm/x'")


def test_a_good_archive_unpacks_its_files_only(tmp_path: Path) -> None:
    unpack(tar(folder()), tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


@pytest.mark.parametrize(
    ("files", "match"),
    [
        (folder(extra={"pytorch_model.bin": b"pickle"}), "pickle"),
        ({**folder(), "m/training_args.bin": b"x"}, "pickle"),
        (folder({**CONFIG, "auto_map": {"AutoModel": "m.M"}}), "remote code"),
        ({k: v for k, v in folder().items() if "tokenizer" not in k}, "no tokenizer"),
        ({k: v for k, v in folder().items() if "safetensors" not in k}, "model.safetensors"),
        (folder({"architectures": ["BertForMaskedLM"]}), "not a kind"),
    ],
)
def test_checkpoints_refused_before_loading(files: dict[str, bytes], match: str) -> None:
    with pytest.raises(InvalidModelError, match=match):
        hf_facts(tar(files))


def test_kinds_follow_architectures_and_declarations_must_agree() -> None:
    def ck(config: dict[str, object], extra: dict[str, bytes] | None = None) -> Checkpoint:
        return archive_checkpoint(tar(folder(config, extra)))

    clf = ck({**CONFIG, "id2label": {"0": "bad", "1": "good"}})
    assert kind(clf) == "text" and clf.labels == ("bad", "good")
    assert kind(ck({"architectures": ["LlamaForCausalLM"]})) == "lm"
    assert kind(ck({"architectures": ["GPT2LMHeadModel"]})) == "lm"
    pooled = {"modules.json": b'[{"type": "x.Pooling"}]'}
    assert kind(ck({"architectures": ["BertModel"]}, pooled)) == "encoder"
    one = {**CONFIG, "num_labels": 1, "id2label": {"0": "LABEL_0"}}
    st = {"config_sentence_transformers.json": b'{"model_type": "CrossEncoder"}'}
    assert kind(ck(one, st)) == "ranker"
    assert kind(ck(one)) == "text" and kind(ck(one), "ranker") == "ranker"
    with pytest.raises(InvalidModelError, match=r"'text' contradicts .*LlamaForCausalLM"):
        kind(ck({"architectures": ["LlamaForCausalLM"]}), "text")
    with pytest.raises(InvalidModelError, match=r"task 'regression': config\.json states a "):
        declare("m", clf, task="regression")
    with pytest.raises(InvalidModelError, match=r"3 names; config\.json has 2 outputs"):
        declare("m", clf, output_names=("a", "b", "c"))
    assert declare("m", clf, output_names=("neg", "pos")).output_names == ("neg", "pos")


@pytest.fixture(scope="module")
def models() -> dict[str, object]:
    out: dict[str, object] = {}
    for name in ("classifier", "lm", "cross-encoder", "encoder"):
        data = fx.archived(name)
        facts = hf_facts(data)
        decl = declare(name, archive_checkpoint(data))
        assert decl.modality == facts.modality
        out[name] = register(decl, {"model": data})[0]
    return out


TEXTS = ["a truly wonderful film", "The plot made no sense, and the acting was bad."]


def test_classifier_is_transformers_softmax(models: dict[str, object]) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = models["classifier"]
    assert isinstance(model, TextModel) and model.output_names == ("negative", "positive")
    path = fx.folder("classifier")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        enc = tok(TEXTS, padding=True, return_tensors="pt")
        expected = torch.softmax(hf(**enc).logits, dim=-1).numpy()
    np.testing.assert_allclose(model.predict(TEXTS), expected, atol=1e-5)
    assert np.ptp(expected[:, 1]) > 0.05  # the seeded head separates texts
    spans = model.token_spans(TEXTS[0])
    assert [TEXTS[0][s:e] for s, e in spans] == ["a", "truly", "wonderful", "film"]


def test_encoder_is_sentence_transformers(models: dict[str, object]) -> None:
    from sentence_transformers import SentenceTransformer

    model = models["encoder"]
    assert isinstance(model, TextModel) and model.modality == "encoder"
    st = SentenceTransformer(str(fx.folder("encoder")), device="cpu", local_files_only=True)
    np.testing.assert_allclose(model.predict(TEXTS), st.encode(TEXTS), atol=1e-5)


def test_cross_encoder_and_lm_match_transformers(models: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    ranker = models["cross-encoder"]
    assert isinstance(ranker, RankerModel)
    path = fx.folder("cross-encoder")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    docs = ["paris is the capital of france", "bread is baked"]
    with torch.no_grad():
        enc = tok(["capital of france"] * 2, docs, padding=True, return_tensors="pt")
        expected = hf(**enc).logits[:, 0].numpy()
    np.testing.assert_allclose(ranker.score("capital of france", docs), expected, atol=1e-5)

    lm = models["lm"]
    assert isinstance(lm, TextModel) and lm.modality == "lm"
    path = fx.folder("lm")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    causal = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    ids = tok(TEXTS[0], add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(causal(ids).logits[0, :-1], dim=-1)
    expected_ll = float(logp.gather(1, ids[0, 1:, None]).sum())
    assert lm.predict([TEXTS[0]])[0, 0] == pytest.approx(expected_ll, abs=1e-3)


def test_gpt2_lm_head_model_reuses_its_cache_as_exact_loo(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from explainers.attribot import AttriBoTOptions, attribute
    from models.builtin.lm import LanguageModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, eos_token_id=102)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    fx._tokenizer(tmp_path)
    data = fx.archive(tmp_path)
    lm = register(declare("gpt2", archive_checkpoint(data)), {"model": data})[0]
    assert isinstance(lm, LanguageModel) and isinstance(lm.hf.hf, GPT2LMHeadModel)
    context = "Zorblat is the capital. It has a harbour.\n\nBread is baked."
    loo, _ = attribute(
        lm, context, "What is the capital?", " Zorblat.", AttriBoTOptions(method="loo")
    )
    cached, _ = attribute(lm, context, "What is the capital?", " Zorblat.", AttriBoTOptions())
    assert cached.details and cached.details["forward_passes"]
    np.testing.assert_allclose(cached.values, loo.values, atol=1e-5)
