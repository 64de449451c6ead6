"""xai: command line for the attribution service (python -m xai ...)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from xai.client import Client, ServiceError


def read_instances(path: Path) -> list[Any]:
    """CSV (header = feature names), JSON lines (a row or {feature: value} each) or JSON list."""
    if path.suffix == ".csv":
        import pandas as pd

        return list(pd.read_csv(path).to_dict(orient="records"))
    text = path.read_text()
    if path.suffix == ".json":
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def table(results: list[dict[str, Any]]) -> Any:
    """One row per instance: index, output, base and output values, one column per player."""
    import pandas as pd

    rows = []
    for r in results:
        row: dict[str, Any] = {"index": r["index"]}
        if "explanation" not in r:
            row["error"] = r.get("error")
        else:
            e = r["explanation"]
            row.update(
                output=e["output_name"],
                base_value=e["base_value"],
                instance_output_value=e["instance_output_value"],
            )
            row.update(zip(r["feature_names"], e["values"], strict=True))
        rows.append(row)
    return pd.DataFrame(rows)


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
        raise SystemExit(f"--output is required for {fmt}")
    frame = table(results)
    if fmt == "csv":
        frame.to_csv(output, index=False)
    elif fmt == "parquet":
        frame.to_parquet(output, index=False)
    else:
        raise SystemExit(f"unknown format {fmt!r}: use jsonl, csv or parquet")


def audit(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {
        "seed": args.seed,
        "budget": args.budget,
        "parameters": json.loads(args.parameters),
    }
    if args.target is not None:
        fields["target"] = int(args.target) if args.target.isdigit() else args.target
    with Client(args.url) as client:
        result = client.audit(
            args.model,
            read_instances(Path(args.file)),
            explainer=args.explainer,
            progress=not args.no_progress,
            idempotency_key=args.idempotency_key,
            chunk_size=args.chunk_size,
            **fields,
        )
    write(result.results, args.output, args.format)
    status = result.status
    print(
        f"job {status['id']}: {status['status']}, {status['progress']['done']}/"
        f"{status['progress']['total']} instances",
        file=sys.stderr,
    )
    return 0 if status["status"] == "succeeded" else 1


def models(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        for m in client.models():
            print(f"{m['name']}\t{m['version']}\t{m['modality']}\t{m['state']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xai", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("audit", help="explain every row of a file as a batch job")
    p.add_argument("model")
    p.add_argument("file", help=".csv (header = features), .jsonl or .json")
    p.add_argument("--explainer", default="shapley")
    p.add_argument("--budget", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target")
    p.add_argument("--parameters", default="{}", help="explainer options as JSON")
    p.add_argument("--chunk-size", type=int)
    p.add_argument("--idempotency-key")
    p.add_argument("--output", "-o", help="file to write; by extension .jsonl, .csv, .parquet")
    p.add_argument("--format", choices=["jsonl", "csv", "parquet"])
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=audit)
    sub.add_parser("models", help="list models").set_defaults(run=models)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
