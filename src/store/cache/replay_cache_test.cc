// src/store/cache/replay_cache_test.cc — the in-process replay cache over SQLite files: the
// contract suite unchanged, and what the cache adds (it answers from memory, and only by the rule
// in replay_cache.h).
#include "idem/store/replay_cache.h"

#include <gtest/gtest.h>

#include <atomic>

#include "idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

SqliteStoreOptions Options(const std::string& path) {
  SqliteStoreOptions options;
  options.path = path;
  options.pool_size = 2;
  return WithContractTables(options);
}

INSTANTIATE_TEST_SUITE_P(Cached, StoreContractTest,
                         ::testing::Values(StoreFactory{
                             "CachedSqlite",
                             [](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
                               IDEM_ASSIGN_OR_RETURN(
                                   std::unique_ptr<Store> sqlite,
                                   OpenSqliteStore(Options(env.dir.File("idem.db")), env.clock,
                                                   env.random));
                               return WrapWithReplayCache(std::move(sqlite), {}, env.clock);
                             }}),
                         FactoryName);

// Counts the reads that reach the database.
class CountingReads final : public StoreWrapper {
 public:
  explicit CountingReads(std::unique_ptr<Store> inner)
      : StoreWrapper(*inner), inner_(std::move(inner)) {}
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    ++reads;
    return inner_->Read(scope);
  }
  std::atomic<int> reads{0};

 private:
  std::unique_ptr<Store> inner_;
};

constexpr Millis kRetention = kContractRetention;
// How long the cache keeps a record read with kRetention left: 2 % less (cache::kSlowClockPpm).
constexpr Millis kKept = kRetention * 49 / 50;

class ReplayCacheTest : public ::testing::Test {
 protected:
  void Open(ReplayCacheOptions options = {}) {
    auto sqlite = OpenSqliteStore(Options(dir_.File("idem.db")), clock_, random_);
    ASSERT_TRUE(sqlite.has_value()) << sqlite.error().message;
    auto counting = std::make_unique<CountingReads>(std::move(*sqlite));
    counting_ = counting.get();
    options.monotonic = &monotonic_;
    store_ = WrapWithReplayCache(std::move(counting), options, clock_);
  }

  // A record of `key` claimed and finished with `answer` (or left running when `finish` is false),
  // at recovery point `point`.
  ScopeHash Make(const std::string& key, const std::string& answer, bool finish = true,
                 RecordState state = RecordState::kSucceeded, std::string point = "done") {
    const ClaimSpec spec = ContractSpec(key);
    auto txn = store_->Begin();
    EXPECT_TRUE(txn.has_value());
    auto claim = (*txn)->Claim(spec);
    EXPECT_TRUE(claim.has_value() && claim->claimed);
    if (finish) {
      EXPECT_TRUE((*txn)
                      ->Finish(spec.scope, claim->record.lease,
                               Outcome{state, 201, answer, std::move(point)})
                      .has_value());
    }
    EXPECT_TRUE((*txn)->Commit().has_value());
    return spec.scope;
  }

  TempDir dir_;
  FakeClock clock_;
  FakeMonotonicClock monotonic_;
  SeededRandom random_{7};
  CountingReads* counting_ = nullptr;
  std::unique_ptr<Store> store_;
};

TEST_F(ReplayCacheTest, AFinishedRecordReadOnceIsAnsweredFromMemoryAfterwards) {
  Open();
  const ScopeHash scope = Make("key-mem-1", "answer");
  EXPECT_FALSE(store_->ReadCached(scope).has_value()) << "nothing is cached before a read";
  ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, 1);
  const std::optional<Record> held = store_->ReadCached(scope);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->response, "answer");
  ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, 1) << "the second read came from memory";
}

TEST_F(ReplayCacheTest, ARunningRecordIsNeverCached) {
  Open();
  const ScopeHash scope = Make("key-mem-2", "", /*finish=*/false);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, 3);
  EXPECT_FALSE(store_->ReadCached(scope).has_value());
}

// A held outcome is final, yet an operator may settle it from another process: it is read from
// the store every time, and never kept.
TEST_F(ReplayCacheTest, AHeldOutcomeIsNeverCached) {
  Open();
  const ScopeHash scope = Make("key-mem-h", "unknown", /*finish=*/true, RecordState::kFailedFinal,
                               std::string(kOutcomeUnknownPoint));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, 3);
  auto held = counting_->Read(scope);
  ASSERT_TRUE(held.has_value() && held->has_value());
  store_->KeepFinished(**held, monotonic_.Now());
  EXPECT_FALSE(store_->ReadCached(scope).has_value());
}

// The execution that finished a record hands it over (Store::KeepFinished): it is held from
// as_of, the claim's start, for what the store said it had left, and answered with no read.
// A running record is never kept.
TEST_F(ReplayCacheTest, AKeptFinishedRecordIsHeldFromAsOfForWhatItHadLeft) {
  Open();
  const ScopeHash scope = Make("key-mem-k", "answer");
  auto finished = counting_->Read(scope);  // as the engine knows it; the cache does not see this
  ASSERT_TRUE(finished.has_value() && finished->has_value());
  const ScopeHash running = Make("key-mem-r", "", /*finish=*/false);
  auto unfinished = counting_->Read(running);
  ASSERT_TRUE(unfinished.has_value() && unfinished->has_value());
  const int reads = counting_->reads;

  const SteadyTime claim_began = monotonic_.Now() - Millis(1000);
  store_->KeepFinished(**finished, claim_began);
  store_->KeepFinished(**unfinished, claim_began);
  const std::optional<Record> held = store_->ReadCached(scope);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->response, "answer");
  ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, reads) << "answered from memory";
  EXPECT_FALSE(store_->ReadCached(running).has_value());

  monotonic_.Advance(kKept - Millis(1000) - Millis(1));
  EXPECT_TRUE(store_->ReadCached(scope).has_value());
  monotonic_.Advance(Millis(1));
  EXPECT_FALSE(store_->ReadCached(scope).has_value())
      << "counted from as_of, not from the hand-over";
}

// An entry lives for what the store said the record had left, less 2 %, on the monotonic clock:
// even with the wall clock stopped (or running behind), it is gone before the record's expiry,
// also by a monotonic clock 2 % slow (a drifting VM), so a key's new operation after the expiry
// is never answered with the old one's answer. Found by the simulator, seed 160: an instance
// whose clock ran 5,728 ppm slow kept the whole 60 s retention, and answered a key's new operation
// 422 from its cache 60 ms after the record expired; before, this entry lived the full retention.
TEST_F(ReplayCacheTest, AnEntryEndsBeforeTheRecordsExpiryByTheMonotonicClock) {
  Open();
  const ScopeHash scope = Make("key-mem-3", "answer");
  ASSERT_TRUE(store_->Read(scope)->has_value());
  monotonic_.Advance(kKept - Millis(1));
  EXPECT_TRUE(store_->ReadCached(scope).has_value());
  monotonic_.Advance(Millis(1));
  EXPECT_FALSE(store_->ReadCached(scope).has_value());
}

TEST_F(ReplayCacheTest, ALocalClockPastTheExpiryEndsAnEntry) {
  Open();
  const ScopeHash scope = Make("key-mem-4", "answer");
  ASSERT_TRUE(store_->Read(scope)->has_value());
  clock_.Advance(kRetention);
  EXPECT_FALSE(store_->ReadCached(scope).has_value());
}

// The byte bound: with room for about one record, the least recently used goes.
TEST_F(ReplayCacheTest, TheByteBoundEvictsTheLeastRecentlyUsed) {
  Open({.max_bytes = 1500});
  const ScopeHash first = Make("key-mem-5", std::string(600, 'a'));
  const ScopeHash second = Make("key-mem-6", std::string(600, 'b'));
  ASSERT_TRUE(store_->Read(first)->has_value());
  ASSERT_TRUE(store_->ReadCached(first).has_value());
  ASSERT_TRUE(store_->Read(second)->has_value());
  EXPECT_TRUE(store_->ReadCached(second).has_value());
  EXPECT_FALSE(store_->ReadCached(first).has_value()) << "evicted for the second";
  const ScopeHash huge = Make("key-mem-7", std::string(4000, 'c'));
  ASSERT_TRUE(store_->Read(huge)->has_value());
  EXPECT_FALSE(store_->ReadCached(huge).has_value()) << "larger than the bound: not kept";
  EXPECT_TRUE(store_->ReadCached(second).has_value()) << "and it evicted nothing";
}

TEST_F(ReplayCacheTest, ZeroBytesTurnsTheCacheOff) {
  Open({.max_bytes = 0});
  const ScopeHash scope = Make("key-mem-8", "answer");
  ASSERT_TRUE(store_->Read(scope)->has_value());
  ASSERT_TRUE(store_->Read(scope)->has_value());
  EXPECT_EQ(counting_->reads, 2);
  EXPECT_FALSE(store_->ReadCached(scope).has_value());
}

}  // namespace
}  // namespace idem::testing
