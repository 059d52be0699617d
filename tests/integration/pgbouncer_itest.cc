// tests/integration/pgbouncer_itest.cc — idemd instances behind a real PgBouncer in transaction
// pooling mode (scripts/with-services starts one): starts and restarts that migrate through the
// pooler, and the listener pointed at the database directly.
#include <random>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

std::string PgBouncerUrl() {
  const char* url = std::getenv("IDEM_TEST_PGBOUNCER_URL");
  return url != nullptr ? url : "";
}

// `url` with its database name replaced by `database` (the path of a postgresql:// URL).
std::string WithDatabase(const std::string& url, const std::string& database) {
  return url.substr(0, url.rfind('/') + 1) + database;
}

class PgBouncerIdemdTest : public IdemdTest {
 public:
  void SetUp() override {
    IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
    IDEM_NEED_SERVICE(PgBouncerUrl(), "IDEM_TEST_PGBOUNCER_URL");
    IdemdTest::SetUp();
    // Behind a transaction pooler the schema is "public" (a search_path does not carry across
    // transactions): each test has a database of its own.
    static std::mt19937_64 rng(std::random_device{}());
    database_ = "itb" + std::to_string(rng() % 1000000000000ULL);
    std::string error;
    PostgresSql("CREATE DATABASE " + database_, &error);
    ASSERT_EQ(error, "");
    direct_url_ = WithDatabase(PostgresServerUrl(), database_);
    pooled_url_ = WithDatabase(PgBouncerUrl(), database_);
  }

  // An instance's config: the store through PgBouncer, without server-side prepared statements,
  // and (when `listen_direct`) its listener on the database itself.
  IdemdOptions Options(bool listen_direct) const {
    std::string extra = "prepared_statements = false\n";
    if (listen_direct) extra += "listen_url = \"" + direct_url_ + "\"\n";
    return {.lease_ms = 2000, .store_url = pooled_url_, .extra_store = extra};
  }

  // Starts instance `i` on `options`; its address, or an error when it did not start listening
  // within `within` (a start that hangs in its migration).
  Result<http::Url> StartInstance(int i, const IdemdOptions& options,
                                  std::chrono::milliseconds within) {
    const std::string name = "idemd-" + std::to_string(i);
    WriteConfig(dir_.File(name + ".toml"), options);
    auto p = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", dir_.File(name + ".toml")},
                                          {{"IDEM_SECRETS", secrets_toml_}}, dir_.path().string(),
                                          dir_.File(name + ".log"));
    if (!p) return p.error();
    instances_[static_cast<std::size_t>(i)].emplace(std::move(*p));
    auto line = instances_[static_cast<std::size_t>(i)]->WaitForLine("idemd listening on ", within);
    if (!line) return line.error();
    return *http::ParseHttpUrl(*line);
  }

  // SIGTERM and wait: the drained stop a rolling restart makes.
  void StopInstance(int i) {
    auto& p = instances_[static_cast<std::size_t>(i)];
    p->Signal(SIGTERM);
    if (!p->Wait(std::chrono::seconds(10))) p->Signal(SIGKILL);
    p.reset();
  }

  std::string database_;
  std::string direct_url_;
  std::string pooled_url_;
  std::vector<std::optional<testing::ChildProcess>> instances_{3};
};

// Three instances restarted one after another, over and over, while they take payments: every
// start migrates (checks the schema) through the pooler at the same time as the others' traffic,
// and every start must become ready. A migration lock taken on one server session and released
// through the pool on another stays held, and every later start waits on it forever.
TEST_F(PgBouncerIdemdTest, RepeatedRestartsThroughThePoolerAllBecomeReady) {
  constexpr int kRounds = 10;  // 30 restarts
  std::vector<http::Url> urls(3);
  for (int i = 0; i < 3; ++i) {
    auto url = StartInstance(i, Options(false), std::chrono::seconds(15));
    ASSERT_TRUE(url.has_value()) << "instance " << i << ": " << url.error().message;
    urls[static_cast<std::size_t>(i)] = *url;
  }
  int order = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < 3; ++i) {
      // Traffic on the two others while this one restarts.
      std::vector<std::thread> clients;
      std::atomic<int> failed{0};
      for (int other = 0; other < 3; ++other) {
        if (other == i) continue;
        clients.emplace_back([&, other, first = order] {
          for (int n = 0; n < 5; ++n) {
            const std::string id = "PGB-" + std::to_string(first) + "-" + std::to_string(other) +
                                   "-" + std::to_string(n);
            if (PayAt(urls[static_cast<std::size_t>(other)], "pgb-key-" + id, Body(id)).status !=
                201) {
              ++failed;
            }
          }
        });
      }
      ++order;
      StopInstance(i);
      auto url = StartInstance(i, Options(false), std::chrono::seconds(15));
      for (auto& c : clients) c.join();
      ASSERT_TRUE(url.has_value()) << "round " << round << ", instance " << i
                                   << " never became ready: " << url.error().message;
      urls[static_cast<std::size_t>(i)] = *url;
      EXPECT_EQ(failed.load(), 0) << "round " << round;
    }
  }
  // Each instance still executes and replays.
  for (int i = 0; i < 3; ++i) {
    const std::string id = "PGB-LAST-" + std::to_string(i);
    const http::Response first =
        PayAt(urls[static_cast<std::size_t>(i)], "pgb-last-" + id, Body(id));
    EXPECT_EQ(first.status, 201) << first.body;
    const http::Response again =
        PayAt(urls[static_cast<std::size_t>((i + 1) % 3)], "pgb-last-" + id, Body(id));
    EXPECT_EQ(again.body, first.body);
    EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
  }
  EXPECT_EQ(TotalCharges(), 3 * kRounds * 2 * 5 + 3);
}

// The store's notifications do not pass a transaction pooler; with `listen_url` on the database
// itself, a duplicate parked on one instance is woken by the completion on another.
TEST_F(PgBouncerIdemdTest, TheListenerOnTheDatabaseHearsCompletionsOfOtherInstances) {
  auto a = StartInstance(0, Options(true), std::chrono::seconds(15));
  ASSERT_TRUE(a.has_value()) << a.error().message;
  auto b = StartInstance(1, Options(true), std::chrono::seconds(15));
  ASSERT_TRUE(b.has_value()) << b.error().message;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // b's listener connects

  Fault(R"({"fault":"slow","delay_ms":700,"times":1})");
  http::Response first;
  std::thread executor([&] { first = PayAt(*a, "pgb-wait-key", Body("PGB-WAIT")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const http::Response waited = PayAt(*b, "pgb-wait-key", Body("PGB-WAIT"), "wait=10");
  executor.join();
  EXPECT_EQ(waited.status, 201);
  EXPECT_EQ(waited.body, first.body);
  auto metrics = http::Call(*b, http::Request{"GET", "/metrics", {}, {}});
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->body.find("idem_store_notifications_total 0"), std::string::npos)
      << "instance b heard the completion from instance a";
  EXPECT_EQ(TotalCharges(), 1);
}

}  // namespace
}  // namespace idem::itest
