// Shared helpers of the `specdec-kimi serve` client checks (check.js, concurrency.js,
// disconnect.js): the official openai client pointed at BASE_URL/v1, and a failure that names
// what went wrong.
import OpenAI from 'openai';

export class CheckFailure extends Error {}

export function fail(message) {
  throw new CheckFailure(message);
}

export function expect(cond, message) {
  if (!cond) fail(message);
}

export function show(value) {
  return JSON.stringify(value);
}

// The API key: OPENAI_API_KEY when set (a server started with --api-key), else a placeholder
// (the client insists on one; a server without --api-key ignores it).
export function apiKey() {
  return process.env.OPENAI_API_KEY || 'none';
}

export function client(baseURL, extra = {}) {
  return new OpenAI({
    baseURL: baseURL.replace(/\/+$/, '') + '/v1',
    apiKey: apiKey(),
    maxRetries: 0,  // a retried request would hide a failure
    timeout: 120_000,
    ...extra,
  });
}

// Runs main(args) and exits: 0 when it returns, 1 with "FAIL: ..." when it throws.
export function run(name, usage, minArgs, main) {
  const args = process.argv.slice(2);
  if (args.length < minArgs) {
    console.error(`usage: node ${name} ${usage}`);
    process.exit(2);
  }
  main(...args).then(
    () => process.exit(0),
    (err) => {
      if (err instanceof CheckFailure) {
        console.error(`FAIL: ${name}: ${err.message}`);
      } else {
        console.error(`FAIL: ${name}: unexpected error: ${err?.stack || err}`);
        if (err instanceof OpenAI.APIError) {
          console.error(`  status ${err.status}, body ${show(err.error)}`);
        }
      }
      process.exit(1);
    },
  );
}

// Assembles a streamed completion / chat completion: the text of its deltas, the finish reason,
// the usage chunk (which must be the last chunk, with no choices, when include_usage is set).
export async function collect(stream, { chat, includeUsage }) {
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  let chunks = 0;
  let afterUsage = 0;
  const ids = new Set();
  for await (const chunk of stream) {
    chunks += 1;
    ids.add(chunk.id);
    if (usage) afterUsage += 1;
    if (chunk.usage) {
      expect(chunk.choices.length === 0,
             `the usage chunk has choices: ${show(chunk)}`);
      usage = chunk.usage;
      continue;
    }
    if (includeUsage) {
      expect(chunk.usage === null,
             `a chunk before the usage chunk has usage ${show(chunk.usage)} (expected null)`);
    }
    expect(chunk.choices.length === 1, `a chunk without exactly one choice: ${show(chunk)}`);
    const c = chunk.choices[0];
    if (chat) {
      if (c.delta.role) role = c.delta.role;
      if (typeof c.delta.content === 'string') text += c.delta.content;
    } else {
      expect(typeof c.text === 'string', `a completion chunk without text: ${show(chunk)}`);
      text += c.text;
    }
    if (c.finish_reason) {
      expect(finish === null, `two chunks with a finish_reason (${finish}, ${c.finish_reason})`);
      finish = c.finish_reason;
    }
  }
  expect(ids.size === 1, `the chunks of one stream carry ${ids.size} ids: ${show([...ids])}`);
  expect(afterUsage === 0, `${afterUsage} chunk(s) after the usage chunk`);
  return { text, finish, usage, role, chunks };
}
