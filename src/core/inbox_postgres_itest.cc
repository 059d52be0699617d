// src/core/inbox_postgres_itest.cc — the Inbox suite (inbox_test.cc) on a real PostgreSQL
// (started by scripts/with-services; its address in IDEM_TEST_PG_URL), in a schema of its own
// for every test. Without the variable every test is skipped, or fails under
// IDEM_REQUIRE_SERVICES (testing/services.h).
#include <map>
#include <memory>
#include <random>

#include "idem/outbox.h"
#include "idem/store/postgres.h"
#include "src/core/inbox_suite.h"
#include "testing/services.h"

namespace idem::testing {
namespace {

std::string FreshSchema() {
  static std::mt19937_64 rng(std::random_device{}());
  return "inbox_" + std::to_string(rng() % 1'000'000'000'000ULL);
}

InboxBackend PostgresBackend() {
  // Every instance a test opens shares the test's schema: a second instance is a second process.
  auto schemas = std::make_shared<std::map<const InboxEnv*, std::string>>();
  return InboxBackend{"Postgres",
                      [schemas](InboxEnv& env) -> Result<std::unique_ptr<Store>> {
                        std::string& schema = (*schemas)[&env];
                        if (schema.empty()) schema = FreshSchema();
                        PostgresStoreOptions options;
                        options.conninfo = ServiceUrl("IDEM_TEST_PG_URL");
                        options.schema = schema;
                        options.pool_size = 4;
                        options.apps = {InboxTestTables(), {"outbox", OutboxMigrations()}};
                        // On the test's clock, so a test moves a lease past its end.
                        return OpenPostgresStore(options, env.clock, env.random);
                      },
                      {"IDEM_TEST_PG_URL"}};
}

INSTANTIATE_TEST_SUITE_P(Postgres, InboxTest, ::testing::Values(PostgresBackend()),
                         InboxBackendName);
INSTANTIATE_TEST_SUITE_P(Postgres, OutboxTest, ::testing::Values(PostgresBackend()),
                         InboxBackendName);

}  // namespace
}  // namespace idem::testing
