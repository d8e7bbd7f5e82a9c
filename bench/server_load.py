"""Load test for `treeflash serve`: N concurrent streaming chat clients for D seconds.

Each client sends streaming requests back to back until the window closes; requests still running
then get `--drain` seconds to finish, after which the script disconnects them (which also checks
that the server cancels abandoned generations: it must be idle a moment later).

Reports: no 5xx (HTTP status or an error event inside a stream), every stream that was not cut by
the script ended with exactly one finish_reason, time to first token percentiles, throughput, the
server's own timing (its /metrics histograms), and, given the server's pid, its RSS over time and
the CPU its event-loop thread and its other threads used. The machine's load average is sampled
throughout (on a shared machine it says how much CPU the server could get). Writes JSON.

    treeflash serve --port 8000 --threads 1 &
    python -m bench.server_load --url http://127.0.0.1:8000 --pid $! --clients 32 --duration 120 \\
        --out bench/results/server_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

PROMPTS = [
    "Name three colors.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me one tip for learning Python.",
    "What is 12 times 12?",
    "Say hello in Spanish.",
    "List two planets.",
    "What is a prime number?",
]


@dataclass
class Result:
    client: int
    status: int = 0
    started: float = 0.0  # seconds since the run began
    ttft_s: float | None = None
    seconds: float | None = None
    completion_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    error: str | None = None  # an error event inside the stream, or the transport error
    cut: bool = False  # disconnected by this script at the end of the drain


async def one_request(client: httpx.AsyncClient, url: str, headers: dict, body: dict, res: Result, t0: float) -> None:
    sent = time.perf_counter()
    res.started = sent - t0
    async with client.stream("POST", url, json=body, headers=headers) as r:
        res.status = r.status_code
        if r.status_code != 200:
            res.error = (await r.aread()).decode(errors="replace")[:300]
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = chunk["error"].get("message", "error event")
                continue
            for choice in chunk.get("choices", []):
                if res.ttft_s is None and (choice["delta"].get("content") or choice.get("finish_reason")):
                    res.ttft_s = time.perf_counter() - sent
                if choice.get("finish_reason"):
                    res.finish_reasons.append(choice["finish_reason"])
            if chunk.get("usage"):
                res.completion_tokens = chunk["usage"]["completion_tokens"]
    res.seconds = time.perf_counter() - sent


async def client_loop(k: int, args, results: list[Result], deadline: float, t0: float) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/") + "/v1/chat/completions"
    timeout = httpx.Timeout(None, connect=30)
    async with httpx.AsyncClient(timeout=timeout) as client:
        i = 0
        while time.perf_counter() < deadline:
            body = {"messages": [{"role": "user", "content": PROMPTS[(k + i) % len(PROMPTS)]}], "max_tokens": args.max_tokens,
                    "temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}}
            if args.model:
                body["model"] = args.model
            res = Result(client=k)
            results.append(res)
            try:
                await one_request(client, url, headers, body, res, t0)
            except asyncio.CancelledError:
                res.cut = True
                raise
            except httpx.HTTPError as e:
                res.error = f"{type(e).__name__}: {e}"
            i += 1


async def sample_machine(pid: int | None, t0: float, samples: list, loads: list, stop: asyncio.Event, every: float) -> None:
    """Every `every` seconds: the server's RSS (when its pid is known) and the machine's 1-minute load average."""
    while not stop.is_set():
        now = round(time.perf_counter() - t0, 1)
        if pid is not None:
            rss = read_rss_mb(pid)
            if rss is not None:
                samples.append((now, rss))
        loads.append((now, round(os.getloadavg()[0], 2)))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


def read_thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the server's main thread, which runs the asyncio event loop
    (HTTP parsing, JSON, SSE), and of all its other threads together (the engine's thread, PyTorch's
    intra-op threads, the thread pool that tokenizes and renders templates)."""
    out = {"main_thread": 0.0, "other_threads": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / tick
        out["main_thread" if int(tid) == pid else "other_threads"] += seconds
    return out


async def server_metrics(url: str, headers: dict) -> dict:
    """Means of the server's own histograms (GET /metrics): its view of time to first token and of
    decode time per output token, which excludes the client and the network."""
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            text = (await c.get(url.rstrip("/") + "/metrics", headers=headers)).text
    except httpx.HTTPError as e:
        return {"error": str(e)}
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    out = {}
    for key, name in (("ttft_s", "treeflash_time_to_first_token_seconds"), ("time_per_output_token_s", "treeflash_time_per_output_token_seconds"),
                      ("tokens_per_s_per_choice", "treeflash_tokens_per_second")):
        count = values.get(name + "_count", 0)
        out[key + "_mean"] = round(values.get(name + "_sum", 0) / count, 4) if count else None
        out[key + "_count"] = int(count)
    out["generation_tokens_total"] = values.get("treeflash_generation_tokens_total")
    return out


def read_cpu_s(pid: int) -> float | None:
    """The process's user + system CPU seconds so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def read_cmdline(pid: int) -> str | None:
    """The server's command line, so the JSON says how the server was started (threads, drafter, ...)."""
    try:
        return " ".join(a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a)
    except OSError:
        return None


def read_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731
    return {"p50": round(pick(0.5), 3), "p90": round(pick(0.9), 3), "p99": round(pick(0.99), 3), "max": round(xs[-1], 3),
            "mean": round(statistics.fmean(xs), 3), "n": len(xs)}


async def idle_after(url: str, headers: dict, wait_s: float) -> dict:
    """Poll until nothing waits and nothing runs: the generations the script abandoned must have
    been cancelled (a waiting one leaves the queue at once, the running one stops at its next step)."""
    base = url.rstrip("/")
    t0 = time.perf_counter()
    health, running = {}, None
    async with httpx.AsyncClient(timeout=10) as c:
        while time.perf_counter() - t0 < wait_s:
            try:
                health = (await c.get(base + "/health", headers=headers)).json()
                metrics = (await c.get(base + "/metrics", headers=headers)).text
                running = next((float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("treeflash_requests_running ")), None)
                if health.get("queue_depth") == 0 and running == 0:
                    return {"idle": True, "idle_after_s": round(time.perf_counter() - t0, 2), "health": health}
            except (httpx.HTTPError, ValueError) as e:
                health = {"error": str(e)}
            await asyncio.sleep(0.2)
    return {"idle": False, "health": health, "requests_running": running}


async def run(args) -> dict:
    results: list[Result] = []
    rss: list = []
    loads: list = []
    stop = asyncio.Event()
    load_start = os.getloadavg()
    cpu_start = read_cpu_s(args.pid) if args.pid else None
    threads_start = read_thread_cpu_s(args.pid) if args.pid else None
    server_command = read_cmdline(args.pid) if args.pid else None
    t0 = time.perf_counter()
    deadline = t0 + args.duration
    sampler = asyncio.create_task(sample_machine(args.pid, t0, rss, loads, stop, args.rss_every))
    clients = [asyncio.create_task(client_loop(k, args, results, deadline, t0)) for k in range(args.clients)]
    _, pending = await asyncio.wait(clients, timeout=args.duration + args.drain)
    for task in pending:  # still generating after the drain: disconnect (the server must cancel them)
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t0
    cpu_end = read_cpu_s(args.pid) if args.pid else None
    threads_end = read_thread_cpu_s(args.pid) if args.pid else None
    load_end = os.getloadavg()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    after = await idle_after(args.url, headers, 60)
    seen_by_server = await server_metrics(args.url, headers)
    stop.set()
    await sampler

    done = [r for r in results if not r.cut]
    fivexx = [r for r in results if r.status >= 500 or (r.error and r.status == 200 and not r.cut)]
    unfinished = [r for r in done if r.status == 200 and len(r.finish_reasons) != 1]
    completed = [r for r in done if r.status == 200 and len(r.finish_reasons) == 1 and not r.error]
    tokens = sum(r.completion_tokens for r in completed)
    statuses: dict[str, int] = {}
    for r in results:
        key = "cut" if r.cut else str(r.status or "transport_error")
        statuses[key] = statuses.get(key, 0) + 1
    summary = {
        "no_5xx": not fivexx,
        "every_stream_finished": not unfinished,
        "idle_after_cut": after["idle"],
        "idle_after_cut_s": after.get("idle_after_s"),
        "requests": len(results),
        "completed": len(completed),
        "cut_at_end": sum(r.cut for r in results),
        "statuses": statuses,
        "ttft_s": percentiles([r.ttft_s for r in completed if r.ttft_s is not None]),
        "request_s": percentiles([r.seconds for r in completed if r.seconds is not None]),
        "completion_tokens": tokens,
        "throughput_tokens_per_s": round(tokens / wall, 3),
        "requests_per_s": round(len(completed) / wall, 4),
        "wall_s": round(wall, 1),
        "server_cpu_cores_used": round((cpu_end - cpu_start) / wall, 2) if cpu_start is not None and cpu_end is not None else None,
        "server_thread_cpu_s": {k: round(threads_end[k] - threads_start[k], 2) for k in threads_start} if threads_start else None,
        "server_metrics": seen_by_server,
        "loadavg_1m": {"start": round(load_start[0], 2), "mean": round(statistics.fmean(l for _, l in loads), 2) if loads else None,
                       "max": max((l for _, l in loads), default=None), "end": round(load_end[0], 2)},
        "rss_mb": {"first": rss[0][1] if rss else None, "max": max((m for _, m in rss), default=None),
                   "last": rss[-1][1] if rss else None},
    }
    return {
        "command": "python -m bench.server_load " + " ".join(args.argv),
        "server_command": server_command,
        "config": {k: v for k, v in vars(args).items() if k not in ("argv", "api_key")},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "loadavg_1m_start": round(load_start[0], 2), "loadavg_1m_end": round(load_end[0], 2)},
        "summary": summary,
        "after": after,
        "rss_samples": rss,
        "loadavg_samples": loads,
        "failures": [asdict(r) for r in fivexx + unfinished][:50],
        "requests": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    import sys

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--pid", type=int, default=None, help="the server's pid, to sample its RSS")
    p.add_argument("--clients", type=int, default=32, help="concurrent streaming clients (default 32)")
    p.add_argument("--duration", type=float, default=120, help="seconds during which clients start requests (default 120)")
    p.add_argument("--drain", type=float, default=60, help="seconds running requests get after that, then are cut (default 60)")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens per request (default 16)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--model", default=None, help="model name to send (default: none, the server's own)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS and load-average samples (default 2)")
    p.add_argument("--out", default=None, help="write the JSON here (default: print the summary only)")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    report = asyncio.run(run(args))
    print(json.dumps(report["summary"], indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    ok = report["summary"]["no_5xx"] and report["summary"]["every_stream_finished"] and report["summary"]["idle_after_cut"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
