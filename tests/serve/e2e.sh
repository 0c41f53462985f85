#!/usr/bin/env bash
# End-to-end test of `specdec-kimi serve` (the serve.e2e ctest test, tests/serve.cmake):
#   bash tests/serve/e2e.sh SPECDEC_KIMI WORK_DIR TOOLS_DIR
# (a) writes a tiny random checkpoint and an EAGLE-3 draft into WORK_DIR; (b) serves them on a
# free port (--served-model-name tiny); (c) curl checks of the endpoints, errors and metrics, and
# a second server on the same port must fail; (d) `npm ci` of TOOLS_DIR (tools/openai_client)
# in a copy under WORK_DIR, then the official openai client's checks (check.js,
# concurrency.js 64, disconnect.js); (e) a server with --api-key and --tp-size 2 (its greedy ids
# those of one rank); (f) SIGTERM: exit 0 in 10 s.
# Exit 0 when everything passed; 1 with "FAIL: ..." on the first failure; 77 (ctest's skip)
# when everything else passed but node / npm / the npm registry was unavailable for (d).
# Needs bash, curl and python3 (JSON checks); talks to 127.0.0.1 only.
# Environment: SPECDEC_E2E_DISCONNECT_ROUNDS (default 10): how many streaming clients disconnect.
set -euo pipefail

if (($# != 3)); then
  echo "usage: bash $0 SPECDEC_KIMI WORK_DIR TOOLS_DIR" >&2
  exit 2
fi
KIMI=$1
WORK=$2
TOOLS=$3
MODEL=tiny
NUM_DRAFT_TOKENS=4
# Streaming clients that disconnect (disconnect.js ROUNDS); more stress the release of the
# cancelled requests' state (a server that frees it wrongly dies at the SIGTERM check).
DISCONNECT_ROUNDS=${SPECDEC_E2E_DISCONNECT_ROUNDS:-10}
T_START=$SECONDS

PASSED=0
SERVER_PIDS=()
SERVER_LOGS=()

pass() {
  PASSED=$((PASSED + 1))
  echo "  ok: $*"
}

fail() {
  echo "FAIL: $*" >&2
  local log
  for log in "${SERVER_LOGS[@]}"; do
    [[ -f $log ]] || continue
    echo "--- last lines of $log:" >&2
    grep -Ev '^(load |Decode batch)' "$log" | tail -n 15 >&2 || true
  done
  exit 1
}

cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted" >&2; exit 1' INT TERM

[[ -x $KIMI ]] || fail "no executable specdec-kimi at '$KIMI'"
[[ -f $TOOLS/package.json && -f $TOOLS/package-lock.json && -f $TOOLS/check.js ]] ||
  fail "'$TOOLS' is not tools/openai_client (package.json, package-lock.json, check.js)"
command -v curl >/dev/null || fail "curl is needed"
command -v python3 >/dev/null || fail "python3 is needed (the JSON checks)"
TOOLS=$(cd "$TOOLS" && pwd)
# A fresh WORK_DIR but for the npm install of an unchanged package-lock.json (openai_client/).
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
find "$WORK" -mindepth 1 -maxdepth 1 ! -name openai_client -exec rm -rf {} +
BODY=$WORK/body

# ---- (a) the tiny checkpoint and its EAGLE-3 draft -----------------------------------------
echo "e2e: writing the tiny checkpoint + EAGLE-3 draft to $WORK"
"$KIMI" init-random --preset tiny --out "$WORK/target" --seed 3 --draft eagle3 --layers 0,1,2 \
  --draft-out "$WORK/draft" >"$WORK/init.log" 2>&1 ||
  fail "init-random failed: $(tail -n 5 "$WORK/init.log")"
[[ -f $WORK/target/config.json && -f $WORK/draft/config.json ]] ||
  fail "init-random wrote no config.json"
# The served context: max_position_embeddings less the tree's positions (server: margin).
CONTEXT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_position_embeddings"] - int(sys.argv[2]))' \
  "$WORK/target/config.json" "$NUM_DRAFT_TOKENS")
pass "init-random: checkpoint + draft (context $CONTEXT)"

SERVE_FLAGS=(serve --model-path "$WORK/target" --speculative-algorithm EAGLE3
             --speculative-draft-model-path "$WORK/draft" --speculative-num-steps 3
             --speculative-eagle-topk 1 --speculative-num-draft-tokens "$NUM_DRAFT_TOKENS"
             --no-self-check --served-model-name "$MODEL")

# start_server LOG [FLAGS...]: serves on a free port; sets SERVER_PID and PORT once /health
# answers.
start_server() {
  local log=$1
  shift
  : >"$log"  # exists before the polling below reads it (the server's own open may come later)
  "$KIMI" "${SERVE_FLAGS[@]}" --port 0 "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  SERVER_LOGS+=("$log")
  PORT=""
  local i
  for ((i = 0; i < 600; ++i)); do  # 60 s
    kill -0 "$SERVER_PID" 2>/dev/null ||
      fail "the server exited before serving (log $log): $(grep -v '^load ' "$log" | tail -n 5)"
    if [[ -z $PORT ]]; then
      PORT=$(sed -n 's|^specdec-kimi: serving .* on http://127\.0\.0\.1:\([0-9][0-9]*\) (model .*|\1|p' \
        "$log" | head -n 1)
    fi
    if [[ -n $PORT ]] &&
       curl -sf --noproxy '*' --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/health"; then
      return 0
    fi
    sleep 0.1
  done
  fail "the server did not answer /health within 60 s (port '${PORT}', log $log)"
}

# stop_server PID WHAT: SIGTERM, then it must exit 0 within 10 s.
stop_server() {
  local pid=$1 what=$2 i rc=0
  kill -TERM "$pid" 2>/dev/null || fail "$what: already gone before SIGTERM"
  for ((i = 0; i < 100; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && fail "$what: still running 10 s after SIGTERM"
  wait "$pid" || rc=$?
  local kept=() p
  for p in "${SERVER_PIDS[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
  SERVER_PIDS=("${kept[@]}")
  [[ $rc == 0 ]] || fail "$what: exit status $rc after SIGTERM (expected 0)"
  pass "$what: SIGTERM -> exit 0 within 10 s"
}

# req METHOD PATH [JSON_BODY [CURL_ARGS...]]: the response body into $BODY, the status into
# STATUS (to $BASE, the server under test); an empty JSON_BODY sends none.
req() {
  local method=$1 path=$2
  shift 2
  local args=(-sS --noproxy '*' --max-time 60 -o "$BODY" -w '%{http_code}' -X "$method")
  if (($#)); then
    [[ -z $1 ]] || args+=(-H 'Content-Type: application/json' --data-binary "$1")
    shift
  fi
  STATUS=$(curl "${args[@]}" "$@" "$BASE$path") || fail "curl $method $path: transport error"
}

# expect_status WHAT CODE: the last req's status.
expect_status() {
  [[ $STATUS == "$2" ]] || fail "$1: HTTP $STATUS (expected $2): $(head -c 600 "$BODY")"
}

# jcheck WHAT PYTHON_EXPR: the last response body, as JSON `d`, must make the expression true.
jcheck() {
  python3 - "$BODY" "$2" <<'PY' || fail "$1: $(head -c 800 "$BODY")"
import json, sys
try:
    d = json.load(open(sys.argv[1], encoding="utf-8"))
except Exception as e:
    print(f"not JSON ({e})", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if eval(sys.argv[2], {"d": d}) else 1)
PY
}

# jget PYTHON_EXPR: the expression's value over the last response body.
jget() {
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1], encoding="utf-8")); print(eval(sys.argv[2]))' \
    "$BODY" "$1"
}

# An OpenAI error body: {"error": {"message": str, "type": str, ...}}.
IS_ERROR='isinstance(d.get("error"), dict) and isinstance(d["error"].get("message"), str) and len(d["error"]["message"]) > 0 and isinstance(d["error"].get("type"), str)'

# ---- (b) the server -------------------------------------------------------------------------
echo "e2e: starting the server"
start_server "$WORK/server.log"
PID1=$SERVER_PID
PORT1=$PORT
BASE=http://127.0.0.1:$PORT1
pass "server up on port $PORT1 (/health answers)"
# The greedy reference for the tensor-parallel server in (e).
TP_REQUEST='{"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": true}}'
req POST /generate "$TP_REQUEST"
expect_status "POST /generate (the tensor-parallel reference)" 200
TP_REFERENCE=$(jget 'd["output_ids"]')

# ---- (c) curl checks ------------------------------------------------------------------------
req GET /health
expect_status "GET /health" 200
[[ $(cat "$BODY") == OK ]] || fail "GET /health: body '$(head -c 200 "$BODY")' (expected OK)"
pass "GET /health: 200 OK"

req GET /v1/models
expect_status "GET /v1/models" 200
jcheck "GET /v1/models lists '$MODEL' with max_model_len $CONTEXT" \
  "d['object'] == 'list' and any(m['id'] == '$MODEL' and m.get('max_model_len') == $CONTEXT for m in d['data'])"
pass "GET /v1/models: lists '$MODEL' (max_model_len $CONTEXT)"

req GET /get_server_info
expect_status "GET /get_server_info" 200
jcheck "GET /get_server_info" \
  "d['served_model_name'] == '$MODEL' and d['context_length'] == $CONTEXT and d['speculative_algorithm'] == 'EAGLE3' and d['speculative_num_draft_tokens'] == $NUM_DRAFT_TOKENS and isinstance(d['cuda_graph_bs'], list) and isinstance(d['disable_cuda_graph'], bool)"
pass "GET /get_server_info: model, context, speculative config, graph ladder"

req POST /generate '{"text": "hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}'
expect_status "POST /generate" 200
jcheck "POST /generate: text + meta_info.spec_accept_length" \
  "isinstance(d['text'], str) and isinstance(d['meta_info']['spec_accept_length'], (int, float)) and d['meta_info']['spec_accept_length'] >= 1 and d['meta_info']['spec_verify_ct'] >= 1 and 1 <= d['meta_info']['completion_tokens'] <= 8 and len(d['output_ids']) == d['meta_info']['completion_tokens']"
pass "POST /generate: text, output_ids, meta_info.spec_accept_length $(jget "d['meta_info']['spec_accept_length']")"

# A field no rule reads (a typo of max_tokens) is served as if absent and named in the log once.
req POST /v1/completions '{"prompt": "hi", "max_token": 2, "temperature": 0, "max_tokens": 2}'
expect_status "POST /v1/completions with an ignored field" 200
req POST /v1/completions '{"prompt": "hi", "max_token": 2, "temperature": 0, "max_tokens": 2}'
expect_status "POST /v1/completions with an ignored field, again" 200
n=$(grep -c "a request carries 'max_token', which this server ignores" "$WORK/server.log")
[[ $n == 1 ]] || fail "the ignored field 'max_token': logged $n times (expected once)"
pass "an ignored request field ('max_token') is served as if absent and logged once"
req POST /generate '{"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0, "max_new_token": 2}}'
expect_status "POST /generate with an ignored sampling field" 200
n=$(grep -c "a request carries 'sampling_params.max_new_token', which this server ignores" "$WORK/server.log")
[[ $n == 1 ]] || fail "the ignored field 'sampling_params.max_new_token': logged $n times (expected once)"
pass "an ignored field inside sampling_params is named by its path in the log"

COMP='{"model": "tiny", "prompt": "hello", "max_tokens": 16, "temperature": 0, "ignore_eos": true}'
req POST /v1/completions "$COMP"
expect_status "POST /v1/completions" 200
jcheck "POST /v1/completions: choices + usage" \
  "d['object'] == 'text_completion' and d['model'] == '$MODEL' and len(d['choices']) == 1 and isinstance(d['choices'][0]['text'], str) and d['choices'][0]['finish_reason'] == 'length' and d['usage']['completion_tokens'] == 16 and d['usage']['prompt_tokens'] > 0 and d['usage']['total_tokens'] == d['usage']['prompt_tokens'] + 16"
PROMPT_TOKENS=$(jget "d['usage']['prompt_tokens']")
COMP_TEXT=$(jget "json.dumps(d['choices'][0]['text'])")
pass "POST /v1/completions: 200, usage {prompt $PROMPT_TOKENS, completion 16}"

# The same request streamed: SSE data events, the same text, the usage chunk, then [DONE].
STREAM=$WORK/stream.txt
code=$(curl -sS -N --noproxy '*' --max-time 60 -o "$STREAM" -w '%{http_code} %{content_type}' \
  -H 'Content-Type: application/json' \
  --data-binary "${COMP%\}}, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
  "$BASE/v1/completions") || fail "curl -N streaming /v1/completions: transport error"
[[ $code == "200 text/event-stream"* ]] || fail "streaming /v1/completions: '$code': $(head -c 400 "$STREAM")"
python3 - "$STREAM" "$COMP_TEXT" <<'PY' || fail "streaming /v1/completions: $(tail -c 600 "$STREAM")"
import json, sys
lines = [l for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l.strip()]
if not lines or lines[-1] != "data: [DONE]":
    sys.exit(f"the last event is {lines[-1:]!r}, not 'data: [DONE]'")
if lines.count("data: [DONE]") != 1:
    sys.exit("more than one [DONE]")
chunks = []
for l in lines[:-1]:
    if not l.startswith("data: {"):
        sys.exit(f"not an SSE data event: {l!r}")
    chunks.append(json.loads(l[len("data: "):]))
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
if text != json.loads(sys.argv[2]):
    sys.exit(f"streamed text {text!r} != non-streamed {json.loads(sys.argv[2])!r}")
finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
if finish != ["length"]:
    sys.exit(f"finish_reason(s) {finish!r}, expected ['length']")
if chunks[-1]["choices"] or chunks[-1]["usage"]["completion_tokens"] != 16:
    sys.exit(f"the last chunk before [DONE] is not the usage chunk: {chunks[-1]!r}")
PY
pass "streaming /v1/completions (curl -N): $(grep -c '^data: ' "$STREAM") events, same text, usage chunk, 'data: [DONE]' last"

req POST /v1/chat/completions '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}'
expect_status "POST /v1/chat/completions" 200
jcheck "POST /v1/chat/completions" \
  "d['object'] == 'chat.completion' and d['choices'][0]['message']['role'] == 'assistant' and isinstance(d['choices'][0]['message']['content'], str) and d['choices'][0]['finish_reason'] in ('length', 'stop') and d['usage']['completion_tokens'] <= 8"
pass "POST /v1/chat/completions: 200, assistant message, usage"

req POST /v1/completions '{"model": "tiny", "prompt": "hello", "max_tokens": 4'
expect_status "malformed JSON" 400
jcheck "malformed JSON: an OpenAI error body" "$IS_ERROR"
pass "malformed JSON: 400 with an OpenAI error body"

req POST /v1/completions '{"model": "tiny", "prompt": "hello", "max_tokens": "4"}'
expect_status "max_tokens as a string" 400
jcheck "max_tokens as a string: an error naming max_tokens" \
  "$IS_ERROR and (d['error'].get('param') == 'max_tokens' or 'max_tokens' in d['error']['message'])"
pass "max_tokens \"4\": 400 naming max_tokens"

# The context: prompt + max_tokens == CONTEXT fits, one more does not.
FIT=$((CONTEXT - PROMPT_TOKENS))
req POST /v1/completions "{\"model\": \"tiny\", \"prompt\": \"hello\", \"max_tokens\": $FIT, \"temperature\": 0, \"ignore_eos\": true}"
expect_status "prompt + max_tokens == context ($PROMPT_TOKENS + $FIT)" 200
jcheck "prompt + max_tokens == context: all of max_tokens" \
  "d['usage']['completion_tokens'] == $FIT and d['choices'][0]['finish_reason'] == 'length'"
pass "prompt + max_tokens == context ($PROMPT_TOKENS + $FIT = $CONTEXT): 200, $FIT tokens"
req POST /v1/completions "{\"model\": \"tiny\", \"prompt\": \"hello\", \"max_tokens\": $((FIT + 1))}"
expect_status "prompt + max_tokens past the context ($PROMPT_TOKENS + $((FIT + 1)))" 400
jcheck "past the context: an error" "$IS_ERROR and 'context' in d['error']['message']"
pass "prompt + max_tokens == context + 1: 400 ($(jget "d['error'].get('code')"))"

req POST /v1/completions '{"model": "not-tiny", "prompt": "hello", "max_tokens": 4}'
expect_status "unknown model" 404
jcheck "unknown model: an OpenAI error body" "$IS_ERROR"
pass "unknown model: 404 with an OpenAI error body"

req POST /v1/completions '{"model": "tiny", "prompt": [1, 2, 99999], "max_tokens": 4}'
expect_status "a prompt id outside the vocabulary" 400
jcheck "a prompt id outside the vocabulary: an error naming prompt[2]" \
  "$IS_ERROR and d['error'].get('param') == 'prompt[2]' and 'vocabulary' in d['error']['message']"
pass "a prompt id outside the vocabulary: 400 naming prompt[2]"

req GET /v1/no-such-endpoint
expect_status "unknown endpoint" 404
jcheck "unknown endpoint: an OpenAI error body" "$IS_ERROR"
pass "unknown endpoint: 404 with an OpenAI error body"

req GET /metrics
expect_status "GET /metrics" 200
verify=$(sed -n 's/^specdec_spec_verify_total{[^}]*} \([0-9.e+]*\)$/\1/p' "$BODY")
[[ -n $verify ]] || fail "GET /metrics has no specdec_spec_verify_total sample"
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$verify" ||
  fail "GET /metrics: specdec_spec_verify_total is $verify after the requests (expected > 0)"
grep -q '^specdec_requests_finished_total{.*reason="length"} [1-9]' "$BODY" ||
  fail "GET /metrics: no request finished by length: $(grep requests_finished "$BODY")"
pass "GET /metrics: specdec_spec_verify_total $verify > 0"

# A second server on the same port must fail, naming the port in use.
rc=0
out=$(timeout 60 "$KIMI" "${SERVE_FLAGS[@]}" --port "$PORT1" 2>&1) || rc=$?
[[ $rc != 0 ]] || fail "a second server on port $PORT1 exited 0"
((rc != 124)) || fail "a second server on port $PORT1 was still running after 60 s (it should fail)"
grep -q 'in use' <<<"$out" ||
  fail "a second server on port $PORT1: exit $rc without 'in use': $(grep -v '^load ' <<<"$out" | tail -n 3)"
pass "a second server on port $PORT1: exit $rc, '$(grep -o '[^:]*in use[^(]*' <<<"$out" | head -n 1 | sed 's/^ *//;s/ *$//')'"

req GET /health
expect_status "GET /health after the second server failed" 200

# ---- (d) the official openai client ---------------------------------------------------------
NODE_SKIP=""
NODE_DIR=$WORK/openai_client
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  NODE_SKIP="node or npm is not installed"
elif (($(node -p 'Number(process.versions.node.split(".")[0])') < 20)); then
  NODE_SKIP="node $(node --version) is older than 20 (the openai client needs >= 20)"
else
  mkdir -p "$NODE_DIR"
  find "$NODE_DIR" -mindepth 1 -maxdepth 1 ! -name node_modules -exec rm -rf {} +
  cp "$TOOLS"/package.json "$TOOLS"/package-lock.json "$TOOLS"/*.js "$NODE_DIR"/
  # npm ci unless node_modules already holds this package-lock.json's install (the stamp).
  STAMP=$NODE_DIR/node_modules/.specdec-package-lock.json
  if [[ -f $STAMP ]] && cmp -s "$STAMP" "$NODE_DIR/package-lock.json"; then
    echo "e2e: $NODE_DIR/node_modules is up to date with package-lock.json"
  else
    echo "e2e: npm ci in $NODE_DIR"
    if (cd "$NODE_DIR" && timeout 300 npm ci --no-audit --no-fund --prefer-offline \
          --fetch-retries=1 --fetch-timeout=60000) >"$WORK/npm.log" 2>&1; then
      cp "$NODE_DIR/package-lock.json" "$STAMP"
    elif timeout 30 npm ping >/dev/null 2>&1; then
      fail "npm ci failed although the registry answers (log $WORK/npm.log): $(tail -n 5 "$WORK/npm.log")"
    else
      NODE_SKIP="npm ci failed and the npm registry does not answer (npm ping): $(grep -m 1 -E 'FetchError|npm (error|ERR!) code' "$WORK/npm.log" || tail -n 1 "$WORK/npm.log")"
    fi
  fi
fi
if [[ -z $NODE_SKIP ]]; then
  pass "the openai client installed: openai $(cd "$NODE_DIR" && node -p 'require("openai/version").VERSION' 2>&1)"
  # node_client NAME ARGS...: one client script against the server, its output shown.
  node_client() {
    local name=$1 rc=0
    shift
    (cd "$NODE_DIR" && timeout 300 node "$name" "$@") >"$WORK/$name.log" 2>&1 || rc=$?
    if ((rc != 0)); then
      sed 's/^/    /' "$WORK/$name.log"
      fail "node $name $* exited $rc (log $WORK/$name.log)"
    fi
    sed '$d; s/^/    /' "$WORK/$name.log"  # the summary line follows as the check's own
    pass "$(tail -n 1 "$WORK/$name.log")"
  }
  OPENAI_API_KEY='' node_client check.js "$BASE" "$MODEL"
  OPENAI_API_KEY='' node_client concurrency.js "$BASE" "$MODEL" 64
  OPENAI_API_KEY='' node_client disconnect.js "$BASE" "$MODEL" "$DISCONNECT_ROUNDS"
else
  echo "SKIPPED: the openai client checks (d): $NODE_SKIP"
fi

# After everything: nothing running, no KV page held, nothing failed in the engine. (The
# gauges may lag the last response by a step: polled for up to 10 s.)
for ((k = 0; k < 100; ++k)); do
  req GET /metrics
  grep -q '^specdec_num_running_reqs{[^}]*} 0$' "$BODY" &&
    grep -q '^specdec_kv_pages_used{[^}]*} 0$' "$BODY" && break
  sleep 0.1
done
grep -q '^specdec_num_running_reqs{[^}]*} 0$' "$BODY" ||
  fail "requests still running 10 s after the last response: $(grep '^specdec_num_running_reqs' "$BODY")"
grep -q '^specdec_kv_pages_used{[^}]*} 0$' "$BODY" ||
  fail "KV pages still held 10 s after the last response: $(grep '^specdec_kv_pages_used' "$BODY")"
grep -q '^specdec_requests_finished_total{.*reason="error"} 0$' "$BODY" ||
  fail "engine errors: $(grep 'reason="error"' "$BODY")"
pass "GET /metrics at the end: 0 running, 0 KV pages used, 0 engine errors"

# ---- (f) SIGTERM the first server, streams in flight: they finish, then it exits 0 ---------
DRAIN=()
for i in 1 2 3 4 5 6 7 8; do
  curl -sS -N --noproxy '*' --max-time 60 -o "$WORK/drain$i.txt" -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\": \"drain $i\", \"max_tokens\": 240, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
    "$BASE/v1/completions" 2>"$WORK/drain$i.err" &
  DRAIN+=($!)
done
started=0
for ((k = 0; k < 200; ++k)); do  # until every stream has its first event (10 s)
  started=0
  for i in 1 2 3 4 5 6 7 8; do [[ -s $WORK/drain$i.txt ]] && started=$((started + 1)); done
  ((started == 8)) && break
  sleep 0.05
done
((started == 8)) || fail "only $started of 8 streams started within 10 s"
stop_server "$PID1" "server on port $PORT1 (8 streams in flight)"
grep -q 'server stopped' "$WORK/server.log" || fail "the server log does not say 'server stopped'"
for i in "${!DRAIN[@]}"; do
  wait "${DRAIN[$i]}" || fail "stream $((i + 1)) in flight at SIGTERM: curl failed: $(cat "$WORK/drain$((i + 1)).err")"
done
running=$(sed -n 's/^specdec-kimi: stopping: no new requests, finishing \([0-9]*\) running$/\1/p' "$WORK/server.log")
for i in 1 2 3 4 5 6 7 8; do
  [[ $(grep -v '^$' "$WORK/drain$i.txt" | tail -n 1) == 'data: [DONE]' ]] ||
    fail "stream $i in flight at SIGTERM did not end with [DONE]: $(tail -c 300 "$WORK/drain$i.txt")"
  grep -q '"usage":{"completion_tokens":240,' "$WORK/drain$i.txt" ||
    fail "stream $i in flight at SIGTERM: not 240 tokens: $(tail -c 300 "$WORK/drain$i.txt")"
done
pass "8 streams in flight at SIGTERM (${running:-?} running when it came) all finished: 240 tokens, [DONE]"

# ---- (e) a server with --api-key ------------------------------------------------------------
echo "e2e: starting a server with --api-key, tensor parallel over 2 CPU ranks"
start_server "$WORK/server-key.log" --api-key sekrit --tp-size 2
PID2=$SERVER_PID
PORT2=$PORT
BASE=http://127.0.0.1:$PORT2
req GET /health
expect_status "--api-key: GET /health without the key" 200
pass "--api-key: GET /health without the key: 200"
req GET /v1/models
expect_status "--api-key: GET /v1/models without the key" 401
jcheck "--api-key: 401 body" "$IS_ERROR"
req GET /v1/models "" -H 'Authorization: Bearer wrong'
expect_status "--api-key: GET /v1/models with a wrong key" 401
pass "--api-key: GET /v1/models without the key / with a wrong one: 401"
req GET /v1/models "" -H 'Authorization: Bearer sekrit'
expect_status "--api-key: GET /v1/models with the key" 200
jcheck "--api-key: GET /v1/models with the key" "any(m['id'] == '$MODEL' for m in d['data'])"
req GET /metrics
expect_status "--api-key: GET /metrics without the key" 401
req POST /v1/completions '{"model": "tiny", "prompt": "hi", "max_tokens": 4}' -H 'Authorization: Bearer sekrit'
expect_status "--api-key: POST /v1/completions with the key" 200
pass "--api-key: with 'Authorization: Bearer sekrit': 200 (models, completions); /metrics without: 401"
req POST /generate "$TP_REQUEST" -H 'Authorization: Bearer sekrit'
expect_status "--tp-size 2: POST /generate" 200
jcheck "--tp-size 2: the greedy ids of one rank ($TP_REFERENCE)" "d['output_ids'] == $TP_REFERENCE"
pass "--tp-size 2 (lockstep ranks): the same 24 greedy ids as one rank"
if [[ -z $NODE_SKIP ]]; then
  OPENAI_API_KEY=sekrit node_client check.js "$BASE" "$MODEL"
fi

# ---- (f) SIGTERM the second server ---------------------------------------------------------
stop_server "$PID2" "server with --api-key on port $PORT2"

if [[ -n $NODE_SKIP ]]; then
  echo "SKIPPED: the openai client checks (d): $NODE_SKIP"
  echo "e2e: $PASSED checks passed, the openai client checks skipped ($((SECONDS - T_START)) s)"
  exit 77
fi
echo "e2e: $PASSED checks passed ($((SECONDS - T_START)) s)"
