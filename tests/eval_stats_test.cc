// The eval room's accumulators against closed-form values computed here by hand, and
// merge against single-pass accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mlakv/eval_stats.h"

namespace mlakv {
namespace {

TEST(ErrorStats, ClosedForm) {
  ErrorStats s;
  // ref (3, 4), got (3, 5): err (0, 1); ||ref|| = 5; ||got|| = sqrt(34); <ref, got> = 29.
  ASSERT_TRUE(s.notify(std::vector<float>{3, 4}, std::vector<float>{3, 5}).ok());
  EXPECT_EQ(s.count(), 2);
  EXPECT_DOUBLE_EQ(s.max_abs(), 1.0);
  EXPECT_DOUBLE_EQ(s.rmse(), std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(s.rel_l2(), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.cosine(), 29.0 / (5.0 * std::sqrt(34.0)));
}

TEST(ErrorStats, NonFiniteCountedNotSummed) {
  ErrorStats s;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(s.notify(std::vector<float>{1, 2, 3}, std::vector<float>{nan, inf, 3}).ok());
  EXPECT_EQ(s.count(), 1);
  EXPECT_EQ(s.nonfinite(), 2);
  EXPECT_DOUBLE_EQ(s.rel_l2(), 0.0);
}

TEST(ErrorStats, EmptyAndZeroReference) {
  ErrorStats s;
  EXPECT_DOUBLE_EQ(s.rel_l2(), 0.0);
  EXPECT_DOUBLE_EQ(s.cosine(), 1.0);
  s.notify(0.0, 1.0);
  EXPECT_TRUE(std::isinf(s.rel_l2()));
  EXPECT_FALSE(s.notify(std::vector<float>{1}, std::vector<float>{1, 2}).ok());
}

TEST(ErrorStats, MergeEqualsSinglePass) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n(0, 1);
  ErrorStats all, a, b;
  for (int i = 0; i < 1000; ++i) {
    const double r = n(rng), g = r + 0.01 * n(rng);
    all.notify(r, g);
    (i < 400 ? a : b).notify(r, g);
  }
  a.merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.max_abs(), all.max_abs());
  EXPECT_NEAR(a.rel_l2(), all.rel_l2(), 1e-12 * all.rel_l2());
  EXPECT_NEAR(a.cosine(), all.cosine(), 1e-12);
}

TEST(KldStats, IdenticalRowsGiveExactlyZero) {
  KldStats s;
  std::vector<float> x = {0.5f, -1.0f, 3.0f, 2.0f};
  ASSERT_TRUE(s.notify_logits(x, x, 0, 2).ok());
  EXPECT_EQ(s.kld_mean(), 0.0);
  EXPECT_EQ(s.kld_max(), 0.0);
  EXPECT_EQ(s.top1_agree(), 1.0);
  EXPECT_DOUBLE_EQ(s.ppl_ref(), s.ppl_q());
}

TEST(KldStats, TwoPointClosedForm) {
  // ref logits (0, 0): P = (1/2, 1/2); q logits (0, ln 3): Q = (1/4, 3/4).
  // KL = 1/2 ln(2) + 1/2 ln(2/3); target 1: NLL_ref = ln 2, NLL_q = ln(4/3).
  KldStats s;
  ASSERT_TRUE(s.notify_logits(std::vector<float>{0, 0}, std::vector<float>{0, static_cast<float>(std::log(3.0))}, 5, 1)
                  .ok());
  const double l3 = static_cast<float>(std::log(3.0));
  const double z = std::log(1 + std::exp(l3));
  const double kl = 0.5 * (std::log(0.5) - (0 - z)) + 0.5 * (std::log(0.5) - (l3 - z));
  EXPECT_NEAR(s.kld_mean(), kl, 1e-15);
  EXPECT_NEAR(kl, 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_DOUBLE_EQ(s.top1_agree(), 0.0);  // argmax 0 (first of a tie) vs 1
  EXPECT_NEAR(s.ppl_ref(), 2.0, 1e-15);
  EXPECT_NEAR(std::log(s.ppl_q()), z - l3, 1e-15);
  EXPECT_NEAR(s.bits_per_token_q(), (z - l3) / std::log(2.0), 1e-15);
}

TEST(KldStats, BucketsQuantilesAndMerge) {
  EXPECT_EQ(KldStats::bucket_of(0), 0);
  EXPECT_EQ(KldStats::bucket_of(1), 1);
  EXPECT_EQ(KldStats::bucket_of(2), 1);
  EXPECT_EQ(KldStats::bucket_of(3), 2);
  EXPECT_EQ(KldStats::bucket_of(6), 2);
  EXPECT_EQ(KldStats::bucket_of(7), 3);
  KldStats all, a, b;
  for (int i = 0; i < 100; ++i) {
    const double k = (i * 37 % 100) / 100.0;  // 0.00 .. 0.99, each once
    all.notify(k, i % 3 == 0, i);
    (i % 2 ? a : b).notify(k, i % 3 == 0, i);
  }
  EXPECT_DOUBLE_EQ(all.kld_p99(), 0.98);  // nearest rank: the 99th of 100 sorted values
  EXPECT_DOUBLE_EQ(all.kld_quantile(1.0), 0.99);
  EXPECT_DOUBLE_EQ(all.top1_agree(), 34.0 / 100.0);
  a.merge(b);
  EXPECT_EQ(a.count(), 100);
  EXPECT_DOUBLE_EQ(a.kld_p99(), all.kld_p99());
  EXPECT_NEAR(a.kld_mean(), all.kld_mean(), 1e-15);
  EXPECT_EQ(a.count_by_bucket(), all.count_by_bucket());
  const auto ba = a.kld_by_bucket(), bb = all.kld_by_bucket();
  ASSERT_EQ(ba.size(), bb.size());
  for (std::size_t i = 0; i < ba.size(); ++i) EXPECT_NEAR(ba[i], bb[i], 1e-15);
}

TEST(KldStats, BadInputsRecordNothing) {
  KldStats s;
  EXPECT_EQ(s.notify_logits(std::vector<float>{}, std::vector<float>{}, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.notify_logits(std::vector<float>{1, 2}, std::vector<float>{1}, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.notify_logits(std::vector<float>{1, 2}, std::vector<float>{1, 2}, 0, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.notify_logits(std::vector<float>{1, NAN}, std::vector<float>{1, 2}, 0).code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.count(), 0);
}

}  // namespace
}  // namespace mlakv
