"""/metrics carries the gauges the Gateway API Inference Extension's endpoint picker (EPP) reads from a
model server, with the types its model-server protocol specifies, and their values follow the engine:
a real (tiny) engine, slowed down so the test can scrape while a request runs.

The protocol, quoted below, lets a server choose its names but fixes types and meaning; treeflash
uses vLLM's names because the EPP's default engine configuration reads exactly those:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/main/docs/proposals/003-model-server-protocol/README.md
"""

import re
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.models.test_loaders import random_hf, write_gguf
from treeflash.engine.engine import Engine, EngineConfig
from treeflash.models.loader import load_model
from treeflash.server.app import ServerConfig, create_app

pytestmark = pytest.mark.deploy

# docs/proposals/003-model-server-protocol/README.md, "Metrics Reporting" (kubernetes-sigs/gateway-api-inference-extension
# at 84436a96b9e6ce2b59ddacd3d04c31b4fbd442de), the required rows and the LoRA section, verbatim:
PROTOCOL = """
| TotalQueuedRequests         | Gauge     | The current total number of requests in the queue.| `vllm:num_requests_waiting`| `nv_trt_llm_request_metrics{request_type=waiting}`| `trtllm_num_requests_waiting` | `sglang:num_queue_reqs`
| TotalRunningRequests         | Gauge     | The current total number of requests actively being served on the model server.| `vllm:num_requests_running`| `nv_trt_llm_request_metrics{request_type=scheduled}`| `trtllm_num_requests_running` | `sglang:num_running_reqs`
| KVCacheUtilization| Gauge     | The current KV cache utilization in percentage.| `vllm:kv_cache_usage_perc`| `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}`| `trtllm_kv_cache_utilization` | `sglang:token_usage`
* Metric name implemented in vLLM: `vllm:lora_requests_info`
* Metric type: Gauge
* Metric labels:
  * `max_lora`: The maximum number of adapters that can be loaded to GPU memory to serve a batch.
  * `running_lora_adapters`: A comma separated list of adapters that are currently loaded in GPU
  * `waiting_lora_adapters`: A comma separated list of adapters that are waiting to be served. Example: `"waiting_lora_adapters": "adapter1, adapter2"`
"""


def protocol_metrics() -> dict[str, str]:
    """vLLM metric name -> type, from the quoted table rows and the LoRA section."""
    out = {}
    for row in re.findall(r"^\| (\w+)\s*\| (\w+)\s*\|[^|]*\| `([^`]+)`", PROTOCOL, re.M):
        out[row[2]] = row[1].lower()
    lora = re.search(r"implemented in vLLM: `([^`]+)`\n\* Metric type: (\w+)", PROTOCOL)
    out[lora[1]] = lora[2].lower()
    return out


LORA_LABELS = set(re.findall(r"^  \* `(\w+)`", PROTOCOL, re.M))


class SlowEngine(Engine):
    """The real engine, 50 ms per step: long enough to scrape while a request runs."""

    def stream(self, req, cancelled=None):
        for event in super().stream(req, cancelled):
            time.sleep(0.05)
            yield event


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_gguf(tmp_path_factory.mktemp("gw") / "tiny.gguf", random_hf("llama"))
    return SlowEngine(load_model(str(path), device="cpu", progress=False), EngineConfig(max_context=128))


def scrape(http) -> dict[str, tuple[str, list]]:
    r = http.get("/metrics")
    assert r.status_code == 200
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(r.text)}


def value(families, name) -> float:
    (sample,) = families[name][1]
    return sample.value


def test_protocol_metrics_are_exported_with_their_types(engine):
    expected = protocol_metrics()
    assert set(expected) == {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                             "vllm:lora_requests_info"}
    assert LORA_LABELS == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    app = create_app(ServerConfig(served_model_name="tiny"), lambda: engine)
    with TestClient(app) as http:
        families = scrape(http)  # while loading (or just loaded): the gauges exist from the start
        for name, kind in expected.items():
            assert families[name][0] == kind, (name, families[name][0])
        (lora,) = families["vllm:lora_requests_info"][1]
        assert set(lora.labels) == LORA_LABELS and lora.labels["max_lora"] == "0"
        assert abs(lora.value - time.time()) < 60  # the protocol: "the last updated timestamp"
        assert families["vllm:num_requests_waiting"][1][0].labels == {"model_name": "tiny"}


def test_gauges_follow_the_engine(engine):
    app = create_app(ServerConfig(served_model_name="tiny"), lambda: engine)
    body = {"prompt": "!#%&", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
    with TestClient(app) as http:
        for _ in range(500):
            if http.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        idle = scrape(http)
        assert value(idle, "vllm:num_requests_waiting") == 0 and value(idle, "vllm:num_requests_running") == 0
        assert value(idle, "vllm:kv_cache_usage_perc") == 0
        done = []
        threads = [threading.Thread(target=lambda: done.append(http.post("/v1/completions", json=body).status_code)) for _ in range(2)]
        for t in threads:
            t.start()
        worker = app.state.treeflash.worker
        for _ in range(500):  # one running, one waiting
            if worker.busy and worker.queue_depth == 1 and engine.cache.seq_len > 8:
                break
            time.sleep(0.01)
        busy = scrape(http)
        assert value(busy, "vllm:num_requests_running") == 1 and value(busy, "vllm:num_requests_waiting") == 1
        usage = value(busy, "vllm:kv_cache_usage_perc")
        assert 4 / engine.cache.max_len < usage <= (4 + 40 + 1) / engine.cache.max_len  # prompt + output so far, of the capacity
        for t in threads:
            t.join(timeout=60)
        assert done == [200, 200]
        after = scrape(http)
        assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0
