// src/core: check.h (MLAKV_CHECK reports file:line, the condition and the reason, then
// aborts; MLAKV_DCHECK does the same in debug builds and evaluates nothing with NDEBUG)
// and rng.h (splitmix64 against the reference implementation's outputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "mlakv/rng.h"

namespace mlakv {
namespace {

TEST(Check, PassingChecksDoNothing) {
  int evaluated = 0;
  MLAKV_CHECK(++evaluated == 1);
  MLAKV_CHECK(evaluated == 1, "with a reason");
  EXPECT_EQ(evaluated, 1);  // the condition is evaluated exactly once
}

TEST(CheckDeathTest, FailingCheckPrintsFileLineConditionAndAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int two = 2;
  EXPECT_DEATH(MLAKV_CHECK(two == 3), "core_test\\.cc:[0-9]+: MLAKV_CHECK failed: two == 3\n");
  EXPECT_DEATH(MLAKV_CHECK(two < 0, "the reason"),
               "core_test\\.cc:[0-9]+: MLAKV_CHECK failed: two < 0 \\(the reason\\)");
}

#ifdef NDEBUG
TEST(Check, DcheckIsCompiledOutWithNdebug) {
  int evaluated = 0;
  MLAKV_DCHECK(++evaluated == 100, "never evaluated");
  EXPECT_EQ(evaluated, 0);
}
#else
TEST(CheckDeathTest, FailingDcheckAbortsInDebugBuilds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int two = 2;
  EXPECT_DEATH(MLAKV_DCHECK(two == 3, "why"), "core_test\\.cc:[0-9]+: MLAKV_DCHECK failed: two == 3 \\(why\\)");
}
#endif

// Vigna's splitmix64.c started from state 0 prints these three numbers.
TEST(Rng, Splitmix64MatchesTheReference) {
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64(kSplitMix64Gamma), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(splitmix64(2 * kSplitMix64Gamma), 0x06C45D188009454Full);
  // The generator walks the same sequence from its spread seed (seed * gamma + 1).
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), splitmix64(1));
  EXPECT_EQ(g.next(), splitmix64(1 + kSplitMix64Gamma));
}

TEST(Rng, NormalHasUnitMomentsAndUniformStaysInRange) {
  // n draws of N(0, 1): the sample mean has sd 1/sqrt(n), the sample variance sd
  // sqrt(2/n); 5 sd bounds fail by chance with probability < 1e-6.
  constexpr int n = 200000;
  SplitMix64 g(2026);
  double s = 0, ss = 0;
  for (int i = 0; i < n; ++i) {
    const double x = g.normal();
    ASSERT_TRUE(std::isfinite(x));
    s += x;
    ss += x * x;
  }
  const double mean = s / n, var = ss / n - mean * mean;
  EXPECT_LT(std::abs(mean), 5.0 / std::sqrt(n));
  EXPECT_LT(std::abs(var - 1.0), 5.0 * std::sqrt(2.0 / n));
  for (int i = 0; i < 1000; ++i) {
    const double u = g.uniform_open(), v = g.uniform();
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_GE(v, 0.0);
    ASSERT_LT(v, 1.0);
  }
}

}  // namespace
}  // namespace mlakv
