"""tritonclient's HTTP client against our server: python triton_client.py URL CASES_JSON.

Prints one JSON object: server liveness/readiness/metadata, per-model readiness and metadata
(plain and /versions/{v}), each case's output, and each error case's status and message.
"""

from __future__ import annotations

from typing import Any

import tritonclient.http as httpclient
from cases import array, emit, load
from tritonclient.utils import InferenceServerException


def infer(client: httpclient.InferenceServerClient, case: dict[str, Any]) -> Any:
    x = array(case)
    tensor = httpclient.InferInput(case.get("input", "input"), list(x.shape), case["datatype"])
    tensor.set_data_from_numpy(x, binary_data=case["binary_in"])
    outputs = None  # no outputs named: tritonclient asks for every output in binary
    if "binary_out" in case:
        outputs = [
            httpclient.InferRequestedOutput(case.get("output", "output"), case["binary_out"])
        ]
    return client.infer(
        case["model"],
        [tensor],
        model_version=case.get("version", ""),
        outputs=outputs,
        request_id=case.get("id", ""),
        parameters=case.get("parameters"),
    )


def main() -> None:
    url, spec = load()
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    result: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(),
        "models": {},
        "results": [],
        "errors": [],
    }
    for name in spec["models"]:
        meta = client.get_model_metadata(name)
        version = meta["versions"][0]
        result["models"][name] = {
            "ready": client.is_model_ready(name),
            "version_ready": client.is_model_ready(name, version),
            "other_version_ready": client.is_model_ready(name, "0" * 16),
            "metadata": meta,
            "version_metadata": client.get_model_metadata(name, version),
        }
    result["unknown_model_ready"] = client.is_model_ready("no-such-model")
    for case in spec["cases"]:
        answer = infer(client, case)
        output = answer.get_output("output")
        result["results"].append(
            {
                "id": answer.get_response()["id"],
                "shape": output["shape"],
                "datatype": output["datatype"],
                "binary": "binary_data_size" in (output.get("parameters") or {}),
                "data": answer.as_numpy("output").reshape(-1).tolist(),
            }
        )
    for case in spec.get("errors", []):
        try:
            infer(client, case)
            result["errors"].append({"status": None})
        except InferenceServerException as exc:
            result["errors"].append({"status": exc.status(), "message": exc.message()})
    client.close()
    emit(result)


if __name__ == "__main__":
    main()
