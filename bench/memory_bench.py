"""Peak memory of one explanation in a real server process, by MAX_BATCH_BYTES (issue 26).

.venv/bin/python bench/memory_bench.py --max-batch-bytes 268435456
Peak = VmHWM of the server during the request (reset by /proc/<pid>/clear_refs) - VmRSS before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent  # the checkout
sys.path.insert(0, str(ROOT))
from tests.conftest import free_port  # noqa: E402
from tests.image_models import image_form, images, resnet18, rgb_cnn, torchscript_bytes  # noqa: E402

LAUNCH = """
import sys, uvicorn
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
s = Settings()
registry = ModelRegistry(s.model_dir, device=s.device, max_batch_bytes=s.max_batch_bytes)
uvicorn.run(create_app(s, registry), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-batch-bytes", type=int, default=256 << 20)
    ap.add_argument("--only", default="cnn64,resnet-shapley,resnet-ig")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    env = {**os.environ, "JOB_QUEUE": "inprocess", "DATABASE_URL": f"sqlite:///{tmp / 'j.db'}",
           "USER_MODEL_DIR": str(tmp / "um"), "LOAD_MODELS_ON_START": "false",
           "MAX_BATCH_BYTES": str(args.max_batch_bytes), "TORCH_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": "131072"}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(port)], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        models = {"cnn64": (rgb_cnn(3, 64), 64), "resnet": (resnet18(), 224)}
        for name, (module, size) in models.items():
            r = httpx.post(f"{url}/v2/repository/models", data=image_form(name, 3, size),
                           files={"file": (f"{name}.pt", torchscript_bytes(module))}, timeout=600)
            assert r.status_code == 201, r.text
        cases = {
            "cnn64": ("cnn64", "shapley", {"inputs": [images(1, 3, 64)[0].tolist()]}),
            "resnet-shapley": ("resnet", "shapley", {"inputs": [images(1, 3, 224)[0].tolist()],
                               "budget": 256, "parameters": {"patch_size": 28}}),
            "resnet-ig": ("resnet", "integrated-gradients",
                          {"inputs": [images(1, 3, 224, seed=1)[0].tolist()]}),
        }
        for case in args.only.split(","):
            name, explainer, body = cases[case]
            info = httpx.get(f"{url}/v2/models/{name}", timeout=30).json()["info"]
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
            before = status(proc.pid, "VmRSS")
            t = time.perf_counter()
            r = httpx.post(f"{url}/v2/models/{name}/explain/{explainer}", json=body, timeout=900)
            wall = time.perf_counter() - t
            peak = status(proc.pid, "VmHWM") - before
            meta = r.json().get("meta", {}) if r.status_code == 200 else r.text[:200]
            evals = meta.get("n_model_evals") if isinstance(meta, dict) else meta
            print(json.dumps({"case": case, "max_batch_bytes": args.max_batch_bytes,
                              "status": r.status_code, "rows_per_call": info.get("rows_per_call"),
                              "row_bytes": info.get("row_bytes"), "evals": evals,
                              "wall_s": round(wall, 1), "peak_increase_mb": round(peak / 1e6)}))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
