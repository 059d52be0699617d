// src/core/failpoint_test.cc — arming, acting and disarming failpoints.
#include "include/idem/failpoint.h"

#include <gtest/gtest.h>

#include <chrono>

namespace idem {
namespace {

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override { ClearFailpoints(); }
};

TEST_F(FailpointTest, UnarmedPointsPass) { EXPECT_TRUE(IDEM_FAILPOINT("nowhere").has_value()); }

TEST_F(FailpointTest, ErrorAndStallAct) {
  ASSERT_TRUE(ArmFailpoints("a=error,b=stall:50").has_value());
  auto a = IDEM_FAILPOINT("a");
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.error().code, Errc::kUnavailable);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(IDEM_FAILPOINT("b").has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  ASSERT_TRUE(ArmFailpoints("a=off").has_value());
  EXPECT_TRUE(IDEM_FAILPOINT("a").has_value());
}

TEST_F(FailpointTest, CrashExitsAtOnce) {
  ASSERT_TRUE(ArmFailpoints("boom=crash").has_value());
  EXPECT_EXIT((void)IDEM_FAILPOINT("boom"), ::testing::ExitedWithCode(86), "");
}

TEST_F(FailpointTest, RejectsMalformedSpecs) {
  for (const char* bad : {"x", "=crash", "x=explode", "x=stall:", "x=stall:1s"}) {
    EXPECT_EQ(ArmFailpoints(bad).error().code, Errc::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace idem
