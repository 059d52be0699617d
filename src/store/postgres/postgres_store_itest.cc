// src/store/postgres/postgres_store_itest.cc — the store contract suite on a real PostgreSQL
// (started by scripts/with-services; its address in IDEM_TEST_PG_URL), plus what only this
// backend has: migrations under an advisory lock from many processes at once, schemas, and lost
// connections.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "include/idem/store/postgres.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

// The server's address, or "" — then every test here is skipped, unless IDEM_REQUIRE_SERVICES
// is set (as scripts/test sets it), which turns the absence into a failure.
std::string ServerUrl() {
  const char* url = std::getenv("IDEM_TEST_PG_URL");
  return url != nullptr ? url : "";
}

#define REQUIRE_POSTGRES()                                                  \
  do {                                                                      \
    if (ServerUrl().empty()) {                                              \
      if (std::getenv("IDEM_REQUIRE_SERVICES") != nullptr) {                \
        FAIL() << "IDEM_TEST_PG_URL is not set (run through scripts/test)"; \
      }                                                                     \
      GTEST_SKIP() << "IDEM_TEST_PG_URL is not set";                        \
    }                                                                       \
  } while (false)

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

StoreFactory PostgresFactory(int pool_size, bool prepared) {
  // Every instance a test opens shares the test's schema: a second instance is a second process.
  auto schemas = std::make_shared<std::map<const StoreTestEnv*, std::string>>();
  return StoreFactory{
      std::string("PostgresPool") + std::to_string(pool_size) + (prepared ? "Prepared" : "Plain"),
      [=](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
        if (ServerUrl().empty())
          return MakeError(Errc::kUnavailable, "IDEM_TEST_PG_URL is not set");
        auto& schema = (*schemas)[&env];
        if (schema.empty()) schema = FreshSchema();
        return OpenPostgresStore(Options(schema, pool_size, prepared), env.clock, env.random);
      }};
}

INSTANTIATE_TEST_SUITE_P(Postgres, StoreContractTest,
                         ::testing::Values(PostgresFactory(8, true), PostgresFactory(4, false)),
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
            2);
  EXPECT_EQ(
      QueryInt("SELECT count(*) FROM " + schema + ".idem_schema WHERE component = 'contract'"),
      static_cast<int64_t>(ContractMigrations().size()));
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
  read_only.app_migrations.push_back({3, "CREATE TABLE never_applied (x BIGINT)"});
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

// A server-side kill of every connection of the store: the pool replaces them, nothing is guessed.
TEST(PostgresStore, LostConnectionsAreReplaced) {
  REQUIRE_POSTGRES();
  const std::string schema = FreshSchema();
  FakeClock clock;
  SeededRandom random(2);
  // Only this store's connections are killed (tests run in parallel on the same server).
  PostgresStoreOptions options = Options(schema, 2, true);
  options.conninfo += (options.conninfo.find('?') == std::string::npos ? "?" : "&") +
                      std::string("application_name=") + schema;
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

}  // namespace
}  // namespace idem::testing
