// tests/integration/failpoint_matrix_itest.cc — every failpoint of a payment × {crash, stall past
// the lease} × {SQLite, PostgreSQL} × {provider honours keys, ignores them}, each followed by the
// client's retries and the reconciler, with the same checks after every cell: one charge, one
// answer (the retry's and every replay's byte-identical), nothing left PROCESSING.
#include <sys/wait.h>

#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

struct Cell {
  const char* point;
  bool crash;  // else a stall past the lease
  bool postgres;
  bool ignore_keys;
};

std::string CellName(const ::testing::TestParamInfo<Cell>& info) {
  const Cell& c = info.param;
  std::string name = c.point;
  name += c.crash ? "_crash" : "_stall";
  name += c.postgres ? "_postgres" : "_sqlite";
  name += c.ignore_keys ? "_keys_ignored" : "_keys_honoured";
  return name;
}

std::vector<Cell> Cells() {
  std::vector<Cell> cells;
  for (const char* point : {"after_claim", "after_charge_sent", "after_provider_charge",
                            "before_complete_commit", "after_complete_commit"}) {
    for (bool crash : {true, false}) {
      for (bool postgres : {false, true}) {
        for (bool ignore_keys : {false, true})
          cells.push_back({point, crash, postgres, ignore_keys});
      }
    }
  }
  return cells;
}

class FailpointMatrixTest : public IdemdTest, public ::testing::WithParamInterface<Cell> {
 public:
  void SetUp() override {
    if (GetParam().postgres) {
      if (PostgresServerUrl().empty()) {
        if (std::getenv("IDEM_REQUIRE_SERVICES") != nullptr)
          FAIL() << "IDEM_TEST_PG_URL is not set";
        GTEST_SKIP() << "IDEM_TEST_PG_URL is not set";
      }
      store_url_ = FreshPostgresStoreUrl();
    } else {
      store_url_ = "sqlite://" + dir_.File("idem.db");
    }
    IdemdTest::SetUp();
  }

  IdemdOptions Options(const std::string& failpoints) const {
    IdemdOptions o{.lease_ms = 2000,
                   .provider_timeout_ms = 1000,
                   .lease_margin_ms = 500,
                   .reconcile_interval_ms = 300,
                   .store_url = store_url_};
    if (!failpoints.empty()) o.env = {{"IDEM_FAILPOINTS", failpoints}};
    return o;
  }

  std::string store_url_;
  std::optional<testing::ChildProcess> second_;  // stall cells: the instance that serves retries
};

TEST_P(FailpointMatrixTest, OneChargeOneAnswerNothingLeftProcessing) {
  const Cell& cell = GetParam();
  StartIdemd(Options(std::string(cell.point) + (cell.crash ? "=crash" : "=stall:3000")));
  ProviderMode(cell.ignore_keys);
  const std::string key = std::string("matrix-") + cell.point;
  const std::string body = Body("ORD-MATRIX-1");

  http::Response first;  // status 0 when the process died under it
  std::thread doomed([&] {
    http::Request req{"POST", "/v1/payments", {}, body};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    if (auto r = http::Call(idemd_url_, std::move(req))) first = std::move(*r);
  });
  if (cell.crash) {
    auto status = idemd_->Wait(std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << "idemd did not stop at " << cell.point;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 86);
    idemd_.reset();
    doomed.join();
    StartIdemd(Options(""));
  } else {
    // The stalled executor holds its request while its lease runs out; the client's retries go
    // to a second instance on the same store (the stalled one would stall them too).
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string config = dir_.File("idemd-b.toml");
    WriteConfig(config, Options(""));
    auto b = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config},
                                          {{"IDEM_SECRETS", secrets_toml_}}, dir_.path().string(),
                                          dir_.File("idemd-b.log"));
    ASSERT_TRUE(b.has_value());
    second_.emplace(std::move(*b));
    auto url = second_->WaitForLine("idemd listening on ", std::chrono::seconds(10));
    ASSERT_TRUE(url.has_value());
    idemd_url_ = *http::ParseHttpUrl(*url);
  }

  http::Response answer;
  for (int i = 0; i < 100; ++i) {
    answer = Pay(key, body);
    if (answer.status != 409 && answer.status != 503 && answer.status != 504) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!cell.crash) doomed.join();
  ASSERT_EQ(answer.status, 201) << answer.body;
  const std::string id = std::string(ParseObject(answer.body)["id"].as_string());
  EXPECT_EQ(ChargesFor(id), 1);
  EXPECT_EQ(TotalCharges(), 1);
  // The stalled request's own answer, when it got one, is the same one.
  if (!cell.crash && first.status == 201) {
    EXPECT_EQ(first.body, answer.body);
  }
  http::Response replay = Pay(key, body);
  EXPECT_EQ(replay.body, answer.body);
  EXPECT_EQ(replay.headers.Get("idempotent-replayed").value_or(""), "true");

  // The reconciler leaves nothing PROCESSING.
  std::unique_ptr<Store> store = OpenExistingStore(store_url_);
  ASSERT_NE(store, nullptr);
  int64_t processing = -1;
  for (int i = 0; i < 50 && processing != 0; ++i) {
    auto rows = store->Query("SELECT count(*) FROM idem_records WHERE state = 'PROCESSING'");
    ASSERT_TRUE(rows.has_value());
    processing = std::get<int64_t>((*rows)[0][0]);
    if (processing != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(processing, 0);
}

INSTANTIATE_TEST_SUITE_P(Matrix, FailpointMatrixTest, ::testing::ValuesIn(Cells()), CellName);

}  // namespace
}  // namespace idem::itest
