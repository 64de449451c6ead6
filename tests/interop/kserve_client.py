"""The KServe Python SDK's REST client against our server: python kserve_client.py URL CASES.

Prints one JSON object: server liveness/readiness, per-model readiness, each case's output
(and whether it came back as binary), and each error case's status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from cases import array, emit, load
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

HEADER = "inference-header-content-length"


async def infer(
    client: InferenceRESTClient, url: str, case: dict[str, Any], headers: dict[str, str]
) -> Any:
    x = array(case)
    tensor = InferInput(case.get("input", "input"), list(x.shape), case["datatype"])
    tensor.set_data_from_numpy(x, binary_data=case["binary_in"])
    outputs = None
    if "binary_out" in case:
        name = case.get("output", "output")
        outputs = [RequestedOutput(name, {"binary_data": case["binary_out"]})]
    request = InferRequest(
        model_name=case["model"],
        infer_inputs=[tensor],
        request_id=case.get("id"),
        parameters=case.get("parameters"),
        request_outputs=outputs,
    )
    return await client.infer(url, request, model_name=case["model"], response_headers=headers)


async def main() -> None:
    url, spec = load()
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=120))
    result: dict[str, Any] = {
        "live": await client.is_server_live(url),
        "ready": await client.is_server_ready(url),
        "models": {
            name: {"ready": await client.is_model_ready(url, name)} for name in spec["models"]
        },
        "unknown_model_ready": await client.is_model_ready(url, "no-such-model"),
        "results": [],
        "errors": [],
    }
    for case in spec["cases"]:
        headers: dict[str, str] = {}
        answer = await infer(client, url, case, headers)
        output = answer.outputs[0]
        result["results"].append(
            {
                "id": answer.id,
                "name": output.name,
                "shape": list(output.shape),
                "datatype": output.datatype,
                "binary": HEADER in {k.lower() for k in headers},
                "data": output.as_numpy().reshape(-1).tolist(),
            }
        )
    for case in spec.get("errors", []):
        try:
            await infer(client, url, case, {})
            result["errors"].append({"status": None})
        except httpx.HTTPStatusError as exc:
            body = exc.response.json()
            result["errors"].append({"status": exc.response.status_code, "code": body["code"]})
    await client.close()
    emit(result)


if __name__ == "__main__":
    asyncio.run(main())
