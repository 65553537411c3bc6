// A minimal progress bar on stderr: redrawn in place on a terminal, reduced to a
// start and a finish line otherwise (logs stay readable).
#pragma once

#include <cstdint>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace mlakv::cli {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true)
      : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(enabled), tty_(::isatty(2) != 0),
        start_(std::chrono::steady_clock::now()) {
    if (enabled_ && !tty_) std::fprintf(stderr, "%s ...\n", label_.c_str());
    update(0);
  }
  ~Progress() { finish(); }

  void update(int64_t done) {
    if (!enabled_ || !tty_) return;
    const int pct = static_cast<int>(100 * done / total_);
    if (pct == last_pct_) return;
    last_pct_ = pct;
    constexpr int kWidth = 30;
    const int fill = kWidth * pct / 100;
    std::string bar(static_cast<std::size_t>(fill), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r[%s] %3d%% %s", bar.c_str(), pct, label_.c_str());
    std::fflush(stderr);
  }

  void finish() {
    if (!enabled_ || finished_) return;
    finished_ = true;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (tty_) {
      update(total_);
      std::fprintf(stderr, " (%.1f s)\n", s);
    } else {
      std::fprintf(stderr, "%s done (%.1f s)\n", label_.c_str(), s);
    }
  }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, tty_;
  bool finished_ = false;
  int last_pct_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mlakv::cli
