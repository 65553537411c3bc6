// src/core/check.h: MLAKV_CHECK reports file:line, the condition and the reason, then
// aborts; MLAKV_DCHECK does the same in debug builds and evaluates nothing with NDEBUG.
#include <gtest/gtest.h>

#include "core/check.h"

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
  EXPECT_DEATH(MLAKV_CHECK(two == 3), "check_test\\.cc:[0-9]+: MLAKV_CHECK failed: two == 3\n");
  EXPECT_DEATH(MLAKV_CHECK(two < 0, "the reason"), "check_test\\.cc:[0-9]+: MLAKV_CHECK failed: two < 0 \\(the reason\\)");
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
  EXPECT_DEATH(MLAKV_DCHECK(two == 3, "why"), "check_test\\.cc:[0-9]+: MLAKV_DCHECK failed: two == 3 \\(why\\)");
}
#endif

}  // namespace
}  // namespace mlakv
