// src/store/sqlite/sqlite_store_test.cc — the contract suite on SQLite files, plus what only
// SQLite has: migrations on open, and several processes sharing one file.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

SqliteStoreOptions Options(const std::string& path, int pool_size) {
  SqliteStoreOptions options;
  options.path = path;
  options.pool_size = pool_size;
  return WithContractTables(options);
}

StoreFactory SqliteFactory(int pool_size, bool synchronous_full) {
  return StoreFactory{
      "SqlitePool" + std::to_string(pool_size) + (synchronous_full ? "Full" : "Normal"),
      [=](StoreTestEnv& env) {
        SqliteStoreOptions options = Options(env.dir.File("idem.db"), pool_size);
        options.synchronous_full = synchronous_full;
        return OpenSqliteStore(options, env.clock, env.random);
      }};
}

INSTANTIATE_TEST_SUITE_P(Sqlite, StoreContractTest,
                         ::testing::Values(SqliteFactory(1, true), SqliteFactory(4, false)),
                         FactoryName);

int64_t QueryInt(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  int64_t value = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

TEST(SqliteStore, OpensInWalModeAndAppliesEachMigrationOnce) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  for (int i = 0; i < 3; ++i) {
    auto store = OpenSqliteStore(Options(path, 2), env.clock, env.random);
    ASSERT_TRUE(store.has_value()) << store.error().message;
  }
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM idem_schema WHERE component = 'idem'"), 6);
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM idem_schema WHERE component = 'contract'"), 2);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

// Migration 4 adds the per-principal record counter: a store that had records before it starts
// with their true counts, and the triggers keep them from then on.
TEST(SqliteStore, TheRecordCounterStartsFromTheRecordsAStoreAlreadyHad) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  {
    auto store = OpenSqliteStore(Options(path, 1), env.clock, env.random);
    ASSERT_TRUE(store.has_value()) << store.error().message;
    for (const auto& [user, key] :
         {std::pair{"alice", "k1"}, {"alice", "k2"}, {"alice", "k3"}, {"bob", "k1"}}) {
      ClaimSpec spec;
      spec.scope = *Scope{"acme", user, "payments.create", key}.Hash();
      spec.tenant = "acme";
      spec.user = user;
      spec.route = "payments.create";
      spec.lease_ttl = Millis(30000);
      spec.retention = Millis(3'600'000);
      auto txn = (*store)->Begin();
      ASSERT_TRUE(txn.has_value() && (*txn)->Claim(spec).has_value() && (*txn)->Commit());
    }
  }
  // Back to a store at version 3, records and all (migration 5 changes nothing on SQLite).
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP TRIGGER idem_retained_insert; DROP TRIGGER idem_retained_delete; "
                         "DROP TABLE idem_retained; DROP INDEX idem_records_held; "
                         "DELETE FROM idem_schema WHERE component = 'idem' AND version >= 4",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);

  auto store = OpenSqliteStore(Options(path, 1), env.clock, env.random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  auto txn = (*store)->Begin();
  ASSERT_TRUE(txn.has_value());
  EXPECT_EQ(*(*txn)->Count("acme", "alice", std::nullopt, 100), 3);
  EXPECT_EQ(*(*txn)->Count("acme", "bob", std::nullopt, 100), 1);
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM idem_schema WHERE component = 'idem'"), 6);
}

TEST(SqliteStore, AppliesANewAppMigrationOnReopen) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  ASSERT_TRUE(OpenSqliteStore(Options(path, 1), env.clock, env.random).has_value());
  SqliteStoreOptions v2 = Options(path, 1);
  v2.apps.at(0).migrations.push_back({3, "ALTER TABLE contract_business ADD COLUMN extra TEXT"});
  auto store = OpenSqliteStore(v2, env.clock, env.random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  EXPECT_EQ(QueryInt(path, "SELECT max(version) FROM idem_schema WHERE component = 'contract'"), 3);
}

TEST(SqliteStore, RefusesASchemaNewerThanItKnows) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  ASSERT_TRUE(OpenSqliteStore(Options(path, 1), env.clock, env.random).has_value());
  QueryInt(path, "INSERT INTO idem_schema VALUES ('idem', 99, 0) RETURNING 1");
  auto store = OpenSqliteStore(Options(path, 1), env.clock, env.random);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, Errc::kDataLoss);
}

// idemctl's read-only open: no file, no table, no migration; only a check of the schema.
TEST(SqliteStore, WithoutMigrationsOpensOnlyAnExistingCurrentSchema) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  SqliteStoreOptions read_only = Options(path, 1);
  read_only.apply_migrations = false;

  auto missing = OpenSqliteStore(read_only, env.clock, env.random);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kInvalidArgument);
  EXPECT_NE(missing.error().message.find("start idemd once"), std::string::npos)
      << missing.error().message;
  EXPECT_FALSE(std::filesystem::exists(path)) << "a read-only open created the file";

  std::ofstream(path).close();  // a fresh, empty file
  auto fresh = OpenSqliteStore(read_only, env.clock, env.random);
  ASSERT_FALSE(fresh.has_value());
  EXPECT_EQ(fresh.error().code, Errc::kInvalidArgument);
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM sqlite_master"), 0) << "it created tables";
  std::filesystem::remove(path);

  // After a normal open (idemd's), the read-only open reads what was written.
  auto owner = OpenSqliteStore(Options(path, 1), env.clock, env.random);
  ASSERT_TRUE(owner.has_value()) << owner.error().message;
  ClaimSpec spec;
  spec.scope = *Scope{"acme", "alice", "r", "read-only-key"}.Hash();
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "r";
  {
    auto txn = std::move(*(*owner)->Begin());
    ASSERT_TRUE(txn->Claim(spec).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  owner->reset();  // idemd stopped: the WAL is checkpointed and its files removed
  read_only.apps.at(0).migrations.push_back({3, "CREATE TABLE never_applied (x INTEGER)"});
  auto reader = OpenSqliteStore(read_only, env.clock, env.random);
  ASSERT_TRUE(reader.has_value()) << reader.error().message;
  auto read = (*reader)->Read(spec.scope);
  ASSERT_TRUE(read.has_value() && read->has_value());
  EXPECT_EQ((*read)->route, "r");
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM sqlite_master WHERE name = 'never_applied'"), 0)
      << "an app migration ran";

  // A schema newer than this build is refused, not used.
  QueryInt(path, "INSERT INTO idem_schema VALUES ('idem', 99, 0) RETURNING 1");
  auto newer = OpenSqliteStore(read_only, env.clock, env.random);
  ASSERT_FALSE(newer.has_value());
  EXPECT_EQ(newer.error().code, Errc::kDataLoss);
}

TEST(SqliteStore, ABrokenMigrationLeavesNothingApplied) {
  StoreTestEnv env;
  const std::string path = env.dir.File("idem.db");
  SqliteStoreOptions options = Options(path, 1);
  options.apps.at(0).migrations = {{1, "CREATE TABLE ok_table (x INTEGER)"},
                                   {2, "THIS IS NOT SQL"}};
  auto store = OpenSqliteStore(options, env.clock, env.random);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, Errc::kInvalidArgument);
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM sqlite_master WHERE name = 'ok_table'"), 0);
}

TEST(SqliteStore, RejectsBadOptions) {
  StoreTestEnv env;
  EXPECT_EQ(OpenSqliteStore(SqliteStoreOptions{}, env.clock, env.random).error().code,
            Errc::kInvalidArgument);
  SqliteStoreOptions too_many = Options(env.dir.File("a.db"), 65);
  EXPECT_EQ(OpenSqliteStore(too_many, env.clock, env.random).error().code, Errc::kInvalidArgument);
  SqliteStoreOptions unnamed = Options(env.dir.File("b.db"), 1);
  unnamed.apps.at(0).name.clear();
  EXPECT_EQ(OpenSqliteStore(unnamed, env.clock, env.random).error().code, Errc::kInvalidArgument);
  SqliteStoreOptions twice = Options(env.dir.File("c.db"), 1);
  twice.apps.push_back(twice.apps.at(0));  // two applications of one name would share versions
  EXPECT_EQ(OpenSqliteStore(twice, env.clock, env.random).error().code, Errc::kInvalidArgument);
  SqliteStoreOptions as_idem = Options(env.dir.File("d.db"), 1);
  as_idem.apps.at(0).name = "idem";
  EXPECT_EQ(OpenSqliteStore(as_idem, env.clock, env.random).error().code, Errc::kInvalidArgument);
  for (const int64_t cache : {kSqliteWriteCacheMinBytes - 1, kSqliteWriteCacheMaxBytes + 1}) {
    SqliteStoreOptions options = Options(env.dir.File("e.db"), 1);
    options.write_cache_bytes = cache;
    EXPECT_EQ(OpenSqliteStore(options, env.clock, env.random).error().code, Errc::kInvalidArgument)
        << cache;
  }
  for (const int pages : {0, 1'000'001}) {
    SqliteStoreOptions options = Options(env.dir.File("f.db"), 1);
    options.wal_autocheckpoint_pages = pages;
    EXPECT_EQ(OpenSqliteStore(options, env.clock, env.random).error().code, Errc::kInvalidArgument)
        << pages;
  }
  SqliteStoreOptions nowhere = Options("/nonexistent-dir/x/idem.db", 1);
  EXPECT_EQ(OpenSqliteStore(nowhere, env.clock, env.random).error().code, Errc::kUnavailable);
}

// The writer checkpoints the WAL into the database file after wal_autocheckpoint_pages: with a
// few pages the WAL file stays a few pages long; with many, the same writes stay in the WAL.
TEST(SqliteStore, TheWriterCheckpointsAfterTheWalPagesItIsGiven) {
  const auto wal_bytes_after_writes = [](int pages) {
    StoreTestEnv env;
    SqliteStoreOptions options = Options(env.dir.File("idem.db"), 1);
    options.wal_autocheckpoint_pages = pages;
    auto store = OpenSqliteStore(options, env.clock, env.random);
    EXPECT_TRUE(store.has_value()) << store.error().message;
    if (!store) return std::uintmax_t{0};
    const std::string value(3000, 'v');  // about a page a row
    for (int i = 0; i < 400; ++i) {
      auto txn = (*store)->Begin();
      EXPECT_TRUE(txn.has_value());
      if (!txn) break;
      EXPECT_TRUE((*txn)->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                               {"k" + std::to_string(i), value}));
      EXPECT_TRUE((*txn)->Commit());
    }
    return std::filesystem::file_size(env.dir.File("idem.db") + "-wal");
  };
  const std::uintmax_t few = wal_bytes_after_writes(10);
  const std::uintmax_t many = wal_bytes_after_writes(100'000);
  EXPECT_LT(few, std::uintmax_t{64} * 4096) << "checkpointed every 10 pages or so";
  EXPECT_GT(many, std::uintmax_t{400} * 4096) << "400 rows of a page each, none checkpointed";
}

TEST(SqliteStore, BeginReportsUnavailableWhenThePoolStaysBusy) {
  StoreTestEnv env;
  SqliteStoreOptions options = Options(env.dir.File("idem.db"), 1);
  options.pool_wait = Millis(50);  // one writer connection per store
  auto store = OpenSqliteStore(options, env.clock, env.random);
  ASSERT_TRUE(store.has_value());
  auto held = (*store)->Begin();
  ASSERT_TRUE(held.has_value());
  auto second = (*store)->Begin();
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().code, Errc::kUnavailable);
}

TEST(SqliteStore, WriteLockHeldByAnotherStoreTimesOutAsUnavailable) {
  StoreTestEnv env;
  SqliteStoreOptions options = Options(env.dir.File("idem.db"), 1);
  options.busy_timeout = Millis(50);
  auto a = OpenSqliteStore(options, env.clock, env.random);
  auto b = OpenSqliteStore(options, env.clock, env.random);
  ASSERT_TRUE(a.has_value() && b.has_value());
  auto held = (*a)->Begin();
  ASSERT_TRUE(held.has_value());
  auto blocked = (*b)->Begin();
  ASSERT_FALSE(blocked.has_value());
  EXPECT_EQ(blocked.error().code, Errc::kUnavailable);
  held->reset();
  EXPECT_TRUE((*b)->Begin().has_value());
}

bool Stored(Store& store, const std::string& key) {
  auto read = store.Read(ContractSpec(key).scope);
  EXPECT_TRUE(read.has_value()) << read.error().message;
  return read && read->has_value();
}

// Three transactions start while `first` holds the writer and run `each` (on their own threads)
// when it is their turn; the group they may form with `first` ends when they are all done.
// Returns their Commit results, in start order, after `first` committed with `*first_commit`.
std::vector<Status> WaitBehind(Store& store, StoreTxn& first, Status* first_commit,
                               const std::function<Status(StoreTxn&, int)>& each) {
  std::vector<Status> results(3, Ok());
  std::vector<std::thread> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.emplace_back([&, i] {
      auto txn = store.Begin();
      results[i] = txn ? each(**txn, i) : Status(std::move(txn).error());
    });
  }
  // Long enough for every thread to reach its wait for the writer (no timing is asserted).
  std::this_thread::sleep_for(Millis(300));
  *first_commit = first.Commit();
  for (std::thread& t : waiting) t.join();
  return results;
}

// A store whose writer is held by `first_`, a transaction that has claimed "k0".
class SqliteGroupCommit : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = OpenSqliteStore(Options(env_.dir.File("idem.db"), 2), env_.clock, env_.random);
    ASSERT_TRUE(opened.has_value()) << opened.error().message;
    store_ = std::move(*opened);
    auto first = store_->Begin();
    ASSERT_TRUE(first.has_value() && (*first)->Claim(ContractSpec("k0")).has_value());
    first_ = std::move(*first);
  }

  // WaitBehind first_, which commits into first_commit_.
  std::vector<Status> RunBehind(const std::function<Status(StoreTxn&, int)>& each) {
    return WaitBehind(*store_, *first_, &first_commit_, each);
  }

  StoreTestEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreTxn> first_;
  Status first_commit_ = Ok();
};

// Group commit: write transactions waiting for the writer when one commits run inside its SQLite
// transaction and share its COMMIT, so the first one's Commit answers only once theirs are
// durable too (one sync for the group).
TEST_F(SqliteGroupCommit, TransactionsWaitingToWriteShareTheCommitOfTheOneBefore) {
  std::vector<Status> results = RunBehind([&](StoreTxn& txn, int i) -> Status {
    IDEM_RETURN_IF_ERROR(txn.Claim(ContractSpec("k" + std::to_string(i + 1))));
    // Not durable yet: another connection does not see it before the group commits.
    EXPECT_FALSE(Stored(*store_, "k0"));
    return txn.Commit();
  });
  ASSERT_TRUE(first_commit_.has_value()) << first_commit_.error().message;
  for (const Status& s : results) EXPECT_TRUE(s.has_value()) << s.error().message;
  for (const char* key : {"k0", "k1", "k2", "k3"}) EXPECT_TRUE(Stored(*store_, key)) << key;
}

// A member that rolls back undoes only its own writes; the rest of its group commits.
TEST_F(SqliteGroupCommit, AGroupMemberThatRollsBackTakesOnlyItsOwnWritesWithIt) {
  std::vector<Status> results = RunBehind([&](StoreTxn& txn, int i) -> Status {
    IDEM_RETURN_IF_ERROR(txn.Claim(ContractSpec("k" + std::to_string(i + 1))));
    if (i == 1) return Ok();  // destroyed uncommitted: rolled back
    return txn.Commit();
  });
  ASSERT_TRUE(first_commit_.has_value()) << first_commit_.error().message;
  for (const Status& s : results) EXPECT_TRUE(s.has_value()) << s.error().message;
  EXPECT_TRUE(Stored(*store_, "k0"));
  EXPECT_TRUE(Stored(*store_, "k1"));
  EXPECT_FALSE(Stored(*store_, "k2"));
  EXPECT_TRUE(Stored(*store_, "k3"));
  auto txn = store_->Begin();
  ASSERT_TRUE(txn.has_value());
  EXPECT_EQ(*(*txn)->Count("acme", "alice", std::nullopt, 100), 3);
}

// When the database rolls the whole transaction back, every member of the group learns at its
// Commit that nothing was committed; the next transaction starts a new group.
TEST_F(SqliteGroupCommit, WhenTheGroupIsRolledBackEveryMembersCommitFails) {
  std::atomic<int> turns{0};
  std::vector<int> turn_of(3, -1);
  std::vector<Status> results = RunBehind([&](StoreTxn& txn, int i) -> Status {
    const int turn = turns++;  // in the order they hold the writer
    turn_of[i] = turn;
    IDEM_RETURN_IF_ERROR(txn.Claim(ContractSpec("t" + std::to_string(turn))));
    if (turn == 1) {
      EXPECT_TRUE(txn.Exec("ROLLBACK").has_value());  // business SQL ends it all
      // No statement runs outside the transaction after that.
      EXPECT_FALSE(txn.Exec("INSERT INTO contract_business (k, v) VALUES ('x', 'y')"));
    }
    return txn.Commit();
  });
  ASSERT_FALSE(first_commit_.has_value());
  EXPECT_EQ(first_commit_.error().code, Errc::kUnavailable);
  for (int i = 0; i < 3; ++i) {
    if (turn_of[i] < 2) {  // in the group that was rolled back
      ASSERT_FALSE(results[i].has_value()) << "turn " << turn_of[i];
      EXPECT_EQ(results[i].error().code, Errc::kUnavailable) << results[i].error().message;
    } else {  // the next group
      EXPECT_TRUE(results[i].has_value()) << results[i].error().message;
    }
  }
  for (const char* key : {"k0", "t0", "t1"}) EXPECT_FALSE(Stored(*store_, key)) << key;
  EXPECT_TRUE(Stored(*store_, "t2"));
  EXPECT_EQ(QueryInt(env_.dir.File("idem.db"), "SELECT count(*) FROM contract_business"), 0);
}

// Several processes claim the same scopes in one file: each scope has exactly one winner.
TEST(SqliteStore, ProcessesSharingTheFileClaimEachScopeOnce) {
  constexpr int kProcesses = 4;
  constexpr int kScopes = 300;
  TempDir dir;
  const std::string path = dir.File("idem.db");
  {
    FakeClock clock;
    SeededRandom random(1);
    ASSERT_TRUE(OpenSqliteStore(Options(path, 1), clock, random).has_value());
  }
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FakeClock clock;
      SeededRandom random(static_cast<uint64_t>(100 + p));
      auto store = OpenSqliteStore(Options(path, 2), clock, random);
      if (!store) _exit(2);
      std::ofstream wins(dir.File("wins-" + std::to_string(p)));
      for (int i = 0; i < kScopes; ++i) {
        ClaimSpec spec;
        spec.scope = *Scope{"acme", "alice", "r", "multi-" + std::to_string(i)}.Hash();
        spec.tenant = "acme";
        spec.user = "alice";
        spec.route = "r";
        auto txn = (*store)->Begin();
        if (!txn) _exit(3);
        auto claim = (*txn)->Claim(spec);
        if (!claim || !(*txn)->Commit()) _exit(4);
        if (claim->claimed) wins << i << "\n";
      }
      wins.close();
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
  }
  std::vector<int> winners(kScopes, 0);
  for (int p = 0; p < kProcesses; ++p) {
    std::ifstream in(dir.File("wins-" + std::to_string(p)));
    int i;
    while (in >> i) ++winners[static_cast<std::size_t>(i)];
  }
  for (int i = 0; i < kScopes; ++i) EXPECT_EQ(winners[static_cast<std::size_t>(i)], 1) << i;
  EXPECT_EQ(QueryInt(path, "SELECT count(*) FROM idem_records"), kScopes);
}

}  // namespace
}  // namespace idem::testing
