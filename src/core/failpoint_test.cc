// src/core/failpoint_test.cc — arming, acting and disarming failpoints.
#include "idem/failpoint.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace idem {
namespace {

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override { ClearFailpoints(); }
};

TEST_F(FailpointTest, UnarmedPointsPass) { EXPECT_TRUE(IDEM_FAILPOINT("after_claim").has_value()); }

TEST_F(FailpointTest, ErrorAndStallAct) {
  ASSERT_TRUE(ArmFailpoints("after_claim=error,heartbeat=stall:50").has_value());
  auto a = IDEM_FAILPOINT("after_claim");
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.error().code, Errc::kUnavailable);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(IDEM_FAILPOINT("heartbeat").has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  ASSERT_TRUE(ArmFailpoints("after_claim=off").has_value());
  EXPECT_TRUE(IDEM_FAILPOINT("after_claim").has_value());
}

TEST_F(FailpointTest, CrashExitsAtOnce) {
  ASSERT_TRUE(ArmFailpoints("after_charge_sent=crash").has_value());
  EXPECT_EXIT((void)IDEM_FAILPOINT("after_charge_sent"), ::testing::ExitedWithCode(86), "");
}

TEST_F(FailpointTest, RejectsMalformedSpecs) {
  for (const char* bad :
       {"x", "=crash", "after_claim=explode", "after_claim=stall:", "after_claim=stall:1s"}) {
    EXPECT_EQ(ArmFailpoints(bad).error().code, Errc::kInvalidArgument) << bad;
  }
}

// A typo names no failpoint: refused, naming the known ones, and nothing is armed.
TEST_F(FailpointTest, RefusesNamesThatAreNoFailpoint) {
  auto typo = ArmFailpoints("after_claim=error,after_clam=crash");
  ASSERT_FALSE(typo.has_value());
  EXPECT_EQ(typo.error().code, Errc::kInvalidArgument);
  EXPECT_NE(typo.error().message.find("'after_clam'"), std::string::npos) << typo.error().message;
  EXPECT_NE(typo.error().message.find("after_complete_commit"), std::string::npos);
  EXPECT_TRUE(IDEM_FAILPOINT("after_claim").has_value()) << "armed despite the refused spec";
  for (std::string_view name : kFailpoints) {
    EXPECT_TRUE(ArmFailpoints(std::string(name) + "=off").has_value()) << name;
  }
}

TEST(RevertFixesTest, TakesBackTheFixesNamedAndOnlyThose) {
#if defined(IDEM_NO_FAILPOINTS)
  EXPECT_FALSE(RevertFixes("margin").has_value());
  EXPECT_FALSE(IDEM_REVERTED("margin"));
#else
  EXPECT_FALSE(IDEM_REVERTED("margin"));
  ASSERT_TRUE(RevertFixes("unknown_5xx").has_value());
  EXPECT_TRUE(IDEM_REVERTED("unknown_5xx"));
  EXPECT_FALSE(IDEM_REVERTED("margin"));
  ASSERT_TRUE(RevertFixes("margin,unknown_5xx").has_value());
  EXPECT_TRUE(IDEM_REVERTED("margin"));
  const Status unknown = RevertFixes("margin,settle_nothing");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message.find("settle_nothing"), std::string::npos);
  EXPECT_TRUE(IDEM_REVERTED("margin")) << "a refused list changes nothing";
  ASSERT_TRUE(RevertFixes("").has_value());
  EXPECT_FALSE(IDEM_REVERTED("margin"));
  EXPECT_FALSE(IDEM_REVERTED("unknown_5xx"));
#endif
}

}  // namespace
}  // namespace idem
