// src/core/store_test.cc — SweepExpired over a real SQLite store: batches, the round's bound, a
// round stopped between two batches, and the pacing between them.
#include "idem/store.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <vector>

#include "idem/failpoint.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"

namespace idem {
namespace {

// `count` finished records that expire after one second, written in one transaction.
void FinishedRecords(Store& store, int count) {
  auto txn = std::move(*store.Begin());
  for (int i = 0; i < count; ++i) {
    ClaimSpec spec;
    spec.scope = *Scope{"acme", "alice", "r", "sweep-key-" + std::to_string(i)}.Hash();
    spec.tenant = "acme";
    spec.user = "alice";
    spec.route = "r";
    spec.retention = Millis(1000);
    auto claim = txn->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    ASSERT_TRUE(txn->Finish(spec.scope, claim->record.lease,
                            Outcome{RecordState::kSucceeded, 201, "sealed", "done"})
                    .has_value());
  }
  ASSERT_TRUE(txn->Commit().has_value());
}

// A SQLite store in a directory of its own, on a clock the test moves.
class SweepExpiredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SqliteStoreOptions options;
    options.path = dir_.File("idem.db");
    auto opened = OpenSqliteStore(options, clock_, random_);
    ASSERT_TRUE(opened.has_value()) << opened.error().message;
    store_ = std::move(*opened);
  }

  testing::FakeClock clock_;
  testing::SeededRandom random_{7};
  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(SweepExpiredTest, DeletesWholeBatchesUpToTheRoundsBound) {
  FinishedRecords(*store_, 2 * limits::kSweepBatch + 1);

  auto early = SweepExpired(*store_, {});
  ASSERT_TRUE(early.has_value()) << early.error().message;
  EXPECT_EQ(*early, 0) << "nothing has expired yet";

  clock_.Advance(Millis(1000));
  // A round of two batches deletes exactly two batches, though more have expired.
  auto bounded = SweepExpired(*store_, {}, 2);
  ASSERT_TRUE(bounded.has_value()) << bounded.error().message;
  EXPECT_EQ(*bounded, 2 * limits::kSweepBatch);
  // The next round ends at the first short batch.
  auto rest = SweepExpired(*store_, {}, 2);
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(*rest, 1);
}

// The step between two batches (failpoint sweep_between_batches): a round that fails there keeps
// the batches it deleted (each committed on its own) and leaves the rest to the next round. The
// step is only between batches: not after a short batch, nor after the round's last.
TEST_F(SweepExpiredTest, ARoundStoppedBetweenBatchesKeepsWhatItDeleted) {
  FinishedRecords(*store_, 2 * limits::kSweepBatch + 1);
  clock_.Advance(Millis(1000));
  auto left = [&] {
    return std::get<int64_t>(store_->Query("SELECT count(*) FROM idem_records")->at(0).at(0));
  };

  ASSERT_TRUE(ArmFailpoints("sweep_between_batches=error").has_value());
  auto stopped = SweepExpired(*store_, {});
  const int64_t left_after_stop = left();
  auto one_batch = SweepExpired(*store_, {}, 1);
  ClearFailpoints();
#if !defined(IDEM_NO_FAILPOINTS)
  ASSERT_FALSE(stopped.has_value());
  EXPECT_EQ(stopped.error().code, Errc::kUnavailable);
  EXPECT_EQ(left_after_stop, limits::kSweepBatch + 1) << "the first batch's deletions stand";
  ASSERT_TRUE(one_batch.has_value()) << "a round of one batch has no step between batches";
  EXPECT_EQ(*one_batch, limits::kSweepBatch);
  EXPECT_EQ(left(), 1);
#endif
  auto rest = SweepExpired(*store_, {});
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(left(), 0) << "the next round finishes the sweep";
}

// A clock on which every reading is `step` (10 ms unless told) after the one before: each batch
// "takes" one step.
class TickingClock final : public MonotonicClock {
 public:
  explicit TickingClock(std::chrono::microseconds step = Millis(10)) : step_(step) {}
  SteadyTime Now() const override { return SteadyTime{} + step_ * ++readings_; }

 private:
  std::chrono::microseconds step_;
  mutable int64_t readings_ = 0;
};

// Paced, a round rests twice as long as each batch took after every full batch the round goes on
// from: not after a short batch, nor after the round's last. With `rest_per_work` 0 it is still
// asked whether to go on, for no time.
TEST_F(SweepExpiredTest, PacedRestsAfterEachBatchItGoesOnFrom) {
  FinishedRecords(*store_, 3 * limits::kSweepBatch + 1);
  clock_.Advance(Millis(1000));
  TickingClock ticking;
  std::vector<Millis> rests;
  const SweepPacing pacing{&ticking,
                           2,
                           [&](Millis d) {
                             rests.push_back(d);
                             return true;
                           },
                           {}};

  auto bounded = SweepExpired(*store_, {}, 2, &pacing);
  ASSERT_TRUE(bounded.has_value()) << bounded.error().message;
  EXPECT_EQ(*bounded, 2 * limits::kSweepBatch);
  EXPECT_EQ(rests, std::vector<Millis>{Millis(20)}) << "one rest, between the round's two batches";

  rests.clear();
  auto rest = SweepExpired(*store_, {}, limits::kSweepBatchesPerRound, &pacing);
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(*rest, limits::kSweepBatch + 1);
  EXPECT_EQ(rests, std::vector<Millis>{Millis(20)}) << "none after the short batch";

  const SweepPacing unpaced{&ticking,
                            0,
                            [&](Millis d) {
                              rests.push_back(d);
                              return true;
                            },
                            {}};
  FinishedRecords(*store_, 2 * limits::kSweepBatch);
  clock_.Advance(Millis(1000));
  rests.clear();
  auto flat_out = SweepExpired(*store_, {}, limits::kSweepBatchesPerRound, &unpaced);
  ASSERT_TRUE(flat_out.has_value()) << flat_out.error().message;
  EXPECT_EQ(*flat_out, 2 * limits::kSweepBatch);
  EXPECT_EQ(rests, (std::vector<Millis>{Millis(0), Millis(0)}))
      << "rest_per_work 0 asks after each full batch, for no time";
}

// A batch faster than a millisecond still rests (the rest is rounded up, not down to 0 ms), and
// `swept` hears of each batch as it commits: also of the one before a round fails between
// batches, which the round's failed result cannot carry.
TEST_F(SweepExpiredTest, TellsEachBatchAsItCommitsAndRestsAtLeastAMillisecond) {
  FinishedRecords(*store_, 2 * limits::kSweepBatch + 3);
  clock_.Advance(Millis(1000));
  TickingClock fast(std::chrono::microseconds(100));
  std::vector<Millis> rests;
  std::vector<int64_t> batches;
  const SweepPacing pacing{.clock = &fast,
                           .rest_per_work = 2,
                           .rest =
                               [&](Millis d) {
                                 rests.push_back(d);
                                 return true;
                               },
                           .swept = [&](int64_t n) { batches.push_back(n); }};

  ASSERT_TRUE(ArmFailpoints("sweep_between_batches=error").has_value());
  auto stopped = SweepExpired(*store_, {}, std::numeric_limits<int>::max(), &pacing);
  ClearFailpoints();
#if !defined(IDEM_NO_FAILPOINTS)
  ASSERT_FALSE(stopped.has_value());
  EXPECT_EQ(batches, std::vector<int64_t>{limits::kSweepBatch}) << "the batch before the failure";
  EXPECT_EQ(rests, std::vector<Millis>{Millis(1)}) << "200 us of rest, rounded up";
  batches.clear();
  auto rest = SweepExpired(*store_, {}, std::numeric_limits<int>::max(), &pacing);
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(batches, (std::vector<int64_t>{limits::kSweepBatch, 3})) << "the short batch too";
  EXPECT_EQ(*rest, limits::kSweepBatch + 3);
#else
  ASSERT_TRUE(stopped.has_value()) << stopped.error().message;
  EXPECT_EQ(batches, (std::vector<int64_t>{limits::kSweepBatch, limits::kSweepBatch, 3}));
  EXPECT_EQ(rests, (std::vector<Millis>{Millis(1), Millis(1)})) << "200 us of rest, rounded up";
#endif
}

// An unbounded round (idemd's) goes on until it has caught up, however many batches that takes,
// and ends at the first rest that says stop (idemd shutting down), keeping what it deleted.
TEST_F(SweepExpiredTest, AnUnboundedRoundCatchesUpOrStopsWhenItsRestSaysSo) {
  const int kBatches = limits::kSweepBatchesPerRound + 3;
  FinishedRecords(*store_, kBatches * limits::kSweepBatch + 7);
  clock_.Advance(Millis(1000));
  TickingClock ticking;
  int asked = 0;
  const SweepPacing stops_after_two{&ticking, 1, [&](Millis) { return ++asked < 2; }, {}};

  auto stopped = SweepExpired(*store_, {}, std::numeric_limits<int>::max(), &stops_after_two);
  ASSERT_TRUE(stopped.has_value()) << stopped.error().message;
  EXPECT_EQ(*stopped, 2 * limits::kSweepBatch) << "the batch before the rest that said stop stands";
  EXPECT_EQ(asked, 2);

  const SweepPacing goes_on{&ticking, 1, [](Millis) { return true; }, {}};
  auto caught_up = SweepExpired(*store_, {}, std::numeric_limits<int>::max(), &goes_on);
  ASSERT_TRUE(caught_up.has_value()) << caught_up.error().message;
  EXPECT_EQ(*caught_up, (kBatches - 2) * limits::kSweepBatch + 7)
      << "past the default round's " << limits::kSweepBatchesPerRound << " batches";
}

}  // namespace
}  // namespace idem
