// specdec-kimi serve: the HTTP front end (server.hpp says what it serves).
#include "server.hpp"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/io/tokenizer.hpp"
#include "specdec/serve/metrics_text.hpp"
#include "specdec/serve/openai_api.hpp"

namespace specdec::kimi_server {
namespace {

using nlohmann::json;
using serve::ApiError;
using serve::Endpoint;
using serve::ParsedRequest;

std::atomic<int> g_signals{0};
extern "C" void on_signal(int) { g_signals.fetch_add(1); }

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static char const* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = digits[rng() % 16];
  return s;
}

void send_error(httplib::Response& res, ApiError const& e) {
  res.status = e.status;
  res.set_content(serve::dump_json(e.body()), "application/json");
}

ApiError api_error(int status, std::string type, std::string message, std::string code = {}) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

// A refused submit as an HTTP error: the request's fault (400), the server's state (503), or
// the engine's (500).
ApiError submit_error(Status const& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kMalformedInput:
      return api_error(400, "invalid_request_error", s.message());
    case StatusCode::kUnsupported:
      return api_error(503, "server_unavailable", s.message(), "server_busy");
    default:
      return api_error(500, "server_error", s.to_string());
  }
}

// One request's tokens and text as the scheduler delivers them (shared by the HTTP handler and
// the scheduler's callbacks, which hold it: events_of).
struct Flow {
  explicit Flow(io::Tokenizer const& tokenizer, std::vector<std::string> stops)
      : decoder(tokenizer, /*skip_special=*/true), matcher(std::move(stops)) {}

  std::mutex mu;
  std::condition_variable cv;
  io::StreamDecoder decoder;
  serve::StopStringMatcher matcher;
  std::vector<int32_t> output_ids;
  std::string text;       // all text so far (stop strings cut)
  size_t sent = 0;        // bytes of text streamed
  bool stopped = false;   // a stop string matched
  bool done = false;
  engine::RequestOutcome outcome;
  Status decode_error;

  // New tokens; false once a stop string matched (the request stops there).
  bool take(std::span<int32_t const> tokens) {
    std::lock_guard lock(mu);
    for (int32_t id : tokens) {
      output_ids.push_back(id);
      std::string piece;
      if (Status s = decoder.feed(id, &piece); !s.ok() && decode_error.ok()) decode_error = s;
      text += matcher.feed(piece, &stopped);
      if (stopped) break;
    }
    cv.notify_all();
    return !stopped;
  }

  void finish(engine::RequestOutcome const& o) {
    std::lock_guard lock(mu);
    if (!stopped) {
      std::string tail;
      decoder.flush(&tail);
      text += matcher.feed(tail, &stopped);
      if (!stopped) text += matcher.flush();
    }
    outcome = o;
    done = true;
    cv.notify_all();
  }
};

// The scheduler's callbacks for `flow`; they hold it, so it outlives a client that went away.
engine::RequestEvents events_of(std::shared_ptr<Flow> const& flow) {
  engine::RequestEvents ev;
  ev.on_tokens = [flow](std::span<int32_t const> tokens) { return flow->take(tokens); };
  ev.on_finish = [flow](engine::RequestOutcome const& o) { flow->finish(o); };
  return ev;
}

char const* finish_reason(engine::RequestOutcome const& o) {
  return engine::openai_finish_reason(o.reason);
}

// The request's own figures (a finished flow); text_error names a token the text could not show.
json meta_info(std::string const& id, Flow& flow) {
  std::lock_guard lock(flow.mu);
  engine::RequestOutcome const& o = flow.outcome;
  json reason = {{"type", finish_reason(o)}};
  if (o.reason == engine::FinishReason::kError) reason["message"] = o.error;
  json m = {{"id", id},
            {"prompt_tokens", o.prompt_tokens},
            {"completion_tokens", o.output_tokens},
            {"finish_reason", reason},
            {"finish_detail", engine::finish_reason_name(o.reason)},
            {"e2e_latency", o.total_s},
            {"queue_time", o.queue_s},
            {"time_to_first_token", o.first_token_s},
            {"spec_verify_ct", o.metrics.verify_ct},
            {"spec_accept_length", o.metrics.accept_length()},
            {"spec_accept_rate", o.metrics.accept_rate()},
            {"spec_per_position_accept", o.metrics.per_position_accept()}};
  if (!flow.decode_error.ok()) m["text_error"] = flow.decode_error.message();
  return m;
}

class Server {
 public:
  Server(ServerOptions const& o, engine::ServingBackend& backend, io::Tokenizer const& tokenizer)
      : o_(o), backend_(backend), tok_(tokenizer), created_(unix_now()) {}

  Status run() {
    svr_.new_task_queue = [n = o_.http_threads] { return new httplib::ThreadPool(n); };
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
    // server share an occupied port instead of failing.
    svr_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    svr_.set_payload_max_length(64u << 20);
    svr_.set_pre_routing_handler([this](httplib::Request const& req, httplib::Response& res) {
      if (o_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + o_.api_key) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      send_error(res, api_error(401, "authentication_error",
                                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    svr_.set_error_handler([](httplib::Request const& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        send_error(res, api_error(404, "invalid_request_error",
                                  "no such endpoint: " + req.method + " " + req.path,
                                  "not_found"));
      }
    });
    svr_.set_exception_handler(
        [](httplib::Request const&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (std::exception const& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, api_error(500, "server_error", "internal error: " + what));
        });
    svr_.Get("/health", [](httplib::Request const&, httplib::Response& res) {
      res.set_content("OK", "text/plain");
    });
    svr_.Get("/v1/models", [this](httplib::Request const&, httplib::Response& res) {
      engine::ServingInfo const& info = backend_.info();
      res.set_content(serve::dump_json(serve::models_response(info.model_name, created_,
                                                              "specdec", info.context_length)),
                      "application/json");
    });
    svr_.Get(R"(/v1/models/(.+))", [this](httplib::Request const& req, httplib::Response& res) {
      engine::ServingInfo const& info = backend_.info();
      if (req.matches[1] != info.model_name) {
        return send_error(res, api_error(404, "invalid_request_error",
                                         "the model '" + std::string(req.matches[1]) +
                                             "' does not exist: this server serves '" +
                                             info.model_name + "'",
                                         "model_not_found"));
      }
      json const list =
          serve::models_response(info.model_name, created_, "specdec", info.context_length);
      res.set_content(serve::dump_json(list["data"][0]), "application/json");
    });
    svr_.Get("/get_server_info", [this](httplib::Request const&, httplib::Response& res) {
      res.set_content(serve::dump_json(server_info()), "application/json");
    });
    svr_.Get("/metrics", [this](httplib::Request const&, httplib::Response& res) {
      res.set_content(serve::prometheus_text(backend_.stats(), backend_.info()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    svr_.Post("/v1/completions", [this](httplib::Request const& req, httplib::Response& res) {
      handle(Endpoint::kCompletions, req, res);
    });
    svr_.Post("/v1/chat/completions", [this](httplib::Request const& req, httplib::Response& res) {
      handle(Endpoint::kChatCompletions, req, res);
    });
    svr_.Post("/generate", [this](httplib::Request const& req, httplib::Response& res) {
      handle(Endpoint::kGenerate, req, res);
    });

    int port = o_.port;
    errno = 0;
    bool const bound = port == 0 ? (port = svr_.bind_to_any_port(o_.host)) > 0
                                 : svr_.bind_to_port(o_.host, port);
    if (!bound) {
      int const err = errno;
      return Status::InvalidArgument(
          "cannot listen on " + o_.host + ":" + std::to_string(o_.port) + ": " +
          (err ? std::strerror(err) : "bind failed") +
          (err == EADDRINUSE ? " (another process holds the port: pick another --port)" : ""));
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::fprintf(stderr, "specdec-kimi: serving %s on http://%s:%d (model %s)\n",
                 backend_.info().speculative_config.c_str(), o_.host.c_str(), port,
                 backend_.info().model_name.c_str());
    std::thread watcher([this] { watch_signals(); });
    bool const ok = svr_.listen_after_bind();
    stopping_ = true;
    watcher.join();
    backend_.shutdown(/*cancel_running=*/true);
    std::fprintf(stderr, "specdec-kimi: server stopped\n");
    if (!ok && !signalled_) return Status::Internal("the HTTP server stopped unexpectedly");
    return Status::Ok();
  }

 private:
  // First signal: intake stops (submit refuses), running requests finish, then the listener
  // stops once every response is out. A second signal cancels what still runs.
  void watch_signals() {
    std::thread drain;
    while (!stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int const n = g_signals.load();
      if (n >= 1 && !signalled_) {
        signalled_ = true;
        std::fprintf(stderr, "specdec-kimi: stopping: no new requests, finishing %lld running\n",
                     static_cast<long long>(backend_.stats().running));
        drain = std::thread([this] {
          backend_.shutdown(/*cancel_running=*/false);
          for (int i = 0; i < 1000 && in_flight_.load() > 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          svr_.stop();
        });
      }
      if (n >= 2 && !cancelled_) {
        cancelled_ = true;
        std::fprintf(stderr, "specdec-kimi: second signal: cancelling the running requests\n");
        backend_.shutdown(/*cancel_running=*/true);
      }
    }
    if (drain.joinable()) drain.join();
  }

  json server_info() const {
    engine::ServingInfo const& i = backend_.info();
    engine::ServingStats const s = backend_.stats();
    return {{"model_path", i.model_path},
            {"served_model_name", i.model_name},
            {"device", i.device},
            {"speculative_config", i.speculative_config},
            {"speculative_algorithm", i.speculative_algorithm},
            {"speculative_num_steps", i.speculative_num_steps},
            {"speculative_eagle_topk", i.speculative_eagle_topk},
            {"speculative_num_draft_tokens", i.speculative_num_draft_tokens},
            {"context_length", i.context_length},
            {"vocab_size", i.vocab_size},
            {"max_running_requests", i.max_running_requests},
            {"chunked_prefill_size", i.prefill_chunk},
            {"max_total_num_tokens", s.kv_pages_total * s.page_size},
            {"page_size", s.page_size},
            {"eos_token_ids", i.eos_ids},
            {"cuda_graph", s.cuda_graph},
            {"cuda_graph_bs", i.cuda_graph_bs},
            {"disable_cuda_graph", !i.cuda_graph},
            {"internal_states", json::array({json::object({
                                    {"avg_spec_accept_length", s.spec.accept_length()},
                                    {"spec_accept_rate", s.spec.accept_rate()},
                                    {"num_running_reqs", s.running},
                                    {"num_queue_reqs", s.queued}})})},
            {"version", "specdec"}};
  }

  // The prompt's ids: text encoded (chat: Kimi's template with the generation prompt) or ids
  // as given; an error names what is wrong.
  std::optional<ApiError> prompt_ids(ParsedRequest const& p, std::vector<int32_t>* ids) const {
    Status s;
    if (p.endpoint == Endpoint::kChatCompletions) {
      std::vector<io::ChatMessage> messages;
      for (size_t i = 0; i < p.messages.size(); ++i) {
        std::string role = p.messages[i].role == "developer" ? "system" : p.messages[i].role;
        if (role == "tool") {
          ApiError e = api_error(400, "invalid_request_error",
                                 "messages[" + std::to_string(i) +
                                     "].role 'tool': tool messages are not supported by this "
                                     "server's chat template (system, user, assistant)",
                                 "unsupported_value");
          e.param = "messages[" + std::to_string(i) + "].role";
          return e;
        }
        messages.push_back({role, p.messages[i].content});
      }
      s = tok_.encode_chat(messages, /*add_generation_prompt=*/true, ids);
    } else if (p.prompt_text) {
      s = tok_.encode(*p.prompt_text, ids);
    } else {
      *ids = *p.prompt_ids;
    }
    if (!s.ok()) return api_error(400, "invalid_request_error", "the prompt: " + s.message());
    return std::nullopt;
  }

  void handle(Endpoint endpoint, httplib::Request const& req, httplib::Response& res) {
    if (stopping_ || signalled_) {
      send_error(res, api_error(503, "server_unavailable", "the server is shutting down",
                                "server_shutting_down"));
      return;
    }
    ParsedRequest p;
    std::optional<ApiError> err;
    switch (endpoint) {
      case Endpoint::kCompletions:
        err = serve::parse_completions(req.body, o_.default_max_tokens, &p);
        break;
      case Endpoint::kChatCompletions:
        err = serve::parse_chat_completions(req.body, o_.default_max_tokens, &p);
        break;
      case Endpoint::kGenerate:
        err = serve::parse_generate(req.body, &p);
        break;
    }
    if (err) return send_error(res, *err);
    log_ignored_fields(p.ignored_fields);
    engine::ServingInfo const& info = backend_.info();
    if (!p.model.empty() && p.model != info.model_name) {
      ApiError e = api_error(404, "invalid_request_error",
                             "the model '" + p.model + "' does not exist: this server serves '" +
                                 info.model_name + "' (GET /v1/models)",
                             "model_not_found");
      e.param = "model";
      return send_error(res, e);
    }
    if ((err = serve::check_vocabulary(p, info.vocab_size))) return send_error(res, *err);
    engine::GenerationRequest r;
    if ((err = prompt_ids(p, &r.prompt))) return send_error(res, *err);
    // A default max_tokens is cut to the context the prompt leaves (as vLLM and SGLang do); one
    // the request gave is never cut: past the context it is an error.
    int64_t const room = info.context_length - static_cast<int64_t>(r.prompt.size());
    if (!p.sampling.max_tokens_given && room >= 1 && p.sampling.max_tokens > room) {
      p.sampling.max_tokens = static_cast<int>(room);
    }
    int64_t const total = static_cast<int64_t>(r.prompt.size()) + p.sampling.max_tokens;
    if (total > info.context_length) {
      ApiError e = api_error(
          400, "invalid_request_error",
          "this model's context is " + std::to_string(info.context_length) + " tokens; the " +
              "request has " + std::to_string(r.prompt.size()) + " prompt tokens and asks for " +
              std::to_string(p.sampling.max_tokens) + " more (" + std::to_string(total) +
              "): shorten the prompt or lower max_tokens",
          "context_length_exceeded");
      e.param = endpoint == Endpoint::kGenerate ? "sampling_params.max_new_tokens" : "max_tokens";
      return send_error(res, e);
    }
    to_request(p, endpoint, &r);
    auto flow = std::make_shared<Flow>(tok_, p.sampling.stop);
    uint64_t id = 0;
    Status const s = backend_.submit(r, events_of(flow), &id);
    if (!s.ok()) return send_error(res, submit_error(s));
    std::string const prefix = endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
    std::string const rid = p.rid.value_or(prefix + random_hex(24));
    int64_t const prompt_tokens = static_cast<int64_t>(r.prompt.size());
    if (p.stream) return stream(endpoint, p, flow, id, rid, res);
    in_flight_.fetch_add(1);
    {
      std::unique_lock lock(flow->mu);
      flow->cv.wait(lock, [&] { return flow->done; });
    }
    in_flight_.fetch_sub(1);
    engine::RequestOutcome const& o = flow->outcome;
    if (o.reason == engine::FinishReason::kError) {
      return send_error(res, api_error(500, "server_error", "the engine failed: " + o.error));
    }
    json const usage = serve::usage_json(prompt_tokens, o.output_tokens);
    json out;
    switch (endpoint) {
      case Endpoint::kCompletions:
        out = serve::completion_response(rid, unix_now(), info.model_name, flow->text,
                                         finish_reason(o), usage);
        break;
      case Endpoint::kChatCompletions:
        out = serve::chat_response(rid, unix_now(), info.model_name, flow->text,
                                   finish_reason(o), usage);
        break;
      case Endpoint::kGenerate:
        out = {{"text", flow->text}, {"output_ids", flow->output_ids}};
        break;
    }
    out["meta_info"] = meta_info(rid, *flow);
    res.set_content(serve::dump_json(out), "application/json");
  }

  // Sampling fields into the engine's request (chat also stops at the tokenizer's stop ids).
  void to_request(ParsedRequest const& p, Endpoint endpoint,
                               engine::GenerationRequest* r) const {
    serve::SamplingFields const& f = p.sampling;
    r->max_new_tokens = f.max_tokens;
    r->temperature = f.temperature;
    r->top_p = f.top_p;
    r->top_k = f.top_k > 0 ? f.top_k : 0;
    r->seed = f.seed ? *f.seed : std::random_device{}() * uint64_t{0x9E3779B97F4A7C15ull};
    r->stop_at_eos = !f.ignore_eos;
    r->stop_ids = f.stop_token_ids;
    if (endpoint == Endpoint::kChatCompletions && !f.ignore_eos) {
      for (int32_t id : tok_.stop_ids()) r->stop_ids.push_back(id);
    }
  }

  // SSE: text as it is decoded; a client that goes away cancels its request.
  void stream(Endpoint endpoint, ParsedRequest const& p, std::shared_ptr<Flow> flow, uint64_t id,
              std::string const& rid, httplib::Response& res) {
    in_flight_.fetch_add(1);
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::string const model = backend_.info().model_name;
    int64_t const created = unix_now();
    auto started = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, endpoint, include_usage = p.include_usage, flow, id, rid, model, created, finished,
         started](size_t, httplib::DataSink& sink) {
          auto send = [&](std::string const& event) { return sink.write(event.data(), event.size()); };
          if (!*started) {
            *started = true;
            if (endpoint == Endpoint::kChatCompletions &&
                !send(serve::sse_data(serve::chat_chunk(rid, created, model, "assistant", "",
                                                        std::nullopt, include_usage)))) {
              return false;
            }
          }
          std::string delta;
          bool done = false;
          {
            std::unique_lock lock(flow->mu);
            flow->cv.wait_for(lock, std::chrono::milliseconds(50),
                              [&] { return flow->done || flow->text.size() > flow->sent; });
            delta = flow->text.substr(flow->sent);
            flow->sent = flow->text.size();
            done = flow->done;
          }
          if (!sink.is_writable()) return false;  // the client went away: the releaser cancels
          if (!delta.empty()) {
            json chunk;
            switch (endpoint) {
              case Endpoint::kCompletions:
                chunk = serve::completion_chunk(rid, created, model, delta, std::nullopt,
                                                include_usage);
                break;
              case Endpoint::kChatCompletions:
                chunk = serve::chat_chunk(rid, created, model, std::nullopt, delta, std::nullopt,
                                          include_usage);
                break;
              case Endpoint::kGenerate: {
                std::lock_guard lock(flow->mu);
                chunk = {{"text", flow->text.substr(0, flow->sent)},
                         {"output_ids", flow->output_ids}};
                break;
              }
            }
            if (!send(serve::sse_data(chunk))) return false;
          }
          if (!done) return true;
          engine::RequestOutcome const& o = flow->outcome;
          json const usage = serve::usage_json(o.prompt_tokens, o.output_tokens);
          std::string const reason = finish_reason(o);
          json last;
          switch (endpoint) {
            case Endpoint::kCompletions:
              last = serve::completion_chunk(rid, created, model, "", reason, include_usage);
              break;
            case Endpoint::kChatCompletions:
              last = serve::chat_chunk(rid, created, model, std::nullopt, std::nullopt, reason,
                                       include_usage);
              break;
            case Endpoint::kGenerate:
              last = {{"text", flow->text}, {"output_ids", flow->output_ids}};
              break;
          }
          last["meta_info"] = meta_info(rid, *flow);
          if (!send(serve::sse_data(last))) return false;
          if (include_usage && endpoint != Endpoint::kGenerate) {
            std::string const object = endpoint == Endpoint::kCompletions
                                           ? "text_completion"
                                           : "chat.completion.chunk";
            if (!send(serve::sse_data(serve::usage_chunk(rid, created, model, object, usage)))) {
              return false;
            }
          }
          if (!send(serve::sse_done())) return false;
          finished->store(true);
          sink.done();
          return true;
        },
        [this, id, flow, finished](bool) {
          // The stream ended: a client that left before the end cancels its request.
          bool done = false;
          {
            std::lock_guard lock(flow->mu);
            done = flow->done;
          }
          if (!finished->load() && !done) backend_.cancel(id);
          in_flight_.fetch_sub(1);
        });
  }

  // Request fields no rule reads are served as if absent (as OpenAI's clients expect), so a typo
  // such as "max_token" would pass unseen: each name is logged the first time a request carries
  // it (at most kMaxIgnoredNames names, so clients cannot grow the set without bound).
  void log_ignored_fields(std::vector<std::string> const& fields) {
    if (fields.empty()) return;
    constexpr size_t kMaxIgnoredNames = 256, kMaxNameBytes = 64;
    std::string fresh;
    std::lock_guard<std::mutex> lock(ignored_mu_);
    for (std::string const& f : fields) {
      if (ignored_names_.size() >= kMaxIgnoredNames) break;
      if (std::find(ignored_names_.begin(), ignored_names_.end(), f) != ignored_names_.end()) {
        continue;
      }
      ignored_names_.push_back(f);
      std::string shown = serve::detail::printable(f.substr(0, kMaxNameBytes));
      if (f.size() > kMaxNameBytes) shown += "...";
      fresh += (fresh.empty() ? "'" : ", '") + shown + "'";
    }
    if (!fresh.empty()) {
      std::fprintf(stderr,
                   "specdec-kimi: a request carries %s, which this server ignores (served as if "
                   "absent; each name is logged once)\n",
                   fresh.c_str());
    }
  }

  ServerOptions o_;
  engine::ServingBackend& backend_;
  io::Tokenizer const& tok_;
  int64_t const created_;
  httplib::Server svr_;
  std::atomic<bool> stopping_{false}, signalled_{false}, cancelled_{false};
  std::atomic<int> in_flight_{0};
  std::mutex ignored_mu_;
  std::vector<std::string> ignored_names_;  // logged once each (log_ignored_fields)
};

}  // namespace

Status run_server(ServerOptions const& options, engine::ServingBackend& backend,
                  io::Tokenizer const& tokenizer) {
  Server server(options, backend, tokenizer);
  return server.run();
}

}  // namespace specdec::kimi_server
