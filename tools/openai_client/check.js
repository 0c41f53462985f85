// node check.js BASE_URL MODEL
// `specdec-kimi serve` through the official openai client: chat and text completions, streamed
// and not, all greedy; the streamed text must equal the non-streamed text of the same request,
// usage must add up, and errors must come back as the client's APIError with the right status.
import OpenAI from 'openai';
import { VERSION } from 'openai/version';
import { client, collect, expect, fail, run, show } from './common.js';

let checks = 0;
function ok(what) {
  checks += 1;
  console.log(`  ok: ${what}`);
}

function checkFinish(what, finish, usage, maxTokens) {
  expect(finish === 'length' || finish === 'stop',
         `${what}: finish_reason ${show(finish)} (expected "length" or "stop")`);
  expect(usage && Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0,
         `${what}: usage.prompt_tokens missing or not positive: ${show(usage)}`);
  expect(Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 0,
         `${what}: usage.completion_tokens missing: ${show(usage)}`);
  expect(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
         `${what}: usage.total_tokens != prompt_tokens + completion_tokens: ${show(usage)}`);
  if (finish === 'length') {
    expect(usage.completion_tokens === maxTokens,
           `${what}: finish_reason "length" but usage.completion_tokens ${usage.completion_tokens} ` +
           `!= max_tokens ${maxTokens}`);
  } else {
    expect(usage.completion_tokens <= maxTokens,
           `${what}: usage.completion_tokens ${usage.completion_tokens} > max_tokens ${maxTokens}`);
  }
}

function same(what, streamed, plain) {
  expect(streamed.text === plain.text,
         `${what}: streamed text ${show(streamed.text)} != non-streamed text ${show(plain.text)}`);
  expect(streamed.finish === plain.finish,
         `${what}: streamed finish_reason ${show(streamed.finish)} != non-streamed ` +
         `${show(plain.finish)}`);
  expect(show(streamed.usage) === show(plain.usage),
         `${what}: streamed usage ${show(streamed.usage)} != non-streamed ${show(plain.usage)}`);
}

async function expectApiError(what, status, promise) {
  try {
    await promise;
  } catch (err) {
    expect(err instanceof OpenAI.APIError,
           `${what}: expected an APIError with status ${status}, got ${err?.stack || err}`);
    expect(err.status === status,
           `${what}: expected status ${status}, got ${err.status} (${err.message})`);
    expect(typeof err.error?.message === 'string' && err.error.message.length > 0,
           `${what}: the error body has no message: ${show(err.error)}`);
    return err;
  }
  fail(`${what}: the request succeeded; expected an APIError with status ${status}`);
}

async function main(baseURL, model) {
  const api = client(baseURL);

  // GET /v1/models
  const models = [];
  for await (const m of api.models.list()) models.push(m);
  expect(models.some((m) => m.id === model),
         `models.list() does not list ${show(model)}: ${show(models)}`);
  expect(models.every((m) => m.object === 'model'), `models.list(): ${show(models)}`);
  ok(`models.list() lists ${show(model)}`);

  // Chat completions, non-streaming then streaming, same greedy request.
  const chatMax = 24;
  const chatReq = {
    model,
    messages: [
      { role: 'system', content: 'You are a terse assistant.' },
      { role: 'user', content: 'Say something about speculative decoding.' },
    ],
    max_tokens: chatMax,
    temperature: 0,
  };
  const chat = await api.chat.completions.create(chatReq);
  expect(chat.object === 'chat.completion', `chat: object ${show(chat.object)}`);
  expect(chat.model === model, `chat: model ${show(chat.model)} != ${show(model)}`);
  expect(chat.choices.length === 1, `chat: ${chat.choices.length} choices`);
  const chatMsg = chat.choices[0].message;
  expect(chatMsg.role === 'assistant' && typeof chatMsg.content === 'string',
         `chat: message ${show(chatMsg)}`);
  const chatPlain = { text: chatMsg.content, finish: chat.choices[0].finish_reason,
                      usage: chat.usage };
  checkFinish('chat', chatPlain.finish, chatPlain.usage, chatMax);
  ok(`chat.completions (non-streaming): finish_reason ${chatPlain.finish}, ` +
     `${chat.usage.completion_tokens} tokens`);

  const chatStreamed = await collect(
    await api.chat.completions.create({ ...chatReq, stream: true,
                                        stream_options: { include_usage: true } }),
    { chat: true, includeUsage: true });
  expect(chatStreamed.role === 'assistant', `chat stream: role ${show(chatStreamed.role)}`);
  expect(chatStreamed.usage, 'chat stream: no usage chunk with stream_options.include_usage');
  checkFinish('chat stream', chatStreamed.finish, chatStreamed.usage, chatMax);
  same('chat stream vs non-streaming', chatStreamed, chatPlain);
  ok(`chat.completions (streaming, ${chatStreamed.chunks} chunks) == non-streaming, usage chunk last`);

  // Text completions, non-streaming then streaming (with and without include_usage).
  const compMax = 32;
  const compReq = { model, prompt: 'The draft model proposes tokens and the target',
                    max_tokens: compMax, temperature: 0 };
  const comp = await api.completions.create(compReq);
  expect(comp.object === 'text_completion', `completions: object ${show(comp.object)}`);
  expect(comp.model === model, `completions: model ${show(comp.model)} != ${show(model)}`);
  expect(comp.choices.length === 1 && typeof comp.choices[0].text === 'string',
         `completions: choices ${show(comp.choices)}`);
  const compPlain = { text: comp.choices[0].text, finish: comp.choices[0].finish_reason,
                      usage: comp.usage };
  checkFinish('completions', compPlain.finish, compPlain.usage, compMax);
  ok(`completions (non-streaming): finish_reason ${compPlain.finish}, ` +
     `${comp.usage.completion_tokens} tokens`);

  const compStreamed = await collect(
    await api.completions.create({ ...compReq, stream: true,
                                   stream_options: { include_usage: true } }),
    { chat: false, includeUsage: true });
  expect(compStreamed.usage, 'completions stream: no usage chunk with include_usage');
  checkFinish('completions stream', compStreamed.finish, compStreamed.usage, compMax);
  same('completions stream vs non-streaming', compStreamed, compPlain);
  ok(`completions (streaming, ${compStreamed.chunks} chunks) == non-streaming`);

  const compBare = await collect(await api.completions.create({ ...compReq, stream: true }),
                                 { chat: false, includeUsage: false });
  expect(compBare.usage === null,
         `completions stream without include_usage sent usage ${show(compBare.usage)}`);
  expect(compBare.text === compPlain.text && compBare.finish === compPlain.finish,
         `completions stream without include_usage: ${show(compBare)} != ${show(compPlain)}`);
  ok('completions (streaming, no include_usage) == non-streaming, no usage chunk');

  // ignore_eos (an extra body field, SGLang's): the full max_tokens, finish_reason "length".
  const longMax = 48;
  const long = await api.completions.create({ ...compReq, max_tokens: longMax, ignore_eos: true });
  expect(long.choices[0].finish_reason === 'length' && long.usage.completion_tokens === longMax,
         `completions with ignore_eos: finish_reason ${long.choices[0].finish_reason}, ` +
         `usage ${show(long.usage)} (expected "length" and ${longMax} tokens)`);
  ok(`completions with ignore_eos: "length", ${longMax} tokens`);

  // A stop string taken from the greedy output: the text ends before its first occurrence.
  const base = long.choices[0].text;
  const chars = [...base];
  if (chars.length >= 4) {
    const stop = chars.slice(2, 4).join('');
    const expected = base.slice(0, base.indexOf(stop));
    const stopReq = { ...compReq, max_tokens: longMax, ignore_eos: true, stop: [stop] };
    const cut = await api.completions.create(stopReq);
    expect(cut.choices[0].finish_reason === 'stop',
           `completions with stop ${show(stop)}: finish_reason ${cut.choices[0].finish_reason}`);
    expect(cut.choices[0].text === expected,
           `completions with stop ${show(stop)}: text ${show(cut.choices[0].text)}, expected ` +
           `${show(expected)} (the output before the stop string)`);
    const cutStreamed = await collect(await api.completions.create({ ...stopReq, stream: true }),
                                      { chat: false, includeUsage: false });
    expect(cutStreamed.text === expected && cutStreamed.finish === 'stop',
           `completions stream with stop ${show(stop)}: ${show(cutStreamed)}, expected text ` +
           `${show(expected)} and "stop"`);
    ok(`stop string ${show(stop)} cuts the text (streamed and not)`);
  } else {
    console.log(`  note: the greedy output ${show(base)} is too short for the stop-string check`);
  }

  // Errors: the client's APIError with the server's status.
  const notFound = await expectApiError('unknown model', 404,
    api.completions.create({ ...compReq, model: `${model}-does-not-exist` }));
  expect(notFound instanceof OpenAI.NotFoundError, 'unknown model: not a NotFoundError');
  ok('an unknown model: APIError 404 (NotFoundError)');
  const badField = await expectApiError('max_tokens as a string', 400,
    api.completions.create({ ...compReq, max_tokens: 'eight' }));
  expect(badField instanceof OpenAI.BadRequestError, 'bad field: not a BadRequestError');
  expect(/max_tokens/.test(badField.message),
         `bad field: the error does not name max_tokens: ${badField.message}`);
  ok('max_tokens "eight": APIError 400 naming max_tokens');
  await expectApiError('chat without messages', 400,
    api.chat.completions.create({ model, max_tokens: 4 }));
  ok('chat without messages: APIError 400');
  await expectApiError('temperature -1', 400,
    api.completions.create({ ...compReq, temperature: -1 }));
  ok('temperature -1: APIError 400');

  // The server still answers the same greedy request the same way after the errors.
  const again = await api.completions.create(compReq);
  expect(again.choices[0].text === compPlain.text,
         `completions after the errors: ${show(again.choices[0].text)} != ${show(compPlain.text)}`);
  ok('the server still answers identically after the errors');

  console.log(`check.js: ${checks} checks passed (openai ${VERSION})`);
}

run('check.js', 'BASE_URL MODEL', 2, main);
