// tests/integration/failpoint_matrix_itest.cc — every failpoint on a payment's way × {crash, stall
// past the lease} × {SQLite, PostgreSQL} × {provider honours keys, ignores them}, each followed by
// the client's retries and the takeover loop, with the same checks after every cell: one charge,
// one answer (the retry's and every replay's byte-identical), nothing left PROCESSING; with Redis,
// also no cache entry that outlives its record and no in-flight marker left behind.
//
// Points are reached three ways: the steps of an execution, by the request under test; the
// replay cache's fill, by a replay (so the order is paid first); the sweeper between two batches,
// by its own thread once a round has more than a batch to delete (so the cell writes that many
// expired records, and checks that a crash or a stall there leaves whole batches deleted and
// every unexpired or running record kept, and that the next round finishes the sweep).
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "idem/limits.h"
#include "server/idemd/routes.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

// How a cell's point is reached.
enum class Path { kExecution, kReplay, kSweep };

Path PathOf(std::string_view point) {
  if (point == "cache_before_fill") return Path::kReplay;
  if (point == "sweep_between_batches") return Path::kSweep;
  return Path::kExecution;
}

// The cache points are reached only through the Redis fast path.
bool NeedsRedis(std::string_view point) { return point.rfind("cache_", 0) == 0; }

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
  for (const char* point :
       {"cache_after_marker", "after_claim", "after_charge_sent", "after_provider_charge",
        "before_complete_commit", "after_complete_commit", "cache_before_fill",
        "sweep_between_batches"}) {
    for (bool crash : {true, false}) {
      for (bool postgres : {false, true}) {
        for (bool ignore_keys : {false, true})
          cells.push_back({point, crash, postgres, ignore_keys});
      }
    }
  }
  return cells;
}

// ---- Redis, as the tests see it -------------------------------------------------------------

// Keys in Redis (idemd's defaults, include/idem/store/redis.h): the cache entry and the marker.
std::string CacheKey(const ScopeHash& scope) { return "idem:rec:" + ToHex(scope); }
std::string MarkerKey(const ScopeHash& scope) { return "idem:rec:lock:" + ToHex(scope); }

// How much later than its record's expiry a cache entry may seem to end: this test reads the
// entry's TTL and Redis's time in two commands, and expiries are whole milliseconds.
constexpr int64_t kMeasureSlackMs = 100;

// ---- Records for the sweeper ----------------------------------------------------------------

// Written by the test in one transaction, so that one round of the sweeper meets them all, under
// a tenant of their own (no payment, no quota, no route the takeover loop lists): more expired
// finished records than one batch, so the round has a second batch; and records the sweeper must
// keep — finished ones before their expiry, and PROCESSING ones past their retention whose lease
// is live (an execution still running: never swept, whatever its expiry).
constexpr const char* kSeedTenant = "sweep-seeds";
constexpr const char* kExpired = "expired";
constexpr const char* kUnexpired = "unexpired";
constexpr const char* kLive = "live";
constexpr int64_t kExpiredSeeds = limits::kSweepBatch + 100;
constexpr int64_t kUnexpiredSeeds = 20;
constexpr int64_t kLiveSeeds = 5;

struct LiveSeed {
  ScopeHash scope;
  Lease lease;
};

// `count` records of the seed tenant's user `kind` in `txn`, expiring `retention` after their
// claim: finished ones, or (kLive) running ones whose leases go to *live.
void Seed(StoreTxn& txn, const char* kind, int64_t count, Millis retention,
          std::vector<LiveSeed>* live = nullptr) {
  for (int64_t i = 0; i < count; ++i) {
    ClaimSpec spec;
    auto scope = Scope{kSeedTenant, kind, "sweep.seed", "seed-" + std::to_string(i)}.Hash();
    ASSERT_TRUE(scope.has_value());
    spec.scope = *scope;
    spec.tenant = kSeedTenant;
    spec.user = kind;
    spec.route = "sweep.seed";
    spec.fingerprint.rules_version = 1;
    spec.fingerprint.secret_id = 1;
    spec.lease_ttl = std::chrono::hours(1);
    spec.retention = retention;
    auto claim = txn.Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    if (std::string_view(kind) == kLive) {
      live->push_back({*scope, claim->record.lease});
      continue;
    }
    Outcome done{RecordState::kSucceeded, 201, "sealed elsewhere", "done"};
    ASSERT_TRUE(txn.Finish(*scope, claim->record.lease, done).has_value());
  }
}

class FailpointMatrixTest : public IdemdTest, public ::testing::WithParamInterface<Cell> {
 public:
  void SetUp() override {
    if (NeedsRedis(GetParam().point)) IDEM_NEED_SERVICE(RedisServerUrl(), "IDEM_TEST_REDIS_URL");
    if (GetParam().postgres) {
      IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
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
    if (NeedsRedis(GetParam().point)) o.redis_url = RedisServerUrl();
    if (PathOf(GetParam().point) == Path::kSweep) o.extra_idempotency = "sweep_interval_ms = 200";
    if (!failpoints.empty()) o.env = {{"IDEM_FAILPOINTS", failpoints}};
    return o;
  }

  // The checks of every cell, once the order has `answer` (a 201): one charge, for this order;
  // every answer seen (`seen`: the stalled request's, the one before a replay's point) and a
  // replay byte-identical to it; with Redis, the order's cache entry (the replays went through
  // it) ends no later than its record and no in-flight marker is left; nothing left PROCESSING
  // once the takeover loop ran.
  void ExpectInvariants(const std::string& key, const std::string& body,
                        const http::Response& answer,
                        const std::vector<const http::Response*>& seen) {
    ASSERT_EQ(answer.status, 201) << answer.body;
    const std::string id = std::string(ParseObject(answer.body)["id"].as_string());
    EXPECT_EQ(ChargesFor(id), 1);
    EXPECT_EQ(TotalCharges(), 1);
    for (const http::Response* other : seen) {
      if (other->status == 201) {
        EXPECT_EQ(other->body, answer.body);
      }
    }
    http::Response replay = Pay(key, body);
    EXPECT_EQ(replay.body, answer.body);
    EXPECT_EQ(replay.headers.Get("idempotent-replayed").value_or(""), "true");

    std::unique_ptr<Store> store = OpenExistingStore(store_url_);
    ASSERT_NE(store, nullptr);
    if (NeedsRedis(GetParam().point)) {
      auto scope = Scope{"acme", "alice", std::string(idemd::kPaymentsCreateRoute), key}.Hash();
      ASSERT_TRUE(scope.has_value());
      auto record = store->Read(*scope);
      ASSERT_TRUE(record.has_value() && record->has_value());
      RedisReply left = RedisCommand({"PTTL", CacheKey(*scope)});
      RedisReply time = RedisCommand({"TIME"});
      ASSERT_TRUE(left && time && time->type == REDIS_REPLY_ARRAY && time->elements == 2);
      EXPECT_GT(left->integer, 0) << "the replays did not go through the cache";
      const int64_t now_ms =
          std::stoll(time->element[0]->str) * 1000 + std::stoll(time->element[1]->str) / 1000;
      const int64_t outlives = now_ms + left->integer - ToUnixMillis((*record)->expires_at);
      EXPECT_LE(outlives, kMeasureSlackMs)
          << "the cache entry outlives its record by " << outlives << " ms";
      RedisReply marker = RedisCommand({"EXISTS", MarkerKey(*scope)});
      ASSERT_TRUE(marker);
      EXPECT_EQ(marker->integer, 0)
          << "an in-flight marker is left for an order that has its answer";
    }
    int64_t processing = -1;
    for (int i = 0; i < 50 && processing != 0; ++i) {
      auto rows = store->Query("SELECT count(*) FROM idem_records WHERE state = 'PROCESSING'");
      ASSERT_TRUE(rows.has_value());
      processing = std::get<int64_t>((*rows)[0][0]);
      if (processing != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(processing, 0);
  }

  // Writes the sweeper's records (above) in one transaction; the live ones' leases in *live.
  void SeedSweep(std::vector<LiveSeed>* live) {
    std::unique_ptr<Store> store = OpenExistingStore(store_url_);
    ASSERT_NE(store, nullptr);
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    ASSERT_NO_FATAL_FAILURE(Seed(**txn, kExpired, kExpiredSeeds, Millis(1)));
    ASSERT_NO_FATAL_FAILURE(Seed(**txn, kUnexpired, kUnexpiredSeeds, std::chrono::hours(1)));
    ASSERT_NO_FATAL_FAILURE(Seed(**txn, kLive, kLiveSeeds, Millis(1), live));
    ASSERT_TRUE((*txn)->Commit().has_value());
  }

  // How many of the sweeper's records of one kind are left.
  int64_t SeedsLeft(const char* kind) {
    std::unique_ptr<Store> store = OpenExistingStore(store_url_);
    if (store == nullptr) return -1;
    auto rows = store->Query("SELECT count(*) FROM idem_records WHERE tenant = ? AND user_id = ?",
                             {std::string(kSeedTenant), std::string(kind)});
    EXPECT_TRUE(rows.has_value()) << rows.error().message;
    return rows ? std::get<int64_t>((*rows)[0][0]) : -1;
  }

  // Waits (up to 10 s) until `count` expired records are left.
  bool ExpiredLeft(int64_t count) {
    for (int i = 0; i < 500; ++i) {
      if (SeedsLeft(kExpired) == count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // The sweeper never deleted a record it must keep.
  void ExpectKept() {
    EXPECT_EQ(SeedsLeft(kUnexpired), kUnexpiredSeeds) << "the sweeper deleted unexpired records";
    EXPECT_EQ(SeedsLeft(kLive), kLiveSeeds) << "the sweeper deleted running executions";
  }

  std::string store_url_;
  std::optional<testing::ChildProcess> second_;  // stall cells: the instance that serves retries
};

TEST_P(FailpointMatrixTest, OneChargeOneAnswerNothingLeftProcessing) {
  const Cell& cell = GetParam();
  const Path path = PathOf(cell.point);
  StartIdemd(Options(std::string(cell.point) + (cell.crash ? "=crash" : "=stall:3000")));
  ProviderMode(cell.ignore_keys);
  // A key of this run's own: Redis keeps what it cached after the test's database is gone.
  static std::mt19937_64 rng(std::random_device{}());
  const std::string key = std::string("matrix-") + cell.point + "-" + std::to_string(rng());
  const std::string body = Body("ORD-MATRIX-1");

  // A replay's point needs an answer to replay.
  http::Response earlier;
  if (path == Path::kReplay) {
    earlier = Pay(key, body);
    ASSERT_EQ(earlier.status, 201) << earlier.body;
  }
  http::Response first;  // status 0 when the process died under it
  std::atomic<bool> first_returned{false};
  std::jthread doomed([&] {
    http::Request req{"POST", "/v1/payments", {}, body};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    if (auto r = http::Call(idemd_url_, std::move(req))) first = std::move(*r);
    first_returned = true;
  });
  std::vector<LiveSeed> live;
  if (path == Path::kSweep) {
    ASSERT_NO_FATAL_FAILURE(SeedSweep(&live));
  }
  if (cell.crash) {
    auto status = idemd_->Wait(std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << "idemd did not stop at " << cell.point;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 86);
    idemd_.reset();
    doomed.join();
    if (path == Path::kSweep) {
      // Whole batches: the first one's deletions stand, the rest is still there, and nothing
      // the sweeper must keep went with it.
      EXPECT_EQ(SeedsLeft(kExpired), kExpiredSeeds - limits::kSweepBatch);
      ExpectKept();
    }
    StartIdemd(Options(""));
  } else {
    if (path == Path::kSweep) {
      ASSERT_TRUE(ExpiredLeft(kExpiredSeeds - limits::kSweepBatch))
          << "the sweeper did not stop after its first batch";
      ExpectKept();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(first_returned) << "the request did not stall at " << cell.point;
    }
    // The stalled executor holds its request while its lease runs out; the client's retries go
    // to a second instance on the same store (the stalled one would stall them too).
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
  if (path == Path::kSweep) {
    // The next round (after the restart, or the other instance's) finished the sweep and still
    // kept what it must; the live executions then finish, as their owners would.
    EXPECT_TRUE(ExpiredLeft(0)) << "expired records left: " << SeedsLeft(kExpired);
    ExpectKept();
    std::unique_ptr<Store> store = OpenExistingStore(store_url_);
    ASSERT_NE(store, nullptr);
    for (const LiveSeed& seed : live) {
      auto txn = store->Begin();
      ASSERT_TRUE(txn.has_value());
      const Outcome done{RecordState::kSucceeded, 201, "sealed elsewhere", "done"};
      ASSERT_TRUE((*txn)->Finish(seed.scope, seed.lease, done).has_value());
      ASSERT_TRUE((*txn)->Commit().has_value());
    }
  }
  ExpectInvariants(key, body, answer, {&first, &earlier});
}

// idemd's sweeper keeps up with any rate of expiry the store can take: one round deletes a backlog
// larger than SweepExpired's default round (limits::kSweepBatchesPerRound batches), says so in
// one log line, and counts it in idem_sweep_deleted_total. With rounds bounded at the default,
// the first round's line said 10,000 and the rest waited for the next interval.
TEST_F(IdemdTest, OneSweepRoundCatchesUpWithABacklogOfAnySize) {
  constexpr int64_t kBacklog = (limits::kSweepBatchesPerRound + 1) * limits::kSweepBatch + 600;
  StartIdemd();  // the default interval: no round before the backlog is written
  {
    std::unique_ptr<Store> store = OpenExistingStore("sqlite://" + dir_.File("idem.db"));
    ASSERT_NE(store, nullptr);
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    ASSERT_NO_FATAL_FAILURE(Seed(**txn, kExpired, kBacklog, Millis(1)));
    ASSERT_NO_FATAL_FAILURE(Seed(**txn, kUnexpired, kUnexpiredSeeds, std::chrono::hours(1)));
    ASSERT_TRUE((*txn)->Commit().has_value());
  }
  KillIdemd();
  StartIdemd(IdemdOptions{.extra_idempotency = "sweep_interval_ms = 200"});

  // The first round's line (at most 60 s: a sanitizer build deletes slowly).
  std::optional<boost::json::object> round;
  for (int i = 0; i < 600 && !round; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(dir_.File("idemd.log"));
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line idemd is still writing
      if (line.find(R"("msg":"expired records swept")") == std::string::npos) continue;
      round = ParseObject(line);
      break;
    }
  }
  ASSERT_TRUE(round.has_value()) << "no sweep round was logged";
  EXPECT_EQ(round->at("deleted").as_int64(), kBacklog) << "one round, the whole backlog";
  EXPECT_GE(round->at("ms").as_int64(), 0);
  std::unique_ptr<Store> store = OpenExistingStore("sqlite://" + dir_.File("idem.db"));
  ASSERT_NE(store, nullptr);
  auto left = store->Query("SELECT count(*) FROM idem_records WHERE tenant = ?",
                           {std::string(kSeedTenant)});
  ASSERT_TRUE(left.has_value()) << left.error().message;
  EXPECT_EQ(std::get<int64_t>((*left)[0][0]), kUnexpiredSeeds) << "the unexpired ones are kept";
  EXPECT_NE(
      Get("/metrics", "").body.find("idem_sweep_deleted_total " + std::to_string(kBacklog) + "\n"),
      std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Matrix, FailpointMatrixTest, ::testing::ValuesIn(Cells()), CellName);

}  // namespace
}  // namespace idem::itest
