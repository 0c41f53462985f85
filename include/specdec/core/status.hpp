// Status: the error type every header returns instead of throwing.
// A Status is ok or carries a code and a message that names the problem and, where one exists,
// the fix ("nodes 17 > topk + (steps-1)*topk^2 = 9: raise --speculative-num-steps or lower
// --speculative-num-draft-tokens"). Nothing in the library adjusts a value silently.
#pragma once

#include <charconv>
#include <string>
#include <utility>

namespace specdec {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a parameter or flag value that cannot work
  kMalformedInput,   // data (a tree, a file, a request) that breaks its format
  kUnsupported,      // a valid combination that is not compiled in
  kCudaError,        // a CUDA runtime call failed
  kInternal,
};

inline const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kMalformedInput: return "malformed input";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCudaError: return "cuda error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status MalformedInput(std::string m) { return {StatusCode::kMalformedInput, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status CudaError(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same status with `context` (e.g. "kimi_prefill (cpu): ") before its message; ok stays ok.
  Status prefixed(std::string const& context) const {
    return ok() ? *this : Status(code_, context + message_);
  }
  std::string to_string() const {
    return ok() ? std::string("ok") : std::string(status_code_name(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A float as messages show it: the shortest text that reads back as the same float ("1e-38",
// "0.9", "nan"), where std::to_string would print 0.000000 or 0.900000.
inline std::string float_text(float v) {
  char buf[32];
  auto const r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace specdec

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define SPECDEC_RETURN_IF_ERROR(expr)              \
  do {                                             \
    ::specdec::Status specdec_status_ = (expr);    \
    if (!specdec_status_.ok()) return specdec_status_; \
  } while (0)
