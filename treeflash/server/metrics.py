"""Prometheus metrics, in a registry of the app's own (two apps in one process never share counters).

Per request: status by route, the wait for the engine, time to first token (as the server sees it: queue wait included),
time per output token and tokens per second (the engine's own timing of each choice). Read at
scrape time: queue depth, whether a request is running, and the engine's running speculation
totals, tau and acceptance per depth (definitions in treeflash.spec.stats).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from treeflash.server.worker import Job, Worker

ROUTES = ("/chat/completions", "/completions", "/models", "/health", "/metrics", "/tokenize", "/detokenize", "/messages",
          "/messages/count_tokens", "/responses")

_TIME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
_BUDGET_BUCKETS = (0, 4, 8, 16, 32, 48, 64, 128, 256)  # draft nodes per step (--budget auto's arms by default)


def route_label(path: str) -> str:
    """A fixed set of labels, whatever paths clients send (label values must not be unbounded)."""
    if path.startswith("/v1/"):
        path = path[3:]
    if path.startswith("/models/"):
        return "/models"
    return path if path in ROUTES else "other"


class Metrics:
    def __init__(self, worker: Worker, model_name: str = ""):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("treeflash_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.ttft = Histogram("treeflash_time_to_first_token_seconds", "request arrival to first token, queue wait included",
                              buckets=_TIME_BUCKETS, registry=r)
        self.tpot = Histogram("treeflash_time_per_output_token_seconds", "decode time per output token after the first, per choice",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.rate = Histogram("treeflash_tokens_per_second", "output tokens per second of generation, per choice",
                              buckets=_RATE_BUCKETS, registry=r)
        self.queue_wait = Histogram("treeflash_queue_wait_seconds", "time a request waited for the engine (submitted to started)",
                                    buckets=_TIME_BUCKETS, registry=r)
        self.prompt_tokens = Counter("treeflash_prompt_tokens", "prompt tokens processed", registry=r)
        self.output_tokens = Counter("treeflash_generation_tokens", "tokens generated", registry=r)
        self.cached_tokens = Counter("treeflash_prefix_cache_hit_tokens", "prompt tokens resumed from the prefix cache, not prefilled",
                                     registry=r)
        self.constrained = Counter("treeflash_constrained_requests", "requests with a structured-output grammar (by kind: "
                                   "json_schema, regex, grammar, choice) or min_tokens", ["kind"], registry=r)
        queue = Gauge("treeflash_queue_depth", "requests waiting for the engine", registry=r)
        queue.set_function(lambda: worker.queue_depth)
        running = Gauge("treeflash_requests_running", "requests the engine is generating for (0 or 1)", registry=r)
        running.set_function(lambda: float(worker.busy))
        ready = Gauge("treeflash_model_ready", "1 once the model is loaded", registry=r)
        ready.set_function(lambda: float(worker.state == "ready"))
        r.register(_SpecCollector(worker))
        r.register(_GatewayCollector(worker, model_name))
        r.register(_MemoryCollector(worker))

    def observe_job(self, job: Job, arrived_at: float) -> None:
        kinds = {r.grammar.kind for r in job.requests if r.grammar is not None} | {"min_tokens" for r in job.requests if r.min_tokens}
        for kind in kinds:
            self.constrained.labels(kind).inc()
        if job.started_at is not None:
            self.queue_wait.observe(job.started_at - job.submitted_at)
        if job.first_event_at is not None:
            self.ttft.observe(job.first_event_at - arrived_at)
        for u in job.usages:
            self.prompt_tokens.inc(u.prompt_tokens)
            self.output_tokens.inc(u.completion_tokens)
            self.cached_tokens.inc(u.cached_tokens)
            if u.seconds > 0:
                self.rate.observe(u.completion_tokens / u.seconds)
            if u.completion_tokens > 1:
                self.tpot.observe((u.seconds - u.first_token_s) / (u.completion_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SpecCollector:
    """tau, acceptance per depth and the budget of each step (draft nodes; 0 = plain) from the engine's
    running totals, read when scraped."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def describe(self):
        return []

    def collect(self):
        engine = self.worker.engine
        if engine is None:
            return
        stats = engine.totals
        passes = CounterMetricFamily("treeflash_spec_target_passes", "target forward passes while decoding")
        passes.add_metric([], stats.passes)
        committed = CounterMetricFamily("treeflash_spec_committed_tokens", "tokens committed by those passes (accepted + bonus)")
        committed.add_metric([], stats.committed)
        tau = GaugeMetricFamily("treeflash_spec_tau", "mean tokens committed per target pass (1.0 without a drafter)")
        tau.add_metric([], stats.tau)
        accept = GaugeMetricFamily("treeflash_spec_acceptance", "fraction of passes whose draft reached a depth and was accepted there",
                                   labels=["depth"])
        for depth, rate in enumerate(stats.acceptance_per_depth(), start=1):
            accept.add_metric([str(depth)], rate)
        per_budget = CounterMetricFamily("treeflash_spec_steps_by_budget", "decode steps by their budget (draft nodes; 0 = a "
                                         "plain step): what --budget auto chose", labels=["budget"])
        for b, n in sorted(stats.steps_per_budget.items()):
            per_budget.add_metric([str(b)], n)
        yield from (passes, committed, tau, accept, per_budget, _budget_histogram(stats.steps_per_budget))


def _budget_histogram(steps_per_budget: dict[int, int]) -> HistogramMetricFamily:
    """The per-step budgets as a Prometheus histogram (cumulative buckets of draft nodes)."""
    h = HistogramMetricFamily("treeflash_spec_step_budget", "draft nodes per decode step (0 = a plain step)")
    buckets = [(str(le), sum(n for b, n in steps_per_budget.items() if b <= le)) for le in _BUDGET_BUCKETS]
    buckets.append(("+Inf", sum(steps_per_budget.values())))
    h.add_metric([], buckets, sum_value=sum(b * n for b, n in steps_per_budget.items()))
    return h


class _GatewayCollector:
    """The gauges Kubernetes' Gateway API Inference Extension endpoint picker scrapes to route between
    replicas, under vLLM's names, which its model-server protocol lists and its default engine config
    reads (docs/proposals/003-model-server-protocol in kubernetes-sigs/gateway-api-inference-extension):
    queued requests, running requests, KV-cache usage as a fraction (vLLM: "1 means 100 percent"),
    and the LoRA info gauge (no adapters are served: max_lora 0, its value the scrape time)."""

    def __init__(self, worker: Worker, model_name: str):
        self.worker = worker
        self.model_name = model_name

    def describe(self):
        return []

    def collect(self):
        labels, values = ["model_name"], [self.model_name]
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "requests waiting for the engine", labels=labels)
        waiting.add_metric(values, self.worker.queue_depth)
        running = GaugeMetricFamily("vllm:num_requests_running", "requests the engine is generating for", labels=labels)
        running.add_metric(values, float(self.worker.busy))
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent (committed tokens of the "
                                  "running request / cache capacity; 0 when idle)", labels=labels)
        usage.add_metric(values, self._kv_usage())
        lora = GaugeMetricFamily("vllm:lora_requests_info", "LoRA adapters (none are served); the value is the scrape time",
                                 labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        lora.add_metric(["0", "", ""], time.time())
        yield from (waiting, running, usage, lora)

    def _kv_usage(self) -> float:
        engine = self.worker.engine
        if engine is None or not self.worker.busy:
            return 0.0
        return min(1.0, engine.cache.seq_len / engine.cache.max_len)


class _MemoryCollector:
    """The memory plan the engine was sized by (models/memory) and the context it allocated."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def describe(self):
        return []

    def collect(self):
        engine = self.worker.engine
        if engine is None:
            return
        context = GaugeMetricFamily("treeflash_context_tokens", "tokens of context the KV cache was allocated for")
        context.add_metric([], engine.max_context)
        yield context
        plan = getattr(getattr(engine, "config", None), "memory_plan", None)
        if plan is None:
            return
        parts = GaugeMetricFamily("treeflash_memory_planned_bytes", "planned device bytes by part (treeflash fit's table)",
                                  labels=["part"])
        for p in plan.parts:
            parts.add_metric([p.name], p.bytes)
        total = GaugeMetricFamily("treeflash_memory_planned_total_bytes", "planned device bytes, all parts")
        total.add_metric([], plan.total)
        yield from (parts, total)
