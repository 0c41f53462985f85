// node concurrency.js BASE_URL MODEL [N=64]
// N clients at once, each a different greedy completions request (its own prompt, max_tokens
// 8..40, every other one streamed): every request must be answered; then each is sent again
// alone, one after another, and must give the same text, finish_reason and token count as in
// the crowd (batching must not change a greedy output).
import { client, collect, expect, fail, run, show } from './common.js';

const WORDS = ['draft', 'verify', 'tree', 'token', 'accept', 'kernel', 'cache', 'page', 'batch',
               'prefill', 'decode', 'eagle', 'target', 'logit', 'commit', 'rollback'];

function requestOf(model, i) {
  const words = [];
  for (let k = 0; k < 3 + (i % 5); ++k) words.push(WORDS[(i * 7 + k * 3) % WORDS.length]);
  return {
    model,
    prompt: `#${i}: ${words.join(' ')}`,
    max_tokens: 8 + ((i * 13) % 33),  // 8..40
    temperature: 0,
    stream: i % 2 === 1,
  };
}

async function send(api, req) {
  if (req.stream) {
    const r = await collect(
      await api.completions.create({ ...req, stream_options: { include_usage: true } }),
      { chat: false, includeUsage: true });
    expect(r.usage, `request ${show(req.prompt)}: the stream has no usage chunk`);
    return { text: r.text, finish: r.finish, tokens: r.usage.completion_tokens };
  }
  const c = await api.completions.create(req);
  expect(c.choices.length === 1, `request ${show(req.prompt)}: ${c.choices.length} choices`);
  return { text: c.choices[0].text, finish: c.choices[0].finish_reason,
           tokens: c.usage.completion_tokens };
}

function checkOne(req, r, when) {
  expect(r.finish === 'length' || r.finish === 'stop',
         `${when} ${show(req.prompt)}: finish_reason ${show(r.finish)}`);
  if (r.finish === 'length') {
    expect(r.tokens === req.max_tokens,
           `${when} ${show(req.prompt)}: "length" after ${r.tokens} tokens, max_tokens ` +
           `${req.max_tokens}`);
  }
}

async function main(baseURL, model, nArg = '64') {
  const n = Number(nArg);
  expect(Number.isInteger(n) && n > 0, `N must be a positive integer, got ${show(nArg)}`);
  const api = client(baseURL);
  const reqs = Array.from({ length: n }, (_, i) => requestOf(model, i));

  const t0 = performance.now();
  const settled = await Promise.allSettled(reqs.map((req) => send(api, req)));
  const crowdS = (performance.now() - t0) / 1000;
  const failures = settled
    .map((s, i) => (s.status === 'rejected' ? `#${i}: ${s.reason?.message || s.reason}` : null))
    .filter(Boolean);
  if (failures.length) {
    fail(`${failures.length} of ${n} concurrent requests failed:\n  ${failures.join('\n  ')}`);
  }
  const crowd = settled.map((s) => s.value);
  crowd.forEach((r, i) => checkOne(reqs[i], r, 'concurrent'));

  const t1 = performance.now();
  const mismatches = [];
  let tokens = 0;
  for (let i = 0; i < n; ++i) {
    const alone = await send(api, reqs[i]);
    checkOne(reqs[i], alone, 'alone');
    tokens += alone.tokens;
    if (alone.text !== crowd[i].text || alone.finish !== crowd[i].finish ||
        alone.tokens !== crowd[i].tokens) {
      mismatches.push(`#${i} ${show(reqs[i].prompt)} (${reqs[i].stream ? 'stream' : 'plain'}, ` +
                      `max_tokens ${reqs[i].max_tokens}): concurrent ${show(crowd[i])} != alone ` +
                      `${show(alone)}`);
    }
  }
  const aloneS = (performance.now() - t1) / 1000;
  if (mismatches.length) {
    fail(`${mismatches.length} of ${n} outputs differ between concurrent and alone:\n  ` +
         mismatches.join('\n  '));
  }
  const distinct = new Set(crowd.map((r) => r.text)).size;
  const streamed = reqs.filter((r) => r.stream).length;
  console.log(`concurrency.js: ${n}/${n} concurrent requests answered in ${crowdS.toFixed(2)} s ` +
              `(${streamed} streamed), all ${n} identical when re-sent alone ` +
              `(${aloneS.toFixed(2)} s, ${tokens} tokens, ${distinct} distinct texts)`);
}

run('concurrency.js', 'BASE_URL MODEL [N]', 2, main);
