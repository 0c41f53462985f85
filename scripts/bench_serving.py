#!/usr/bin/env python3
"""Load benchmark of `specdec-kimi serve`: throughput, time to first token (TTFT) and time per
output token (TPOT) at several concurrencies, with and without speculation, in one run.

    scripts/bench_serving.py --binary build/examples/specdec-kimi --model-path DIR \
        [--speculative "NGRAM 4/1/5" | --speculative "--speculative-algorithm ... "] \
        [--draft-path DIR] [--concurrency 1,4,16] [--requests-per-level N] [--max-tokens 64] \
        [--prompt-len 32] [--prompt-kind ids|text] [--device cpu|cuda] [--json OUT.json] \
        [--seed S] [--check-ids] [--order sequential|interleaved] [--server-args "..."]

--speculative takes 'ALGO STEPS/TOPK/DRAFT_TOKENS' or the server's flags as one string. The default
is NGRAM 4/1/5 (Kimi-K2.5's n-gram chain): the binary serves only compiled bundles, and its n-gram
chains are 4/1/5 and 2/1/3 (NGRAM 3/1/4 is refused with the list of compiled ones).

It starts the server twice on free ports of 127.0.0.1 (`--port 0`; the port is read from the
server's "... on http://127.0.0.1:PORT ..." line on stderr): once plain (`--speculative-algorithm
NONE`) and once with the speculative flags. For each it waits for GET /health, sends one warm-up
request (not counted), then at each concurrency level C sends the same N requests, C at a time
(closed loop: a worker sends its next request when its previous one finished), over
POST /v1/completions with "stream": true, greedy (temperature 0), "ignore_eos": true, so every
request makes exactly max_tokens tokens. Prompts are deterministic from --seed: lists of token ids
in [0, 256) (the bytes of the tiny preset's byte-level vocabulary; --prompt-kind ids) or lowercase
ASCII text (--prompt-kind text). --order sequential (default) runs every level on the speculative server,
stops it, then every level on the plain one (one model in memory at a time; the speculative
flags, the likelier to be refused, are tried first);
--order interleaved keeps both up and alternates plain / speculative per level (fairer under a
drifting background load, two models in memory).

Per request (client clock, time.perf_counter):
  TTFT  send (before connecting) -> the first SSE `data:` event. The server sends an event only
        when it has text to send (the completions endpoint has no empty role event), so this is
        the first decodable text: a token whose bytes are an incomplete UTF-8 sequence or a
        special token (skipped in the text) produces no event of its own and delays it. That is
        the latency a streaming client sees; the server's own submit -> first token time
        (meta_info.time_to_first_token) is recorded beside it as server_ttft.
  TPOT  (arrival of the final event, the one with finish_reason and meta_info) - (arrival of the
        first event), divided by completion_tokens - 1 (meta_info.completion_tokens of the final
        event). Events are not tokens: the server coalesces the text decoded since its last write
        into one event (a speculative step commits several tokens at once), so TPOT uses the token
        count, never the event count.
  e2e   send -> the `data: [DONE]` line.
Per level: output tokens/s = all completion tokens / the level's wall time (first send to last
[DONE]); requests/s likewise; mean / median / p99 (linear interpolation) of TTFT, TPOT and e2e;
the mean over requests of meta_info.spec_accept_length (tokens committed per verify, bonus
included; 1.0 for plain decoding). Cross-check: GET /metrics before and after each level; the
level's accept length from the counters (delta specdec_spec_committed_tokens_total / delta
specdec_spec_verify_total) must match the one from the responses (sum of accept_length *
verify_ct / sum of verify_ct); the gauge specdec_spec_accept_length (since start) is recorded too.

Lossless check: plain and speculative outputs must be the same per request (streamed text,
completion_tokens and finish_reason); a mismatch is an error (exit 1). The streamed text skips
special tokens and turns invalid UTF-8 into U+FFFD, so --check-ids also compares the token ids:
each distinct prompt once more, non-streaming, on POST /generate (output_ids), untimed.

The servers get SIGTERM at the end and must exit 0; a server that fails to start (exits, or never
prints its port or answers /health within --startup-timeout) is an error with the tail of its
log. Exit status: 0 when all is well; 1 on any error (failed request, wrong token count, mismatch,
server failure); 2 for bad arguments. Python standard library only; talks to 127.0.0.1 only.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"
DEFAULT_SPECULATIVE = "NGRAM 4/1/5"
PORT_RE = re.compile(r"on http://127\.0\.0\.1:(\d+)")


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Arguments


def parse_speculative(text):
    """'ALGO S/K/N' or the server's flags as one string -> a list of flags."""
    text = text.strip()
    m = re.fullmatch(r"([A-Za-z0-9_]+)\s+(\d+)/(\d+)/(\d+)", text)
    if m:
        algo, steps, topk, nodes = m.groups()
        return ["--speculative-algorithm", algo.upper(), "--speculative-num-steps", steps,
                "--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", nodes]
    flags = shlex.split(text)
    if "--speculative-algorithm" not in flags:
        raise argparse.ArgumentTypeError(
            f"--speculative '{text}': give 'ALGO STEPS/TOPK/DRAFT_TOKENS' (e.g. 'NGRAM 4/1/5') or "
            "the server's flags, with --speculative-algorithm")
    return flags


def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency '{text}': whole numbers, e.g. 1,4,16")
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency '{text}': each level >= 1")
    return levels


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Load benchmark of specdec-kimi serve: throughput, TTFT and TPOT at several "
                    "concurrencies, plain and speculative, with a lossless check.")
    p.add_argument("--binary", required=True, help="the specdec-kimi binary")
    p.add_argument("--model-path", required=True, help="the target checkpoint directory")
    p.add_argument("--speculative", default=DEFAULT_SPECULATIVE,
                   help="'ALGO STEPS/TOPK/DRAFT_TOKENS' or the server's speculative flags as one "
                        f"string (default '{DEFAULT_SPECULATIVE}')")
    p.add_argument("--draft-path", help="--speculative-draft-model-path for EAGLE3 / EAGLE")
    p.add_argument("--concurrency", type=parse_levels, default=[1, 4, 16],
                   help="concurrency levels, comma-separated (default 1,4,16)")
    p.add_argument("--requests-per-level", type=int, default=None,
                   help="requests at each level (default max(8, 4 x concurrency))")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32,
                   help="prompt length in token ids (--prompt-kind ids) or characters (text)")
    p.add_argument("--prompt-kind", choices=["ids", "text"], default="ids")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", help="write every figure and per-request record to this file")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    p.add_argument("--check-ids", action="store_true",
                   help="also compare output token ids (non-streaming /generate, untimed)")
    p.add_argument("--order", choices=["sequential", "interleaved"], default="sequential")
    p.add_argument("--server-args", default="",
                   help="more flags for both servers, one string (e.g. '--max-running-requests 32')")
    p.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds for a server to load and answer /health")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="socket timeout of one request, seconds")
    p.add_argument("--log-dir", help="where the server logs go (default: a new temp directory)")
    args = p.parse_args(argv)
    try:
        args.spec_flags = parse_speculative(args.speculative)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if args.max_tokens < 2:
        p.error("--max-tokens must be >= 2 (TPOT needs two tokens)")
    if args.prompt_len < 1:
        p.error("--prompt-len must be >= 1")
    if args.requests_per_level is not None and args.requests_per_level < 1:
        p.error("--requests-per-level must be >= 1")
    if not os.access(args.binary, os.X_OK):
        p.error(f"--binary {args.binary}: not an executable file")
    return args


def requests_at(args, c):
    return args.requests_per_level if args.requests_per_level else max(8, 4 * c)


# ---------------------------------------------------------------------------------------------
# Prompts


def make_prompt(args, tag):
    """A deterministic prompt from (--seed, tag): token ids in [0, 256) or lowercase text."""
    rng = random.Random(f"{args.seed}:{tag}")
    if args.prompt_kind == "ids":
        return [rng.randrange(256) for _ in range(args.prompt_len)]
    alphabet = "abcdefghijklmnopqrstuvwxyz    "
    return "".join(rng.choice(alphabet) for _ in range(args.prompt_len))


# ---------------------------------------------------------------------------------------------
# The server


class Server:
    """One `specdec-kimi serve` process: started on a free port, its output drained to a log."""

    def __init__(self, args, name, extra_flags, log_dir):
        self.name = name
        self.cmd = [args.binary, "serve", "--model-path", args.model_path, "--host", HOST,
                    "--port", "0", "--device", args.device, "--no-self-check"]
        self.cmd += extra_flags + shlex.split(args.server_args)
        self.log_path = os.path.join(log_dir, f"server_{name}.log")
        self.port = None
        self.proc = None
        self.lines = []
        self.returncode = None
        self.cpu_s = None  # CPU seconds used, read just before the SIGTERM
        self.expected_tokens = 0  # tokens of every finished response (for settled_metrics)
        self._port_event = threading.Event()
        self._reader = None
        self._log = None

    def tail(self, n=25):
        return "\n".join("    " + line for line in self.lines[-n:]) or "    (no output)"

    def _drain(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            # Progress bars redraw with carriage returns: keep the last frame.
            line = line.split("\r")[-1]
            self.lines.append(line)
            self._log.write(line + "\n")
            self._log.flush()
            m = PORT_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self._port_event.set()
        self._port_event.set()  # the process closed its output: wake the waiter

    def start(self, timeout):
        self._log = open(self.log_path, "w")
        self._log.write("$ " + shlex.join(self.cmd) + "\n")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as e:
            raise BenchError(f"{self.name} server: cannot run {self.cmd[0]}: {e}")
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        self._port_event.wait(timeout)
        if self.port is None:
            self.kill()
            why = (f"exited with status {self.returncode}" if self.returncode is not None
                   else f"printed no port within {timeout:.0f} s")
            raise BenchError(f"{self.name} server failed to start ({why}):\n"
                             f"  $ {shlex.join(self.cmd)}\n  log {self.log_path}, last lines:\n"
                             f"{self.tail()}")
        while True:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise BenchError(f"{self.name} server exited ({self.returncode}) before /health "
                                 f"answered:\n{self.tail()}")
            try:
                status, _ = http_get(self.port, "/health", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{self.name} server: /health did not answer 200 within "
                                 f"{timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.1)

    def cpu_seconds(self):
        """User + system CPU seconds of the running server (Linux /proc), else None."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def stop(self, timeout=120.0):
        """SIGTERM, then the exit status (0 expected); SIGKILL after `timeout`."""
        if self.proc is not None and self.proc.poll() is None:
            self.cpu_s = self.cpu_seconds()
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.returncode = self.proc.returncode
            return self.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchError(f"{self.name} server did not exit within {timeout:.0f} s of "
                             f"SIGTERM (killed):\n{self.tail()}")
        finally:
            self._close()
        return self.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            self.returncode = self.proc.returncode
        self._close()

    def _close(self):
        if self._reader is not None:
            self._reader.join(5)
        if self._log is not None and not self._log.closed:
            self._log.close()


# ---------------------------------------------------------------------------------------------
# HTTP


def http_get(port, path, timeout=30):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def http_post_json(port, path, body, timeout):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def read_metrics(port):
    """GET /metrics -> {name: value}, samples of one name (label sets) summed."""
    status, text = http_get(port, "/metrics")
    if status != 200:
        raise BenchError(f"GET /metrics answered {status}: {text[:300]}")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def settled_metrics(port, expected_generation_tokens, timeout=5.0):
    """/metrics once its generation-token counter has reached `expected` (the tokens of every
    finished response so far) and nothing runs: the scheduler counts a step's tokens after it
    has handed them and the finish to the requests, so a read right after the last [DONE] can
    miss that step. Returns (metrics, seconds waited, settled)."""
    t0 = time.perf_counter()
    while True:
        m = read_metrics(port)
        waited = time.perf_counter() - t0
        if (m.get("specdec_generation_tokens_total", 0) >= expected_generation_tokens
                and m.get("specdec_num_running_reqs", 0) == 0):
            return m, waited, True
        if waited > timeout:
            return m, waited, False
        time.sleep(0.005)


def completion_body(args, prompt, stream):
    return {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def stream_request(port, args, prompt):
    """One streaming /v1/completions request, timed on the client; a dict, never raises."""
    rec = {"error": None}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=args.request_timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(completion_body(args, prompt, True)),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        r = conn.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read().decode('utf-8', 'replace')[:300]}"
            return rec
        t_first = t_final = t_done = None
        texts, final, n_events = [], None, 0
        while True:
            line = r.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                t_done = now
                break
            n_events += 1
            if t_first is None:
                t_first = now
            event = json.loads(data)
            if "error" in event:
                rec["error"] = f"error event: {json.dumps(event)[:300]}"
                return rec
            choice = event["choices"][0]
            texts.append(choice.get("text") or "")
            if choice.get("finish_reason") is not None:
                final, t_final = event, now
        if t_done is None or final is None:
            rec["error"] = "the stream ended without a final event and [DONE]"
            return rec
        meta = final.get("meta_info", {})
        n = int(meta.get("completion_tokens", 0))
        rec.update({
            "text": "".join(texts),
            "finish_reason": final["choices"][0]["finish_reason"],
            "completion_tokens": n,
            "prompt_tokens": meta.get("prompt_tokens"),
            "events": n_events,
            "ttft_s": t_first - t0,
            "tpot_s": (t_final - t_first) / (n - 1) if n > 1 else None,
            "e2e_s": t_done - t0,
            "server_ttft_s": meta.get("time_to_first_token"),
            "server_e2e_s": meta.get("e2e_latency"),
            "queue_s": meta.get("queue_time"),
            "accept_length": meta.get("spec_accept_length"),
            "verify_ct": meta.get("spec_verify_ct"),
            "t_send": t0, "t_end": t_done,
        })
        if n != args.max_tokens or rec["finish_reason"] != "length":
            rec["error"] = (f"expected {args.max_tokens} tokens and finish_reason 'length' "
                            f"(ignore_eos), got {n} and '{rec['finish_reason']}'")
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return rec


def generate_ids(port, args, prompt):
    """Non-streaming POST /generate -> output_ids (for --check-ids)."""
    body = {"sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0,
                                "ignore_eos": True}}
    body["input_ids" if isinstance(prompt, list) else "text"] = prompt
    status, text = http_post_json(port, "/generate", body, args.request_timeout)
    if status != 200:
        raise BenchError(f"POST /generate answered {status}: {text[:300]}")
    return json.loads(text)["output_ids"]


# ---------------------------------------------------------------------------------------------
# Statistics


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default); None for no data."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def dist(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    return {"mean": statistics.fmean(xs), "median": statistics.median(xs),
            "p99": percentile(xs, 99)}


def run_level(server, args, c, prompts):
    """The level's requests, c at a time, on `server`: the level's summary and records."""
    before, _, _ = settled_metrics(server.port, server.expected_tokens)
    t_start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=c) as pool:
        records = list(pool.map(lambda p: stream_request(server.port, args, p), prompts))
    wall = time.perf_counter() - t_start
    ok = [r for r in records if not r["error"]]
    tokens = sum(r["completion_tokens"] for r in ok)
    first_read = read_metrics(server.port)
    server.expected_tokens += tokens
    after, lag, settled = settled_metrics(server.port, server.expected_tokens)
    d_commit = after.get("specdec_spec_committed_tokens_total", 0) - before.get(
        "specdec_spec_committed_tokens_total", 0)
    d_verify = after.get("specdec_spec_verify_total", 0) - before.get("specdec_spec_verify_total", 0)
    d_gen = after.get("specdec_generation_tokens_total", 0) - before.get(
        "specdec_generation_tokens_total", 0)
    resp_verify = sum(r["verify_ct"] or 0 for r in ok)
    resp_commit = sum((r["accept_length"] or 0) * (r["verify_ct"] or 0) for r in ok)
    summary = {
        "concurrency": c,
        "requests": len(records),
        "failed": len(records) - len(ok),
        "wall_s": wall,
        "completion_tokens": tokens,
        "output_tok_per_s": tokens / wall if wall > 0 else None,
        "req_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_s": dist([r["ttft_s"] for r in ok]),
        "tpot_s": dist([r["tpot_s"] for r in ok]),
        "e2e_s": dist([r["e2e_s"] for r in ok]),
        "server_ttft_s": dist([r["server_ttft_s"] for r in ok]),
        "accept_length_mean": statistics.fmean([r["accept_length"] for r in ok
                                                if r["accept_length"] is not None] or [0.0]),
        "accept_length_responses": resp_commit / resp_verify if resp_verify else None,
        "accept_length_metrics": d_commit / d_verify if d_verify else None,
        "metrics_accept_length_gauge": {"before": before.get("specdec_spec_accept_length"),
                                        "after": after.get("specdec_spec_accept_length")},
        "metrics_delta": {"committed": d_commit, "verify": d_verify, "generation_tokens": d_gen},
        # /metrics read at once after the last [DONE], and how long until it counted every token.
        "metrics_generation_tokens_at_done": first_read.get("specdec_generation_tokens_total", 0)
                                             - before.get("specdec_generation_tokens_total", 0),
        "metrics_settle_s": lag,
        "metrics_settled": settled,
    }
    return summary, records


# ---------------------------------------------------------------------------------------------
# The run


def fmt(x, scale=1.0, digits=1):
    return "-" if x is None else f"{x * scale:.{digits}f}"


def main(argv):
    args = parse_args(argv)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench_serving_")
    os.makedirs(log_dir, exist_ok=True)
    command = shlex.join(["python3", *(sys.argv if argv is None else ["bench_serving.py", *argv])])
    spec_flags = list(args.spec_flags)
    if args.draft_path:
        spec_flags += ["--speculative-draft-model-path", args.draft_path]
    modes = {"plain": ["--speculative-algorithm", "NONE"], "spec": spec_flags}
    levels = args.concurrency
    plan = {c: [make_prompt(args, f"{c}:{i}") for i in range(requests_at(args, c))]
            for c in levels}
    errors, warnings = [], []
    results = {m: {"levels": {}, "records": {}} for m in modes}
    servers = {m: Server(args, m, flags, log_dir) for m, flags in modes.items()}

    def bring_up(mode):
        s = servers[mode]
        t = time.perf_counter()
        s.start(args.startup_timeout)
        status, text = http_get(s.port, "/get_server_info")
        info = json.loads(text) if status == 200 else {}
        results[mode]["server_info"] = info
        results[mode]["port"] = s.port
        results[mode]["startup_s"] = time.perf_counter() - t
        warm = stream_request(s.port, args, make_prompt(args, "warmup"))
        if warm["error"]:
            raise BenchError(f"{mode} server: the warm-up request failed: {warm['error']}\n"
                             f"{s.tail()}")
        s.expected_tokens += warm["completion_tokens"]
        print(f"[{mode}] up on {HOST}:{s.port} in {results[mode]['startup_s']:.1f} s: "
              f"{info.get('speculative_config', '?')} (log {s.log_path})", file=sys.stderr)

    def measure(mode, c):
        summary, records = run_level(servers[mode], args, c, plan[c])
        results[mode]["levels"][c] = summary
        results[mode]["records"][c] = records
        for i, r in enumerate(records):
            if r["error"]:
                errors.append(f"{mode} c={c} request {i}: {r['error']}")
        a, b = summary["accept_length_responses"], summary["accept_length_metrics"]
        if (a is None) != (b is None) or (a is not None and abs(a - b) > 1e-6 * max(1.0, a)):
            warnings.append(f"{mode} c={c}: accept length from the responses {a} != from "
                            f"/metrics {b} (delta committed / delta verify)")
        if (not summary["metrics_settled"]
                or summary["metrics_delta"]["generation_tokens"] != summary["completion_tokens"]):
            warnings.append(f"{mode} c={c}: /metrics counted "
                            f"{summary['metrics_delta']['generation_tokens']:.0f} generated tokens "
                            f"{summary['metrics_settle_s'] * 1e3:.0f} ms after the last [DONE], "
                            f"the responses {summary['completion_tokens']}")
        print(f"[{mode}] c={c:<3} {summary['requests']} requests in {summary['wall_s']:.2f} s: "
              f"{fmt(summary['output_tok_per_s'])} tok/s, TTFT p50 "
              f"{fmt(summary['ttft_s']['median'], 1e3, 2)} ms, TPOT p50 "
              f"{fmt(summary['tpot_s']['median'], 1e3, 3)} ms, accept "
              f"{summary['accept_length_mean']:.2f}", file=sys.stderr)

    def check_ids():
        out = {}
        for mode in modes:
            out[mode] = {(c, i): generate_ids(servers[mode].port, args, p)
                         for c in levels for i, p in enumerate(plan[c])}
        return out

    def shut(mode):
        s = servers[mode]
        rc = s.stop()
        results[mode]["exit_status"] = rc
        if rc != 0:
            errors.append(f"{mode} server exited with status {rc} after SIGTERM "
                          f"(expected 0):\n{s.tail()}")
        elif not any("server stopped" in line for line in s.lines):
            warnings.append(f"{mode} server exited 0 without its 'server stopped' line")

    ids = {}
    t_run = time.perf_counter()
    cpu_client = time.process_time()
    try:
        if args.order == "sequential":
            # Speculative first: its flags are the likelier to be refused, before the long part.
            for mode in ("spec", "plain"):
                bring_up(mode)
                for c in levels:
                    measure(mode, c)
                if args.check_ids:
                    ids[mode] = {(c, i): generate_ids(servers[mode].port, args, p)
                                 for c in levels for i, p in enumerate(plan[c])}
                shut(mode)
        else:
            for mode in modes:
                bring_up(mode)
            for c in levels:
                for mode in modes:
                    measure(mode, c)
            if args.check_ids:
                ids = check_ids()
            for mode in modes:
                shut(mode)
    except BenchError as e:
        errors.append(str(e))
    except KeyboardInterrupt:
        errors.append("interrupted")
    finally:
        for s in servers.values():  # after an error: SIGTERM what still runs, then SIGKILL
            if s.proc is not None and s.proc.poll() is None:
                try:
                    s.stop(timeout=30)
                except BenchError as e:
                    errors.append(str(e))
            s.kill()  # a no-op for a server already stopped
    run_s = time.perf_counter() - t_run
    cpu = {"client_s": time.process_time() - cpu_client, "cores": os.cpu_count(),
           **{f"{m}_server_s": servers[m].cpu_s for m in modes}}

    # Lossless: the same output per request, plain and speculative.
    mismatches = []
    for c in levels:
        recs_p = results["plain"]["records"].get(c)
        recs_s = results["spec"]["records"].get(c)
        if recs_p is None or recs_s is None:
            continue
        for i, (a, b) in enumerate(zip(recs_p, recs_s)):
            if a["error"] or b["error"]:
                continue
            if (a["text"], a["completion_tokens"], a["finish_reason"]) != (
                    b["text"], b["completion_tokens"], b["finish_reason"]):
                at = next((k for k, (x, y) in enumerate(zip(a["text"], b["text"])) if x != y),
                          min(len(a["text"]), len(b["text"])))
                mismatches.append({"concurrency": c, "request": i, "what": "text",
                                   "first_difference_at_char": at,
                                   "plain": a["text"][max(0, at - 4):at + 12],
                                   "spec": b["text"][max(0, at - 4):at + 12]})
    if len(ids) == 2:
        for key, a in ids["plain"].items():
            b = ids["spec"][key]
            if a != b:
                at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                mismatches.append({"concurrency": key[0], "request": key[1], "what": "output_ids",
                                   "first_difference_at_token": at,
                                   "plain": a[max(0, at - 2):at + 6], "spec": b[max(0, at - 2):at + 6]})
    for m in mismatches:
        errors.append(f"lossless: c={m['concurrency']} request {m['request']}: plain and "
                      f"speculative {m['what']} differ: {json.dumps(m)}")

    # The table.
    spec_info = results["spec"].get("server_info", {})
    lines = [f"command: {command}",
             f"speculative config: {spec_info.get('speculative_config', ' '.join(spec_flags))}",
             f"device: {args.device}; {args.max_tokens} output tokens per request, prompts of "
             f"{args.prompt_len} {'token ids' if args.prompt_kind == 'ids' else 'characters'}, "
             f"greedy, seed {args.seed}; run {run_s:.0f} s",
             "",
             "| concurrency | requests | plain tok/s | spec tok/s | speedup | accept length | "
             "TTFT p50 plain / spec (ms) | TPOT p50 plain / spec (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in levels:
        p = results["plain"]["levels"].get(c)
        s = results["spec"]["levels"].get(c)
        if p is None and s is None:
            continue
        pt = p and p["output_tok_per_s"]
        st = s and s["output_tok_per_s"]
        speedup = f"{st / pt:.2f}x" if pt and st else "-"
        lines.append(
            f"| {c} | {requests_at(args, c)} | {fmt(pt)} | {fmt(st)} | {speedup} | "
            f"{fmt(s and s['accept_length_mean'], 1, 2)} | "
            f"{fmt(p and p['ttft_s']['median'], 1e3, 2)} / {fmt(s and s['ttft_s']['median'], 1e3, 2)} | "
            f"{fmt(p and p['tpot_s']['median'], 1e3, 3)} / {fmt(s and s['tpot_s']['median'], 1e3, 3)} |")
    print("\n".join(lines))
    print()
    print("details (ms; mean / p99):")
    for mode in modes:
        for c in levels:
            x = results[mode]["levels"].get(c)
            if x is None:
                continue
            print(f"  {mode:5} c={c:<3} TTFT {fmt(x['ttft_s']['mean'], 1e3, 2)} / "
                  f"{fmt(x['ttft_s']['p99'], 1e3, 2)}  TPOT {fmt(x['tpot_s']['mean'], 1e3, 3)} / "
                  f"{fmt(x['tpot_s']['p99'], 1e3, 3)}  e2e {fmt(x['e2e_s']['mean'], 1e3, 1)} / "
                  f"{fmt(x['e2e_s']['p99'], 1e3, 1)}  server TTFT p50 "
                  f"{fmt(x['server_ttft_s']['median'], 1e3, 2)}  req/s {fmt(x['req_per_s'], 1, 1)}"
                  f"  accept (responses / /metrics) {fmt(x['accept_length_responses'], 1, 3)} / "
                  f"{fmt(x['accept_length_metrics'], 1, 3)}")
            missing = x["completion_tokens"] - x["metrics_generation_tokens_at_done"]
            if missing > 0:
                print(f"        /metrics right after the last [DONE] lacked {missing:.0f} of the "
                      f"{x['completion_tokens']} tokens; complete after "
                      f"{x['metrics_settle_s'] * 1e3:.1f} ms")
    checked = sum(len(v) for v in results["spec"]["records"].values())
    print(f"lossless: {len(mismatches)} mismatches over {checked} requests"
          f"{' (text and output_ids)' if len(ids) == 2 else ' (streamed text)'}")
    print(f"CPU seconds over the {run_s:.0f} s run ({cpu['cores']} cores): this client "
          f"{cpu['client_s']:.1f}, plain server {fmt(cpu['plain_server_s'])}, speculative "
          f"server {fmt(cpu['spec_server_s'])}")
    for w in warnings:
        print(f"warning: {w}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    print(f"server logs: {log_dir}")

    if args.json:
        out = {"command": command, "args": {k: v for k, v in vars(args).items()},
               "speculative_flags": spec_flags, "run_s": run_s, "cpu": cpu, "log_dir": log_dir,
               "definitions": {
                   "ttft_s": "client: send -> first SSE data event (first decodable text)",
                   "tpot_s": "(final event - first event) / (completion_tokens - 1)",
                   "e2e_s": "client: send -> [DONE]",
                   "output_tok_per_s": "completion tokens of the level / its wall time",
                   "accept_length_mean": "mean over requests of meta_info.spec_accept_length",
                   "accept_length_metrics": "delta committed / delta verify from /metrics"},
               "modes": {}, "prompts": {str(c): plan[c] for c in levels},
               "mismatches": mismatches, "warnings": warnings, "errors": errors,
               "table": lines}
        for mode in modes:
            r = results[mode]
            out["modes"][mode] = {
                "server_command": servers[mode].cmd, "server_log": servers[mode].log_path,
                "server_info": r.get("server_info"), "startup_s": r.get("startup_s"),
                "exit_status": r.get("exit_status"),
                "levels": {str(c): v for c, v in r["levels"].items()},
                "records": {str(c): [{k: v for k, v in rec.items() if k not in ("t_send", "t_end")}
                                     for rec in recs] for c, recs in r["records"].items()}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(None))
