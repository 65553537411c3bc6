#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "mlakv/eval_stats.h"

namespace mlakv {

// ---- ErrorStats --------------------------------------------------------------------

void ErrorStats::notify(double ref, double got) {
  if (!std::isfinite(ref) || !std::isfinite(got)) {
    ++nonfinite_;
    return;
  }
  const double e = got - ref;
  ++count_;
  sum_sq_err_ += e * e;
  sum_sq_ref_ += ref * ref;
  sum_sq_got_ += got * got;
  sum_dot_ += ref * got;
  max_abs_ = std::max(max_abs_, std::fabs(e));
}

Status ErrorStats::notify(std::span<const float> ref, std::span<const float> got) {
  if (ref.size() != got.size()) {
    return invalid_argument(fmt::format("ErrorStats: {} reference values but {} values to compare", ref.size(),
                                        got.size()));
  }
  for (std::size_t i = 0; i < ref.size(); ++i) notify(ref[i], got[i]);
  return Status::Ok();
}

void ErrorStats::merge(const ErrorStats& o) {
  count_ += o.count_;
  nonfinite_ += o.nonfinite_;
  sum_sq_err_ += o.sum_sq_err_;
  sum_sq_ref_ += o.sum_sq_ref_;
  sum_sq_got_ += o.sum_sq_got_;
  sum_dot_ += o.sum_dot_;
  max_abs_ = std::max(max_abs_, o.max_abs_);
}

double ErrorStats::rmse() const { return count_ == 0 ? 0.0 : std::sqrt(sum_sq_err_ / static_cast<double>(count_)); }

double ErrorStats::rel_l2() const {
  if (sum_sq_ref_ == 0) return sum_sq_err_ == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(sum_sq_err_ / sum_sq_ref_);
}

double ErrorStats::cosine() const {
  if (sum_sq_ref_ == 0 && sum_sq_got_ == 0) return 1.0;
  if (sum_sq_ref_ == 0 || sum_sq_got_ == 0) return 0.0;
  return sum_dot_ / std::sqrt(sum_sq_ref_ * sum_sq_got_);
}

// ---- KldStats ----------------------------------------------------------------------

int KldStats::bucket_of(int64_t position) {
  if (position < 0) position = 0;
  int b = 0;
  for (uint64_t v = static_cast<uint64_t>(position) + 1; v > 1; v >>= 1) ++b;
  return std::min(b, kMaxBuckets - 1);
}

namespace {

// log-softmax in float64: returns log Z and the argmax; lp[v] = x[v] - logZ.
double log_normalizer(std::span<const float> x, int64_t* argmax) {
  double m = -std::numeric_limits<double>::infinity();
  int64_t am = 0;
  for (std::size_t v = 0; v < x.size(); ++v) {
    if (x[v] > m) {
      m = x[v];
      am = static_cast<int64_t>(v);
    }
  }
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  *argmax = am;
  return m + std::log(s);
}

}  // namespace

Status KldStats::notify_logits(std::span<const float> ref, std::span<const float> q, int64_t position,
                               int64_t target) {
  if (ref.empty() || ref.size() != q.size()) {
    return invalid_argument(fmt::format("KldStats: logits rows of {} and {} values (need equal, non-empty rows)",
                                        ref.size(), q.size()));
  }
  if (target >= static_cast<int64_t>(ref.size())) {
    return invalid_argument(fmt::format("KldStats: target token {} is outside the vocabulary of {}", target,
                                        ref.size()));
  }
  for (std::size_t v = 0; v < ref.size(); ++v) {
    if (!std::isfinite(ref[v]) || !std::isfinite(q[v])) {
      return data_loss(fmt::format("KldStats: non-finite logit at position {} vocab id {} (ref {}, q {})", position,
                                   v, ref[v], q[v]));
    }
  }
  int64_t am_ref = 0, am_q = 0;
  const double lz_ref = log_normalizer(ref, &am_ref), lz_q = log_normalizer(q, &am_q);
  double kld = 0;
  for (std::size_t v = 0; v < ref.size(); ++v) {
    const double lp = static_cast<double>(ref[v]) - lz_ref, lq = static_cast<double>(q[v]) - lz_q;
    kld += std::exp(lp) * (lp - lq);
  }
  // Rounding can leave a tiny negative sum for near-identical rows; KL is >= 0.
  kld = std::max(kld, 0.0);
  double nll_ref = -1, nll_q = -1;
  if (target >= 0) {
    nll_ref = lz_ref - ref[static_cast<std::size_t>(target)];
    nll_q = lz_q - q[static_cast<std::size_t>(target)];
  }
  notify(kld, am_ref == am_q, position, nll_ref, nll_q);
  return Status::Ok();
}

void KldStats::notify(double kld, bool top1_agree, int64_t position, double nll_ref, double nll_q) {
  klds_.push_back(kld);
  kld_sum_ += kld;
  agree_ += top1_agree ? 1 : 0;
  if (nll_ref >= 0 && nll_q >= 0) {
    ++nll_count_;
    nll_ref_sum_ += nll_ref;
    nll_q_sum_ += nll_q;
  }
  const auto b = static_cast<std::size_t>(bucket_of(position));
  if (bucket_sum_.size() <= b) {
    bucket_sum_.resize(b + 1, 0.0);
    bucket_count_.resize(b + 1, 0);
  }
  bucket_sum_[b] += kld;
  ++bucket_count_[b];
}

void KldStats::merge(const KldStats& o) {
  klds_.insert(klds_.end(), o.klds_.begin(), o.klds_.end());
  kld_sum_ += o.kld_sum_;
  agree_ += o.agree_;
  nll_count_ += o.nll_count_;
  nll_ref_sum_ += o.nll_ref_sum_;
  nll_q_sum_ += o.nll_q_sum_;
  if (bucket_sum_.size() < o.bucket_sum_.size()) {
    bucket_sum_.resize(o.bucket_sum_.size(), 0.0);
    bucket_count_.resize(o.bucket_count_.size(), 0);
  }
  for (std::size_t b = 0; b < o.bucket_sum_.size(); ++b) {
    bucket_sum_[b] += o.bucket_sum_[b];
    bucket_count_[b] += o.bucket_count_[b];
  }
}

double KldStats::kld_mean() const { return klds_.empty() ? 0.0 : kld_sum_ / static_cast<double>(klds_.size()); }

double KldStats::kld_quantile(double q) const {
  if (klds_.empty()) return 0.0;
  std::vector<double> v = klds_;
  const double rank = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size()));
  const std::size_t k = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double KldStats::kld_max() const {
  return klds_.empty() ? 0.0 : *std::max_element(klds_.begin(), klds_.end());
}

double KldStats::top1_agree() const {
  return klds_.empty() ? 0.0 : static_cast<double>(agree_) / static_cast<double>(klds_.size());
}

double KldStats::ppl_ref() const {
  return nll_count_ == 0 ? 0.0 : std::exp(nll_ref_sum_ / static_cast<double>(nll_count_));
}
double KldStats::ppl_q() const { return nll_count_ == 0 ? 0.0 : std::exp(nll_q_sum_ / static_cast<double>(nll_count_)); }
double KldStats::bits_per_token_q() const {
  return nll_count_ == 0 ? 0.0 : nll_q_sum_ / static_cast<double>(nll_count_) / std::log(2.0);
}

std::vector<double> KldStats::kld_by_bucket() const {
  std::vector<double> r(bucket_sum_.size());
  for (std::size_t b = 0; b < r.size(); ++b) {
    r[b] = bucket_count_[b] == 0 ? std::numeric_limits<double>::quiet_NaN()
                                 : bucket_sum_[b] / static_cast<double>(bucket_count_[b]);
  }
  return r;
}

std::vector<int64_t> KldStats::count_by_bucket() const { return bucket_count_; }

}  // namespace mlakv
