#!/usr/bin/env python3
"""Soak test: mixed traffic against one `deltaserve serve` for DURATION seconds (default 1800).

Traffic (CLIENTS threads, each picking a scenario at random): streaming and non-streaming chat,
completions, streams the client cuts mid-way (plain close or RST), malformed requests (bad JSON,
wrong types, unknown fields, a body over the size limit, broken HTTP, a body cut short) and long
prompts. Every SAMPLE seconds the server's RSS, open fds and threads (from /proc) and the
/metrics gauges (running, waiting, kv usage, open streams) go into a CSV row.

At the end: the traffic stops, the server must drain back to idle (running = waiting = streams =
kv used = 0), and growth is reported as the mean of the last window (default the last 10 min)
against the first window after warm-up (default 5 min after WARMUP s). Fails (exit 1) on an
unexpected status (5xx, or success for a malformed request), a server that dies or does not go
idle, RSS growth over MAX_RSS_GROWTH_MB, or fd growth over MAX_FD_GROWTH.

Usage: tools/soak.py [--duration S] [--binary build/src/app/deltaserve] [--model models/tiny-coder]
       Env equivalents: DURATION, BINARY, MODEL, PORT, CLIENTS, SAMPLE, WARMUP, OUT, SERVE_ARGS.
Standard library only.
"""
import argparse
import csv
import http.client
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

GAUGES = ["deltaserve_requests_running", "deltaserve_requests_waiting", "deltaserve_kv_usage_ratio",
          "deltaserve_kv_tokens_used", "deltaserve_http_streams_open", "deltaserve_state_slots_used"]
WORDS = ("def class return import lambda yield async await while for if else try except "
         "the quick brown fox jumps over lazy dog compute value index buffer").split()


def env(name, default):
    return os.environ.get(name, default)


class Soak:
    def __init__(self, args):
        self.a = args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}      # (scenario, outcome) -> n
        self.unexpected = []  # descriptions (first 50 kept)
        self.rng = random.Random(args.seed)
        self.unexpected_log = None  # file: every unexpected answer, as it happens

    # ---- bookkeeping
    def note(self, scenario, outcome, ok=True, detail=""):
        with self.lock:
            self.counts[(scenario, outcome)] = self.counts.get((scenario, outcome), 0) + 1
            if not ok and len(self.unexpected) < 50:
                self.unexpected.append(f"{scenario}: {outcome} {detail[:200]}")
            if not ok:
                self.counts[("UNEXPECTED", scenario)] = self.counts.get(("UNEXPECTED", scenario), 0) + 1
                if self.unexpected_log:
                    self.unexpected_log.write(f"{time.strftime('%H:%M:%S')} {scenario}: {outcome} {detail[:500]}\n")
                    self.unexpected_log.flush()

    # ---- HTTP helpers
    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.a.port, timeout=timeout)

    def post(self, path, body, timeout=300, headers=None):
        c = self.conn(timeout)
        try:
            data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request("POST", path, body=data, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def raw(self, data, read_timeout=10.0):
        """Sends raw bytes, returns the status code of the answer (0 if none)."""
        s = socket.create_connection(("127.0.0.1", self.a.port), timeout=read_timeout)
        try:
            s.sendall(data)
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            buf = b""
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            parts = buf.split(b" ", 2)
            return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
        except (socket.timeout, ConnectionError):
            return 0
        finally:
            s.close()

    def prompt(self, n_words):
        return " ".join(self.rng.choice(WORDS) for _ in range(n_words))

    def chat_body(self, stream, max_tokens=None, words=None):
        return {"model": "m", "stream": stream,
                "max_tokens": max_tokens or self.rng.randint(4, 48),
                "temperature": self.rng.choice([0, 0.7, 1.0]),
                "messages": [{"role": "system", "content": "You write code."},
                             {"role": "user", "content": self.prompt(words or self.rng.randint(3, 60))}]}

    # ---- scenarios
    def sc_chat(self):
        st, body = self.post("/v1/chat/completions", self.chat_body(False))
        ok = st == 200 and b"choices" in body
        self.note("chat", st, ok, body.decode(errors="replace"))

    def sc_completion(self):
        st, body = self.post("/v1/completions", {"model": "m", "prompt": self.prompt(20),
                                                 "max_tokens": self.rng.randint(1, 32)})
        self.note("completion", st, st == 200, body.decode(errors="replace"))

    def sc_stream(self):
        c = self.conn(300)
        try:
            c.request("POST", "/v1/chat/completions", body=json.dumps(self.chat_body(True)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            ok = r.status == 200 and data.rstrip().endswith(b"data: [DONE]")
            self.note("stream", r.status, ok, data[-200:].decode(errors="replace"))
        finally:
            c.close()

    def sc_stream_cut(self):
        """Streams, reads a few events, then drops the connection (half the time with an RST)."""
        body = json.dumps(self.chat_body(True, max_tokens=400)).encode()
        s = socket.create_connection(("127.0.0.1", self.a.port), timeout=300)
        try:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            want = self.rng.randint(1, 6)
            got = b""
            while got.count(b"data: ") < want:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            if self.rng.random() < 0.5:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.note("stream_cut", got[9:12].decode(errors="replace") or "none", got.startswith(b"HTTP/1.1 200"))
        except (socket.timeout, ConnectionError) as e:
            self.note("stream_cut", type(e).__name__, False)
        finally:
            s.close()

    def sc_malformed(self):
        kind = self.rng.choice(["bad_json", "wrong_type", "unknown_field", "bad_messages", "deep",
                                "oversized", "broken_http", "short_body", "bad_content_length"])
        if kind == "bad_json":
            st, _ = self.post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}')
            self.note("malformed_" + kind, st, st == 400)
        elif kind == "wrong_type":
            body = self.chat_body(False)
            key, val = self.rng.choice([("max_tokens", "many"), ("temperature", "hot"), ("messages", 5),
                                        ("stream", "yes"), ("n", -3), ("stop", 7)])
            body[key] = val
            st, _ = self.post("/v1/chat/completions", body)
            self.note("malformed_" + kind, st, st == 400)
        elif kind == "unknown_field":
            body = self.chat_body(False)
            body["no_such_field"] = 1
            st, _ = self.post("/v1/chat/completions", body)
            self.note("malformed_" + kind, st, st == 400)
        elif kind == "bad_messages":
            st, _ = self.post("/v1/chat/completions", {"model": "m", "messages": [{"role": "wizard"}]})
            self.note("malformed_" + kind, st, st == 400)
        elif kind == "deep":
            st, _ = self.post("/v1/chat/completions", b"[" * 5000 + b"]" * 5000)
            self.note("malformed_" + kind, st, st == 400)
        elif kind == "oversized":
            # Content-Length over the limit: 413 without the body being read.
            st = self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{")
            self.note("malformed_" + kind, st, st == 413)
        elif kind == "broken_http":
            st = self.raw(self.rng.choice([b"GARBAGE\r\n\r\n", b"POST / HTTP/9.9\r\n\r\n",
                                           b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"]))
            self.note("malformed_" + kind, st, st in (400, 0))
        elif kind == "short_body":
            # Promises 1000 bytes, sends 10 and closes: the server must just drop it.
            st = self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\":",
                          read_timeout=5)
            self.note("malformed_" + kind, st, st in (0, 400))
        else:
            st = self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            self.note("malformed_" + kind, st, st == 400)

    def sc_long_prompt(self):
        words = self.rng.randint(2000, 6000)
        st, body = self.post("/v1/chat/completions", self.chat_body(self.rng.random() < 0.5, 4, words), timeout=600)
        # 400 is a valid answer if the prompt exceeds the context length.
        self.note("long_prompt", st, st in (200, 400), body[:200].decode(errors="replace"))

    SCENARIOS = [("sc_chat", 20), ("sc_stream", 20), ("sc_completion", 8), ("sc_stream_cut", 15),
                 ("sc_malformed", 30), ("sc_long_prompt", 4)]

    def client(self, idx):
        rng = random.Random(self.a.seed * 1000 + idx)
        names = [n for n, _ in self.SCENARIOS]
        weights = [w for _, w in self.SCENARIOS]
        while not self.stop.is_set():
            name = rng.choices(names, weights)[0]
            try:
                getattr(self, name)()
            except Exception as e:  # noqa: BLE001 - any client-side failure is a finding
                self.note(name[3:], type(e).__name__, False, str(e))
                time.sleep(0.5)

    # ---- sampling
    def metrics(self):
        c = self.conn(30)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        finally:
            c.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) >= 2 and parts[0] in GAUGES:
                out[parts[0]] = float(parts[1])
        return out

    def sample(self, pid, t0):
        row = {"t_s": round(time.time() - t0, 1)}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    row["rss_mb"] = round(int(line.split()[1]) / 1024, 2)
                if line.startswith("Threads:"):
                    row["threads"] = int(line.split()[1])
        row["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        try:
            m = self.metrics()
        except Exception:  # noqa: BLE001
            m = {}
        for g in GAUGES:
            row[g.replace("deltaserve_", "")] = m.get(g, "")
        with self.lock:
            row["requests_done"] = sum(v for (s, _), v in self.counts.items() if s != "UNEXPECTED")
            row["unexpected"] = sum(v for (s, _), v in self.counts.items() if s == "UNEXPECTED")
        return row


def window_mean(rows, key, lo, hi):
    vals = [r[key] for r in rows if lo <= r["t_s"] < hi and r.get(key, "") != ""]
    return statistics.mean(vals) if vals else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=float(env("DURATION", "1800")))
    p.add_argument("--binary", default=env("BINARY", "build/src/app/deltaserve"))
    p.add_argument("--model", default=env("MODEL", "models/tiny-coder"))
    p.add_argument("--port", type=int, default=int(env("PORT", "0")))
    p.add_argument("--clients", type=int, default=int(env("CLIENTS", "6")))
    p.add_argument("--sample", type=float, default=float(env("SAMPLE", "5")))
    p.add_argument("--warmup", type=float, default=float(env("WARMUP", "")) if env("WARMUP", "") else None)
    p.add_argument("--out", default=env("OUT", ""))
    p.add_argument("--serve-args", default=env("SERVE_ARGS", "--threads 1"))
    p.add_argument("--max-rss-growth-mb", type=float, default=float(env("MAX_RSS_GROWTH_MB", "64")))
    p.add_argument("--max-fd-growth", type=float, default=float(env("MAX_FD_GROWTH", "8")))
    p.add_argument("--seed", type=int, default=int(env("SEED", "16")))
    a = p.parse_args()
    if a.port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.port = s.getsockname()[1]
    # Windows: warm-up, then the first 5 min vs the last 10 min (scaled down for short runs).
    warm = a.warmup if a.warmup is not None else min(120.0, a.duration / 10)
    first_len = min(300.0, (a.duration - warm) / 6)
    last_len = min(600.0, (a.duration - warm) / 3)
    out = a.out or f"build/soak/soak-{time.strftime('%Y%m%d-%H%M%S')}.csv"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    log_path = out[:-4] + ".server.log"

    cmd = [a.binary, "serve", "--model-path", a.model, "--host", "127.0.0.1", "--port", str(a.port)] + a.serve_args.split()
    print("soak: starting", " ".join(cmd), flush=True)
    log = open(log_path, "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    soak = Soak(a)
    soak.unexpected_log = open(out[:-4] + ".unexpected.log", "w")
    deadline = time.time() + 300
    while True:
        if srv.poll() is not None:
            sys.exit(f"soak: server exited with {srv.returncode} during start-up; see {log_path}")
        try:
            c = soak.conn(2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            srv.kill()
            sys.exit("soak: server not healthy after 300 s")
        time.sleep(0.5)

    t0 = time.time()
    threads = [threading.Thread(target=soak.client, args=(i,), daemon=True) for i in range(a.clients)]
    for t in threads:
        t.start()
    rows = []
    fields = None
    failures = []
    with open(out, "w", newline="") as f:
        writer = None
        next_sample = t0
        while time.time() - t0 < a.duration:
            if srv.poll() is not None:
                failures.append(f"server exited with {srv.returncode} at t={time.time() - t0:.0f}s")
                break
            if time.time() >= next_sample:
                row = soak.sample(srv.pid, t0)
                rows.append(row)
                if writer is None:
                    fields = list(row.keys())
                    writer = csv.DictWriter(f, fieldnames=fields)
                    writer.writeheader()
                writer.writerow(row)
                f.flush()
                if len(rows) % max(1, int(60 / a.sample)) == 0:
                    print(f"soak: t={row['t_s']:.0f}s rss={row['rss_mb']}MB fds={row['fds']} "
                          f"running={row['requests_running']} waiting={row['requests_waiting']} "
                          f"kv={row['kv_usage_ratio']} done={row['requests_done']} unexpected={row['unexpected']}",
                          flush=True)
                next_sample += a.sample
            time.sleep(0.2)
        soak.stop.set()
        for t in threads:
            t.join(timeout=620)
        # Drain: the server must return to idle.
        idle = None
        drain_deadline = time.time() + 60
        while srv.poll() is None and time.time() < drain_deadline:
            row = soak.sample(srv.pid, t0)
            rows.append(row)
            if writer:
                writer.writerow(row)
            if (row["requests_running"], row["requests_waiting"], row["http_streams_open"], row["kv_tokens_used"]) == (0, 0, 0, 0):
                idle = row
                break
            time.sleep(1)
    if srv.poll() is None and idle is None:
        failures.append(f"server not idle 60 s after the traffic stopped: {rows[-1]}")

    post = [r for r in rows if r["t_s"] >= warm]
    traffic = [r["t_s"] for r in rows if r["t_s"] <= a.duration]
    end_t = max(traffic) if traffic else 0
    first = (warm, warm + first_len)
    last = (end_t - last_len, end_t + 0.01)
    report = {"duration_s": a.duration, "samples": len(rows), "warmup_s": warm,
              "first_window_s": first[:2], "last_window_s": [round(last[0], 1), "end"]}
    for key in ("rss_mb", "fds", "threads"):
        a0 = window_mean(post, key, *first)
        a1 = window_mean(post, key, *last)
        report[key] = {"first": round(a0, 2), "last": round(a1, 2), "growth": round(a1 - a0, 2),
                       "max": max((r[key] for r in rows), default=None)}
    report["idle_after"] = idle
    with soak.lock:
        report["requests"] = {f"{s}:{o}": n for (s, o), n in sorted(soak.counts.items(), key=str) if s != "UNEXPECTED"}
        report["unexpected"] = {o: n for (s, o), n in soak.counts.items() if s == "UNEXPECTED"}
        report["unexpected_examples"] = soak.unexpected[:10]
    if report["rss_mb"]["growth"] > a.max_rss_growth_mb:
        failures.append(f"RSS grew {report['rss_mb']['growth']} MB (limit {a.max_rss_growth_mb})")
    if report["fds"]["growth"] > a.max_fd_growth:
        failures.append(f"open fds grew {report['fds']['growth']} (limit {a.max_fd_growth})")
    if report["unexpected"]:
        failures.append(f"unexpected answers: {report['unexpected']}")

    if srv.poll() is None:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(60)
            report["server_exit"] = rc
            if rc != 0:
                failures.append(f"server exited {rc} on SIGTERM")
        except subprocess.TimeoutExpired:
            srv.kill()
            failures.append("server did not stop within 60 s of SIGTERM")
    report["failures"] = failures
    with open(out[:-4] + ".json", "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    print(f"soak: CSV {out}; server log {log_path}")
    print("soak: PASS" if not failures else "soak: FAIL\n  " + "\n  ".join(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
