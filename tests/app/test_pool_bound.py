"""The compute bound is real: work abandoned at its deadline keeps its EXPLAIN_WORKERS slot
(and its place among MAX_PENDING_EXPLAINS) until its thread has stopped, and stops at its next
deadline check. A real server process with EXPLAIN_WORKERS=2, and the pool itself on a real
event loop with work that ignores its cancel check."""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from app.fair import FairSlots
from app.pool import ComputePool
from tests.app.test_bounded_time import cpu_seconds, digit, server

IG = "/v2/models/digits-cnn/explain/integrated-gradients"
WORKERS = 2


def heavy(seed: int) -> dict[str, Any]:
    """65,536 gradient rows asked in one pass of batch_size rows (~1.5 CPU-s unsliced)."""
    params = {"baseline": "uniform", "steps": 1024, "n_baselines": 64, "batch_size": 65536}
    return {"inputs": [digit()], "seed": seed, "timeout_ms": 300, "parameters": params}


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"{name} missing from /metrics"
    return float(found.group(1))


@pytest.fixture(scope="module")
def two_workers(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    env = {"EXPLAIN_WORKERS": str(WORKERS)}
    with server(model_dir, tmp_path_factory.mktemp("pool"), **env) as pair:
        # Warm up: the first gradient pass of a fresh process takes seconds (torch's start).
        httpx.post(pair[0] + IG, json=heavy(999), timeout=60)
        yield pair


def test_abandoned_heavy_requests_never_exceed_the_workers(
    two_workers: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = two_workers
    answers: list[tuple[int, float]] = []
    peaks: list[float] = []
    firing = True

    def fire(seed: int) -> None:
        began = time.monotonic()
        r = httpx.post(
            url + IG, json=heavy(seed), headers={"Cache-Control": "no-cache"}, timeout=60
        )
        answers.append((r.status_code, time.monotonic() - began))

    def watch() -> None:
        while firing:
            text = httpx.get(url + "/metrics", timeout=10).text
            peaks.append(gauge(text, "explain_compute_threads"))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for _round in range(2):  # one key's abandoned requests, twice over
        shots = [threading.Thread(target=fire, args=(seed,)) for seed in range(6)]
        for shot in shots:
            shot.start()
        for shot in shots:
            shot.join()
    firing = False
    watcher.join()
    assert [code for code, _ in answers] == [504] * 12, answers
    # The 504 goes out at the deadline (300 ms + the route's grace), not when the work stops.
    assert max(took for _, took in answers) < 2.5, answers
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert gauge(metrics, "explain_compute_threads_peak") <= WORKERS
    assert max(peaks) <= WORKERS
    # Abandoned work stops at its next deadline check (passes of ~0.1 s), then frees its slot.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        metrics = httpx.get(url + "/metrics", timeout=10).text
        if (
            gauge(metrics, "explain_abandoned_running") == 0
            and gauge(metrics, "explain_pending") == 0
        ):
            break
        time.sleep(0.05)
    assert gauge(metrics, "explain_abandoned_running") == 0
    assert gauge(metrics, "explain_pending") == 0
    before = cpu_seconds(proc.pid)
    time.sleep(1.0)
    assert cpu_seconds(proc.pid) - before < 0.3, "abandoned work still computes"


def test_a_light_request_answers_in_time_after_abandoned_heavy_ones(
    two_workers: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = two_workers
    shots = [
        threading.Thread(
            target=httpx.post,
            args=(url + IG,),
            kwargs={
                "json": heavy(100 + s),
                "headers": {"Cache-Control": "no-cache"},
                "timeout": 60,
            },
        )
        for s in range(6)
    ]
    for shot in shots:
        shot.start()
    for shot in shots:
        shot.join()  # every one answered 504: their threads may still be stopping
    light = {"inputs": [digit()], "timeout_ms": 3000, "parameters": {"steps": 16}}
    began = time.monotonic()
    r = httpx.post(url + IG, json=light, headers={"Cache-Control": "no-cache"}, timeout=30)
    took = time.monotonic() - began
    assert r.status_code == 200, r.text
    assert took < 1.5, f"a light request took {took:.2f} s behind abandoned work"


def test_an_abandoned_thread_keeps_its_slot_and_its_pending_place() -> None:
    """Work that ignores its cancel check (a long native call) holds the slot until it
    returns: the next call waits for it instead of running beside it."""
    release = threading.Event()
    seen: dict[str, Any] = {}

    async def main() -> None:
        state = SimpleNamespace(
            limiter=FairSlots(1),
            pending_explains=0,
            settings=SimpleNamespace(max_pending_explains=2),
        )
        pool = ComputePool(state, CollectorRegistry())
        with anyio.move_on_after(0.2):
            await pool.run(release.wait, 5.0)  # the route's deadline passes: abandoned
        seen["abandoned"] = (pool.abandoned, pool.threads)
        seen["held"] = (state.limiter.busy, state.pending_explains)
        seen["full_at_two"] = pool.full() is False
        order: list[str] = []

        async def second() -> None:
            order.append(str(await pool.run(lambda: "second")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            await anyio.sleep(0.3)
            order.append("released")  # the second call is still waiting for the slot
            release.set()
        seen["order"] = order
        await anyio.sleep(0.05)
        seen["after"] = (state.limiter.busy, state.pending_explains, pool.abandoned)
        seen["peak"] = pool.peak

    anyio.run(main)
    assert seen["abandoned"] == (1, 1)
    assert seen["held"] == (1, 1)
    assert seen["full_at_two"]
    assert seen["order"] == ["released", "second"]
    assert seen["after"] == (0, 0, 0)
    assert seen["peak"] == 1


def test_a_call_cancelled_while_queued_holds_nothing() -> None:
    release = threading.Event()
    seen: dict[str, Any] = {}

    async def main() -> None:
        state = SimpleNamespace(
            limiter=FairSlots(1),
            pending_explains=0,
            settings=SimpleNamespace(max_pending_explains=2),
        )
        pool = ComputePool(state, CollectorRegistry())
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.run, release.wait, 5.0)
            await anyio.sleep(0.1)
            with anyio.move_on_after(0.1):
                await pool.run(lambda: "never")  # queued behind the first: then given up
            seen["queued_gone"] = state.pending_explains
            release.set()
        await anyio.sleep(0.05)
        seen["after"] = (state.limiter.busy, state.pending_explains, pool.peak)

    anyio.run(main)
    assert seen["queued_gone"] == 1
    assert seen["after"] == (0, 0, 1)


def test_gradient_passes_are_short_under_a_cancel_check(registry: Any) -> None:
    """Asked for one pass of 32,768 rows (~1.3 s of a real CNN's forward and backward pass),
    a cancel that comes 0.2 s in is seen at the next pass of ~SLICE_S, not after the pass."""
    import numpy as np

    from explainers.games import Cancelled
    from explainers.games.deadlines import stop_when
    from explainers.gradients.integrated import input_gradients, score_function

    model = registry.get("digits-cnn")
    score = score_function(model, "probability")
    points = np.random.default_rng(0).random((32768, *model.input_shape))
    began = time.monotonic()
    input_gradients(score, points, 0, 32768)  # no check set: one pass, as asked
    whole = time.monotonic() - began
    withdrawn = threading.Event()
    timer = threading.Timer(0.2, withdrawn.set)
    began = time.monotonic()
    timer.start()
    with stop_when(withdrawn.is_set), pytest.raises(Cancelled):
        input_gradients(score, points, 0, 32768)
    stopped = time.monotonic() - began
    assert whole > 0.8, f"the unsliced pass took {whole:.2f} s: too light to tell"
    assert stopped < 0.2 + 0.35 * whole, f"stopped after {stopped:.2f} s (whole: {whole:.2f} s)"


def test_slots_go_round_robin_between_keys_and_a_key_has_a_share() -> None:
    """Key C queues 6 calls on 1 slot, then key D one: D's call runs second (after the one C
    call already running), not seventh; C's others follow. A key past its share is full while
    another is not (the route answers 429 to it alone)."""
    gates = [threading.Event() for _ in range(7)]
    order: list[str] = []
    seen: dict[str, Any] = {}

    async def main() -> None:
        state = SimpleNamespace(
            limiter=FairSlots(1),
            pending_explains=0,
            settings=SimpleNamespace(max_pending_explains=8, max_pending_per_key=6),
        )
        pool = ComputePool(state, CollectorRegistry())

        def call(name: str, gate: threading.Event) -> None:
            order.append(name)
            gate.wait(5)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(partial(pool.run, call, f"C{i}", gates[i], who="key:C"))
                await anyio.sleep(0.01)
            seen["c_full"], seen["d_full"] = pool.full_for("key:C"), pool.full_for("key:D")
            tg.start_soon(partial(pool.run, call, "D0", gates[6], who="key:D"))
            await anyio.sleep(0.05)
            for gate in gates:  # one at a time: each finishes, the next gets the slot
                gate.set()
                await anyio.sleep(0.05)
        seen["after"] = (state.limiter.busy, state.pending_explains, dict(pool.by_key))

    anyio.run(main)
    assert order == ["C0", "D0", "C1", "C2", "C3", "C4", "C5"]
    assert seen["c_full"] is True and seen["d_full"] is False
    assert seen["after"] == (0, 0, {})


def test_active_keys_share_the_slots_and_a_lone_key_uses_them_all() -> None:
    """Two slots: key C alone takes both; once key D is active each holds one, so D's next
    request finds its slot free while C still has work queued; when D has been quiet for
    active_s, C takes both again."""
    seen: dict[str, Any] = {}

    async def main() -> None:
        slots = FairSlots(2, active_s=0.3)
        await slots.acquire("C")
        await slots.acquire("C")  # alone: both slots
        seen["alone"] = dict(slots.running)
        queued = [asyncio.ensure_future(slots.acquire("C")) for _ in range(3)]
        d1 = asyncio.ensure_future(slots.acquire("D"))
        await asyncio.sleep(0.01)
        seen["d_waits_for_a_release"] = not d1.done()
        slots.release("C")  # one of C's finishes: D's turn (share now 1 each)
        await asyncio.sleep(0.01)
        seen["d_granted"] = d1.done() and slots.running == {"C": 1, "D": 1}
        slots.release("D")  # D done: C is at its share, the slot stays for D
        await asyncio.sleep(0.01)
        seen["kept_for_d"] = slots.busy == 1 and not any(q.done() for q in queued)
        d2 = asyncio.ensure_future(slots.acquire("D"))
        await asyncio.sleep(0.01)
        seen["d2_at_once"] = d2.done()
        slots.release("D")
        await asyncio.sleep(0.5)  # D quiet past active_s: C takes the free slot
        seen["c_takes_both"] = sum(q.done() for q in queued) == 1 and slots.running == {"C": 2}
        for q in queued:
            q.cancel()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert seen["alone"] == {"C": 2}
    assert seen["d_waits_for_a_release"] and seen["d_granted"]
    assert seen["kept_for_d"] and seen["d2_at_once"] and seen["c_takes_both"]
