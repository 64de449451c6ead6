"""Hugging Face checkpoints over HTTP: registered with a name and a file (or a `uri`), listed
with what config.json states, explained through the text, LM, encoder and ranker machinery;
word Shapley values equal exact enumeration computed with transformers directly; refused
checkpoints are 4xx JSON errors and leave nothing in the store."""

from __future__ import annotations

import io
import itertools
import json
import math
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.base import ModelNotReadyError
from models.registry import ModelRegistry
from tests.models import hf_fixtures as fx

SENTENCE = "a truly wonderful and moving film"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-repository")
    shutil.copytree(fx.folder("cross-encoder"), root / "rankers" / "tiny-cross")
    return root


@pytest.fixture(scope="module")
def client(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, repository: Path
) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("hf-http")
    settings = Settings(
        model_dir=model_dir,
        user_model_dir=tmp / "user",
        redis_url=None,
        database_url=f"sqlite:///{tmp / 'jobs.db'}",
        load_models_on_start=False,
        max_model_bytes=200 << 20,  # MiniLM in float32 is 84 MB packed
        model_repository=repository,
    )
    with TestClient(create_app(settings, ModelRegistry(model_dir))) as c:
        yield c


def register(client: TestClient, name: str, data: bytes, **form: str) -> Any:
    return client.post(
        "/v2/repository/models",
        data={"name": name, **form},
        files={"file": (f"{name}.tar.gz", data)},
    )


def stored(client: TestClient) -> set[str]:
    app: Any = client.app
    return set(app.state.user_models.current())


def post(client: TestClient, url: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(url, json=body)
    assert r.status_code == status, r.text
    return r.json()


@pytest.fixture(scope="module")
def classifier(client: TestClient) -> dict[str, Any]:
    r = register(client, "minilm-clf", fx.archived("classifier"))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_classifier_registers_with_name_and_file(
    client: TestClient, classifier: dict[str, Any]
) -> None:
    meta = client.get("/v2/models/minilm-clf").json()
    assert meta["modality"] == "text" and meta["task"] == "classification"
    assert meta["output_names"] == ["negative", "positive"] and meta["feature_names"] == []
    assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
    assert meta["platform"] == "huggingface"
    assert meta["explainers"] == [
        "shapley",
        "integrated-gradients",
        "uni",
        "autognothi",
        "sufficient-subset",
    ]
    assert meta["info"]["sandbox"]["network"] == "isolated"  # in its model worker (default)
    assert classifier["versions"] == meta["versions"]


def exact_shapley(words: list[str], target: int) -> np.ndarray:
    """Shapley values of the words by enumeration of every coalition, transformers directly:
    an absent word is deleted (the words left are joined by spaces)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = fx.folder("classifier")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    n = len(words)
    coalitions = list(itertools.product([0, 1], repeat=n))
    texts = [" ".join(w for w, keep in zip(words, c, strict=True) if keep) for c in coalitions]
    with torch.no_grad():
        enc = tok(texts, padding=True, return_tensors="pt")
        v = torch.softmax(hf(**enc).logits.double(), dim=-1)[:, target].numpy()
    value = dict(zip(coalitions, v, strict=True))
    phi = np.zeros(n)
    for c in coalitions:
        for i in range(n):
            if c[i]:
                continue
            s = sum(c)
            with_i = tuple(1 if j == i else c[j] for j in range(n))
            phi[i] += (
                math.factorial(s)
                * math.factorial(n - s - 1)
                / math.factorial(n)
                * (value[with_i] - value[c])
            )
    return phi


def test_word_shapley_equals_exact_enumeration_with_transformers(
    client: TestClient, classifier: dict[str, Any]
) -> None:
    body = {"inputs": [SENTENCE], "target": "positive", "budget": 64}
    out = post(client, "/v2/models/minilm-clf/explain/shapley", body)
    e = out["data"]["explanations"][0]
    assert e["exact"] and [p["text"] for p in e["players"]] == SENTENCE.split()
    expected = exact_shapley(SENTENCE.split(), target=1)
    assert np.abs(np.array(e["values"]) - expected).max() < 1e-4
    assert np.abs(expected).max() > 1e-2  # the values are not all ~0


def test_text_machinery_answers(client: TestClient, classifier: dict[str, Any]) -> None:
    url = "/v2/models/minilm-clf"
    body = {"inputs": [SENTENCE], "target": 1, "budget": 64}
    sii = post(client, f"{url}/explain/shapley", {**body, "parameters": {"index": "k-SII"}})
    assert sii["meta"]["parameters"]["max_order"] == 2
    tokens = post(client, f"{url}/explain/shapley", {**body, "parameters": {"players": "tokens"}})
    assert [p["text"] for p in tokens["data"]["explanations"][0]["players"]] == SENTENCE.split()
    post(client, f"{url}/explain/sufficient-subset", {"inputs": [SENTENCE]})
    evaluated = {**body, "parameters": {"evaluate": ["deletion"]}}
    assert post(client, f"{url}/explain/shapley", evaluated)["meta"].get("evaluation")
    infer = {"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [SENTENCE]}]}
    probs = post(client, f"{url}/infer", infer)["outputs"][0]["data"]
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)
    numbers = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    bad = post(client, f"{url}/infer", numbers, status=400)
    assert "BYTES" in bad["error"]
    bad = post(client, f"{url}/explain/shapley", {"inputs": [[1.5, 2.0]]}, status=400)
    assert bad["code"]


def test_integrated_gradients_on_embeddings_equal_captum(
    client: TestClient, classifier: dict[str, Any]
) -> None:
    from captum.attr import LayerIntegratedGradients
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    text = SENTENCE + "!"
    url = "/v2/models/minilm-clf/explain/integrated-gradients"
    out = post(client, url, {"inputs": [text], "target": "positive"})
    e = out["data"]["explanations"][0]
    assert out["meta"]["parameters"]["baseline"] == "mask"
    assert [p["text"] for p in e["players"]] == SENTENCE.split()
    assert abs(e["details"]["completeness_gap"]) < 1e-4
    tokens = [t["value"] for t in e["details"]["tokens"]]
    assert sum(e["values"]) + e["details"]["unassigned"] == pytest.approx(sum(tokens), abs=1e-9)

    path = fx.folder("classifier")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    ids = tok(text, return_tensors="pt")["input_ids"]
    special = torch.tensor(tok.get_special_tokens_mask(ids[0], already_has_special_tokens=True))
    base = torch.where(special.bool(), ids, tok.mask_token_id)

    def probability(ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(hf(input_ids=ids).logits, dim=-1)

    lig = LayerIntegratedGradients(probability, hf.bert.embeddings.word_embeddings)
    attr = lig.attribute(ids, base, target=1, n_steps=50, method="gausslegendre")
    expected = attr.sum(dim=-1)[0][~special.bool()].detach().numpy()
    assert np.abs(np.array(tokens) - expected).max() < 1e-5
    for params in ({"baseline": "blur"}, {"estimator": "valid_ip"}):
        r = client.post(url, json={"inputs": [text], "parameters": params})
        assert r.status_code == 400, r.text


def test_uni_on_embeddings(client: TestClient, classifier: dict[str, Any]) -> None:
    body = {
        "inputs": [SENTENCE],
        "target": "positive",
        "parameters": {"pgd_steps": 4, "ig_steps": 32, "method": "gausslegendre"},
    }
    out = post(client, "/v2/models/minilm-clf/explain/uni", body)
    e = out["data"]["explanations"][0]
    assert out["meta"]["parameters"]["epsilon_units"] == "std"
    assert [p["text"] for p in e["players"]] == SENTENCE.split()
    d = e["details"]
    tokens = sum(t["value"] for t in d["tokens"])
    gap = tokens + e["base_value"] - e["instance_output_value"]
    assert d["completeness_gap"] == pytest.approx(gap, abs=1e-9)
    assert abs(gap) < 0.05 and d["probability_baseline"] < d["probability_input"]


def test_autognothi_trains_beside_the_checkpoint(
    client: TestClient, classifier: dict[str, Any]
) -> None:
    """The checkpoint in its worker: the hidden states of every level come over the pipe."""
    from tests.app.test_jobs import wait

    tiny = {"sentences": 24, "pairs": 4, "epochs": 2, "batch_size": 8, "held_out": 2}
    job = {"kind": "train-autognothi", "model": "minilm-clf", "parameters": tiny}
    r = client.post("/v2/jobs", json=job)
    assert r.status_code == 202, r.text
    status = wait(client, r.json()["id"], timeout=300)
    assert status["status"] == "succeeded", status
    out = post(client, "/v2/models/minilm-clf/explain/autognothi", {"inputs": [SENTENCE]})
    e = out["data"]["explanations"][0]
    assert [p["text"] for p in e["players"]] == SENTENCE.split()
    assert sum(e["values"]) + e["base_value"] == pytest.approx(e["instance_output_value"], abs=1e-4)


def test_causal_lm_answers_attribot_and_contextcite(client: TestClient) -> None:
    zipped = client.post(
        "/v2/repository/models",
        data={"name": "tiny-llama-zip"},
        files={"file": ("m.zip", fx.archived("lm", "zip"))},
    )
    assert zipped.status_code == 201 and zipped.json()["modality"] == "lm", zipped.text
    r = register(client, "tiny-llama", fx.archived("lm"))
    assert r.status_code == 201, r.text
    assert r.json()["modality"] == "lm" and r.json()["explainers"] == ["attribot"]
    context = "Zorblat is the capital of Quenmoria. It has a harbour.\n\nBread is baked from flour."
    body = {"context": context, "query": "What is the capital?", "response": " Zorblat."}
    out = post(client, "/v2/models/tiny-llama/explain/attribot", body)
    spans = out["data"]["explanations"][0]["details"]["spans"]
    assert len(spans) == 3 and all(np.isfinite(s["score"]) for s in spans)
    cc = {**body, "parameters": {"method": "contextcite", "n_ablations": 16}}
    post(client, "/v2/models/tiny-llama/explain/attribot", cc)


def test_encoder_answers_cocoa(client: TestClient) -> None:
    r = register(client, "minilm-st", fx.archived("encoder"))
    assert r.status_code == 201, r.text
    assert r.json()["modality"] == "encoder" and r.json()["explainers"] == ["cocoa"]
    body = {
        "inputs": ["the cat sat on the mat"],
        "corpus": ["a kitten", "cats purr"],
        "foil": ["the stock market", "tax law"],
        "budget": 64,
    }
    out = post(client, "/v2/models/minilm-st/explain/cocoa", body)
    players = out["data"]["explanations"][0]["players"]
    assert [p["text"] for p in players] == ["the", "cat", "sat", "on", "the", "mat"]


def test_cross_encoder_by_uri_answers_rankshap(client: TestClient, repository: Path) -> None:
    r = client.post(
        "/v2/repository/models", data={"name": "tiny-cross", "uri": "rankers/tiny-cross"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["modality"] == "ranker" and r.json()["explainers"] == ["rankshap"]
    body = {"query": "capital of france", "documents": ["paris is the capital", "bread", "rome"]}
    out = post(client, "/v2/models/tiny-cross/explain/rankshap", {**body, "parameters": {"k": 2}})
    assert out["data"]["explanations"][0]["details"]["ranking"]
    # another process builds it from the store; a folder changed since registration is refused
    app: Any = client.app
    fresh = ModelRegistry(app.state.settings.model_dir, store=app.state.user_models)
    assert fresh.get("tiny-cross").version == r.json()["versions"][0]
    (repository / "rankers" / "tiny-cross" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelNotReadyError, match="changed since it was registered"):
        ModelRegistry(app.state.settings.model_dir, store=app.state.user_models).get("tiny-cross")
    for uri in ("../outside", "/etc", "rankers/none"):
        r = client.post("/v2/repository/models", data={"name": "bad-uri", "uri": uri})
        assert r.status_code == 400 and "MODEL_REPOSITORY" in r.json()["error"]
    assert "bad-uri" not in stored(client)


def test_uri_without_model_repository_is_refused(model_dir: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_dir=model_dir,
        user_model_dir=tmp_path / "user",
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        load_models_on_start=False,
    )
    with TestClient(create_app(settings, ModelRegistry(model_dir))) as c:
        r = c.post("/v2/repository/models", data={"name": "x", "uri": "anything"})
    assert r.status_code == 400 and "MODEL_REPOSITORY" in r.json()["error"]


def _retar(data: bytes, add: dict[str, bytes], drop: str = "", link: str = "") -> bytes:
    """The fixture archive with members added, dropped (by substring) or a symlink added."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src,
        tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as dst,
    ):
        for member in src:
            if drop and drop in member.name:
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        for name, blob in add.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            dst.addfile(info, io.BytesIO(blob))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            dst.addfile(info)
    return out.getvalue()


def _config(data: bytes, **changes: Any) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        member = tf.extractfile("model/config.json")
        assert member is not None
        config = {**json.loads(member.read()), **changes}
    return _retar(data, {"model/config.json": json.dumps(config).encode()}, drop="config.json")


@pytest.mark.parametrize(
    ("case", "status", "says"),
    [
        ("traversal", 400, "'..'"),
        ("symlink", 400, "link"),
        ("bomb", 413, "archive bomb"),
        ("pickle", 400, "pickle"),
        ("remote-code", 400, "remote code"),
        ("no-tokenizer", 400, "tokenizer"),
        ("wrong-tokenizer", 400, "tokenizer has 30522 tokens"),
        ("contradiction", 400, "'text' contradicts"),
    ],
)
def test_refused_checkpoints_store_nothing(
    client: TestClient, case: str, status: int, says: str
) -> None:
    lm = fx.archived("lm")  # small: 7 MB
    data = {
        "traversal": lambda: _retar(lm, {"../escape.txt": b"x"}),
        "symlink": lambda: _retar(lm, {}, link="model/vocab.txt"),
        "bomb": lambda: _retar(lm, {"model/zeros.txt": b"\0" * (200 << 20)}),
        "pickle": lambda: _retar(lm, {"model/pytorch_model.bin": b"\x80\x04K\x01."}),
        "remote-code": lambda: _config(lm, auto_map={"AutoModelForCausalLM": "x.Model"}),
        "no-tokenizer": lambda: _retar(lm, {}, drop="tokenizer"),
        "wrong-tokenizer": lambda: _config(lm, vocab_size=1000),
        "contradiction": lambda: lm,
    }[case]()
    form = {"modality": "text"} if case == "contradiction" else {}
    r = register(client, f"bad-{case}", data, **form)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert f"bad-{case}" not in stored(client)
    assert client.get(f"/v2/models/bad-{case}").status_code == 404
