// src/core/inbox_sqlite_test.cc — the Inbox suite (inbox_test.cc) on a SQLite file of its own, and
// the message keys, which need no store.
#include <string>
#include <utility>
#include <vector>

#include "idem/outbox.h"
#include "idem/store/sqlite.h"
#include "src/core/inbox_suite.h"

namespace idem::testing {
namespace {

InboxBackend SqliteBackend() {
  return InboxBackend{"Sqlite", [](InboxEnv& env) -> Result<std::unique_ptr<Store>> {
                        SqliteStoreOptions options;
                        options.path = env.dir.File("inbox.db");
                        options.apps = {InboxTestTables(), {"outbox", OutboxMigrations()}};
                        return OpenSqliteStore(options, env.clock, env.random);
                      }};
}

INSTANTIATE_TEST_SUITE_P(Sqlite, InboxTest, ::testing::Values(SqliteBackend()), InboxBackendName);
INSTANTIATE_TEST_SUITE_P(Sqlite, OutboxTest, ::testing::Values(SqliteBackend()), InboxBackendName);

// No store needed: here only, not in every backend's binary.
TEST(InboxMessage, KeysComeFromAHeaderAJsonMemberOrTheBrokersId) {
  auto by_string = InboxMessage::KeyedByJson(R"({"order":{"id":"A-1"}})", "/order/id");
  ASSERT_TRUE(by_string.has_value()) << by_string.error().message;
  EXPECT_EQ(by_string->key, "A-1");
  EXPECT_EQ(by_string->content_type, "application/json");
  auto by_number = InboxMessage::KeyedByJson(R"({"n":12345678901234})", "/n");
  ASSERT_TRUE(by_number.has_value());
  EXPECT_EQ(by_number->key, "12345678901234");
  for (const auto& [payload, pointer] :
       std::vector<std::pair<std::string, std::string>>{{R"({"n":1.5})", "/n"},
                                                        {R"({"n":null})", "/n"},
                                                        {R"({"n":"x"})", "/m"},
                                                        {R"({"n":"x"})", "n"},
                                                        {"not json", "/n"},
                                                        {"", "/n"}}) {
    auto message = InboxMessage::KeyedByJson(payload, pointer);
    EXPECT_FALSE(message.has_value()) << payload << " " << pointer;
    if (!message) {
      EXPECT_EQ(message.error().code, Errc::kInvalidArgument);
    }
  }
  auto by_header = InboxMessage::KeyedByHeader("ord-9", "{}");
  ASSERT_TRUE(by_header.has_value());
  EXPECT_EQ(by_header->key, "ord-9");
  EXPECT_FALSE(InboxMessage::KeyedByHeader(std::nullopt, "{}").has_value());
  EXPECT_FALSE(InboxMessage::KeyedByHeader("", "{}").has_value());
  EXPECT_EQ(InboxMessage::KeyedByBrokerId("1700000000000-0", "x", "text/plain").key,
            "1700000000000-0");
}

}  // namespace
}  // namespace idem::testing
