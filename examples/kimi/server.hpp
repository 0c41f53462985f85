// specdec-kimi serve: the HTTP front end (cpp-httplib) over a ServingBackend (engine/serving.hpp)
// and the model's tokenizer. Compiled as plain C++ in its own translation unit (server.cpp), so
// the CUDA-compiled main.cpp never sees cpp-httplib; main.cpp builds the engine and its
// Scheduler and calls run_server, which returns when the server has stopped.
//
// Endpoints (serve/openai_api.hpp parses and builds the JSON):
//   POST /v1/completions, /v1/chat/completions   OpenAI's, non-streaming and SSE ("stream": true,
//                                                "stream_options": {"include_usage": true}),
//                                                `usage` and our `meta_info` in every response
//   POST /generate                               SGLang's (text or input_ids, sampling_params,
//                                                stream: cumulative text per event)
//   GET  /v1/models, /get_server_info, /health, /metrics (Prometheus text, serve/metrics_text.hpp)
// meta_info: id, prompt_tokens, completion_tokens, finish_reason {type, matched}, e2e_latency,
// queue_time, spec_verify_ct, spec_accept_length, spec_accept_rate, spec_per_position_accept.
// Output text: the tokens decoded as UTF-8 as they arrive (io::StreamDecoder, special tokens
// skipped), stop strings cut (serve::StopStringMatcher; the request stops there and its KV is
// freed). Chat prompts use Kimi's chat template and stop at the tokenizer's <|im_end|> / [EOS]
// as well as at the model's eos.
// Errors are OpenAI error objects: 400 for a bad request (malformed JSON, a missing or
// wrong-typed field, invalid sampling values, a prompt + a given max_tokens past the context, an id
// outside the vocabulary), 401 without the --api-key bearer token (every endpoint but /health),
// 404 for an unknown model name or path, 503 when the queue is full or the server is stopping,
// 500 for an engine failure; the server keeps serving after each.
// A streaming client that disconnects cancels its request (its KV pages are freed at the next
// step). SIGINT / SIGTERM: intake stops (503), running requests finish, the server exits 0; a
// second signal cancels the running requests.
#pragma once

#include <string>

#include "specdec/core/status.hpp"
#include "specdec/engine/serving.hpp"

namespace specdec::io {
class Tokenizer;
}

namespace specdec::kimi_server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;               // 0: any free port (the log line names it)
  std::string api_key;            // empty: no authentication
  int default_max_tokens = 128;   // max_tokens when a request gives none (cut to the context
                                  // its prompt leaves)
  int http_threads = 256;         // connections served at once
};

// Serves until SIGINT / SIGTERM; Ok after a clean stop, or the reason it could not start
// (e.g. the port is in use).
Status run_server(ServerOptions const& options, engine::ServingBackend& backend,
                  io::Tokenizer const& tokenizer);

}  // namespace specdec::kimi_server
