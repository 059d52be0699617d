// src/core/result_test.cc — Result<T> and the propagation macros.
#include "idem/result.h"

#include <gtest/gtest.h>

#include <memory>

namespace idem {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return MakeError(Errc::kInvalidArgument, "odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  IDEM_ASSIGN_OR_RETURN(int h, Half(x));
  IDEM_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  IDEM_RETURN_IF_ERROR(Half(x));
  return Ok();
}

TEST(Result, HoldsAValueOrAnError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto bad = Quarter(6);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, Errc::kInvalidArgument);
  EXPECT_EQ(bad.error().message, "odd");
  EXPECT_TRUE(CheckEven(2).has_value());
  EXPECT_EQ(CheckEven(3).error().code, Errc::kInvalidArgument);
}

TEST(Result, MovesOnlyTypes) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}

TEST(Result, ErrcNamesAreStableAndDistinct) {
  EXPECT_EQ(ErrcName(Errc::kFingerprintMismatch), "fingerprint_mismatch");
  EXPECT_EQ(ErrcName(Errc::kResourceExhausted), "resource_exhausted");
  EXPECT_NE(ErrcName(Errc::kFenced), ErrcName(Errc::kConflict));
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  Result<int> bad = MakeError(Errc::kInternal, "x");
  EXPECT_DEATH((void)bad.value(), "check failed");
}

}  // namespace
}  // namespace idem
