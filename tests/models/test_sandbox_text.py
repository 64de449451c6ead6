"""Hugging Face checkpoints and ONNX text models in model workers (models/sandbox/hf_*.py): each
kind registers through a worker (another process, chrooted, user nobody) and answers what the
in-process model answers, to float32 rounding; gradients through the embedding hook's proxy
equal autograd's in process; a worker killed mid-call is a ModelWorkerError (the service's 502)
and the other models keep answering. Real processes, the offline fixtures."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from models.adapters.checkpoint import archive_checkpoint
from models.adapters.hf import declare
from models.adapters.user import register
from models.sandbox import ModelWorkerError, sandboxed_register
from models.sandbox.proxy import worker_group
from tests.models import hf_fixtures as fx
from tests.models import onnx_text_fixtures as ox

TEXTS = ["a truly wonderful and moving film", "a dull, lifeless mess."]


@functools.cache
def pair(name: str) -> tuple[Any, Any]:
    """(the model through its worker, the same checkpoint in process)."""
    data = ox.archived() if name == "onnx" else fx.archived(name)
    decl = declare(name, archive_checkpoint(data))
    sandboxed, _ = sandboxed_register(decl, {"model": data})
    local, _ = register(decl, {"model": data})
    return sandboxed, local


def _in_worker(model: Any) -> None:
    group = worker_group(model)
    assert group is not None
    pids = group.pids()
    assert pids and os.getpid() not in pids
    assert model.info["sandbox"]["network"] == "isolated"
    if os.geteuid() == 0:
        assert model.info["sandbox"]["user"] == "nobody"
        assert model.info["sandbox"]["filesystem"].startswith("chroot")


@pytest.mark.parametrize("name", ["classifier", "encoder", "onnx"])
def test_text_models_answer_as_in_process(name: str) -> None:
    model, local = pair(name)
    _in_worker(model)
    assert type(model) is type(local) or name == "classifier"
    np.testing.assert_allclose(model.predict(TEXTS), local.predict(TEXTS), rtol=1e-5, atol=1e-6)
    assert model.token_spans(TEXTS[1]) == local.token_spans(TEXTS[1])
    assert (model.mask_token, model.max_tokens) == (local.mask_token, local.max_tokens)
    assert model.differentiable == local.differentiable


def test_autognothi_encoder_pass_in_the_worker_equals_in_process() -> None:
    from explainers.amortized.autognothi.net import encode, vocabulary

    model, local = pair("classifier")
    texts = ["a truly wonderful and moving film", "dull."]
    got, want = encode(model, texts), encode(local, texts)
    for name in ("token_mask", "words", "word_mask"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.hidden.shape == want.hidden.shape
    torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.probs, want.probs, rtol=1e-5, atol=1e-6)
    assert vocabulary(model) == vocabulary(local) and "film" in vocabulary(model)


def test_ranker_scores_as_in_process() -> None:
    model, local = pair("cross-encoder")
    _in_worker(model)
    docs = [["a first document", "the second one"], ["x", "query words here"]]
    np.testing.assert_allclose(
        model.score_lists(["a query", "words"], docs),
        local.score_lists(["a query", "words"], docs),
        rtol=1e-5,
        atol=1e-6,
    )


def test_embedding_hook_values_and_gradients_match_autograd_in_process() -> None:
    model, local = pair("classifier")
    hook, ref = model.embeddings, local.embeddings
    assert hook.encode(TEXTS[0]) == ref.encode(TEXTS[0])
    assert (hook.mask_id, hook.pad_id) == (ref.mask_id, ref.pad_id)
    ids, types, _, _ = hook.encode(TEXTS[0])
    x = hook.embed(torch.tensor([ids]))
    torch.testing.assert_close(x, ref.embed(torch.tensor([ids])).detach())
    torch.testing.assert_close(hook.embedding_std(), ref.embedding_std())
    t = torch.tensor([types])
    weights = torch.linspace(-1.0, 1.0, 2)
    grads = []
    for h in (hook, ref):
        xg = x.clone().requires_grad_(True)
        out = h.scores(xg, t, "logit")
        (g,) = torch.autograd.grad((out * weights).sum(), xg)
        grads.append(g)
    assert grads[1].abs().max() > 1e-3  # a gradient worth comparing
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    # UNI's module of embeddings: outputs and weight gradients as in process
    mod, mod_ref = hook.module(t), ref.module(t)
    torch.testing.assert_close(mod(x), mod_ref(x).detach(), rtol=1e-5, atol=1e-6)
    refs = list(mod_ref.parameters())
    gs = torch.autograd.grad(mod(x)[0, 1], list(mod.parameters()), allow_unused=True)
    gs_ref = torch.autograd.grad(mod_ref(x)[0, 1], refs, allow_unused=True)
    assert len(gs) == len(gs_ref)
    for g, g_ref, p in zip(gs, gs_ref, refs, strict=True):
        want = torch.zeros_like(p) if g_ref is None else g_ref
        torch.testing.assert_close(torch.zeros_like(p) if g is None else g, want, rtol=1e-4,
                                   atol=1e-6)  # fmt: skip


def test_language_model_log_likelihoods_prefix_reuse_and_generation() -> None:
    model, local = pair("lm")
    _in_worker(model)
    prompt = model.encode("the cat sat on the", bos=True)
    assert prompt == local.encode("the cat sat on the", bos=True)
    response = model.encode(" mat today", bos=False)
    ll, prefix = model.full_pass(prompt, response)
    ll_ref, prefix_ref = local.full_pass(prompt, response)
    assert ll == pytest.approx(ll_ref, rel=1e-5)
    prompts = [prompt[:3], prompt[:2] + prompt[3:], prompt]
    got, passes, tokens = model.response_log_likelihood(prompts, response, prefix=prefix)
    want, passes_ref, tokens_ref = local.response_log_likelihood(
        prompts, response, prefix=prefix_ref
    )
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (passes, tokens) == (passes_ref, tokens_ref)  # the cache was reused in the worker
    plain, _, _ = local.response_log_likelihood(prompts, response)
    np.testing.assert_allclose(got, plain, rtol=1e-4)
    assert model.generate(prompt, 4) == local.generate(prompt, 4)
    assert model.tokenizer.decode(prompt) == local.decode(prompt)
    np.testing.assert_allclose(model.predict(TEXTS), local.predict(TEXTS), rtol=1e-5)


def test_a_worker_killed_mid_call_fails_that_call_and_others_keep_answering() -> None:
    model, _ = pair("cross-encoder")
    other, local_other = pair("classifier")
    group = worker_group(model)
    assert group is not None
    model.score("q", ["d"])  # the worker is up
    (pid,) = group.pids()
    os.kill(pid, signal.SIGSTOP)  # it reads nothing now: the next call waits in the pipe
    errors: list[BaseException] = []

    def call() -> None:
        try:
            model.score("q", ["d"])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ModelWorkerError)
    assert "crashed (SIGKILL)" in str(errors[0])
    np.testing.assert_allclose(other.predict(TEXTS), local_other.predict(TEXTS), rtol=1e-5)
    assert np.isfinite(model.score("q", ["d"])).all()  # started again
    assert group.pids() != [pid]
