// Mergeable quality accumulators: the ground that `mlakv eval`, the demo and the CUDA
// harness measure on. Each accumulator takes observations one by one (`notify*`), can be
// filled per thread / per window / per rank and then combined (`merge`), and answers
// its summary figures at any time. merge(a, b) gives what one accumulator fed a's
// observations then b's gives, up to the rounding of float64 sums (counts, maxima and
// quantiles exactly: the p99 keeps every per-position value), so results do not
// depend on how work was split.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakv/status.h"

namespace mlakv {

// Element-wise error of `got` against a reference `ref` (attention outputs, decoded
// records, layer outputs). Non-finite `got` values are counted, not summed.
class ErrorStats {
 public:
  void notify(double ref, double got);
  // Element i of `got` against element i of `ref`; kInvalidArgument when sizes differ.
  Status notify(std::span<const float> ref, std::span<const float> got);
  void merge(const ErrorStats& other);

  int64_t count() const { return count_; }          // finite pairs seen
  int64_t nonfinite() const { return nonfinite_; }  // pairs whose `got` (or ref) was NaN/Inf
  double max_abs() const { return max_abs_; }       // max |got - ref|
  double rmse() const;                               // sqrt(mean (got - ref)^2)
  double rel_l2() const;   // ||got - ref|| / ||ref|| (0 when both are 0, +inf when only ref is 0)
  double cosine() const;   // <got, ref> / (||got|| ||ref||) (1 when both are 0)

 private:
  int64_t count_ = 0, nonfinite_ = 0;
  double sum_sq_err_ = 0, sum_sq_ref_ = 0, sum_sq_got_ = 0, sum_dot_ = 0, max_abs_ = 0;
};

// Next-token distribution quality of a quantized run against a reference run, position
// by position (teacher-forced): KL(P_ref || P_q) in nats, top-1 agreement, and the
// negative log-likelihood of the true next token under both (perplexity, bits/token).
class KldStats {
 public:
  // Bucket b holds positions [2^b - 1, 2^(b+1) - 1): 0, 1-2, 3-6, 7-14, ...
  static int bucket_of(int64_t position);
  static constexpr int kMaxBuckets = 40;

  // One position from its logits (vocab-sized, same size for both): log-softmax in
  // float64, KL(P_ref || P_q) = sum_v P_ref(v) (log P_ref(v) - log P_q(v)) (exactly 0
  // when the two rows are equal). `target` < 0: no NLL for this position (e.g. the
  // last position of a window). Errors: kInvalidArgument for size mismatch, empty rows
  // or a target outside the vocabulary; kDataLoss for non-finite logits. Nothing is
  // recorded on error.
  Status notify_logits(std::span<const float> ref_logits, std::span<const float> q_logits, int64_t position,
                       int64_t target = -1);
  // One position from precomputed values (nll_* < 0: none).
  void notify(double kld, bool top1_agree, int64_t position, double nll_ref = -1, double nll_q = -1);
  void merge(const KldStats& other);

  int64_t count() const { return static_cast<int64_t>(klds_.size()); }
  double kld_mean() const;
  double kld_quantile(double q) const;  // nearest-rank quantile of the per-position KLDs
  double kld_p99() const { return kld_quantile(0.99); }
  double kld_max() const;
  double top1_agree() const;            // fraction of positions whose argmax agrees
  int64_t nll_count() const { return nll_count_; }
  double ppl_ref() const;               // exp(mean NLL) of the reference run
  double ppl_q() const;                 // ... and of the quantized run
  double bits_per_token_q() const;      // mean NLL / ln 2
  // Mean KLD per position bucket (NaN where a bucket is empty); size = highest bucket + 1.
  std::vector<double> kld_by_bucket() const;
  std::vector<int64_t> count_by_bucket() const;

 private:
  std::vector<double> klds_;  // per position, kept for quantiles (merge concatenates)
  double kld_sum_ = 0;
  int64_t agree_ = 0;
  int64_t nll_count_ = 0;
  double nll_ref_sum_ = 0, nll_q_sum_ = 0;
  std::vector<double> bucket_sum_;
  std::vector<int64_t> bucket_count_;
};

}  // namespace mlakv
