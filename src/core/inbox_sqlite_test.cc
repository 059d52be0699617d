// src/core/inbox_sqlite_test.cc — the Inbox suite (inbox_test.cc) on a SQLite file of its own.
#include "idem/store/sqlite.h"
#include "src/core/inbox_suite.h"

namespace idem::testing {
namespace {

InboxBackend SqliteBackend() {
  return InboxBackend{"Sqlite", [](InboxEnv& env) -> Result<std::unique_ptr<Store>> {
                        SqliteStoreOptions options;
                        options.path = env.dir.File("inbox.db");
                        options.apps = {InboxTestTables()};
                        return OpenSqliteStore(options, env.clock, env.random);
                      }};
}

INSTANTIATE_TEST_SUITE_P(Sqlite, InboxTest, ::testing::Values(SqliteBackend()), InboxBackendName);

}  // namespace
}  // namespace idem::testing
