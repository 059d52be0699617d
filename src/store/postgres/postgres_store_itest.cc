// src/store/postgres/postgres_store_itest.cc — the store contract suite on a real PostgreSQL
// (started by scripts/with-services; its address in IDEM_TEST_PG_URL), plus what only this
// backend has: migrations under an advisory lock from many processes at once, schemas, lost
// connections, and the bounds on every call: a row locked by a stuck transaction, a server
// process stopped mid-run (SIGSTOP, only the backends serving the test's own store), a server
// that accepts connections and never answers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "idem/store/postgres.h"
#include "testing/fakes.h"
#include "testing/round_trips.h"
#include "testing/services.h"
#include "testing/stall.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

// The server's address, or "" — then every test here is skipped, unless IDEM_REQUIRE_SERVICES
// is set (as scripts/test sets it), which turns the absence into a failure (testing/services.h).
std::string ServerUrl() { return ServiceUrl("IDEM_TEST_PG_URL"); }

#define REQUIRE_POSTGRES() IDEM_NEED_SERVICE(ServerUrl(), "IDEM_TEST_PG_URL")

// A schema of its own for every test, so tests share the server but not data.
std::string FreshSchema() {
  static std::mt19937_64 rng(std::random_device{}());
  char buf[32];
  std::snprintf(buf, sizeof buf, "t%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

PostgresStoreOptions Options(const std::string& schema, int pool_size, bool prepared) {
  PostgresStoreOptions options;
  options.conninfo = ServerUrl();
  options.schema = schema;
  options.pool_size = pool_size;
  options.prepared_statements = prepared;
  return WithContractTables(options);
}

// `notifications` false: a store that announces no completion (PostgresStoreOptions), on which
// the whole contract holds as well.
StoreFactory PostgresFactory(int pool_size, bool prepared, bool notifications) {
  // Every instance a test opens shares the test's schema: a second instance is a second process.
  auto schemas = std::make_shared<std::map<const StoreTestEnv*, std::string>>();
  return StoreFactory{std::string("PostgresPool") + std::to_string(pool_size) +
                          (prepared ? "Prepared" : "Plain") + (notifications ? "" : "Quiet"),
                      [=](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
                        auto& schema = (*schemas)[&env];
                        if (schema.empty()) schema = FreshSchema();
                        PostgresStoreOptions options = Options(schema, pool_size, prepared);
                        options.notifications = notifications;
                        return OpenPostgresStore(options, env.clock, env.random);
                      },
                      {"IDEM_TEST_PG_URL"}};
}

INSTANTIATE_TEST_SUITE_P(Postgres, StoreContractTest,
                         ::testing::Values(PostgresFactory(8, true, true),
                                           PostgresFactory(4, false, false)),
                         FactoryName);

int64_t QueryInt(const std::string& sql) {
  PGconn* c = PQconnectdb(ServerUrl().c_str());
  PGresult* r = PQexec(c, sql.c_str());
  int64_t v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                  ? std::atoll(PQgetvalue(r, 0, 0))
                  : -1;
  PQclear(r);
  PQfinish(c);
  return v;
}

TEST(PostgresStore, ManyProcessesMigratingAtOnceApplyEachMigrationOnce) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  std::vector<pid_t> children;
  for (int i = 0; i < 6; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FakeClock clock;
      SeededRandom random(static_cast<uint64_t>(i));
      _exit(OpenPostgresStore(Options(schema, 1, true), clock, random).has_value() ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(QueryInt("SELECT count(*) FROM " + schema + ".idem_schema WHERE component = 'idem'"),
            6);
  EXPECT_EQ(
      QueryInt("SELECT count(*) FROM " + schema + ".idem_schema WHERE component = 'contract'"),
      static_cast<int64_t>(ContractMigrations().size()));
}

// A store opened without a clock runs on the database's: every lease, takeover, expiry and sweep
// is decided by the server's time of the statement, and every record read carries that time
// (observed_at). Two such stores — two instances — agree on a lease whatever their own clocks
// say, because neither reads one.
TEST(PostgresStore, LeasesAndExpiriesRunOnTheDatabasesClock) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  SeededRandom random_a(1), random_b(2);
  auto a = std::move(*OpenPostgresStore(Options(schema, 2, true), random_a));
  auto b = std::move(*OpenPostgresStore(Options(schema, 2, false), random_b));
  auto db_now = [&] {
    auto rows = a->Query("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint");
    EXPECT_TRUE(rows.has_value());
    return FromUnixMillis(std::get<int64_t>((*rows)[0][0]));
  };
  ClaimSpec spec;
  spec.scope = *Scope{"acme", "alice", "r", "db-clock-key-1"}.Hash();
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "r";
  spec.lease_ttl = Millis(700);
  spec.retention = Millis(1500);

  const Timestamp before = db_now();
  Record claimed;
  {
    auto txn = std::move(*a->Begin());
    auto claim = txn->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    claimed = claim->record;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  const Timestamp after = db_now();
  EXPECT_GE(claimed.observed_at, before);
  EXPECT_LE(claimed.observed_at, after);
  EXPECT_EQ(claimed.created_at, claimed.observed_at) << "one time for the whole statement";
  EXPECT_EQ(claimed.lease.until, claimed.observed_at + spec.lease_ttl);
  EXPECT_EQ(claimed.expires_at, claimed.observed_at + spec.retention);

  // The other instance sees the lease live and cannot take it over.
  {
    auto txn = std::move(*b->Begin());
    auto claim = txn->Claim(spec);
    ASSERT_TRUE(claim.has_value());
    EXPECT_FALSE(claim->claimed);
    EXPECT_GT(claim->record.lease.until, claim->record.observed_at);
    auto taken = txn->Reclaim(spec, claim->record.lease.fence);
    ASSERT_FALSE(taken.has_value());
    EXPECT_EQ(taken.error().code, Errc::kConflict);
  }
  // Once the database's clock has passed the lease, it can.
  std::this_thread::sleep_for(spec.lease_ttl + Millis(100));
  Record taken;
  {
    auto txn = std::move(*b->Begin());
    auto r = txn->Reclaim(spec, claimed.lease.fence);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    taken = *r;
    EXPECT_GT(taken.observed_at, claimed.lease.until);
    auto renewed = txn->Renew(spec.scope, taken.lease, Millis(60000));
    ASSERT_TRUE(renewed.has_value());
    EXPECT_GE(renewed->until, taken.observed_at + Millis(60000));
    EXPECT_LE(renewed->until, db_now() + Millis(60000));
    ASSERT_TRUE(txn->Finish(spec.scope, *renewed, {RecordState::kSucceeded, 201, "sealed", ""})
                    .has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  auto read = a->Read(spec.scope);
  ASSERT_TRUE(read.has_value() && read->has_value());
  EXPECT_GT((*read)->expires_at, (*read)->observed_at) << "kept a retention from the takeover";
  EXPECT_EQ(*a->Sweep(10, {}), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(
      std::max<int64_t>(0, ToUnixMillis((*read)->expires_at) - ToUnixMillis(db_now())) + 100));
  EXPECT_EQ(*a->Sweep(10, {}), 1) << "expired by the database's clock";
}

// What only PostgreSQL has among the types SqlValue decodes, and a type it refuses.
TEST(PostgresStore, DecodesItsOwnTypesAndRefusesUnknownOnes) {
  REQUIRE_POSTGRES();
  FakeClock clock;
  SeededRandom random(3);
  auto store = OpenPostgresStore(Options(FreshSchema(), 1, true), clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  auto rows = (*store)->Query(
      "SELECT 12345.6789::numeric, (-0.00012)::numeric, 0::numeric(10, 2), 10000::numeric, "
      "'NaN'::numeric, 123456789012345678901234567890.5::numeric, 1.5::real, true, 7::smallint, "
      "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, '{\"k\": [1, 2]}'::jsonb, 'x'::varchar(4), "
      "'1999-12-31 23:59:59.9995'::timestamp, ?::timestamptz, ?::double precision",
      {FromUnixMillis(1'800'000'000'123), -0.125});
  ASSERT_TRUE(rows.has_value()) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  const SqlRow& r = rows->at(0);
  ASSERT_EQ(r.size(), 15u);
  const std::vector<std::string> numerics = {
      "12345.6789", "-0.00012", "0.00", "10000", "NaN", "123456789012345678901234567890.5"};
  for (std::size_t i = 0; i < numerics.size(); ++i) {
    ASSERT_TRUE(std::holds_alternative<std::string>(r[i])) << "numeric " << i;
    EXPECT_EQ(std::get<std::string>(r[i]), numerics[i]);
  }
  EXPECT_EQ(std::get<double>(r[6]), 1.5);
  EXPECT_EQ(std::get<int64_t>(r[7]), 1);
  EXPECT_EQ(std::get<int64_t>(r[8]), 7);
  EXPECT_EQ(std::get<std::string>(r[9]), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
  EXPECT_EQ(std::get<std::string>(r[10]), "{\"k\": [1, 2]}");
  EXPECT_EQ(std::get<std::string>(r[11]), "x");
  // Microseconds round down to the millisecond, before the epoch too.
  EXPECT_EQ(std::get<Timestamp>(r[12]), FromUnixMillis(946'684'799'999));
  EXPECT_EQ(std::get<Timestamp>(r[13]), FromUnixMillis(1'800'000'000'123));
  EXPECT_EQ(std::get<double>(r[14]), -0.125);

  auto array = (*store)->Query("SELECT ARRAY[1, 2]");
  ASSERT_FALSE(array.has_value());
  EXPECT_EQ(array.error().code, Errc::kInvalidArgument);
  EXPECT_NE(array.error().message.find("column 0"), std::string::npos) << array.error().message;
}

TEST(PostgresStore, RefusesASchemaNewerThanItKnows) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(1);
  ASSERT_TRUE(OpenPostgresStore(Options(schema, 1, true), clock, random).has_value());
  QueryInt("WITH x AS (INSERT INTO " + schema +
           ".idem_schema VALUES ('idem', 99, 0) RETURNING 1) "
           "SELECT count(*) FROM x");
  auto store = OpenPostgresStore(Options(schema, 1, true), clock, random);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, Errc::kDataLoss);
}

// idemctl's read-only open: no schema is created; an existing one is checked and read.
TEST(PostgresStore, WithoutMigrationsOpensOnlyAnExistingCurrentSchema) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(1);
  PostgresStoreOptions read_only = Options(schema, 1, true);
  read_only.apply_migrations = false;
  auto missing = OpenPostgresStore(read_only, clock, random);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kInvalidArgument);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM pg_namespace WHERE nspname = '" + schema + "'"), 0)
      << "a read-only open created the schema";

  ASSERT_TRUE(OpenPostgresStore(Options(schema, 1, true), clock, random).has_value());
  read_only.apps.at(0).migrations.push_back({3, "CREATE TABLE never_applied (x BIGINT)"});
  auto reader = OpenPostgresStore(read_only, clock, random);
  ASSERT_TRUE(reader.has_value()) << reader.error().message;
  EXPECT_EQ(QueryInt("SELECT count(*) FROM pg_tables WHERE schemaname = '" + schema +
                     "' AND tablename = 'never_applied'"),
            0)
      << "an app migration ran";
  auto read = (*reader)->Read(*Scope{"acme", "alice", "r", "read-only-key"}.Hash());
  ASSERT_TRUE(read.has_value()) << read.error().message;
  EXPECT_FALSE(read->has_value());

  QueryInt("WITH x AS (INSERT INTO " + schema +
           ".idem_schema VALUES ('idem', 99, 0) RETURNING 1) SELECT count(*) FROM x");
  auto newer = OpenPostgresStore(read_only, clock, random);
  ASSERT_FALSE(newer.has_value());
  EXPECT_EQ(newer.error().code, Errc::kDataLoss);
}

TEST(PostgresStore, RejectsBadOptionsAndUnreachableServers) {
  FakeClock clock;
  SeededRandom random(1);
  PostgresStoreOptions bad_schema;
  bad_schema.conninfo = "postgresql://127.0.0.1:1/x";
  bad_schema.schema = "Robert'); DROP TABLE x;--";
  EXPECT_EQ(OpenPostgresStore(bad_schema, clock, random).error().code, Errc::kInvalidArgument);
  PostgresStoreOptions nowhere;
  nowhere.conninfo = "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2";
  EXPECT_EQ(OpenPostgresStore(nowhere, clock, random).error().code, Errc::kUnavailable);
}

// `options` with its connections named `name` in pg_stat_activity, so a test can find the server
// processes serving its own store (tests run in parallel on the same server).
PostgresStoreOptions Named(PostgresStoreOptions options, const std::string& name) {
  options.conninfo += (options.conninfo.find('?') == std::string::npos ? "?" : "&") +
                      std::string("application_name=") + name;
  return options;
}

// Each bound is accepted at its limit and refused one past it, before anything connects.
TEST(PostgresStore, TimeoutsHoldAtTheirLimitsAndOnePast) {
  using std::chrono::seconds;
  struct Case {
    std::function<void(PostgresTimeouts&)> at_limit;
    std::function<void(PostgresTimeouts&)> past_limit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](auto& t) { t.connect = Millis(1); }, [](auto& t) { t.connect = Millis(0); }, "connect"},
      {[](auto& t) { t.connect = Millis(3'600'000); },
       [](auto& t) { t.connect = Millis(3'600'001); }, "connect"},
      {[](auto& t) { t.statement = t.lock = Millis(1); }, [](auto& t) { t.statement = Millis(0); },
       "statement"},
      {[](auto& t) { t.statement = Millis(3'600'000); },
       [](auto& t) { t.statement = Millis(3'600'001); }, "statement"},
      {[](auto& t) { t.lock = t.statement; }, [](auto& t) { t.lock = t.statement + Millis(1); },
       "lock"},
      {[](auto& t) { t.lock = Millis(1); }, [](auto& t) { t.lock = Millis(0); }, "lock"},
      {[](auto& t) { t.idle_in_transaction = Millis(1); },
       [](auto& t) { t.idle_in_transaction = Millis(0); }, "idle_in_transaction"},
      {[](auto& t) { t.keepalives_idle = seconds(32767); },
       [](auto& t) { t.keepalives_idle = seconds(32768); }, "keepalives_idle"},
      {[](auto& t) { t.keepalives_interval = seconds(1); },
       [](auto& t) { t.keepalives_interval = seconds(0); }, "keepalives_interval"},
      {[](auto& t) { t.keepalives_count = 127; }, [](auto& t) { t.keepalives_count = 128; },
       "keepalives_count"},
      {[](auto& t) { t.keepalives_count = 1; }, [](auto& t) { t.keepalives_count = 0; },
       "keepalives_count"},
  };
  EXPECT_TRUE(ValidatePostgresTimeouts(PostgresTimeouts{}));
  for (const Case& k : cases) {
    PostgresTimeouts ok;
    k.at_limit(ok);
    EXPECT_TRUE(ValidatePostgresTimeouts(ok)) << k.expect;
    PostgresTimeouts bad;
    k.past_limit(bad);
    const Status refused = ValidatePostgresTimeouts(bad);
    ASSERT_FALSE(refused) << k.expect;
    EXPECT_EQ(refused.error().code, Errc::kInvalidArgument);
    EXPECT_NE(refused.error().message.find(k.expect), std::string::npos) << refused.error().message;
  }
  FakeClock clock;
  SeededRandom random(1);
  PostgresStoreOptions options;
  options.conninfo = "postgresql://127.0.0.1:1/x";
  options.timeouts.statement = Millis(0);
  EXPECT_EQ(OpenPostgresStore(options, clock, random).error().code, Errc::kInvalidArgument);
}

// A server-side kill of every connection of the store: the pool replaces them, nothing is guessed.
TEST(PostgresStore, LostConnectionsAreReplaced) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(2);
  // Only this store's connections are killed (tests run in parallel on the same server).
  const PostgresStoreOptions options = Named(Options(schema, 2, true), schema);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  const ScopeHash scope = *Scope{"acme", "alice", "r", "lost-conn-key"}.Hash();
  EXPECT_TRUE((*store)->Read(scope).has_value());
  EXPECT_EQ(QueryInt("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                     "application_name = '" +
                     schema + "'"),
            2);
  // Reads retry on a fresh connection.
  auto read = (*store)->Read(scope);
  ASSERT_TRUE(read.has_value()) << read.error().message;
  // Transactions start on a fresh connection too.
  auto txn = (*store)->Begin();
  ASSERT_TRUE(txn.has_value()) << txn.error().message;
  ClaimSpec spec;
  spec.scope = scope;
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "r";
  auto claim = (*txn)->Claim(spec);
  ASSERT_TRUE(claim.has_value()) << claim.error().message;
  EXPECT_TRUE(claim->claimed);
  EXPECT_TRUE((*txn)->Commit().has_value());
}

// ---- Bounds: nothing a database does blocks a caller without end -------------------------------

using std::chrono::milliseconds;

// Generous slack over a bound, for a loaded machine; a call that is not bounded blocks until the
// test unblocks it after kGiveUp.
constexpr milliseconds kSlack{1500};
constexpr milliseconds kGiveUp{15000};

// A session of its own on the test server, closed on destruction (which rolls back whatever it
// holds, also when a test fails).
class RawSession {
 public:
  RawSession() : conn_(PQconnectdb(ServerUrl().c_str())) {}
  ~RawSession() { Close(); }
  RawSession(const RawSession&) = delete;
  RawSession& operator=(const RawSession&) = delete;

  // Runs `sql`; the first column of its first row, or "" (errors fail the test).
  std::string Exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    const ExecStatusType status = PQresultStatus(r);
    EXPECT_TRUE(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK)
        << sql << ": " << PQerrorMessage(conn_);
    std::string v = status == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    return v;
  }
  void Close() {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
  }

 private:
  PGconn* conn_;
};

// Every row of `table` locked by a transaction left open, as a stuck instance would leave it.
std::unique_ptr<RawSession> LockRows(const std::string& schema, const std::string& table) {
  auto holder = std::make_unique<RawSession>();
  holder->Exec("BEGIN");
  holder->Exec("SELECT count(*) FROM (SELECT 1 FROM " + schema + "." + table +
               " FOR UPDATE) AS locked");
  return holder;
}

// The server processes serving connections named `name`, when they run on this machine. Waits
// (up to 2 s) for `expected` of them: the session that applied the migrations goes away
// asynchronously, and a process on its way out is not one to stop.
std::vector<pid_t> LocalBackends(const std::string& name, std::size_t expected) {
  RawSession session;
  std::vector<pid_t> out;
  for (int i = 0; i < 100; ++i) {
    const std::string pids = session.Exec(
        "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE application_name = '" +
        name + "'");
    out.clear();
    std::istringstream in(pids);
    for (pid_t pid; in >> pid;) out.push_back(pid);
    if (out.size() == expected) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::erase_if(out, [](pid_t pid) { return !IsLocalProcess(pid, "postgres"); });
  return out;
}

ClaimSpec Spec(const std::string& key) {
  ClaimSpec spec;
  spec.scope = *Scope{"acme", "alice", "r", key}.Hash();
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "r";
  return spec;
}

int64_t BackendPid(Store& store) {
  auto rows = store.Query("SELECT pg_backend_pid()");
  return rows && rows->size() == 1 ? std::get<int64_t>(rows->at(0).at(0)) : -1;
}

template <typename T>
std::string Describe(const Result<T>& r) {
  return r ? "ok" : r.error().message;
}

// A row held by a transaction that never ends: the statement that needs it fails as retryable
// once lock_timeout has passed; the connection stays usable and reads never wait for row locks.
TEST(PostgresStore, ARowLockedByAStuckTransactionIsUnavailableWithinTheLockTimeout) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(4);
  PostgresStoreOptions options = Options(schema, 1, true);
  options.timeouts.lock = milliseconds(500);
  options.timeouts.statement = milliseconds(3000);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  const ClaimSpec spec = Spec("locked-row-key");
  Lease lease;
  {
    auto txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto claim = (*txn)->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    lease = claim->record.lease;
    ASSERT_TRUE((*txn)->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                             {std::string("k1"), std::string("v1")}));
    ASSERT_TRUE((*txn)->Commit());
  }
  const int64_t backend = BackendPid(**store);

  {
    auto holder = LockRows(schema, "idem_records");
    auto read = CallWithin(
        kGiveUp, [&] { return (*store)->Read(spec.scope); }, [&] { holder->Close(); });
    EXPECT_TRUE(read.value.has_value()) << Describe(read.value);
    EXPECT_LT(read.elapsed, kSlack) << "a snapshot read waited for a row lock";

    auto renew = CallWithin(
        kGiveUp,
        [&]() -> Status {
          IDEM_ASSIGN_OR_RETURN(auto txn, (*store)->Begin());
          IDEM_RETURN_IF_ERROR(txn->Renew(spec.scope, lease, milliseconds(30000)));
          return Ok();
        },
        [&] { holder->Close(); });
    EXPECT_FALSE(renew.overran) << "Renew blocked " << renew.elapsed.count()
                                << " ms on the locked record, until the test released it";
    ASSERT_FALSE(renew.value.has_value()) << "Renew succeeded on a locked record";
    EXPECT_EQ(renew.value.error().code, Errc::kUnavailable) << renew.value.error().message;
    EXPECT_GE(renew.elapsed, milliseconds(400)) << "it failed before lock_timeout";
    EXPECT_LT(renew.elapsed, options.timeouts.lock + kSlack);
  }
  {
    auto holder = LockRows(schema, "contract_business");
    auto txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto update = CallWithin(
        kGiveUp,
        [&] {
          return (*txn)->Exec("UPDATE contract_business SET v = ? WHERE k = ?",
                              {std::string("v2"), std::string("k1")});
        },
        [&] { holder->Close(); });
    EXPECT_FALSE(update.overran) << "Exec blocked " << update.elapsed.count()
                                 << " ms on a locked business row, until the test released it";
    ASSERT_FALSE(update.value.has_value()) << "Exec updated a locked row";
    EXPECT_EQ(update.value.error().code, Errc::kUnavailable) << update.value.error().message;
    EXPECT_LT(update.elapsed, options.timeouts.lock + kSlack);
    // A failed Exec leaves its transaction usable.
    auto get = (*txn)->Get(spec.scope);
    EXPECT_TRUE(get.has_value() && get->has_value()) << Describe(get);
  }
  {
    // The locks are gone: the same connection serves again.
    auto txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto renewed = (*txn)->Renew(spec.scope, lease, milliseconds(30000));
    EXPECT_TRUE(renewed.has_value()) << Describe(renewed);
    EXPECT_TRUE((*txn)->Commit());
  }
  EXPECT_EQ(BackendPid(**store), backend) << "a lock timeout cost the connection";
}

// Two claims of one principal, each in its transaction: the second claims, counts and commits
// while the first is still open, and waits for nothing. Before migration 5 the counter's insert
// trigger took the principal's idem_retained row at the first claim's insert and held it to its
// commit, so the second claim's insert waited for the whole first transaction (here: until its
// lock timeout, 500 ms, and then failed). Both still count exactly: each its own insert and what
// had committed before it counted.
TEST(PostgresStore, ClaimsOfOnePrincipalWaitForEachOtherOnlyFromTheirCount) {
  REQUIRE_POSTGRES();
  FakeClock clock;
  SeededRandom random(5);
  PostgresStoreOptions options = Options(FreshSchema(), 2, true);
  options.timeouts.lock = milliseconds(500);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;

  auto first = (*store)->Begin();
  ASSERT_TRUE(first.has_value()) << first.error().message;
  auto claimed = (*first)->Claim(Spec("open-claim"));
  ASSERT_TRUE(claimed.has_value() && claimed->claimed) << Describe(claimed);

  auto second = CallWithin(
      kGiveUp,
      [&]() -> Result<int64_t> {
        IDEM_ASSIGN_OR_RETURN(auto txn, (*store)->Begin());
        IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn->Claim(Spec("committed-claim")));
        if (!claim.claimed) return MakeError(Errc::kInternal, "not claimed");
        IDEM_ASSIGN_OR_RETURN(int64_t retained, txn->Count("acme", "alice", std::nullopt, 100));
        IDEM_RETURN_IF_ERROR(txn->Commit());
        return retained;
      },
      [&] { first->reset(); });
  ASSERT_FALSE(second.overran) << "the second claim waited for the first transaction";
  ASSERT_TRUE(second.value.has_value()) << Describe(second.value);
  EXPECT_EQ(*second.value, 1) << "its own insert; the open claim has not committed";
  EXPECT_LT(second.elapsed, kSlack);

  auto counted = (*first)->Count("acme", "alice", std::nullopt, 100);
  ASSERT_TRUE(counted.has_value()) << Describe(counted);
  EXPECT_EQ(*counted, 2) << "the committed claim and its own insert";
  ASSERT_TRUE((*first)->Commit());

  auto after = (*store)->Begin();
  ASSERT_TRUE(after.has_value());
  auto total = (*after)->Count("acme", "alice", std::nullopt, 100);
  ASSERT_TRUE(total.has_value()) << Describe(total);
  EXPECT_EQ(*total, 2) << "each insert counted once, as its transaction committed";
}

// Two claims of one principal count their quota one after the other, across connections: the
// second's count waits (a row lock, on the principal's idem_retained row) until the first has
// committed, then counts its record. First for a principal with no counter row yet, then for one
// with a row. The lock is a row lock and nothing else: neither transaction holds an advisory
// lock, which a distributed PostgreSQL does not share between nodes. Before this test the
// counts serialised on pg_advisory_xact_lock(hashtext(principal)).
TEST(PostgresStore, QuotaCountsOfOnePrincipalSerialiseOnARowLockAlone) {
  REQUIRE_POSTGRES();
  FakeClock clock;
  SeededRandom random(7);
  PostgresStoreOptions options = Options(FreshSchema(), 2, true);
  options.timeouts.statement = kGiveUp;  // the second count waits for the test, not a timeout
  options.timeouts.lock = kGiveUp;
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  RawSession observer;
  auto pid_of = [](StoreTxn& txn) -> int64_t {
    auto rows = txn.Exec("SELECT pg_backend_pid()", {});
    return rows && rows->size() == 1 ? std::get<int64_t>(rows->at(0).at(0)) : -1;
  };
  auto advisory_locks = [&](int64_t pid) {
    return observer.Exec("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = " +
                         std::to_string(pid));
  };

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "no counter row yet" : "a counter row");
    auto first = (*store)->Begin();
    ASSERT_TRUE(first.has_value()) << first.error().message;
    const int64_t first_pid = pid_of(**first);
    auto claimed = (*first)->Claim(Spec("first-" + std::to_string(round)));
    ASSERT_TRUE(claimed.has_value() && claimed->claimed) << Describe(claimed);
    auto counted = (*first)->CountQuota("acme", "alice", 100, 100);
    ASSERT_TRUE(counted.has_value()) << Describe(counted);
    EXPECT_EQ(counted->processing, 2 * round + 1);
    EXPECT_EQ(counted->retained, 2 * round + 1);
    EXPECT_EQ(advisory_locks(first_pid), "0");

    std::atomic<int64_t> second_pid{-1};
    auto second = std::async(std::launch::async, [&]() -> Result<StoreTxn::QuotaCounts> {
      IDEM_ASSIGN_OR_RETURN(auto txn, (*store)->Begin());
      second_pid = pid_of(*txn);
      IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn->Claim(Spec("second-" + std::to_string(round))));
      if (!claim.claimed) return MakeError(Errc::kInternal, "not claimed");
      IDEM_ASSIGN_OR_RETURN(StoreTxn::QuotaCounts n, txn->CountQuota("acme", "alice", 100, 100));
      IDEM_RETURN_IF_ERROR(txn->Commit());
      return n;
    });
    // Until the second transaction waits for a lock, or is done (then it did not wait).
    bool waiting = false;
    for (auto start = std::chrono::steady_clock::now();
         !waiting && std::chrono::steady_clock::now() - start < kGiveUp &&
         second.wait_for(milliseconds(10)) != std::future_status::ready;) {
      waiting = second_pid >= 0 &&
                observer.Exec("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = " +
                              std::to_string(second_pid.load())) != "0";
    }
    EXPECT_TRUE(waiting) << "the second count did not wait for the first transaction";
    EXPECT_NE(second.wait_for(milliseconds(0)), std::future_status::ready);
    EXPECT_EQ(advisory_locks(second_pid), "0");
    ASSERT_TRUE((*first)->Commit());
    first->reset();
    auto n = second.get();
    ASSERT_TRUE(n.has_value()) << Describe(n);
    EXPECT_EQ(n->processing, 2 * round + 2) << "the first claim, committed, and its own";
    EXPECT_EQ(n->retained, 2 * round + 2);
  }
}

// A payment's success, as Finish records it.
Outcome Succeeded() {
  Outcome outcome;
  outcome.state = RecordState::kSucceeded;
  outcome.status_code = 201;
  outcome.sealed_response = "sealed";
  outcome.recovery_point = "done";
  outcome.retention = Millis(60000);
  return outcome;
}

// Claims `key` and finishes it as succeeded, in two transactions, as an execution does.
Status ClaimAndFinish(Store& store, const ClaimSpec& spec) {
  Lease lease;
  {
    IDEM_ASSIGN_OR_RETURN(auto txn, store.Begin());
    IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn->Claim(spec));
    if (!claim.claimed) return MakeError(Errc::kInternal, "not claimed");
    lease = claim.record.lease;
    IDEM_RETURN_IF_ERROR(txn->Commit());
  }
  IDEM_ASSIGN_OR_RETURN(auto txn, store.Begin());
  IDEM_RETURN_IF_ERROR(txn->Finish(spec.scope, lease, Succeeded()));
  return txn->Commit();
}

// With notifications off a store announces no completion: it has no listener to offer, and a
// session LISTENing on idem_finished hears the completion of a store with notifications on, and
// never the one a quiet store committed before it (notifications arrive in commit order).
TEST(PostgresStore, WithNotificationsOffACompletionNotifiesNoOne) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(8);
  PostgresStoreOptions options = Options(schema, 1, true);
  options.notifications = false;
  auto quiet = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(quiet.has_value()) << quiet.error().message;
  EXPECT_FALSE((*quiet)->capabilities().notifications);
  auto subscription = (*quiet)->SubscribeFinished([](const ScopeHash&) {});
  ASSERT_FALSE(subscription.has_value());
  EXPECT_EQ(subscription.error().code, Errc::kUnavailable);
  options.notifications = true;
  auto notifying = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(notifying.has_value()) << notifying.error().message;
  EXPECT_TRUE((*notifying)->capabilities().notifications);

  PGconn* listener = PQconnectdb(ServerUrl().c_str());
  ASSERT_EQ(PQstatus(listener), CONNECTION_OK) << PQerrorMessage(listener);
  PQclear(PQexec(listener, "LISTEN idem_finished"));
  const ClaimSpec unheard = Spec("quiet-finish");
  const ClaimSpec heard = Spec("notifying-finish");
  ASSERT_TRUE(ClaimAndFinish(**quiet, unheard));
  ASSERT_TRUE(ClaimAndFinish(**notifying, heard));
  bool heard_it = false;
  bool heard_quiet = false;
  const std::string heard_hex = ToHex(heard.scope);
  const std::string unheard_hex = ToHex(unheard.scope);
  for (auto start = std::chrono::steady_clock::now();
       !heard_it && std::chrono::steady_clock::now() - start < kGiveUp;) {
    PQconsumeInput(listener);
    while (PGnotify* n = PQnotifies(listener)) {
      heard_it = heard_it || n->extra == heard_hex;
      heard_quiet = heard_quiet || n->extra == unheard_hex;
      PQfreemem(n);
    }
    if (!heard_it) std::this_thread::sleep_for(milliseconds(10));
  }
  PQfinish(listener);
  EXPECT_TRUE(heard_it) << "the notifying store's completion";
  EXPECT_FALSE(heard_quiet) << "the quiet store's completion was announced";
  auto read = (*quiet)->Read(unheard.scope);
  ASSERT_TRUE(read.has_value() && read->has_value()) << Describe(read);
  EXPECT_EQ((*read)->state, RecordState::kSucceeded) << "finished all the same";
}

// The backend serving the store's only connection stops (SIGSTOP) while idle: the next call sends
// its statement and hears nothing. It fails as retryable once the client's answer deadline
// (statement timeout + 1 s) has passed, and the pool serves again on a fresh connection.
TEST(PostgresStore, AStoppedServerProcessIsUnavailableWithinTheStatementBound) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(5);
  PostgresStoreOptions options = Options(schema, 1, true);
  options.timeouts.statement = milliseconds(1000);
  options.timeouts.lock = milliseconds(500);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  const ScopeHash scope = Spec("stopped-read-key").scope;
  ASSERT_TRUE((*store)->Read(scope).has_value());
  const pid_t backend = static_cast<pid_t>(BackendPid(**store));
  if (!IsLocalProcess(backend, "postgres")) IDEM_SKIP_OR_FAIL("the test server is not local");

  StoppedProcesses stopped({backend});
  auto read = CallWithin(
      kGiveUp, [&] { return (*store)->Read(scope); }, [&] { stopped.Continue(); });
  EXPECT_FALSE(read.overran) << "Read blocked " << read.elapsed.count()
                             << " ms on a stopped server process, until the test resumed it";
  ASSERT_FALSE(read.value.has_value()) << "Read succeeded on a stopped server process";
  EXPECT_EQ(read.value.error().code, Errc::kUnavailable) << read.value.error().message;
  EXPECT_LT(read.elapsed, options.timeouts.statement + milliseconds(1000) + kSlack);

  // The stalled connection was dropped; a fresh one serves while the old process is still stopped.
  auto again = (*store)->Read(scope);
  EXPECT_TRUE(again.has_value()) << Describe(again);
}

// A COMMIT that gets no answer may or may not have happened: kDeadlineExceeded (re-read), within
// the same bound. Here it did happen: the server process reads the COMMIT once resumed.
TEST(PostgresStore, ACommitToAStoppedServerProcessIsAnUnknownOutcomeWithinTheStatementBound) {
  REQUIRE_POSTGRES();
  FakeClock clock;
  SeededRandom random(6);
  PostgresStoreOptions options = Options(FreshSchema(), 1, true);
  options.timeouts.statement = milliseconds(1000);
  options.timeouts.lock = milliseconds(500);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  const ClaimSpec spec = Spec("stopped-commit-key");
  auto txn = (*store)->Begin();
  ASSERT_TRUE(txn.has_value()) << txn.error().message;
  ASSERT_TRUE((*txn)->Claim(spec).has_value());
  auto pid = (*txn)->Exec("SELECT pg_backend_pid()");
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  const pid_t backend = static_cast<pid_t>(std::get<int64_t>(pid->at(0).at(0)));
  if (!IsLocalProcess(backend, "postgres")) IDEM_SKIP_OR_FAIL("the test server is not local");

  StoppedProcesses stopped({backend});
  auto commit = CallWithin(
      kGiveUp, [&] { return (*txn)->Commit(); }, [&] { stopped.Continue(); });
  EXPECT_FALSE(commit.overran) << "Commit blocked " << commit.elapsed.count()
                               << " ms on a stopped server process, until the test resumed it";
  ASSERT_FALSE(commit.value.has_value()) << "Commit succeeded on a stopped server process";
  EXPECT_EQ(commit.value.error().code, Errc::kDeadlineExceeded) << commit.value.error().message;
  EXPECT_LT(commit.elapsed, options.timeouts.statement + milliseconds(1000) + kSlack);

  stopped.Continue();
  txn->reset();
  bool committed = false;
  for (int i = 0; i < 100 && !committed; ++i) {
    auto read = (*store)->Read(spec.scope);
    committed = read.has_value() && read->has_value();
    if (!committed) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(committed) << "the resumed server process did not commit what it had received";
}

// Readiness is decided within its timeout on a connection of its own, whatever the pool does.
TEST(PostgresStore, PingAnswersWithinItsTimeoutWhileTheServerProcessIsStopped) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(7);
  PostgresStoreOptions options = Named(Options(schema, 1, true), schema);
  auto store = OpenPostgresStore(options, clock, random);
  ASSERT_TRUE(store.has_value()) << store.error().message;
  ASSERT_TRUE((*store)->Ping(milliseconds(1000)));
  // The pool's connection and the ping's own.
  const std::vector<pid_t> backends = LocalBackends(schema, 2);
  if (backends.empty()) IDEM_SKIP_OR_FAIL("the test server does not run on this machine");

  StoppedProcesses stopped(backends);
  auto ping = CallWithin(
      kGiveUp, [&] { return (*store)->Ping(milliseconds(1000)); }, [&] { stopped.Continue(); });
  EXPECT_FALSE(ping.overran) << "Ping blocked " << ping.elapsed.count()
                             << " ms on a stopped server process, until the test resumed it";
  ASSERT_FALSE(ping.value.has_value()) << "Ping succeeded on a stopped server process";
  EXPECT_EQ(ping.value.error().code, Errc::kUnavailable) << ping.value.error().message;
  EXPECT_LT(ping.elapsed, milliseconds(1000) + milliseconds(500));

  stopped.Continue();
  EXPECT_TRUE((*store)->Ping(milliseconds(1000))) << "a fresh connection answers again";
}

// A listening socket nobody accepts from: the kernel completes the TCP handshake, as for a
// stopped postmaster, and nothing answers. Closed on destruction.
class SilentServer {
 public:
  SilentServer() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentServer() { Close(); }
  SilentServer(const SilentServer&) = delete;
  SilentServer& operator=(const SilentServer&) = delete;

  uint16_t port() const { return port_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  uint16_t port_ = 0;
};

TEST(PostgresStore, AServerThatNeverAnswersIsUnavailableWithinTheConnectTimeout) {
  FakeClock clock;
  SeededRandom random(8);
  SilentServer silent;
  PostgresStoreOptions options;
  options.conninfo = "postgresql://postgres@127.0.0.1:" + std::to_string(silent.port()) + "/idem";
  options.timeouts.connect = milliseconds(500);
  auto open = CallWithin(
      kGiveUp, [&] { return OpenPostgresStore(options, clock, random); }, [&] { silent.Close(); });
  EXPECT_FALSE(open.overran) << "connecting blocked " << open.elapsed.count()
                             << " ms on a server that never answers, until the test closed it";
  ASSERT_FALSE(open.value.has_value());
  EXPECT_EQ(open.value.error().code, Errc::kUnavailable) << open.value.error().message;
  EXPECT_LT(open.elapsed, options.timeouts.connect + kSlack);
}

// The test server's URL with its port replaced by `port` (a relay's), or "" for a URL of
// another form than scripts/with-services gives ("postgresql://user@127.0.0.1:PORT/db").
std::string ThroughPort(const std::string& url, uint16_t port) {
  const std::string host = "@127.0.0.1:";
  const std::size_t at = url.find(host);
  if (at == std::string::npos) return "";
  const std::size_t digits = at + host.size();
  const std::size_t end = url.find_first_not_of("0123456789", digits);
  if (end == digits) return "";
  return url.substr(0, digits) + std::to_string(port) + url.substr(end);
}

uint16_t ServerPort() {
  const std::string url = ServerUrl();
  const std::size_t at = url.find("@127.0.0.1:");
  return at == std::string::npos ? 0 : static_cast<uint16_t>(std::atoi(url.c_str() + at + 11));
}

// A claim and a completion as idemd makes them (Engine::Start with the payments hook: the claim,
// a business row, the advance, the covered advance, the read back, the quota; Engine::Finish),
// counted in round trips through a relay: BEGIN goes with the first statement, a business
// statement with its savepoint and release, the principal's lock with both quota counts, and the
// read back is the record the covered advance returned. Before the store sent statements
// together, the claim took 12 and the completion 6.
TEST(PostgresStore, AClaimAndACompletionWaitForTheServerOnlyWhereTheyMust) {
  REQUIRE_POSTGRES();
  ASSERT_NE(ServerPort(), 0) << "IDEM_TEST_PG_URL is not a loopback URL with a port";
  for (const bool prepared : {true, false}) {
    SCOPED_TRACE(prepared ? "prepared statements" : "unnamed statements");
    RoundTripCounter relay(ServerPort());
    ASSERT_NE(relay.port(), 0);
    const std::string schema = FreshSchema();
    FakeClock clock;
    SeededRandom random(6);
    PostgresStoreOptions options = Options(schema, 1, prepared);
    options.conninfo = ThroughPort(ServerUrl(), relay.port());
    auto store = OpenPostgresStore(options, clock, random);
    ASSERT_TRUE(store.has_value()) << store.error().message;
    int64_t seen = relay.RoundTrips();
    auto trips = [&] {
      const int64_t now = relay.RoundTrips();
      return now - std::exchange(seen, now);
    };

    const ClaimSpec spec = Spec(prepared ? "trips-prepared" : "trips-plain");
    auto txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    EXPECT_EQ(trips(), 0) << "Begin";
    auto claim = (*txn)->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed) << Describe(claim);
    EXPECT_EQ(trips(), 1) << "BEGIN and the claim";
    ASSERT_TRUE((*txn)->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                             {std::string("order"), std::string("pending")}));
    EXPECT_EQ(trips(), 1) << "a business row with its savepoint";
    const Lease lease = claim->record.lease;
    ASSERT_TRUE((*txn)->Advance(spec.scope, lease, "claimed", "pay_1"));
    EXPECT_EQ(trips(), 1) << "the advance";
    ASSERT_TRUE((*txn)->AdvanceCovered(spec.scope, lease, "charge_sent", Millis(1000)));
    EXPECT_EQ(trips(), 1) << "the covered advance";
    auto read = (*txn)->Get(spec.scope);
    ASSERT_TRUE(read.has_value() && read->has_value()) << Describe(read);
    EXPECT_EQ((*read)->recovery_point, "charge_sent");
    EXPECT_EQ((*read)->resource_id, "pay_1");
    EXPECT_EQ(trips(), 0) << "the read back: the record the covered advance returned";
    auto quota = (*txn)->CountQuota(spec.tenant, spec.user, 1001, 100001);
    ASSERT_TRUE(quota.has_value()) << Describe(quota);
    EXPECT_EQ(quota->processing, 1);
    EXPECT_EQ(quota->retained, 1);
    EXPECT_EQ(trips(), 1) << "both quota counts, the first taking the principal's lock";
    ASSERT_TRUE((*txn)->Commit());
    EXPECT_EQ(trips(), 1) << "COMMIT";

    const Outcome outcome = Succeeded();
    txn->reset();  // gives its connection back to the pool of one
    txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    ASSERT_TRUE((*txn)->Finish(spec.scope, lease, outcome));
    EXPECT_EQ(trips(), 1) << "BEGIN and the finish";
    ASSERT_TRUE((*txn)->Exec("UPDATE contract_business SET v = ? WHERE k = ?",
                             {std::string("paid"), std::string("order")}));
    EXPECT_EQ(trips(), 1) << "the business update with its savepoint";
    ASSERT_TRUE((*txn)->Commit());
    EXPECT_EQ(trips(), 1) << "COMMIT";

    // A business statement that fails as the transaction's first leaves it usable: its savepoint
    // went with BEGIN, and rolling back to it costs one more round trip.
    txn->reset();  // gives its connection back to the pool of one
    txn = (*store)->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto again = (*txn)->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                              {std::string("order"), std::string("again")});
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error().code, Errc::kAlreadyExists) << again.error().message;
    EXPECT_EQ(trips(), 2) << "the failed statement, then the rollback to its savepoint";
    ASSERT_TRUE((*txn)->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                             {std::string("other"), std::string("v")}));
    ASSERT_TRUE((*txn)->Commit());
    EXPECT_EQ(trips(), 2);
    txn->reset();
    auto rows = (*store)->Query("SELECT k, v FROM contract_business ORDER BY k");
    ASSERT_TRUE(rows.has_value()) << Describe(rows);
    ASSERT_EQ(rows->size(), 2u);
    EXPECT_EQ(std::get<std::string>((*rows)[0][1]), "paid");
    EXPECT_EQ(std::get<std::string>((*rows)[1][0]), "other");
  }
}

}  // namespace
}  // namespace idem::testing
