// server/idemd/filter/timed_store_test.cc — the timed store (idemd's store latency metrics): the
// contract suite unchanged over SQLite, and one observation per call under its operation's name.
#include <gtest/gtest.h>

#include "idem/store/sqlite.h"
#include "server/idemd/filter/timed.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

using idemd::Metrics;

SqliteStoreOptions Options(const std::string& path) {
  SqliteStoreOptions options;
  options.path = path;
  options.pool_size = 2;
  return WithContractTables(options);
}

// The suite's stores report here; thread-safe, and alive as long as any store.
Metrics& SuiteMetrics() {
  static Metrics metrics;
  return metrics;
}

INSTANTIATE_TEST_SUITE_P(Timed, StoreContractTest,
                         ::testing::Values(StoreFactory{
                             "TimedSqlite",
                             [](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
                               IDEM_ASSIGN_OR_RETURN(
                                   std::unique_ptr<Store> sqlite,
                                   OpenSqliteStore(Options(env.dir.File("idem.db")), env.clock,
                                                   env.random));
                               return idemd::MakeTimedStore(std::move(sqlite), SuiteMetrics(),
                                                            SystemMonotonicClock());
                             }}),
                         FactoryName);

// The observations of one operation's histogram: its _count, and its bucket at `le`.
int64_t Series(const Metrics& metrics, const std::string& series) {
  const std::string text = metrics.Render();
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + series.size() + 2));
}

int64_t Calls(const Metrics& metrics, const std::string& operation) {
  return Series(metrics,
                "idem_store_operation_duration_seconds_count{operation=\"" + operation + "\"}");
}

TEST(TimedStoreTest, EveryCallIsObservedOnceUnderItsOperationFailuresIncluded) {
  StoreTestEnv env;
  Metrics metrics;
  FakeMonotonicClock monotonic;
  auto sqlite = OpenSqliteStore(Options(env.dir.File("idem.db")), env.clock, env.random);
  ASSERT_TRUE(sqlite.has_value()) << sqlite.error().message;
  std::unique_ptr<Store> store = idemd::MakeTimedStore(std::move(*sqlite), metrics, monotonic);
  for (StoreOperation operation : idemd::kTimedStoreOperations) {
    const std::string name(StoreOperationName(operation));
    EXPECT_EQ(Calls(metrics, name), 0) << name << " is rendered, as 0, before any call";
  }

  const ClaimSpec spec = ContractSpec("timed-key");
  {
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto claim = (*txn)->Claim(spec);
    ASSERT_TRUE(claim.has_value()) << claim.error().message;
    // A renewal by a lease that does not own the record fails, and is timed all the same.
    EXPECT_FALSE((*txn)->Renew(spec.scope, Lease{}, Millis(1000)).has_value());
    ASSERT_TRUE((*txn)
                    ->Finish(spec.scope, claim->record.lease,
                             Outcome{RecordState::kSucceeded, 201, "sealed", "done"})
                    .has_value());
    ASSERT_TRUE((*txn)->Commit().has_value());
  }
  ASSERT_TRUE(store->Read(spec.scope).has_value());
  ASSERT_TRUE(store->Census().has_value());
  ASSERT_TRUE(store->Sweep(10, {}).has_value());
  EXPECT_EQ(Calls(metrics, "begin"), 1);
  EXPECT_EQ(Calls(metrics, "claim"), 1);
  EXPECT_EQ(Calls(metrics, "renew"), 1);
  EXPECT_EQ(Calls(metrics, "finish"), 1);
  EXPECT_EQ(Calls(metrics, "commit"), 1);
  EXPECT_EQ(Calls(metrics, "read"), 1);
  EXPECT_EQ(Calls(metrics, "census"), 1);
  EXPECT_EQ(Calls(metrics, "sweep"), 1);
  EXPECT_EQ(Calls(metrics, "reclaim"), 0);
  // The fake monotonic clock stood still: every call took 0 s, in the first bucket.
  EXPECT_EQ(
      Series(metrics,
             "idem_store_operation_duration_seconds_bucket{operation=\"claim\",le=\"0.0005\"}"),
      1);
}

}  // namespace
}  // namespace idem::testing
