// src/core/seal_test.cc — AES-256-GCM sealing of stored responses.
#include "idem/seal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "testing/fakes.h"

namespace idem {
namespace {

class SealTest : public ::testing::Test {
 protected:
  std::unique_ptr<Sealer> Make(uint32_t current, std::vector<Secret> keys = {}) {
    if (keys.empty()) keys = {{1, std::string(32, 'k')}, {2, std::string(32, 'n')}};
    auto s = Sealer::Create(std::move(keys), current, random_, 64);
    EXPECT_TRUE(s.has_value()) << s.error().message;
    return std::move(*s);
  }
  testing::SeededRandom random_{7};
  ScopeHash scope_ = *Scope{"acme", "alice", "payments.create", "key-00001"}.Hash();
  ScopeHash other_ = *Scope{"acme", "bob", "payments.create", "key-00001"}.Hash();
};

TEST_F(SealTest, RoundTripsAndHidesThePlaintext) {
  auto sealer = Make(1);
  const std::string body = R"({"id":"pay_1","amount":"100.00"})";
  auto sealed = sealer->Seal(scope_, body);
  ASSERT_TRUE(sealed.has_value());
  EXPECT_EQ(sealed->find("pay_1"), std::string::npos);
  EXPECT_EQ(sealed->size(), body.size() + 1 + 4 + 12 + 16);
  EXPECT_EQ(*sealer->Open(scope_, *sealed), body);
  // A fresh nonce each time: equal plaintexts do not produce equal bytes.
  EXPECT_NE(*sealer->Seal(scope_, body), *sealed);
}

TEST_F(SealTest, CannotBeMovedToAnotherRecord) {
  auto sealer = Make(1);
  auto sealed = *sealer->Seal(scope_, "secret answer");
  auto moved = sealer->Open(other_, sealed);
  ASSERT_FALSE(moved.has_value());
  EXPECT_EQ(moved.error().code, Errc::kDataLoss);
}

TEST_F(SealTest, DetectsEveryFlippedByteAndTruncation) {
  auto sealer = Make(1);
  const std::string sealed = *sealer->Seal(scope_, "payload");
  for (std::size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    EXPECT_EQ(sealer->Open(scope_, bad).error().code, Errc::kDataLoss) << "byte " << i;
  }
  for (std::size_t n = 0; n < sealed.size(); ++n) {
    EXPECT_EQ(sealer->Open(scope_, sealed.substr(0, n)).error().code, Errc::kDataLoss) << n;
  }
}

// Contexts are keyed once and reused: each message must start afresh, also after one that failed
// to authenticate, and give what a sealer with new contexts makes and opens.
TEST_F(SealTest, ReusedContextsSealAndOpenEachMessageAfresh) {
  auto sealer = Make(1);
  auto fresh = [&] { return Make(1); };
  const std::string first = *sealer->Seal(scope_, "first answer");
  std::string bad = first;
  bad.back() = static_cast<char>(bad.back() ^ 0x01);
  ASSERT_EQ(sealer->Open(scope_, bad).error().code, Errc::kDataLoss);
  ASSERT_EQ(sealer->Open(other_, first).error().code, Errc::kDataLoss);
  EXPECT_EQ(*sealer->Open(scope_, first), "first answer");
  const std::string second = *sealer->Seal(other_, "a second, longer answer");
  EXPECT_EQ(*fresh()->Open(other_, second), "a second, longer answer");
  EXPECT_EQ(*sealer->Open(other_, second), "a second, longer answer");
  EXPECT_EQ(*sealer->Open(scope_, *fresh()->Seal(scope_, "sealed elsewhere")), "sealed elsewhere");
}

TEST_F(SealTest, ConcurrentSealsAndOpensEachGetTheirOwnContext) {
  auto sealer = Make(1);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string body = "answer " + std::to_string(t) + "/" + std::to_string(i);
        auto sealed = sealer->Seal(scope_, body);
        auto opened = sealed ? sealer->Open(scope_, *sealed) : sealed;
        if (!opened || *opened != body) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(SealTest, OlderKeysStillOpenAfterRotation) {
  const std::string sealed = *Make(1)->Seal(scope_, "v1");
  auto rotated = Make(2);
  EXPECT_EQ(*rotated->Open(scope_, sealed), "v1");
  auto retired = Make(2, {{2, std::string(32, 'n')}});
  EXPECT_EQ(retired->Open(scope_, sealed).error().code, Errc::kDataLoss);
}

TEST_F(SealTest, SizeCapAtAndPastTheEdge) {
  auto sealer = Make(1);
  EXPECT_TRUE(sealer->Seal(scope_, std::string(64, 'x')).has_value());
  EXPECT_EQ(sealer->Seal(scope_, std::string(65, 'x')).error().code, Errc::kTooLarge);
  EXPECT_TRUE(sealer->Seal(scope_, "").has_value());
}

TEST_F(SealTest, KeysMustBe32Bytes) {
  EXPECT_EQ(Sealer::Create({{1, std::string(31, 'k')}}, 1, random_).error().code,
            Errc::kInvalidArgument);
  EXPECT_EQ(Sealer::Create({{1, std::string(33, 'k')}}, 1, random_).error().code,
            Errc::kInvalidArgument);
}

}  // namespace
}  // namespace idem
