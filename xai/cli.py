"""xai: command line for the attribution service (`xai ...` or `python -m xai ...`).

The server is --url, else XAI_URL, else http://127.0.0.1:8000; the key is --api-key, else
XAI_API_KEY. Both may stand before or after the subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from xai.client import Client, XaiError
from xai.errors import AuditRowsFailed, JobFailed
from xai.results import frame


def read_instances(path: Path) -> Any:
    """CSV or Parquet (header = feature names: a DataFrame, checked against the model's
    features), .npy (rows or images), JSON lines (a row or {feature: value} each) or a JSON
    list; an XaiError when the file cannot be read."""
    try:
        if path.suffix in (".csv", ".parquet"):
            import pandas as pd

            return pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
        if path.suffix == ".npy":
            import numpy as np

            return np.load(path, allow_pickle=False)
        text = path.read_text()
        if path.suffix == ".json":
            rows = json.loads(text)
            if not isinstance(rows, list):
                raise XaiError(f"{path}: a JSON file of instances holds a list")
            return rows
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except XaiError:
        raise
    except (OSError, ValueError, ImportError) as exc:  # missing, unreadable, not that format
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0][:200]
        raise XaiError(f"cannot read instances from {path}: {reason}") from None


def table(results: list[dict[str, Any]]) -> Any:
    """One row per instance: index, output, base and output values, one column per player."""
    return frame(results)


def write(results: list[dict[str, Any]], output: str | None, fmt: str | None) -> None:
    fmt = fmt or (Path(output).suffix.lstrip(".") if output else "jsonl")
    if fmt == "jsonl":
        text = "".join(json.dumps(r) + "\n" for r in results)
        if output:
            Path(output).write_text(text)
        else:
            sys.stdout.write(text)
        return
    if output is None:
        raise XaiError(f"--output is required for {fmt}")
    if fmt not in ("csv", "parquet"):
        raise XaiError(f"unknown format {fmt!r}: use jsonl, csv or parquet")
    table_ = table(results)
    try:
        if fmt == "csv":
            table_.to_csv(output, index=False)
        else:
            table_.to_parquet(output, index=False)
    except OSError as exc:
        raise XaiError(f"cannot write {output}: {exc.strerror or exc}") from None


def client(args: argparse.Namespace) -> Client:
    return Client(getattr(args, "url", None), api_key=getattr(args, "api_key", None))


def parse_target(text: str) -> Any:
    """--target: an index or a name, "all", a comma-separated list or a JSON list."""
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise XaiError(f"--target {text!r} is not a JSON list: {exc}") from None
    parts = [p.strip() for p in text.split(",")]
    values = [int(p) if p.isdigit() else p for p in parts]
    return values if len(values) > 1 else values[0]


def request_fields(args: argparse.Namespace) -> dict[str, Any]:
    try:
        parameters = json.loads(args.parameters)
    except json.JSONDecodeError as exc:
        raise XaiError(f"--parameters is not JSON: {exc}") from None
    fields: dict[str, Any] = {"seed": args.seed, "budget": args.budget, "parameters": parameters}
    if args.target is not None:
        fields["target"] = parse_target(args.target)
    return fields


def _summary_line(status: dict[str, Any]) -> str:
    progress = status.get("progress") or {}
    return (
        f"job {status.get('id')}: {status.get('status')}, {progress.get('done')}/"
        f"{progress.get('total')} instances"
    )


def audit(args: argparse.Namespace) -> int:
    """Exit 0 when every row was explained; 1 when the job failed or was cancelled (nothing
    written) or some rows failed (succeeded_with_errors: the results are written, the failed
    rows with their errors, and the server's message is a warning on stderr)."""
    with client(args) as c, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AuditRowsFailed)
        try:
            result = c.audit(
                args.model,
                read_instances(Path(args.file)),
                explainer=args.explainer,
                progress=not args.no_progress,
                idempotency_key=args.idempotency_key,
                chunk_size=args.chunk_size,
                **request_fields(args),
            )
        except JobFailed as exc:
            print(f"xai: error: {exc}", file=sys.stderr)
            print(_summary_line(exc.status), file=sys.stderr)
            return 1
    for w in caught:
        if issubclass(w.category, AuditRowsFailed):
            print(f"xai: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    write(result.results, args.output, args.format)
    status = result.status
    print(_summary_line(status), file=sys.stderr)
    return 0 if status["status"] == "succeeded" and not result.errors else 1


def explain(args: argparse.Namespace) -> int:
    path = Path(args.input)
    if path.suffix in (".csv", ".json", ".jsonl", ".parquet", ".npy"):  # a file, not a text
        inputs = read_instances(path)
    else:  # one instance inline: a JSON row or object, or a text
        try:
            inputs = [json.loads(args.input)]
        except json.JSONDecodeError:
            inputs = [args.input]
    with client(args) as c:
        if args.plot:
            fmt = Path(args.plot).suffix.lstrip(".") or "png"
            if fmt == "json":
                fmt = "vega-lite"
            c.plot(
                args.model,
                inputs,
                explainer=args.explainer,
                format=fmt,
                kind=args.kind,
                path=args.plot,
                **request_fields(args),
            )
            print(f"wrote {args.plot}", file=sys.stderr)
            return 0
        explained = c.explain(args.model, inputs, explainer=args.explainer, **request_fields(args))
    if args.json:
        print(json.dumps(explained.raw))
        return 0
    k = len(explained.output_names or [None])  # explanations per instance
    for i, e in enumerate(explained.explanations):
        names = [p["text"] for p in e.get("players") or []] or explained.feature_names
        print(
            f"[{i // k}] {e['output_name']}: f(x) = {e['instance_output_value']:.6g}, "
            f"E[f(x)] = {e['base_value']:.6g}"
        )
        order = sorted(range(len(e["values"])), key=lambda j: -abs(e["values"][j]))
        for j in order[: args.top]:
            print(f"  {e['values'][j]:+.6g}  {names[j] if j < len(names) else j}")
        for w in e.get("warnings") or []:
            print(f"  warning {w['code']}: {w['message']}")
    return 0


def models(args: argparse.Namespace) -> int:
    with client(args) as c:
        for m in c.models():
            print(f"{m['name']}\t{m['version']}\t{m['modality']}\t{m['state']}")
    return 0


def jobs(args: argparse.Namespace) -> int:
    with client(args) as c:
        for j in c.jobs(limit=args.limit):
            p = j["progress"]
            print(f"{j['id']}\t{j['kind']}\t{j['model']}\t{j['status']}\t{p['done']}/{p['total']}")
    return 0


def job(args: argparse.Namespace) -> int:
    with client(args) as c:
        status = c.cancel(args.id) if args.cancel else c.job(args.id)
        if args.results:
            write(list(c.results(args.id)), args.results, None)
            print(f"wrote {args.results}", file=sys.stderr)
        if args.plot:
            fmt = Path(args.plot).suffix.lstrip(".") or "png"
            c.job_plot(
                args.id,
                kind=args.kind,
                feature=args.feature,
                format="vega" if fmt == "json" else fmt,
                path=args.plot,
            )
            print(f"wrote {args.plot}", file=sys.stderr)
    print(json.dumps(status, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    # --url/--api-key on the main parser and on every subcommand. SUPPRESS: an option left out
    # sets nothing, so a subcommand never overwrites the value given before it (the parsers
    # share these action objects: their default must stay SUPPRESS everywhere).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="default: XAI_URL")
    common.add_argument("--api-key", default=argparse.SUPPRESS, help="default: XAI_API_KEY")
    main = argparse.ArgumentParser(prog="xai", description=__doc__, parents=[common])
    sub = main.add_subparsers(dest="command", required=True)

    def request_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--explainer", default="shapley")
        p.add_argument("--budget", type=int)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--target", help='an output index or name, "all", or a list: 0,1 or ["a", "b"]'
        )
        p.add_argument("--parameters", default="{}", help="explainer options as JSON")

    p = sub.add_parser("audit", parents=[common], help="explain every row of a file as a job")
    p.add_argument("model")
    p.add_argument("file", help=".csv or .parquet (header = features), .npy, .jsonl or .json")
    request_options(p)
    p.add_argument("--chunk-size", type=int)
    p.add_argument("--idempotency-key")
    p.add_argument("--output", "-o", help="file to write; by extension .jsonl, .csv, .parquet")
    p.add_argument("--format", choices=["jsonl", "csv", "parquet"])
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=audit)

    p = sub.add_parser("explain", parents=[common], help="explain one instance (or a file)")
    p.add_argument("model")
    p.add_argument(
        "input", help="a JSON row or object, a text, or a .csv/.parquet/.npy/.jsonl/.json file"
    )
    request_options(p)
    p.add_argument("--top", type=int, default=10, help="players printed, largest |value| first")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.add_argument("--plot", help="write a plot instead: .png, .svg or .json (Vega-Lite)")
    p.add_argument("--kind", default="auto", help="plot kind: auto, waterfall, bar, text, ...")
    p.set_defaults(run=explain)

    sub.add_parser("models", parents=[common], help="list models").set_defaults(run=models)
    p = sub.add_parser("jobs", parents=[common], help="list recent jobs")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(run=jobs)

    p = sub.add_parser("job", parents=[common], help="a job's status; cancel, results, plots")
    p.add_argument("id")
    p.add_argument("--cancel", action="store_true", help="cancel it (DELETE /v2/jobs/{id})")
    p.add_argument("--results", help="write its results: .jsonl, .csv or .parquet")
    p.add_argument("--plot", help="write a global plot of an audit: .png, .svg, .json")
    p.add_argument("--kind", default="summary", help="summary, beeswarm or dependence")
    p.add_argument("--feature", help="dependence: the feature")
    p.set_defaults(run=job)
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except XaiError as exc:  # one line, no traceback: unreachable, refused key, 4xx/5xx
        print(f"xai: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # a missing input file, invalid JSON options
        print(f"xai: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
