#!/usr/bin/env python3
"""Per-step cost of grammar-constrained decoding through `deltaserve serve`.

Sends N concurrent streaming /v1/completions requests, each decoding exactly --max-tokens tokens
(ignore_eos), once plain and once with a constraint (SGLang's `regex` field, or a JSON schema with
--schema), and reports the decode rate (tokens per second over the decode span, and ITL p50) of
each, and the overhead of the constraint. Python's standard library plus `requests`.

  python3 bench/grammar/serve_overhead.py --url http://127.0.0.1:30000 --concurrency 16 --max-tokens 128
"""
import argparse
import json
import statistics
import threading
import time

import requests

REGEX = r"[a-z]+( [a-z]+)*"  # words, forever: every step is masked, nothing ends the output early


def one(url, model, prompt, max_tokens, extra, out):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    body.update(extra)
    t0 = time.perf_counter()
    times = []
    tokens = 0
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=600) as r:
        if r.status_code != 200:
            out.append({"error": r.text[:300]})
            return
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            if j.get("choices") and j["choices"][0].get("text"):
                times.append(time.perf_counter())
    out.append({"t0": t0, "times": times, "tokens": tokens})


RUNS = [0]


def engine_times(url):
    """Engine step counters from /metrics (seconds and steps since start)."""
    out = {}
    for line in requests.get(url + "/metrics").text.splitlines():
        for k in ("steps", "step_seconds", "forward_seconds", "sample_seconds"):
            if line.startswith(f"deltaserve_engine_{k}_total "):
                out[k] = float(line.split()[1])
    return out


def run(url, model, n, max_tokens, extra):
    # Prompts new to the server every run (a nonce first), so its prefix cache serves neither side.
    RUNS[0] += 1
    before = engine_times(url)
    out = []
    threads = [threading.Thread(target=one, args=(url, model, f"# run {RUNS[0]} request {i}\n" + "def f(x):\n    return x" * 4,
                                                  max_tokens, extra, out)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o["error"] for o in out if "error" in o]
    if errors:
        raise SystemExit("request failed: " + errors[0])
    # Tokens come from usage (a streamed chunk can hold several tokens, or none: held-back bytes).
    first = min(o["times"][0] for o in out)
    last = max(o["times"][-1] for o in out)
    tokens = sum(o["tokens"] - 1 for o in out)
    per_token = [(o["times"][-1] - o["times"][0]) / max(1, o["tokens"] - 1) for o in out]
    after = engine_times(url)
    steps = max(1.0, after.get("steps", 0) - before.get("steps", 0))
    per_step = {k: 1e3 * (after.get(k, 0) - before.get(k, 0)) / steps
                for k in ("step_seconds", "forward_seconds", "sample_seconds")}
    return {"decode_tok_s": tokens / (last - first), "itl_ms_p50": 1e3 * statistics.median(per_token),
            "step_ms": per_step}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--model", default="")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = args.model or requests.get(args.url + "/v1/models").json()["data"][0]["id"]
    constrained = {"regex": REGEX}
    run(args.url, model, args.concurrency, 8, constrained)  # warm-up (compiles and caches masks)
    rows = []
    for _ in range(args.rounds):  # alternate, medians
        rows.append(("plain", run(args.url, model, args.concurrency, args.max_tokens, {})))
        rows.append(("regex", run(args.url, model, args.concurrency, args.max_tokens, constrained)))
    for name in ("plain", "regex"):
        rates = [r["decode_tok_s"] for n, r in rows if n == name]
        itls = [r["itl_ms_p50"] for n, r in rows if n == name]
        steps = [r["step_ms"] for n, r in rows if n == name]
        med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
        print(f"{name:6s} decode {statistics.median(rates):8.1f} tok/s (rounds {', '.join(f'{x:.1f}' for x in rates)}); "
              f"time per token p50 {statistics.median(itls):.2f} ms; engine per step {med['step_seconds']:.2f} ms = "
              f"forward {med['forward_seconds']:.2f} + sampling {med['sample_seconds']:.2f} + other")
    plain = statistics.median(r["decode_tok_s"] for n, r in rows if n == "plain")
    regex = statistics.median(r["decode_tok_s"] for n, r in rows if n == "regex")
    print(f"overhead of the constraint: {100 * (1 - regex / plain):.1f}% of decode throughput "
          f"(concurrency {args.concurrency}, {args.max_tokens} tokens each)")


if __name__ == "__main__":
    main()
