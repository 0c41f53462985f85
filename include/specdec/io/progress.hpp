// Progress reporting for long loads and writes (checkpoints of hundreds of GiB).
//
//   ProgressFn       callback(bytes_done, bytes_total, current item name) that loaders call after
//                    each item; an empty ProgressFn means "no reporting".
//   format_progress  one status line: "<label> [#####.....]  42.0%  1.2/2.9 GiB  812.4 MiB/s
//                    ETA 2s  <item>" (pure: tested on hand-worked numbers)
//   ProgressBar      writes that line to a FILE* (stderr by default). On a terminal (isatty) it
//                    redraws one line in place ('\r', at most every 100 ms, and at 100%) and ends
//                    it with a newline on finish(); otherwise (a log file, a pipe) it prints plain
//                    lines at 0%, each further 25% and the end, so logs stay short.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace specdec::io {

using ProgressFn =
    std::function<void(uint64_t bytes_done, uint64_t bytes_total, std::string_view item)>;

// "1.5 GiB", "812.0 KiB", "17 B" (binary units, one decimal above bytes).
inline std::string format_bytes(double bytes) {
  char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  }
  return buf;
}

// "1h02m", "3m07s", "12s"; "?" when unknown (negative).
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0.0)) return "?";
  auto const s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", s);
  }
  return buf;
}

// The status line. `bar_width` 0 leaves the bar out (plain log lines). Rate = done / elapsed;
// ETA = (total - done) / rate, "?" before anything is measurable.
inline std::string format_progress(std::string_view label, uint64_t done, uint64_t total,
                                   double elapsed_s, int bar_width, std::string_view item = {}) {
  double const frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  std::string s(label);
  if (bar_width > 0) {
    int const filled = static_cast<int>(frac * bar_width);
    s += " [";
    s.append(static_cast<size_t>(filled), '#');
    s.append(static_cast<size_t>(bar_width - filled), '.');
    s += "]";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, " %5.1f%%  ", 100.0 * frac);
  s += buf;
  s += format_bytes(static_cast<double>(done)) + " / " + format_bytes(static_cast<double>(total));
  double const rate = elapsed_s > 0.0 ? static_cast<double>(done) / elapsed_s : 0.0;
  if (rate > 0.0) {
    s += "  " + format_bytes(rate) + "/s  ETA " +
         format_duration(static_cast<double>(total - done) / rate);
  } else {
    s += "  ETA ?";
  }
  if (!item.empty()) {
    s += "  ";
    s += item;
  }
  return s;
}

class ProgressBar {
 public:
  explicit ProgressBar(std::string label, std::FILE* out = stderr)
      : label_(std::move(label)),
        out_(out),
        tty_(out != nullptr && ::isatty(::fileno(out)) == 1),
        start_(Clock::now()) {}

  bool is_tty() const { return tty_; }

  void update(uint64_t done, uint64_t total, std::string_view item = {}) {
    if (out_ == nullptr) return;
    updated_ = true;
    done_ = done;
    total_ = total;
    double const elapsed = seconds_since_start();
    if (tty_) {
      bool const complete = done >= total;
      if (!complete && drawn_ && elapsed - last_draw_s_ < 0.1) return;
      last_draw_s_ = elapsed;
      drawn_ = true;
      std::string const line = format_progress(label_, done, total, elapsed, 30, item);
      std::fprintf(out_, "\r%s\x1b[K", line.c_str());
      std::fflush(out_);
      return;
    }
    int const quarter =
        total == 0 ? 4 : static_cast<int>(4 * static_cast<double>(done) / static_cast<double>(total));
    if (quarter > last_quarter_) {
      last_quarter_ = quarter;
      std::fprintf(out_, "%s\n", format_progress(label_, done, total, elapsed, 0).c_str());
      std::fflush(out_);
    }
  }

  // Ends the line on a terminal (after a final redraw); on a log, prints the last line if the
  // 100% line has not been printed. Prints nothing when update() was never called (a failure
  // before any work leaves no bogus "0 B / 0 B" line).
  void finish() {
    if (out_ == nullptr || finished_ || !updated_) return;
    finished_ = true;
    if (tty_) {
      std::string const line =
          format_progress(label_, done_, total_, seconds_since_start(), 30);
      std::fprintf(out_, "\r%s\x1b[K\n", line.c_str());
    } else if (last_quarter_ < 4) {
      std::fprintf(out_, "%s\n",
                   format_progress(label_, done_, total_, seconds_since_start(), 0).c_str());
    }
    std::fflush(out_);
  }

  // A ProgressFn forwarding to this bar (which must outlive it).
  ProgressFn callback() {
    return [this](uint64_t done, uint64_t total, std::string_view item) {
      update(done, total, item);
    };
  }

 private:
  using Clock = std::chrono::steady_clock;
  double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

  std::string label_;
  std::FILE* out_;
  bool tty_;
  Clock::time_point start_;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
  bool updated_ = false;
  bool drawn_ = false;
  bool finished_ = false;
  double last_draw_s_ = 0.0;
  int last_quarter_ = -1;
};

}  // namespace specdec::io
