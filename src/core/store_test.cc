// src/core/store_test.cc — SweepExpired over a real SQLite store: batches, the round's bound, and
// a round stopped between two batches.
#include "idem/store.h"

#include <gtest/gtest.h>

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

TEST(SweepExpired, DeletesWholeBatchesUpToTheRoundsBound) {
  testing::FakeClock clock;
  testing::SeededRandom random(7);
  testing::TempDir dir;
  SqliteStoreOptions options;
  options.path = dir.File("idem.db");
  auto store = std::move(*OpenSqliteStore(options, clock, random));
  FinishedRecords(*store, 2 * limits::kSweepBatch + 1);

  auto early = SweepExpired(*store, {});
  ASSERT_TRUE(early.has_value()) << early.error().message;
  EXPECT_EQ(*early, 0) << "nothing has expired yet";

  clock.Advance(Millis(1000));
  // A round of two batches deletes exactly two batches, though more have expired.
  auto bounded = SweepExpired(*store, {}, 2);
  ASSERT_TRUE(bounded.has_value()) << bounded.error().message;
  EXPECT_EQ(*bounded, 2 * limits::kSweepBatch);
  // The next round ends at the first short batch.
  auto rest = SweepExpired(*store, {}, 2);
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(*rest, 1);
}

// The step between two batches (failpoint sweep_between_batches): a round that fails there keeps
// the batches it deleted (each committed on its own) and leaves the rest to the next round. The
// step is only between batches: not after a short batch, nor after the round's last.
TEST(SweepExpired, ARoundStoppedBetweenBatchesKeepsWhatItDeleted) {
  testing::FakeClock clock;
  testing::SeededRandom random(7);
  testing::TempDir dir;
  SqliteStoreOptions options;
  options.path = dir.File("idem.db");
  auto store = std::move(*OpenSqliteStore(options, clock, random));
  FinishedRecords(*store, 2 * limits::kSweepBatch + 1);
  clock.Advance(Millis(1000));
  auto left = [&] {
    return std::get<int64_t>(store->Query("SELECT count(*) FROM idem_records")->at(0).at(0));
  };

  ASSERT_TRUE(ArmFailpoints("sweep_between_batches=error").has_value());
  auto stopped = SweepExpired(*store, {});
  const int64_t left_after_stop = left();
  auto one_batch = SweepExpired(*store, {}, 1);
  ClearFailpoints();
#if !defined(IDEM_NO_FAILPOINTS)
  ASSERT_FALSE(stopped.has_value());
  EXPECT_EQ(stopped.error().code, Errc::kUnavailable);
  EXPECT_EQ(left_after_stop, limits::kSweepBatch + 1) << "the first batch's deletions stand";
  ASSERT_TRUE(one_batch.has_value()) << "a round of one batch has no step between batches";
  EXPECT_EQ(*one_batch, limits::kSweepBatch);
  EXPECT_EQ(left(), 1);
#endif
  auto rest = SweepExpired(*store, {});
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(left(), 0) << "the next round finishes the sweep";
}

}  // namespace
}  // namespace idem
