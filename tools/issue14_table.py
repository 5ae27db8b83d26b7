#!/usr/bin/env python3
"""Issue #14's figures beside its targets, from the logs of `STAGES=issue14 tools/gpu-run.sh`.

    tools/issue14_table.py DIR

DIR holds bench-offline logs (ctx.log, b16_8k.log, b16_64_1k.log, sampled_f32.log, sampled_bf16.log,
mtp.log) and the HTTP run's http.json. Prints a markdown table: figure, measured, target, met. A
figure whose log is missing or has no such row prints "-". The targets are #14's, set for an H200;
the table names the GPU it was given (smi.txt one level up, when there).
"""
import json
import os
import re
import sys

ROW = re.compile(r"^\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s")
STEP = re.compile(r"batch (\d+): \d+ decode steps, per decode step ([\d.]+) ms")


def rows(path):
    """{(batch, context): (prefill tok/s, decode-only tok/s)} of a bench-offline log."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        m = ROW.match(line)
        if m:
            batch, ctx, prefill, _decode, decode_only = m.groups()
            out[(int(batch), int(ctx))] = (float(prefill), float(decode_only))
    return out


def step_ms(path):
    """{batch: ms a decode step} of a bench-offline log."""
    out = {}
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            m = STEP.search(line)
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.stderr.write("usage: issue14_table.py DIR\n")
        return 2
    d = sys.argv[1]
    ctx, b16_8k, b1664 = rows(f"{d}/ctx.log"), rows(f"{d}/b16_8k.log"), rows(f"{d}/b16_64_1k.log")
    s32, s16 = rows(f"{d}/sampled_f32.log"), rows(f"{d}/sampled_bf16.log")
    mtp = step_ms(f"{d}/mtp.log")
    table = []  # (figure, value or None, target, higher is better, format)

    def dec(r, key):
        return r[key][1] if key in r else None

    for c, target in ((1024, 78), (8192, None), (32768, 60), (131072, 50)):
        table.append((f"batch 1 at {c // 1024}k, decode-only tok/s", dec(ctx, (1, c)), target, True, "{:.1f}"))
    table.append(("batch 16 at 8k, decode-only tok/s", dec(b16_8k, (16, 8192)), 700, True, "{:.1f}"))
    table.append(("batch 16 at 1k, decode-only tok/s", dec(b1664, (16, 1024)), None, True, "{:.1f}"))
    table.append(("batch 64 at 1k, decode-only tok/s", dec(b1664, (64, 1024)), 2000, True, "{:.1f}"))
    for name, r in (("f32", s32), ("bf16", s16)):
        table.append((f"Qwen's sampling at 128, batch 16, {name} GDN state", dec(r, (16, 128)), 1000, True, "{:.1f}"))
        table.append((f"Qwen's sampling at 128, batch 64, {name} GDN state", dec(r, (64, 128)), 3000, True, "{:.1f}"))
    table.append(("MTP k=3, ms a decode step (batch 1, 1k)", mtp.get(1), 15, False, "{:.2f}"))
    prefill = next(iter(b1664.values()))[0] if b1664 else None  # the 8k prefill before the 1k decodes
    table.append(("8k prefill, tok/s", prefill, 12000, True, "{:.0f}"))
    table.append(("8k TTFT, ms (8192 / prefill tok/s)", 8192 / prefill * 1e3 if prefill else None, 650, False, "{:.0f}"))
    http = None
    if os.path.exists(f"{d}/http.json"):
        levels = json.load(open(f"{d}/http.json")).get("levels", [])
        http = next((lv for lv in levels if lv.get("concurrency") == 16), None)
    table.append(("HTTP, 16 streams of 1k prompts, out tok/s", http["output_tokens_per_s"] if http else None, 800, True,
                  "{:.1f}"))
    table.append(("HTTP, 16 streams, TTFT p50 ms", http["ttft_ms"]["p50"] if http else None, 1000, False, "{:.0f}"))

    smi = os.path.join(os.path.dirname(os.path.abspath(d)), "smi.txt")
    if os.path.exists(smi):
        lines = open(smi).read().splitlines()
        if len(lines) > 1:
            print(f"GPU: {lines[1].split(',')[0]} (#14's targets are H200 figures)\n")
    print("| figure | measured | #14 target | met |\n|---|---:|---:|---|")
    for fig, v, target, higher, fmt in table:
        shown = "-" if v is None else fmt.format(v)
        if target is None or v is None:
            met = ""
        else:
            met = "yes" if (v >= target if higher else v <= target) else "no"
        print(f"| {fig} | {shown} | {'' if target is None else target} | {met} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
