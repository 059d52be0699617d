// tests/integration/consumer_itest.cc — the queue consumer's proof (docs/consumers.md): real
// idemd processes consume a real Redis stream into a counting upstream while they are killed
// (-9) at random moments — one of them exactly between a record's commit and its XACK — and
// the broker is restarted once. Afterwards every business key executed exactly once, every
// message is acknowledged or quarantined, the copies published with another payload are
// quarantined, and no record is PROCESSING. On SQLite (one consumer process) and PostgreSQL
// (three).
#include <signal.h>

#include <boost/json.hpp>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kKeys = 700;  // business keys, each published 1..5 times
constexpr int kPoison = 4;  // keys whose upstream always answers 503 ("nothing done")
constexpr int kMaxAttempts = 6;

// One message as published.
struct Published {
  std::string key;
  std::string body;
  bool poison = false;
};

class ConsumerProofTest : public IdemdTest {
 public:
  void SetUp() override {
    IdemdTest::SetUp();
    if (HasFatalFailure()) return;
    KillIdemd();  // the fixture's idemd has no consumer; these tests start their own
    StartService(UPSTREAM_SIM_PATH, "upstream-sim", "upstream.log", &upstream_, &upstream_url_);
    if (HasFatalFailure()) return;
    redis_port_ = testing::FreeLoopbackPort();
    StartRedis();
  }

  // The broker of this test alone, durable (every write to the append-only file before it is
  // answered), so that a restart keeps the stream, the group and its pending entries.
  void StartRedis() {
    auto p = testing::ChildProcess::Spawn(
        {"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(redis_port_),
         "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir",
         dir_.path().string()},
        {}, dir_.path().string(), dir_.File("redis.log"));
    ASSERT_TRUE(p.has_value()) << p.error().message;
    redis_.emplace(std::move(*p));
    ASSERT_TRUE(testing::WaitForPort(redis_port_, seconds(10)));
  }
  void RestartRedis() {
    redis_->Signal(SIGTERM);
    ASSERT_TRUE(redis_->Wait(seconds(10)).has_value());
    redis_.reset();
    StartRedis();
  }

  std::string ConsumerToml() const {
    return "[[consumers]]\nname = \"orders\"\nurl = \"redis://127.0.0.1:" +
           std::to_string(redis_port_) +
           "\"\nstream = \"orders\"\nkey = \"json:/order\"\n"
           "header_fields = [\"x-upstream-delay-ms\", \"x-upstream-status\"]\n"
           "max_attempts = " +
           std::to_string(kMaxAttempts) +
           "\nredeliver_after_ms = 2500\nconcurrency = 4\n"
           "[consumers.target]\nrequest = \"POST /v1/orders\"\nupstream = \"http://127.0.0.1:" +
           std::to_string(upstream_url_.port) +
           "\"\nforward_key_header = \"Idempotency-Key\"\nstatus_path = \"/status/{key}\"\n"
           "nothing_done_statuses = [503]\nlate_execution_ms = 0\ntimeout_ms = 1000\n"
           "lease_ms = 2000\nretention_ms = 600000\n";
  }

  // Starts consumer process `i` (again), armed with `failpoints` when given.
  void StartConsumer(std::size_t i, const std::string& failpoints = "") {
    const std::string config = dir_.File("consumer-" + std::to_string(i) + ".toml");
    WriteConfig(config, {.lease_ms = 2000,
                         .lease_margin_ms = 500,
                         .reconcile_interval_ms = 300,
                         .store_url = store_url_,
                         .extra_tables = ConsumerToml()});
    std::map<std::string, std::string> env = {{"IDEM_SECRETS", secrets_toml_}};
    if (!failpoints.empty()) env["IDEM_FAILPOINTS"] = failpoints;
    consumers_[i].reset();
    auto p =
        testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config}, env, dir_.path().string(),
                                     dir_.File("consumer-" + std::to_string(i) + ".log"));
    ASSERT_TRUE(p.has_value()) << p.error().message;
    consumers_[i].emplace(std::move(*p));
    ASSERT_TRUE(consumers_[i]->WaitForLine("idemd listening on ", seconds(20)).has_value())
        << "consumer " << i << " did not start (consumer-" << i << ".log)";
  }

  int64_t Integer(const RedisReply& reply) {
    return reply && reply->type == REDIS_REPLY_INTEGER ? reply->integer : -1;
  }

  // The group's pending entries and the entries it has not read yet (XINFO GROUPS' lag).
  std::pair<int64_t, int64_t> PendingAndLag() {
    RedisReply groups = RedisCommand({"XINFO", "GROUPS", "orders"}, redis_port_);
    if (!groups || groups->type != REDIS_REPLY_ARRAY || groups->elements != 1) return {-1, -1};
    int64_t pending = -1, lag = -1;
    const redisReply* g = groups->element[0];
    for (std::size_t i = 0; i + 1 < g->elements; i += 2) {
      const std::string name(g->element[i]->str, g->element[i]->len);
      const redisReply* v = g->element[i + 1];
      if (name == "pending" && v->type == REDIS_REPLY_INTEGER) pending = v->integer;
      if (name == "lag" && v->type == REDIS_REPLY_INTEGER) lag = v->integer;
    }
    return {pending, lag};
  }

  // The dead letters: source id → (reason, the message's body).
  std::map<std::string, std::pair<std::string, std::string>> DeadLetters() {
    std::map<std::string, std::pair<std::string, std::string>> out;
    RedisReply range = RedisCommand({"XRANGE", "orders.dead", "-", "+"}, redis_port_);
    if (!range || range->type != REDIS_REPLY_ARRAY) return out;
    for (std::size_t e = 0; e < range->elements; ++e) {
      const redisReply* fields = range->element[e]->element[1];
      std::map<std::string, std::string> f;
      for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
        f[std::string(fields->element[i]->str, fields->element[i]->len)] =
            std::string(fields->element[i + 1]->str, fields->element[i + 1]->len);
      }
      out[f["idem_source_id"]] = {f["idem_reason"], f["body"]};
    }
    return out;
  }

  void Proof(std::size_t processes);

  std::optional<testing::ChildProcess> upstream_;
  http::Url upstream_url_;
  std::optional<testing::ChildProcess> redis_;
  uint16_t redis_port_ = 0;
  std::string store_url_;
  std::vector<std::optional<testing::ChildProcess>> consumers_;
};

void ConsumerProofTest::Proof(std::size_t processes) {
  consumers_.resize(processes);
  for (std::size_t i = 0; i < processes; ++i) ASSERT_NO_FATAL_FAILURE(StartConsumer(i));

  // The messages: each key once with its payload, then 0..4 copies of it, one in six of the keys
  // with a copy of another payload too; some upstream answers take a while, so that kills land
  // while forwards are out.
  std::mt19937_64 random(20261202);
  std::vector<Published> messages;
  for (int k = 0; k < kKeys + kPoison; ++k) {
    const std::string key = "order-" + std::to_string(k);
    const bool poison = k >= kKeys;
    const std::string body = R"({"order":")" + key + R"(","amount":)" + std::to_string(k) + "}";
    const int copies = poison ? 1 : 1 + static_cast<int>(random() % 5);
    for (int c = 0; c < copies; ++c) messages.push_back({key, body, poison});
    if (!poison && k % 6 == 0) {
      messages.push_back({key, R"({"order":")" + key + R"(","amount":-1})", false});
    }
  }
  std::shuffle(messages.begin(), messages.end(), random);
  ASSERT_GE(messages.size(), static_cast<std::size_t>(kKeys) * 3);

  // Published in chunks; between chunks a consumer is killed and restarted, at random moments of
  // its work. Once, one is started with the failpoint between a record's commit and its XACK,
  // and must crash there; once, the broker restarts.
  std::map<std::string, std::string> id_body;  // stream id → body
  std::map<std::string, std::string> id_key;
  // 22 chunks (100 messages each in the ci build).
  const std::size_t kChunk = (messages.size() + 21) / 22;
  int kills = 0;
  constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t armed = kNone;  // the consumer armed with the failpoint, while it runs
  for (std::size_t from = 0; from < messages.size(); from += kChunk) {
    const std::size_t chunk = from / kChunk;
    const std::size_t victim = random() % processes;
    if (chunk == 4) {
      // Between the commit and the acknowledgement: the process exits at the first message it
      // finishes (status 86), and the broker delivers that message again. The others are
      // stopped meanwhile, so that this chunk's messages come to it.
      for (std::size_t i = 0; i < processes; ++i) {
        if (i != victim) consumers_[i]->Signal(SIGSTOP);
      }
      consumers_[victim]->Signal(SIGKILL);
      consumers_[victim]->Wait(seconds(5));
      ASSERT_NO_FATAL_FAILURE(StartConsumer(victim, "consumer_before_ack=crash"));
      armed = victim;
    }
    for (std::size_t i = from; i < std::min(from + kChunk, messages.size()); ++i) {
      const Published& m = messages[i];
      std::vector<std::string> xadd = {"XADD", "orders", "*", "body", m.body};
      if (m.poison) {
        xadd.insert(xadd.end(), {"x-upstream-status", "503"});
      } else if (random() % 4 == 0) {
        xadd.insert(xadd.end(), {"x-upstream-delay-ms", std::to_string(random() % 40)});
      }
      RedisReply id = RedisCommand(xadd, redis_port_);
      ASSERT_TRUE(id && id->type == REDIS_REPLY_STRING);
      id_body[std::string(id->str, id->len)] = m.body;
      id_key[std::string(id->str, id->len)] = m.key;
    }
    std::this_thread::sleep_for(milliseconds(100 + random() % 300));
    if (armed != kNone) {
      const std::optional<int> status = consumers_[armed]->Wait(seconds(20));
      ASSERT_TRUE(status.has_value()) << "the armed consumer never finished a message";
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 86) << *status;
      for (std::size_t i = 0; i < processes; ++i) {
        if (i != armed) consumers_[i]->Signal(SIGCONT);
      }
      ASSERT_NO_FATAL_FAILURE(StartConsumer(armed));
      armed = kNone;
      ++kills;
    } else if (chunk == 10) {
      ASSERT_NO_FATAL_FAILURE(RestartRedis());
    } else if (chunk % 2 == 1) {
      consumers_[victim]->Signal(SIGKILL);
      consumers_[victim]->Wait(seconds(5));
      ++kills;
      if (random() % 2 == 0) std::this_thread::sleep_for(milliseconds(random() % 500));
      ASSERT_NO_FATAL_FAILURE(StartConsumer(victim));
    }
  }
  EXPECT_GE(kills, 6);

  // Then they run undisturbed until the group has read everything and nothing is pending.
  std::pair<int64_t, int64_t> left{-1, -1};
  for (int i = 0; i < 120 && left != std::pair<int64_t, int64_t>{0, 0}; ++i) {
    std::this_thread::sleep_for(milliseconds(500));
    left = PendingAndLag();
  }
  ASSERT_EQ(left, (std::pair<int64_t, int64_t>{0, 0}))
      << "pending, lag: every message must be acknowledged or quarantined";

  // What the upstream executed: each operation's key once, and which body it got.
  http::Request question{"GET", "/admin/executions", {}, ""};
  auto executions = http::Call(upstream_url_, question);
  ASSERT_TRUE(executions.has_value());
  const boost::json::object counts = ParseObject(executions->body);
  std::map<std::string, std::string> executed_body;  // business key → the body it executed with
  std::map<std::string, int64_t> runs;               // business key → executions
  for (const auto& [upstream_key, n] : counts.at("keys").as_object()) {
    auto status =
        http::Call(upstream_url_, {"GET", "/status/" + std::string(upstream_key), {}, ""});
    ASSERT_TRUE(status.has_value());
    ASSERT_EQ(status->status, 200) << status->body;
    const boost::json::object answer = ParseObject(status->body);
    const std::string body(answer.at("body").as_string());
    const std::string key(ParseObject(body).at("order").as_string());
    EXPECT_EQ(executed_body.count(key), 0u) << key << " executed under two operations";
    executed_body[key] = body;
    runs[key] += n.as_int64();
  }
  int exactly_once = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "order-" + std::to_string(k);
    EXPECT_EQ(runs[key], 1) << key;
    exactly_once += runs[key] == 1 ? 1 : 0;
  }
  EXPECT_EQ(exactly_once, kKeys);

  // The dead letters: every copy of another payload than the one executed, and the poison
  // messages after max_attempts deliveries; nothing else.
  const auto dead = DeadLetters();
  int mismatched = 0;
  for (const auto& [id, body] : id_body) {
    const std::string& key = id_key[id];
    const bool poison = std::stoi(key.substr(6)) >= kKeys;
    auto it = dead.find(id);
    if (poison) {
      ASSERT_NE(it, dead.end()) << "poison message " << id << " not quarantined";
      EXPECT_EQ(it->second.first, "attempts");
      EXPECT_GE(runs[key], 1);
      EXPECT_LE(runs[key], kMaxAttempts) << key;
    } else if (body != executed_body[key]) {
      ++mismatched;
      ASSERT_NE(it, dead.end()) << id << " (" << body << ") was not quarantined";
      EXPECT_EQ(it->second.first, "payload-mismatch");
      EXPECT_EQ(it->second.second, body);
    } else {
      EXPECT_EQ(it, dead.end()) << id << " was quarantined (" << it->second.first
                                << ") though its payload executed";
    }
  }
  EXPECT_GT(mismatched, kKeys / 8);
  EXPECT_EQ(dead.size(), static_cast<std::size_t>(mismatched + kPoison));

  // Nothing is left PROCESSING once the takeover loops have run.
  for (auto& c : consumers_) {
    c->Signal(SIGTERM);
    EXPECT_TRUE(c->Wait(seconds(20)).has_value());
  }
  auto store = OpenExistingStore(store_url_);
  ASSERT_NE(store, nullptr);
  auto census = store->Census();
  ASSERT_TRUE(census.has_value()) << census.error().message;
  EXPECT_EQ(census->processing, 0);
  std::printf(
      "consumer proof (%zu processes): %zu messages of %d keys (%d poison), %d killed, "
      "%d copies of another payload quarantined\n",
      processes, messages.size(), kKeys + kPoison, kPoison, kills, mismatched);
}

TEST_F(ConsumerProofTest, OneConsumerOnSqliteKilledAndItsBrokerRestartedExecutesEachKeyOnce) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  Proof(1);
}

TEST_F(ConsumerProofTest, ThreeConsumersOnPostgresKilledAndTheirBrokerRestartedExecuteEachKeyOnce) {
  IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
  store_url_ = FreshPostgresStoreUrl();
  Proof(3);
}

}  // namespace
}  // namespace idem::itest
