// tests/integration/consumer_itest.cc — the queue consumer's proof (docs/consumers.md): real
// idemd processes consume a real Redis stream into a counting upstream while they are killed
// (-9) at random moments — one of them exactly between a record's commit and its XACK — and
// the broker is restarted once. Afterwards every business key executed exactly once, every
// message is acknowledged or quarantined, the copies published with another payload are
// quarantined, and no record is PROCESSING. On SQLite (one consumer process) and PostgreSQL
// (three), on Redis and RabbitMQ; and with idemd's payments operation as the target, each
// merchant order charged once at provider-sim while the provider loses answers of charges it
// made. And end to end from the producer side: an idemd's payment events, relayed by its outbox
// to the broker while it is killed, each executed once by consumers keyed by default.
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <signal.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "tests/integration/idemd_fixture.h"
#include "tests/integration/test_brokers.h"

namespace idem::itest {
namespace {

namespace json = boost::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kKeys = 700;  // business keys, each published 1..5 times
constexpr int kPoison = 4;  // keys whose upstream always answers 503 ("nothing done")
constexpr int kMaxAttempts = 6;

// What the consumers' messages become: requests of the counting upstream, payments of idemd's
// own payments operation charged at provider-sim, or — the messages being the payment events an
// idemd's outbox relay published — requests of the counting upstream keyed as the consumers key
// by default (the event id).
enum class Target { kUpstream, kPayments, kEvents };

// A payment command's body: order `key` for `minor` hundredths, in `currency`.
std::string PaymentCommand(const std::string& key, int64_t minor,
                           const std::string& currency = "CNY") {
  return R"({"merchant_order_no":")" + key + R"(","amount":")" + std::to_string(minor / 100) + "." +
         (minor % 100 < 10 ? "0" : "") + std::to_string(minor % 100) + R"(","currency":")" +
         currency + R"("})";
}

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
  }

  // A failed proof keeps its directory (the processes' logs, the broker's) for a post-mortem.
  void TearDown() override {
    if (HasFailure()) {
      const std::string kept = "/tmp/idem-consumer-proof-" + std::to_string(::getpid());
      std::error_code ec;  // best effort: a file that cannot be copied is left out
      std::filesystem::copy(dir_.path(), kept, std::filesystem::copy_options::recursive, ec);
      std::fprintf(stderr, "consumer proof failed: its directory is kept in %s\n", kept.c_str());
    }
    IdemdTest::TearDown();
  }

  std::string ConsumerToml() const {
    const std::string common = "[[consumers]]\nname = \"orders\"\n" + broker_->SourceToml() +
                               "max_attempts = " + std::to_string(kMaxAttempts) +
                               "\nredeliver_after_ms = 2500\nconcurrency = 4\n";
    if (target_ == Target::kPayments) {
      return common + "key = \"json:/merchant_order_no\"\npayments_tenant = \"acme\"\n";
    }
    return common +
           (target_ == Target::kEvents
                ? "[consumers.target]\nrequest = \"POST /v1/shipments\"\n"
                : "key = \"json:/order\"\n"
                  "header_fields = [\"x-upstream-delay-ms\", \"x-upstream-status\"]\n"
                  "[consumers.target]\nrequest = \"POST /v1/orders\"\n") +
           "upstream = \"http://127.0.0.1:" + std::to_string(upstream_url_.port) +
           "\"\nforward_key_header = \"Idempotency-Key\"\nstatus_path = \"/status/{key}\"\n"
           "nothing_done_statuses = [503]\nlate_execution_ms = 0\ntimeout_ms = 1000\n"
           "lease_ms = 2000\nretention_ms = 600000\n";
  }

  // Starts consumer process `i` (again), armed with `failpoints` when given, its takeover loop
  // running every `takeover_ms`.
  void StartConsumer(std::size_t i, const std::string& failpoints = "", int takeover_ms = 300) {
    const std::string config = dir_.File("consumer-" + std::to_string(i) + ".toml");
    WriteConfig(config, {.lease_ms = 2000,
                         .lease_margin_ms = 500,
                         .reconcile_interval_ms = takeover_ms,
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
    auto line = consumers_[i]->WaitForLine("idemd listening on ", seconds(20));
    ASSERT_TRUE(line.has_value()) << "consumer " << i << " did not start (consumer-" << i
                                  << ".log)";
    auto url = http::ParseHttpUrl(line->substr(line->find("http://")));
    ASSERT_TRUE(url.has_value()) << *line;
    last_url_ = *url;
    if (urls_.size() <= i) urls_.resize(i + 1);
    urls_[i] = *url;
  }
  // The messages the running consumers have in hand (idem_consumer_in_flight summed): what a
  // passive declare of a RabbitMQ queue does not count, e.g. a message waiting out its back-off
  // before it is given back. -1 when a consumer does not answer.
  int64_t InHand() {
    int64_t sum = 0;
    for (std::size_t i = 0; i < consumers_.size() && i < urls_.size(); ++i) {
      if (!consumers_[i]) continue;
      auto metrics = http::Call(urls_[i], {"GET", "/metrics", {}, ""});
      if (!metrics) return -1;
      const std::string prefix = "\nidem_consumer_in_flight{consumer=\"orders\"} ";
      const std::size_t found = metrics->body.find(prefix);
      if (found == std::string::npos) return -1;
      sum += std::stoll(metrics->body.substr(found + prefix.size()));
    }
    return sum;
  }
  // One series of the last consumer started, labelled with the consumer; nullopt when absent.
  std::optional<double> Metric(const std::string& series) {
    auto metrics = http::Call(last_url_, {"GET", "/metrics", {}, ""});
    if (!metrics) return std::nullopt;
    const std::string prefix = "\n" + series + "{consumer=\"orders\"} ";
    const std::size_t found = metrics->body.find(prefix);
    if (found == std::string::npos) return std::nullopt;
    return std::stod(metrics->body.substr(found + prefix.size()));
  }
  void StopConsumers() {
    for (auto& c : consumers_) {
      c->Signal(SIGTERM);
      EXPECT_TRUE(c->Wait(seconds(30)).has_value());
    }
  }

  void Proof(std::unique_ptr<TestBroker> broker, std::size_t processes,
             Target target = Target::kUpstream);
  // On SQLite files (one consumer process), or fresh PostgreSQL schemas (two).
  void EventsProof(std::unique_ptr<TestBroker> broker, bool postgres);
  // No record of the consumers' store is left PROCESSING (once they are stopped: their takeover
  // loops have run).
  void ExpectNothingProcessing() {
    auto store = OpenExistingStore(store_url_);
    ASSERT_NE(store, nullptr);
    auto census = store->Census();
    ASSERT_TRUE(census.has_value()) << census.error().message;
    EXPECT_EQ(census->processing, 0);
  }
  // Lets the consumers run undisturbed until the broker has nothing left and they hold nothing;
  // stopped, they give back what they still hold, which must be nothing (else they run again, a
  // few times at most). Returns what is left unanswered: 0 unless the proof failed.
  int64_t Drain() {
    int64_t left = -1;
    for (int round = 0; round < 4 && left != 0; ++round) {
      for (int i = 0, quiet = 0; i < 240 && quiet < 3; ++i) {
        std::this_thread::sleep_for(milliseconds(500));
        left = broker_->Unanswered();
        quiet = left == 0 && InHand() == 0 ? quiet + 1 : 0;
      }
      StopConsumers();
      // What the stopped consumers gave back reaches the queue's count a moment later.
      for (int i = 0; i < 6 && left == 0; ++i) {
        std::this_thread::sleep_for(milliseconds(500));
        left = broker_->Unanswered();
      }
      if (left != 0) {
        for (std::size_t i = 0; i < consumers_.size(); ++i) {
          StartConsumer(i);
          if (HasFatalFailure()) return -1;
        }
      }
    }
    return left;
  }
  void DeadLettersRedriven(std::unique_ptr<TestBroker> broker);
  // A Redis of this test's with one consumer on SQLite consuming it; nullptr, the test failed,
  // when either would not start.
  RedisBroker* OneRedisConsumer() {
    store_url_ = "sqlite://" + dir_.File("consumers.db");
    auto broker = std::make_unique<RedisBroker>(dir_);
    RedisBroker* redis = broker.get();
    broker_ = std::move(broker);
    broker_->Start();
    if (HasFatalFailure()) return nullptr;
    consumers_.resize(1);
    StartConsumer(0);
    return HasFatalFailure() ? nullptr : redis;
  }
  // Each business key's executions (how often the upstream ran it, or the provider charged its
  // order) and the body of the message that executed.
  void Executed(std::map<std::string, int64_t>& runs,
                std::map<std::string, std::string>& executed_body);

  Target target_ = Target::kUpstream;
  std::optional<testing::ChildProcess> upstream_;
  http::Url upstream_url_;
  std::unique_ptr<TestBroker> broker_;
  std::string store_url_;       // the consumers'
  std::string producer_store_;  // the events proof's producer's
  std::vector<std::optional<testing::ChildProcess>> consumers_;
  http::Url last_url_;           // the last consumer process started
  std::vector<http::Url> urls_;  // each consumer process's, as consumers_
};

void ConsumerProofTest::Proof(std::unique_ptr<TestBroker> broker, std::size_t processes,
                              Target target) {
  broker_ = std::move(broker);
  target_ = target;
  const bool payments = target == Target::kPayments;
  // A charge sent twice would be charged twice: the provider does not deduplicate by key.
  if (payments) ProviderMode(true);
  ASSERT_NO_FATAL_FAILURE(broker_->Start());
  if (IsSkipped()) return;
  consumers_.resize(processes);
  for (std::size_t i = 0; i < processes; ++i) ASSERT_NO_FATAL_FAILURE(StartConsumer(i));

  // The messages: each key once with its payload, then 0..4 copies of it, one in six of the keys
  // with a copy of another payload too; some upstream answers take a while, so that kills land
  // while forwards are out.
  std::mt19937_64 random(20261202);
  std::vector<Published> messages;
  for (int k = 0; k < kKeys + kPoison; ++k) {
    const std::string key = "order-" + std::to_string(k);
    // Poison: the upstream answers 503 every time; a payment in a currency idemd refuses.
    const bool poison = k >= kKeys;
    const std::string body =
        payments ? PaymentCommand(key, (k + 1) * 100, poison ? "XXX" : "CNY")
                 : R"({"order":")" + key + R"(","amount":)" + std::to_string(k) + "}";
    const int copies = poison ? 1 : 1 + static_cast<int>(random() % 5);
    for (int c = 0; c < copies; ++c) messages.push_back({key, body, poison});
    if (!poison && k % 6 == 0) {
      messages.push_back(
          {key, payments ? PaymentCommand(key, 1) : R"({"order":")" + key + R"(","amount":-1})",
           false});
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
    // Charges whose answer is lost: made, and the connection dropped; made 300 ms after a 500.
    // Each is an unknown outcome, settled by looking the charge up before anything is sent again.
    if (payments && chunk == 2)
      Fault(R"({"fault":"succeed_then_timeout","delay_ms":50,"times":3})");
    if (payments && chunk == 7) {
      Fault(R"({"fault":"error","status":500,"charge_after_ms":300,"times":3})");
    }
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
      std::vector<std::pair<std::string, std::string>> headers;
      if (payments) {
        // The header fields are the upstream's; payments meet the provider's faults instead.
      } else if (m.poison) {
        headers.emplace_back("x-upstream-status", "503");
      } else if (random() % 4 == 0) {
        headers.emplace_back("x-upstream-delay-ms", std::to_string(random() % 40));
      }
      const std::string id = broker_->Publish(m.body, headers);
      ASSERT_FALSE(id.empty());
      id_body[id] = m.body;
      id_key[id] = m.key;
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
      ASSERT_NO_FATAL_FAILURE(broker_->Restart());
    } else if (chunk % 2 == 1) {
      consumers_[victim]->Signal(SIGKILL);
      consumers_[victim]->Wait(seconds(5));
      ++kills;
      if (random() % 2 == 0) std::this_thread::sleep_for(milliseconds(random() % 500));
      ASSERT_NO_FATAL_FAILURE(StartConsumer(victim));
    }
  }
  EXPECT_GE(kills, 6);

  // Then they run undisturbed until the broker has nothing left and they hold nothing.
  const int64_t left = Drain();
  ASSERT_EQ(left, 0) << "every message must be acknowledged or quarantined";

  std::map<std::string, std::string> executed_body;  // business key → the body it executed with
  std::map<std::string, int64_t> runs;               // business key → executions
  ASSERT_NO_FATAL_FAILURE(Executed(runs, executed_body));
  int exactly_once = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "order-" + std::to_string(k);
    EXPECT_EQ(runs[key], 1) << key;
    exactly_once += runs[key] == 1 ? 1 : 0;
  }
  EXPECT_EQ(exactly_once, kKeys);

  // The dead letters: every copy of another payload than the one executed, and the poison
  // messages after max_attempts deliveries; nothing else.
  const auto dead = broker_->DeadLetters();
  int mismatched = 0;
  for (const auto& [id, body] : id_body) {
    const std::string& key = id_key[id];
    const bool poison = std::stoi(key.substr(6)) >= kKeys;
    auto it = dead.find(id);
    if (poison && payments) {
      // Refused by the payments' validation (422) before anything was charged.
      ASSERT_NE(it, dead.end()) << "poison message " << id << " not quarantined";
      EXPECT_EQ(it->second.reason, "invalid");
      EXPECT_EQ(runs[key], 0) << key;
    } else if (poison) {
      ASSERT_NE(it, dead.end()) << "poison message " << id << " not quarantined";
      // Quarantined by the consumer after max_attempts deliveries, or by a RabbitMQ queue's
      // delivery limit when kills returned it more often than that before it could be.
      EXPECT_TRUE(it->second.reason == "attempts" || it->second.reason == "delivery_limit")
          << it->second.reason;
      EXPECT_GE(runs[key], 1);
      EXPECT_LE(runs[key], kMaxAttempts) << key;
    } else if (body != executed_body[key]) {
      ++mismatched;
      ASSERT_NE(it, dead.end()) << id << " (" << body << ") was not quarantined";
      EXPECT_EQ(it->second.reason, "payload-mismatch");
      EXPECT_EQ(it->second.body, body);
    } else {
      EXPECT_EQ(it, dead.end()) << id << " was quarantined (" << it->second.reason
                                << ") though its payload executed";
    }
  }
  EXPECT_GT(mismatched, kKeys / 8);
  EXPECT_EQ(dead.size(), static_cast<std::size_t>(mismatched + kPoison));

  ASSERT_NO_FATAL_FAILURE(ExpectNothingProcessing());
  std::printf(
      "consumer proof (%s, %zu processes): %zu messages of %d keys (%d poison), %d killed, "
      "%d copies of another payload quarantined\n",
      payments ? "payments" : "upstream", processes, messages.size(), kKeys + kPoison, kPoison,
      kills, mismatched);
}

// The events proof, end to end: an idemd's payments announce themselves through its outbox relay
// (the fixture's idemd, on a store of its own) to the broker the consumers read, and each event
// becomes one request of the counting upstream, keyed as the consumers key by default: by the
// event id. Meanwhile the producer is killed (-9) at random moments of its relay's work — once
// exactly between a page's publication and its mark, so the page is published again — the
// consumers are killed, and the broker restarts; the books refund charges injected at the
// provider, so some payments have two or three events. Afterwards every event the payments
// wrote reached the upstream exactly once, the broker holds each payment's events in order, and
// nothing was quarantined.
void ConsumerProofTest::EventsProof(std::unique_ptr<TestBroker> broker, bool postgres) {
  if (postgres) {
    IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
    store_url_ = FreshPostgresStoreUrl();
    producer_store_ = FreshPostgresStoreUrl();
  } else {
    store_url_ = "sqlite://" + dir_.File("consumers.db");
    producer_store_ = "sqlite://" + dir_.File("producer.db");
  }
  const std::size_t processes = postgres ? 2 : 1;
  broker_ = std::move(broker);
  target_ = Target::kEvents;
  ASSERT_NO_FATAL_FAILURE(broker_->Start());
  if (IsSkipped()) return;
  consumers_.resize(processes);
  for (std::size_t i = 0; i < processes; ++i) ASSERT_NO_FATAL_FAILURE(StartConsumer(i));
  ASSERT_TRUE(broker_->RouteEvents());
  // The producer: its relay tries a pass every 50 ms, in pages of 8, under a lease of 1.5 s; its
  // books look for duplicate charges every 300 ms, under a lease of 2 s (a producer killed in a
  // run holds it that long, not the default minute).
  IdemdOptions producer;
  producer.store_url = producer_store_;
  producer.extra_tables = "[outbox]\n" + broker_->OutboxToml() +
                          "interval_ms = 50\nbatch = 8\nlease_ms = 1500\n"
                          "[reconciliation]\ninterval_ms = 300\nwindow_ms = 600000\nlag_ms = 0\n"
                          "lease_ms = 2000\n";
  IdemdOptions armed = producer;  // dies (86) after its first page is confirmed, before the mark
  armed.env["IDEM_FAILPOINTS"] = "outbox_after_publish=crash";
  ASSERT_NO_FATAL_FAILURE(StartIdemd(producer));
  bool armed_running = false;
  int failpoint_exits = 0;
  const auto restart_producer = [&](std::optional<int> status) {
    if (armed_running) {
      const bool at_failpoint = status && WIFEXITED(*status) && WEXITSTATUS(*status) == 86;
      EXPECT_TRUE(at_failpoint) << "the armed producer did not die at its failpoint";
      failpoint_exits += at_failpoint ? 1 : 0;
      armed_running = false;
    }
    StartIdemd(producer);
  };
  // POST /v1/payments until the producer answers it finally (201 or 402); a producer that died
  // meanwhile (at its failpoint) is restarted, and the same key sent again. Returns the status
  // and the id of the payment of merchant order `order`.
  const auto pay = [&](const std::string& key, const std::string& order, const std::string& body) {
    for (int attempt = 0; attempt < 150 && !HasFatalFailure(); ++attempt) {
      http::Request req{"POST", "/v1/payments", {}, body};
      req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
      req.headers.Set("Content-Type", "application/json");
      req.headers.Set("Idempotency-Key", key);
      auto r = http::Call(idemd_url_, std::move(req));
      if (r && r->status == 201) {
        return std::make_pair(201, std::string(ParseObject(r->body).at("id").as_string()));
      }
      if (r && r->status == 402) {  // a problem, which does not name the payment: the store does
        std::unique_ptr<Store> store = OpenExistingStore(producer_store_);
        auto rows =
            store
                ? store->Query("SELECT id FROM payments WHERE merchant_order_no = '" + order + "'")
                : Result<std::vector<SqlRow>>(MakeError(Errc::kInternal, "no store"));
        EXPECT_TRUE(rows && rows->size() == 1) << order;
        return std::make_pair(402, rows && rows->size() == 1
                                       ? std::get<std::string>(rows->at(0).at(0))
                                       : std::string());
      }
      if (!r) {
        if (std::optional<int> status = idemd_->Wait(milliseconds(500))) restart_producer(status);
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    ADD_FAILURE() << key << " was never answered";
    return std::make_pair(0, std::string());
  };

  constexpr int kChunks = 8;
  constexpr int kPerChunk = 12;
  std::mt19937_64 random(20261203);
  std::map<std::string, int> status_of;                     // payment → its POST's answer
  std::map<std::string, std::set<std::string>> charges_of;  // payment → charges injected
  int kills = 0;
  int producer_kills = 0;
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    if (chunk == 2) {
      KillIdemd();
      ++producer_kills;
      ASSERT_NO_FATAL_FAILURE(StartIdemd(armed));
      armed_running = true;
    }
    for (int i = 0; i < kPerChunk; ++i) {
      const int n = chunk * kPerChunk + i;
      const std::string order = "ORD-EVENTS-" + std::to_string(n);
      const std::string amount = std::to_string(10 + n) + ".00";
      if (n % 8 == 6) Fault(R"({"fault":"decline","times":1})");
      const auto [status, id] =
          pay("events-proof-" + std::to_string(n), order, Body(order, "\"" + amount + "\""));
      ASSERT_NE(status, 0);
      status_of[id] = status;
      // A charge the provider made twice, or three times: each extra one refunded by the books.
      for (int extra = 0; status == 201 && extra < (n % 8 == 1 ? 2 : n % 4 == 1 ? 1 : 0); ++extra) {
        charges_of[id].insert(InjectCharge(id, amount, "CNY"));
      }
    }
    if (armed_running) {
      ASSERT_NO_FATAL_FAILURE(restart_producer(idemd_->Wait(seconds(20))));
    }
    std::this_thread::sleep_for(milliseconds(random() % 300));
    const std::size_t victim = random() % processes;
    if (chunk == 6) {
      ASSERT_NO_FATAL_FAILURE(broker_->Restart());
    } else if (chunk % 3 != 1) {
      KillIdemd();
      ++producer_kills;
      if (random() % 2 == 0) std::this_thread::sleep_for(milliseconds(random() % 500));
      ASSERT_NO_FATAL_FAILURE(StartIdemd(producer));
    }
    if (chunk % 3 != 0) {
      consumers_[victim]->Signal(SIGKILL);
      consumers_[victim]->Wait(seconds(5));
      ++kills;
      ASSERT_NO_FATAL_FAILURE(StartConsumer(victim));
    }
  }
  EXPECT_EQ(failpoint_exits, 1);

  // The books refund every extra charge, and the relay publishes everything; then the consumers
  // drain.
  for (int i = 0; i < 300; ++i) {
    bool refunded = true;
    for (const auto& [id, charges] : charges_of) {
      for (const std::string& charge : charges) refunded = refunded && RefundsOf(charge) == 1;
    }
    if (refunded) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  std::vector<OutboxEvent> unpublished;
  for (int i = 0; i < 300; ++i) {
    std::unique_ptr<Store> store = OpenExistingStore(producer_store_);
    ASSERT_NE(store, nullptr);
    auto events = UnpublishedOutboxEvents(*store, 1000);
    ASSERT_TRUE(events.has_value()) << events.error().message;
    unpublished = std::move(*events);
    if (unpublished.empty()) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_TRUE(unpublished.empty()) << unpublished.size() << " events never published";
  ASSERT_EQ(Drain(), 0) << "every event must be acknowledged";

  // What the payments wrote: each payment's outcome first, then one refund per extra charge, in
  // sequence order, all published.
  std::map<std::string, std::vector<OutboxEvent>> events_of;
  int declined = 0;
  for (const auto& [id, status] : status_of) {
    std::vector<OutboxEvent>& events = events_of[id] = OutboxEventsAt(producer_store_, id);
    declined += status == 402 ? 1 : 0;
    const std::string outcome = status == 201 ? "payment.succeeded" : "payment.failed";
    ASSERT_EQ(events.size(), 1 + charges_of[id].size()) << id;
    EXPECT_EQ(events[0].id, OutboxEventId(id, outcome, "")) << id;
    std::set<std::string> refunded;
    for (std::size_t e = 0; e < events.size(); ++e) {
      EXPECT_EQ(events[e].sequence, static_cast<int64_t>(e + 1)) << id;
      EXPECT_TRUE(events[e].published_at_ms.has_value()) << events[e].id;
      if (e > 0) refunded.insert(events[e].id);
    }
    std::set<std::string> expected;
    for (const std::string& charge : charges_of[id]) {
      expected.insert(OutboxEventId(id, "payment.refunded", charge));
    }
    EXPECT_EQ(refunded, expected) << id;
  }
  std::map<std::string, const OutboxEvent*> written;  // event id → the event
  for (const auto& [id, events] : events_of) {
    for (const OutboxEvent& e : events) written[e.id] = &e;
  }
  std::size_t extra_charges = 0;
  for (const auto& [id, charges] : charges_of) extra_charges += charges.size();
  EXPECT_GE(declined, kChunks * kPerChunk / 8 - 1);
  EXPECT_EQ(extra_charges, static_cast<std::size_t>(kChunks * kPerChunk * 3 / 8));
  EXPECT_EQ(written.size(), status_of.size() + extra_charges);

  // The broker: every copy an event the payments wrote, more copies than events (the page
  // published again after the failpoint), and each payment's first copies in sequence order.
  const std::vector<std::map<std::string, std::string>> copies = broker_->RelayedCopies();
  std::set<std::string> seen;
  std::map<std::string, int64_t> last_first;  // payment → the sequence of its last new event
  for (const auto& copy : copies) {
    auto event = written.find(copy.count("key") != 0 ? copy.at("key") : "");
    ASSERT_NE(event, written.end()) << "a copy of no event the payments wrote";
    EXPECT_EQ(copy.at("aggregate"), event->second->aggregate);
    EXPECT_EQ(copy.at("sequence"), std::to_string(event->second->sequence));
    if (seen.insert(event->first).second) {
      EXPECT_EQ(event->second->sequence, last_first[event->second->aggregate] + 1)
          << event->first << " came before its payment's event " << event->second->sequence - 1;
      last_first[event->second->aggregate] = event->second->sequence;
    }
  }
  EXPECT_EQ(seen.size(), written.size());
  EXPECT_GT(copies.size(), written.size()) << "no event was published twice";

  // The upstream: each event executed exactly once, nothing else; and how often a payment's
  // events executed out of their order (messages run `concurrency` at a time, and a consumer
  // killed with one in hand gets it back after redeliver_after, perhaps behind the next).
  http::Request question{"GET", "/admin/executions", {}, ""};
  auto executions = http::Call(upstream_url_, question);
  ASSERT_TRUE(executions.has_value());
  std::map<std::string, int64_t> runs;
  std::map<std::string, std::map<int64_t, int64_t>> executed_at;  // payment → sequence → #
  const json::object counts = ParseObject(executions->body);
  for (const auto& [upstream_key, n] : counts.at("keys").as_object()) {
    auto status =
        http::Call(upstream_url_, {"GET", "/status/" + std::string(upstream_key), {}, ""});
    ASSERT_TRUE(status.has_value());
    ASSERT_EQ(status->status, 200) << upstream_key << ": " << status->body;
    const json::object answer = ParseObject(status->body);
    const json::object payload = ParseObject(std::string(answer.at("body").as_string()));
    const std::string payment(payload.at("payment").as_object().at("id").as_string());
    const std::string type(payload.at("type").as_string());
    const std::string charge(payload.contains("refund")
                                 ? payload.at("refund").as_object().at("charge_id").as_string()
                                 : "");
    const std::string event = OutboxEventId(payment, type, charge);
    runs[event] += n.as_int64();
    if (auto w = written.find(event); w != written.end()) {
      executed_at[payment][w->second->sequence] = answer.at("execution").as_int64();
    }
  }
  int exactly_once = 0;
  for (const auto& [event, _] : written) {
    EXPECT_EQ(runs[event], 1) << event;
    exactly_once += runs[event] == 1 ? 1 : 0;
  }
  EXPECT_EQ(runs.size(), written.size()) << "the upstream executed an event nobody wrote";
  int out_of_order = 0;
  for (const auto& [payment, at] : executed_at) {
    int64_t before = 0;
    for (const auto& [sequence, execution] : at) {
      out_of_order += execution < before ? 1 : 0;
      before = execution;
    }
  }
  EXPECT_TRUE(broker_->DeadLetters().empty()) << "an event was quarantined";
  ASSERT_NO_FATAL_FAILURE(ExpectNothingProcessing());
  std::printf(
      "events proof (%zu consumer processes): %zu payments (%d declined), %zu events, %zu "
      "copies published, %d executed exactly once; the producer killed %d times (once at its "
      "failpoint), consumers %d times; %d events executed after their payment's next\n",
      processes, status_of.size(), declined, written.size(), copies.size(), exactly_once,
      producer_kills + failpoint_exits, kills, out_of_order);
}

void ConsumerProofTest::Executed(std::map<std::string, int64_t>& runs,
                                 std::map<std::string, std::string>& executed_body) {
  if (target_ == Target::kPayments) {
    // The payments made (one live payment per merchant order; an attempt that charged nothing
    // may be abandoned), and what the provider charged under each payment's reference.
    auto store = OpenExistingStore(store_url_);
    ASSERT_NE(store, nullptr);
    auto rows = store->Query(
        "SELECT id, merchant_order_no, amount_minor, status FROM payments WHERE tenant = 'acme'");
    ASSERT_TRUE(rows.has_value()) << rows.error().message;
    auto stats = http::Call(provider_url_, {"GET", "/admin/stats", {}, ""});
    ASSERT_TRUE(stats.has_value());
    const boost::json::object charged =
        ParseObject(stats->body).at("charges_by_reference").as_object();
    int64_t accounted = 0;
    for (const SqlRow& row : *rows) {
      const std::string id = std::get<std::string>(row.at(0));
      const std::string order = std::get<std::string>(row.at(1));
      const int64_t minor = std::get<int64_t>(row.at(2));
      const std::string status = std::get<std::string>(row.at(3));
      const boost::json::value* n = charged.if_contains(id);
      const int64_t charges = n != nullptr ? n->as_int64() : 0;
      accounted += charges;
      runs[order] += charges;
      if (status == "abandoned") {
        EXPECT_EQ(charges, 0) << id << " was abandoned though charged";
        continue;
      }
      EXPECT_EQ(status, "succeeded") << id << " of " << order;
      EXPECT_EQ(executed_body.count(order), 0u) << order << " paid by two payments";
      executed_body[order] = PaymentCommand(order, minor);
    }
    // Every charge the provider made belongs to a payment of this database.
    EXPECT_EQ(accounted, TotalCharges());
    return;
  }
  // What the upstream executed: each operation's key once, and which body it got.
  http::Request question{"GET", "/admin/executions", {}, ""};
  auto executions = http::Call(upstream_url_, question);
  ASSERT_TRUE(executions.has_value());
  const boost::json::object counts = ParseObject(executions->body);
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
}

// A dead letter that cannot be written leaves its message pending, never acknowledged: the
// move and the acknowledgement are both or neither. Here the dead-letter key holds a string, so
// XADD fails when it runs.
TEST_F(ConsumerProofTest, ARedisDeadLetterThatCannotBeWrittenLeavesItsMessagePending) {
  RedisBroker* redis = OneRedisConsumer();
  if (redis == nullptr) return;
  ASSERT_NE(redis->Command({"SET", "orders.dead", "not a stream"}), nullptr);
  const std::string id = broker_->Publish(R"({"amount":1})", {});  // no key: quarantined
  std::this_thread::sleep_for(seconds(2));
  EXPECT_EQ(broker_->Unanswered(), 1) << "the message was acknowledged without its dead letter";
  // Once the key can take it, the next delivery (after redeliver_after_ms) moves it.
  ASSERT_NE(redis->Command({"DEL", "orders.dead"}), nullptr);
  std::map<std::string, DeadLetter> dead;
  for (int i = 0; i < 40 && dead.empty(); ++i) {
    std::this_thread::sleep_for(milliseconds(250));
    dead = broker_->DeadLetters();
  }
  ASSERT_EQ(dead.count(id), 1u);
  EXPECT_EQ(dead[id].reason, "invalid");
  EXPECT_EQ(broker_->Unanswered(), 0);
}

// Deliveries are not attempts: a message whose consumers die while its one execution is out is
// delivered again and again, each time to wait for that execution's lease, and is delivered more
// than max_attempts times with one execution started. It is taken over and finished, not
// quarantined (it was, as "attempts", and its effect was left to a re-drive: found by the
// payments proof on RabbitMQ, where kills returned a message waiting out its charge's settle
// window nine times).
TEST_F(ConsumerProofTest, AMessageRedeliveredPastMaxAttemptsWhileItsOneExecutionWasOutRunsOnce) {
  RedisBroker* redis = OneRedisConsumer();
  if (redis == nullptr) return;
  // The upstream executes it at once and answers 1.5 s later; the consumer dies meanwhile.
  const std::string id =
      broker_->Publish(R"({"order":"slow-1","amount":1})", {{"x-upstream-delay-ms", "1500"}});
  for (int i = 0; i < 40; ++i) {
    auto executions = http::Call(upstream_url_, {"GET", "/admin/executions", {}, ""});
    ASSERT_TRUE(executions.has_value());
    if (ParseObject(executions->body).at("total").as_int64() == 1) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  consumers_[0]->Signal(SIGKILL);
  consumers_[0]->Wait(seconds(5));
  // Its deliveries as if its consumers had died ten times more while it waited.
  ASSERT_NE(redis->Command({"XCLAIM", "orders", "idem", "test", "0", id, "RETRYCOUNT",
                            std::to_string(kMaxAttempts + 10)}),
            nullptr);
  // Its takeover loop idle, so that the message's next delivery meets the record unfinished.
  ASSERT_NO_FATAL_FAILURE(StartConsumer(0, "", 600000));
  int64_t left = -1;
  for (int i = 0; i < 80 && left != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(250));
    left = broker_->Unanswered();
  }
  EXPECT_EQ(left, 0);
  EXPECT_TRUE(broker_->DeadLetters().empty()) << broker_->DeadLetters().begin()->second.reason;
  auto executions = http::Call(upstream_url_, {"GET", "/admin/executions", {}, ""});
  ASSERT_TRUE(executions.has_value());
  EXPECT_EQ(ParseObject(executions->body).at("total").as_int64(), 1) << executions->body;
}

// What an operator watches: the messages waiting at the broker (lag, sampled as idemd starts
// and at each census), and the messages in hand with the age of the oldest.
TEST_F(ConsumerProofTest, TheMetricsShowTheLagAndTheOldestMessageInHand) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  broker_ = std::make_unique<RedisBroker>(dir_);
  ASSERT_NO_FATAL_FAILURE(broker_->Start());
  // Published before any consumer: a new group reads the stream from its beginning.
  for (int i = 0; i < 12; ++i) {
    ASSERT_FALSE(broker_
                     ->Publish(R"({"order":"lag-)" + std::to_string(i) + R"(","amount":1})",
                               {{"x-upstream-delay-ms", "1500"}})
                     .empty());
  }
  consumers_.resize(1);
  ASSERT_NO_FATAL_FAILURE(StartConsumer(0));
  std::this_thread::sleep_for(milliseconds(700));
  EXPECT_EQ(Metric("idem_consumer_lag"), 12.0) << "sampled as idemd started, before it read any";
  EXPECT_EQ(Metric("idem_consumer_in_flight"), 4.0) << "concurrency 4, each upstream answer slow";
  const std::optional<double> oldest = Metric("idem_consumer_oldest_in_flight_seconds");
  ASSERT_TRUE(oldest.has_value());
  EXPECT_GT(*oldest, 0.3);
  EXPECT_LT(*oldest, 1.6);
  // Once every message is answered, none is in hand.
  for (int i = 0; i < 80 && broker_->Unanswered() != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(250));
  }
  EXPECT_EQ(broker_->Unanswered(), 0);
  EXPECT_EQ(Metric("idem_consumer_in_flight"), 0.0);
  EXPECT_EQ(Metric("idem_consumer_oldest_in_flight_seconds"), 0.0);
}

// An operator lists a consumer's dead letters and moves them back with idemctl: a message
// quarantined while its upstream failed executes once moved back; a copy of another payload is
// quarantined again; nothing is lost on the way.
void ConsumerProofTest::DeadLettersRedriven(std::unique_ptr<TestBroker> broker) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  broker_ = std::move(broker);
  ASSERT_NO_FATAL_FAILURE(broker_->Start());
  consumers_.resize(1);
  ASSERT_NO_FATAL_FAILURE(StartConsumer(0));
  const std::string config = dir_.File("consumer-0.toml");
  const auto executions_of = [&](const std::string& order) -> int64_t {
    auto executions = http::Call(upstream_url_, {"GET", "/admin/executions", {}, ""});
    if (!executions) return -1;
    int64_t n = 0;
    const boost::json::object counts = ParseObject(executions->body);
    for (const auto& [upstream_key, count] : counts.at("keys").as_object()) {
      auto status =
          http::Call(upstream_url_, {"GET", "/status/" + std::string(upstream_key), {}, ""});
      if (status && status->body.find(order) != std::string::npos) n += count.as_int64();
    }
    return n;
  };
  const auto dead_letters = [&]() {
    auto [code, out] = RunIdemctl(
        {"dead-letter", "list", "--config", config, "--consumer", "orders", "-o", "json"});
    EXPECT_EQ(code, 0) << out;
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(out, ec);
    return !ec && v.is_array() ? v.as_array() : boost::json::array{};
  };
  const auto settle = [&](std::size_t dead) {
    for (int i = 0; i < 80 && !(broker_->Unanswered() == 0 && dead_letters().size() == dead); ++i) {
      std::this_thread::sleep_for(milliseconds(250));
    }
  };
  ASSERT_FALSE(broker_->Publish(R"({"order":"k1","amount":1})", {}).empty());
  settle(0);
  ASSERT_FALSE(broker_->Publish(R"({"order":"k1","amount":2})", {}).empty());  // quarantined
  // As the consumer quarantines a message whose upstream failed max_attempts times.
  ASSERT_FALSE(broker_
                   ->PublishTo("orders.dead", R"({"order":"k2","amount":1})",
                               {{"idem_source_id", "m-old"},
                                {"idem_consumer", "orders"},
                                {"idem_reason", "attempts"},
                                {"idem_detail", "the upstream failed"},
                                {"idem_deliveries", "7"},
                                {"x-trace", "t-1"}})
                   .empty());
  settle(2);
  boost::json::array dead = dead_letters();
  ASSERT_EQ(dead.size(), 2u) << boost::json::serialize(dead);
  std::string mismatch_id, attempts_id;
  for (const boost::json::value& d : dead) {
    const boost::json::object& letter = d.as_object();
    const std::string reason(letter.at("reason").as_string());
    if (reason == "payload-mismatch") {
      mismatch_id = letter.at("id").as_string();
      EXPECT_EQ(letter.at("fields").at("body").as_string(), R"({"order":"k1","amount":2})");
    } else {
      EXPECT_EQ(reason, "attempts");
      attempts_id = letter.at("id").as_string();
      EXPECT_EQ(letter.at("deliveries").as_int64(), 7);
      EXPECT_EQ(letter.at("fields").at("x-trace").as_string(), "t-1");
      EXPECT_EQ(letter.at("fields").as_object().count("idem_reason"), 0u);
    }
  }
  ASSERT_FALSE(attempts_id.empty());
  ASSERT_FALSE(mismatch_id.empty());
  EXPECT_EQ(executions_of("k2"), 0);

  // Moved back, the upstream now answering: it executes, once.
  auto [moved, said] = RunIdemctl(
      {"dead-letter", "redrive", "--config", config, "--consumer", "orders", "--id", attempts_id});
  EXPECT_EQ(moved, 0) << said;
  EXPECT_NE(said.find("1 dead letter of orders moved back"), std::string::npos) << said;
  settle(1);
  EXPECT_EQ(executions_of("k2"), 1);
  dead = dead_letters();
  ASSERT_EQ(dead.size(), 1u) << boost::json::serialize(dead);
  EXPECT_EQ(dead[0].at("reason").as_string(), "payload-mismatch");

  // The copy of another payload, moved back, is quarantined again; k1 ran once.
  auto [again, again_said] =
      RunIdemctl({"dead-letter", "redrive", "--config", config, "--consumer", "orders", "--all"});
  EXPECT_EQ(again, 0) << again_said;
  std::this_thread::sleep_for(seconds(1));
  settle(1);
  dead = dead_letters();
  ASSERT_EQ(dead.size(), 1u) << boost::json::serialize(dead);
  EXPECT_EQ(dead[0].at("reason").as_string(), "payload-mismatch");
  EXPECT_EQ(dead[0].at("fields").at("body").as_string(), R"({"order":"k1","amount":2})");
  EXPECT_EQ(executions_of("k1"), 1);
  EXPECT_EQ(broker_->Unanswered(), 0);

  // A dead letter that is not there: said, exit status 1; an unknown consumer too.
  auto [missing, missing_said] = RunIdemctl(
      {"dead-letter", "redrive", "--config", config, "--consumer", "orders", "--id", "no-such-id"});
  EXPECT_EQ(missing, 1) << missing_said;
  auto [unknown, unknown_said] =
      RunIdemctl({"dead-letter", "list", "--config", config, "--consumer", "nope"});
  EXPECT_EQ(unknown, 1) << unknown_said;
}

TEST_F(ConsumerProofTest, RedisDeadLettersAreListedAndRedrivenWithIdemctl) {
  DeadLettersRedriven(std::make_unique<RedisBroker>(dir_));
}

TEST_F(ConsumerProofTest, RabbitDeadLettersAreListedAndRedrivenWithIdemctl) {
  DeadLettersRedriven(std::make_unique<RabbitBroker>(dir_));
}

// A dead-letter queue deleted after the consumer declared it: the dead letter comes back
// (mandatory), the message is not acknowledged, and once the consumer has declared the queue
// again the message is moved there. Without `mandatory` the broker dropped the dead letter and
// the message was acknowledged: gone.
TEST_F(ConsumerProofTest, ARabbitDeadLetterWithNoQueueIsNotLost) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  auto broker = std::make_unique<RabbitBroker>(dir_);
  RabbitBroker& rabbit = *broker;
  broker_ = std::move(broker);
  ASSERT_NO_FATAL_FAILURE(broker_->Start());
  if (IsSkipped()) return;
  consumers_.resize(1);
  ASSERT_NO_FATAL_FAILURE(StartConsumer(0));
  ASSERT_EQ(broker_->Publish(R"({"order":"first"})", {}).empty(), false);  // the queues exist
  ASSERT_TRUE(rabbit.DeleteQueue("orders.dead"));
  const std::string id = broker_->Publish(R"({"amount":1})", {});  // no key: quarantined
  std::map<std::string, DeadLetter> dead;
  for (int i = 0; i < 80 && !dead.contains(id); ++i) {
    std::this_thread::sleep_for(milliseconds(250));
    dead = broker_->DeadLetters();
  }
  ASSERT_EQ(dead.count(id), 1u) << "the quarantined message was lost";
  EXPECT_EQ(dead[id].reason, "invalid");
}

TEST_F(ConsumerProofTest, OneRedisConsumerOnSqliteKilledAndItsBrokerRestartedExecutesEachKeyOnce) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  Proof(std::make_unique<RedisBroker>(dir_), 1);
}

TEST_F(ConsumerProofTest, ThreeRedisConsumersOnPostgresKilledAndBrokerRestartedExecuteEachKeyOnce) {
  IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
  store_url_ = FreshPostgresStoreUrl();
  Proof(std::make_unique<RedisBroker>(dir_), 3);
}

TEST_F(ConsumerProofTest, OneRabbitConsumerOnSqliteKilledAndItsBrokerRestartedExecutesEachKeyOnce) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  Proof(std::make_unique<RabbitBroker>(dir_), 1);
}

TEST_F(ConsumerProofTest,
       ThreeRabbitConsumersOnPostgresKilledAndBrokerRestartedExecuteEachKeyOnce) {
  IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
  store_url_ = FreshPostgresStoreUrl();
  Proof(std::make_unique<RabbitBroker>(dir_), 3);
}

TEST_F(ConsumerProofTest, PaymentEventsThroughARedisStreamExecuteOnceOnSqlite) {
  EventsProof(std::make_unique<RedisBroker>(dir_), /*postgres=*/false);
}

TEST_F(ConsumerProofTest, PaymentEventsThroughARedisStreamExecuteOnceOnPostgres) {
  EventsProof(std::make_unique<RedisBroker>(dir_), /*postgres=*/true);
}

TEST_F(ConsumerProofTest, PaymentEventsThroughARabbitExchangeExecuteOnceOnSqlite) {
  EventsProof(std::make_unique<RabbitBroker>(dir_), /*postgres=*/false);
}

TEST_F(ConsumerProofTest, PaymentEventsThroughARabbitExchangeExecuteOnceOnPostgres) {
  EventsProof(std::make_unique<RabbitBroker>(dir_), /*postgres=*/true);
}

// A queue of payment commands: each merchant order charged once however often its command is
// delivered, while consumers are killed, the broker restarts and the provider loses answers of
// charges it made.
TEST_F(ConsumerProofTest, ThreeRedisPaymentConsumersOnPostgresChargeEachOrderOnce) {
  IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
  store_url_ = FreshPostgresStoreUrl();
  Proof(std::make_unique<RedisBroker>(dir_), 3, Target::kPayments);
}

TEST_F(ConsumerProofTest, OneRabbitPaymentConsumerOnSqliteChargesEachOrderOnce) {
  store_url_ = "sqlite://" + dir_.File("consumers.db");
  Proof(std::make_unique<RabbitBroker>(dir_), 1, Target::kPayments);
}

}  // namespace
}  // namespace idem::itest
