// src/core/store_test.cc — SweepExpired over a real SQLite store: batches and the round's bound.
#include "include/idem/store.h"

#include <gtest/gtest.h>

#include "include/idem/store/sqlite.h"
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

  auto early = SweepExpired(*store);
  ASSERT_TRUE(early.has_value()) << early.error().message;
  EXPECT_EQ(*early, 0) << "nothing has expired yet";

  clock.Advance(Millis(1000));
  // A round of two batches deletes exactly two batches, though more have expired.
  auto bounded = SweepExpired(*store, 2);
  ASSERT_TRUE(bounded.has_value()) << bounded.error().message;
  EXPECT_EQ(*bounded, 2 * limits::kSweepBatch);
  // The next round ends at the first short batch.
  auto rest = SweepExpired(*store, 2);
  ASSERT_TRUE(rest.has_value()) << rest.error().message;
  EXPECT_EQ(*rest, 1);
}

}  // namespace
}  // namespace idem
