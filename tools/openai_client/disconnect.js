// node disconnect.js BASE_URL [MODEL|-] [ROUNDS=1]
// A streaming client that goes away cancels its request: start a long greedy streaming
// completion (200 tokens, ignore_eos), abort it after the first few chunks, then GET /metrics
// until no request runs, no KV page is held, and requests_finished_total{reason="cancelled"} rose
// by one. (Where the request outran the client -- finished before the server saw it go -- it is
// tried again, up to 3 times.) ROUNDS > 1 repeats the whole check, a server still answering
// after each: many disconnects stress the release of the cancelled requests' state.
import OpenAI from 'openai';
import { apiKey, client, expect, fail, run, show } from './common.js';

const TIMEOUT_MS = 20_000;
const CHUNKS_BEFORE_ABORT = 3;
const MAX_TOKENS = 200;
const ATTEMPTS = 3;

async function metrics(baseURL) {
  const headers = process.env.OPENAI_API_KEY ? { Authorization: `Bearer ${apiKey()}` } : {};
  const res = await fetch(`${baseURL.replace(/\/+$/, '')}/metrics`, { headers });
  expect(res.ok, `GET /metrics: HTTP ${res.status}`);
  const text = await res.text();
  // name{labels} value, labels ignored but for reason="...".
  const get = (name, reason) => {
    for (const line of text.split('\n')) {
      if (line.startsWith('#') || !line.startsWith(name)) continue;
      const m = /^([a-z_]+)(\{[^}]*\})?\s+(\S+)$/.exec(line);
      if (!m || m[1] !== name) continue;
      if (reason !== undefined && !(m[2] || '').includes(`reason="${reason}"`)) continue;
      return Number(m[3]);
    }
    fail(`GET /metrics has no ${name}${reason ? `{reason="${reason}"}` : ''}`);
  };
  return {
    running: get('specdec_num_running_reqs'),
    queued: get('specdec_num_queue_reqs'),
    pages: get('specdec_kv_pages_used'),
    cancelled: get('specdec_requests_finished_total', 'cancelled'),
    length: get('specdec_requests_finished_total', 'length'),
  };
}

// /metrics until nothing runs, waits or holds KV pages (a request just answered may still be
// leaving the batch); TIMEOUT_MS at most.
async function idle(baseURL) {
  const t0 = performance.now();
  for (;;) {
    const m = await metrics(baseURL);
    if (m.running === 0 && m.queued === 0 && m.pages === 0) return m;
    if (performance.now() - t0 > TIMEOUT_MS) {
      fail(`the server is not idle before the test after ${TIMEOUT_MS / 1000} s: ${show(m)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// /metrics until no request runs, no KV page is held and the request is counted as finished
// (cancelled or length); TIMEOUT_MS at most.
async function settle(baseURL, before) {
  const t0 = performance.now();
  let now = await metrics(baseURL);
  const settled = (m) => m.running === 0 && m.pages === 0 &&
                         (m.cancelled > before.cancelled || m.length > before.length);
  while (!settled(now)) {
    if (performance.now() - t0 > TIMEOUT_MS) {
      fail(`${TIMEOUT_MS / 1000} s after the client aborted, /metrics still shows ` +
           `running ${now.running}, kv_pages_used ${now.pages}, cancelled ${now.cancelled} ` +
           `(was ${before.cancelled}), length ${now.length} (was ${before.length}): the ` +
           'disconnect did not cancel the request');
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
    now = await metrics(baseURL);
  }
  return { now, waitedS: (performance.now() - t0) / 1000 };
}

// One streamed request aborted at chunk CHUNKS_BEFORE_ABORT; then /metrics until the server is
// idle again. 'cancelled' when the disconnect cancelled it, 'raced' when the request had finished
// (finish_reason "length") before the server saw the client go: too fast to test, try again.
async function attempt(api, baseURL, model) {
  const before = await idle(baseURL);
  const controller = new AbortController();
  const stream = await api.completions.create(
    { model, prompt: 'Tell a very long story:', max_tokens: MAX_TOKENS, temperature: 0,
      ignore_eos: true, stream: true },
    { signal: controller.signal });
  let chunks = 0;
  let text = '';
  let finished = null;
  try {
    for await (const chunk of stream) {
      chunks += 1;
      text += chunk.choices[0]?.text ?? '';
      if (chunk.choices[0]?.finish_reason) finished = chunk.choices[0].finish_reason;
      if (chunks === CHUNKS_BEFORE_ABORT) controller.abort();  // chunks already read may follow
    }
  } catch (err) {
    // openai's Stream ends quietly on an abort; an error, if any, must be the abort.
    if (!(err instanceof OpenAI.APIUserAbortError) && err?.name !== 'AbortError') throw err;
  }
  if (!controller.signal.aborted) {
    // The whole stream came in fewer chunks than CHUNKS_BEFORE_ABORT.
    expect(finished !== null, `the stream ended after ${chunks} chunks without a finish_reason`);
    await settle(baseURL, before);
    return { outcome: 'raced', chunks, finished };
  }
  const { now, waitedS } = await settle(baseURL, before);
  if (now.cancelled === before.cancelled && now.length === before.length + 1) {
    return { outcome: 'raced', chunks, finished };
  }
  expect(now.cancelled === before.cancelled + 1 && now.length === before.length,
         `requests_finished_total rose by cancelled ${now.cancelled - before.cancelled}, length ` +
         `${now.length - before.length}; expected cancelled 1, length 0`);
  return { outcome: 'cancelled', chunks, chars: [...text].length, waitedS };
}

async function main(baseURL, modelArg, roundsArg = '1') {
  const rounds = Number(roundsArg);
  expect(Number.isInteger(rounds) && rounds > 0, `ROUNDS must be a positive integer, got ${show(roundsArg)}`);
  const api = client(baseURL);
  let model = modelArg;
  if (!model || model === '-') {
    for await (const m of api.models.list()) { model = m.id; break; }
  }
  const results = [];
  for (let round = 1; round <= rounds; ++round) {
    let r;
    for (let i = 1; i <= ATTEMPTS; ++i) {
      r = await attempt(api, baseURL, model);
      if (r.outcome === 'cancelled') break;
      console.log(`  note: round ${round}, attempt ${i}: the ${MAX_TOKENS}-token request finished ` +
                  `before the server saw the disconnect (${r.chunks} chunks read): trying again`);
    }
    expect(r.outcome === 'cancelled',
           `in ${ATTEMPTS} attempts the request always finished before the server saw the ` +
           'disconnect: generation too fast to test it');
    // The server still serves after the cancel.
    const after = await api.completions.create({ model, prompt: 'ok', max_tokens: 4,
                                                 temperature: 0 });
    expect(after.choices.length === 1, `a request after the cancel: ${show(after)}`);
    results.push(r);
  }
  const r = results[0];
  console.log(`disconnect.js: aborted at chunk ${CHUNKS_BEFORE_ABORT} (${r.chunks} read, ` +
              `${r.chars} chars); cancelled +1, 0 running, 0 KV pages after ` +
              `${r.waitedS.toFixed(2)} s` + (rounds > 1 ? `; the same in all ${rounds} rounds` : ''));
}

run('disconnect.js', 'BASE_URL [MODEL|-] [ROUNDS=1]', 1, main);
