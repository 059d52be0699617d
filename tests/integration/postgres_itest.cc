// tests/integration/postgres_itest.cc — idemd on PostgreSQL: the protocol end to end, several
// idemd instances on one database while one of them is killed and restarted, and what idemd
// answers while its database stalls.

#include <signal.h>

#include <atomic>
#include <random>
#include <sstream>
#include <thread>

#include "idem/mutex.h"
#include "testing/http_answers.h"
#include "testing/stall.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

class PostgresIdemdTest : public IdemdTest {
 public:
  void SetUp() override {
    IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
    IdemdTest::SetUp();
    store_url_ = FreshPostgresStoreUrl(&schema_);
    StartIdemd({.store_url = store_url_});
  }

  // A duplicate parked on instance b while this instance executes the request: b answers with
  // the first answer once the execution has finished. `extra_store`: both instances' [store]
  // lines. Returns b's /metrics.
  std::string ParkOnAnotherInstance(const std::string& key, const std::string& extra_store) {
    StartIdemd({.store_url = store_url_, .extra_store = extra_store});
    const std::string config = dir_.File("idemd-b.toml");
    WriteConfig(config, {.store_url = store_url_, .extra_store = extra_store});
    auto b = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config},
                                          {{"IDEM_SECRETS", secrets_toml_}}, dir_.path().string(),
                                          dir_.File("idemd-b.log"));
    EXPECT_TRUE(b.has_value());
    if (!b) return "";
    auto b_url = b->WaitForLine("idemd listening on ", std::chrono::seconds(10));
    EXPECT_TRUE(b_url.has_value());
    if (!b_url) return "";
    const http::Url instance_b = *http::ParseHttpUrl(*b_url);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // b's listener connects

    Fault(R"({"fault":"slow","delay_ms":700,"times":1})");
    http::Response first;
    std::thread executor([&] { first = Pay(key, Body("ORD-" + key)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    http::Request req{"POST", "/v1/payments", {}, Body("ORD-" + key)};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    req.headers.Set("Prefer", "wait=10");
    auto waited = http::Call(instance_b, std::move(req));
    executor.join();
    EXPECT_TRUE(waited.has_value());
    if (!waited) return "";
    EXPECT_EQ(first.status, 201) << first.body;
    EXPECT_EQ(waited->status, 201) << waited->body;
    EXPECT_EQ(waited->body, first.body);
    EXPECT_EQ(TotalCharges(), 1);
    auto metrics = http::Call(instance_b, http::Request{"GET", "/metrics", {}, {}});
    EXPECT_TRUE(metrics.has_value());
    return metrics ? metrics->body : "";
  }

  std::string store_url_;
  std::string schema_;
};

TEST_F(PostgresIdemdTest, ExecutesReplaysAndRefusesMismatches) {
  http::Response first = Pay("pg-order-key-1", Body("ORD-PG1"));
  ASSERT_EQ(first.status, 201) << first.body;
  http::Response again = Pay("pg-order-key-1", Body("ORD-PG1", "100"));
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
  EXPECT_EQ(Pay("pg-order-key-1", Body("ORD-PG1", "1")).status, 422);
  EXPECT_EQ(Pay("pg-order-key-2", Body("ORD-PG1")).status, 200) << "order exists";
  EXPECT_EQ(TotalCharges(), 1);
  EXPECT_EQ(PostgresSql("SELECT status FROM " + schema_ + ".payments"), "succeeded");
  EXPECT_EQ(Get("/readyz", "").status, 200);
}

TEST_F(PostgresIdemdTest, ConcurrentDuplicatesChargeOnce) {
  Fault(R"({"fault":"slow","delay_ms":300,"times":1})");
  std::vector<std::thread> threads;
  std::vector<http::Response> responses(32);
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      responses[static_cast<std::size_t>(i)] =
          Pay("pg-dup-key-1", Body("ORD-PGD"), kAlice, {{"Prefer", "wait=10"}});
    });
  }
  for (auto& t : threads) t.join();
  for (const http::Response& r : responses) {
    EXPECT_EQ(r.status, 201);
    EXPECT_EQ(r.body, responses[0].body);
  }
  EXPECT_EQ(TotalCharges(), 1);
}

// A duplicate parked on another instance is woken by the store's notification.
TEST_F(PostgresIdemdTest, PreferWaitOnAnotherInstanceIsWokenByTheStore) {
  const std::string metrics = ParkOnAnotherInstance("pg-wait-key-1", "");
  EXPECT_EQ(metrics.find("idem_store_notifications_total 0"), std::string::npos)
      << "instance b heard the completion from instance a";
}

// With notifications off (`[store] notifications = false`, as on a database whose nodes do not
// share LISTEN/NOTIFY) the parked duplicate finds the completion by polling: the same answer,
// one charge, and nothing heard.
TEST_F(PostgresIdemdTest, PreferWaitOnAnotherInstanceWithoutNotificationsPollsForTheAnswer) {
  const std::string metrics = ParkOnAnotherInstance("pg-wait-key-2", "notifications = false\n");
  EXPECT_NE(metrics.find("idem_store_notifications_total 0"), std::string::npos)
      << "instance b heard a completion it should not have been told of";
}

// The finding on PostgreSQL: three instances on one database, a provider that ignores keys and
// whose front end answers 502 while its back end makes the charge 3 s later. The client retries
// every second on the next instance: each looks the charge up and answers in progress until the
// send has settled (by the database's clock), then the one after the charge landed returns it.
// One charge. Before the fix the first retry charged again.
TEST_F(PostgresIdemdTest, AnUndeclared5xxChargesOnceAcrossThreeInstances) {
  std::vector<testing::ChildProcess> others;
  std::vector<http::Url> instances = {idemd_url_};
  for (const char* name : {"b", "c"}) {
    const std::string config = dir_.File(std::string("idemd-") + name + ".toml");
    WriteConfig(config, {.settle_ms = 5000, .store_url = store_url_});
    auto p = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config},
                                          {{"IDEM_SECRETS", secrets_toml_}}, dir_.path().string(),
                                          dir_.File(std::string("idemd-") + name + ".log"));
    ASSERT_TRUE(p.has_value());
    auto line = p->WaitForLine("idemd listening on ", std::chrono::seconds(10));
    ASSERT_TRUE(line.has_value());
    instances.push_back(*http::ParseHttpUrl(*line));
    others.push_back(std::move(*p));
  }
  StartIdemd({.settle_ms = 5000, .store_url = store_url_});
  instances[0] = idemd_url_;
  ProviderMode(true);
  Fault(R"({"fault":"error","status":502,"charge_after_ms":3000,"times":1})");
  const std::string body = Body("ORD-PG502");
  const http::Response first = PayAt(instances[0], "pg-502-key", body);
  ASSERT_EQ(first.status, 503) << first.body;
  http::Response again;
  int in_progress = 0;
  for (int i = 1; i <= 10; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    again = PayAt(instances[static_cast<std::size_t>(i) % instances.size()], "pg-502-key", body);
    if (again.status != 409) break;
    ++in_progress;
  }
  EXPECT_GE(in_progress, 1) << "a retry a second after the 502 was not held";
  ASSERT_EQ(again.status, 201) << again.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // anything late has landed
  EXPECT_EQ(TotalCharges(), 1);
  for (testing::ChildProcess& p : others) {
    p.Signal(SIGTERM);
    p.Wait(std::chrono::seconds(10));
  }
}

// Three instances on one database. A client sends new orders, retries and concurrent duplicates
// round-robin across them while one instance is killed (-9) and restarted. Afterwards: one
// charge per order, every acknowledged payment is in the table, every replay from every
// instance is byte-identical to the first answer, and nothing stays PROCESSING once the
// reconcilers have run.
enum class RedisMode { kNone, kRestarted, kDown };

void ThreeInstances(PostgresIdemdTest& t, RedisMode mode) {
  constexpr int kOrders = 40;
  // With Redis: an instance of this test's own, so it can be restarted mid-run.
  const uint16_t redis_port = testing::FreeLoopbackPort();
  std::optional<testing::ChildProcess> redis;
  auto start_redis = [&] {
    auto p = testing::ChildProcess::Spawn(
        {"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(redis_port),
         "--save", "", "--appendonly", "no"},
        {}, t.dir_.path().string(), t.dir_.File("redis.log"));
    ASSERT_TRUE(p.has_value());
    redis.emplace(std::move(*p));
    ASSERT_TRUE(testing::WaitForPort(redis_port, std::chrono::seconds(10)));
  };
  if (mode == RedisMode::kRestarted) start_redis();
  const std::string redis_url = mode == RedisMode::kNone ? ""
                                : mode == RedisMode::kDown
                                    ? "redis://127.0.0.1:1"
                                    : "redis://127.0.0.1:" + std::to_string(redis_port);
  // Instance 0 is the fixture's; two more share the database (and the provider).
  std::vector<std::optional<testing::ChildProcess>> others(2);
  Mutex urls_mu;  // the restarted instance's address changes while clients run
  std::vector<http::Url> urls(3);
  auto start_other = [&](int i) {
    const std::string config = t.dir_.File("idemd-" + std::to_string(i) + ".toml");
    t.WriteConfig(config, {.lease_ms = 2000,
                           .reconcile_interval_ms = 300,
                           .store_url = t.store_url_,
                           .redis_url = redis_url});
    auto p = testing::ChildProcess::Spawn(
        {IDEMD_PATH, "--config", config}, {{"IDEM_SECRETS", t.secrets_toml_}},
        t.dir_.path().string(), t.dir_.File("idemd-" + std::to_string(i) + ".log"));
    ASSERT_TRUE(p.has_value());
    others[static_cast<std::size_t>(i - 1)].emplace(std::move(*p));
    auto url = others[static_cast<std::size_t>(i - 1)]->WaitForLine("idemd listening on ",
                                                                    std::chrono::seconds(10));
    ASSERT_TRUE(url.has_value());
    MutexLock lock(urls_mu);
    urls[static_cast<std::size_t>(i)] = *http::ParseHttpUrl(*url);
  };
  t.StartIdemd({.lease_ms = 2000,
                .reconcile_interval_ms = 300,
                .store_url = t.store_url_,
                .redis_url = redis_url});
  {
    MutexLock lock(urls_mu);
    urls[0] = t.idemd_url_;
  }
  start_other(1);
  start_other(2);
  t.Fault(R"({"fault":"slow","delay_ms":50})");  // every charge takes a moment

  auto pay_at = [&](int instance, const std::string& key, const std::string& body) {
    http::Request req{"POST", "/v1/payments", {}, body};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    http::Url url;
    {
      MutexLock lock(urls_mu);
      url = urls[static_cast<std::size_t>(instance)];
    }
    return http::Call(url, std::move(req));
  };

  std::vector<std::string> first_answer(kOrders);
  Mutex mu;
  std::thread chaos([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    others[0]->Signal(SIGKILL);
    others[0]->Wait(std::chrono::seconds(5));
    others[0].reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    start_other(1);
    if (mode == RedisMode::kRestarted) {  // and Redis goes away and comes back, empty
      redis->Signal(SIGKILL);
      redis->Wait(std::chrono::seconds(5));
      redis.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      start_redis();
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int o = c; o < kOrders; o += 4) {
        const std::string key = "multi-key-" + std::to_string(o);
        const std::string body = IdemdTest::Body("ORD-M" + std::to_string(o));
        // Two concurrent copies on two instances, then retries until a final answer.
        std::thread twin([&, o] { (void)pay_at((o + 1) % 3, key, body); });
        for (int attempt = 0; attempt < 200; ++attempt) {
          auto r = pay_at((o + attempt) % 3, key, body);
          if (r && (r->status == 201 || r->status == 200)) {
            MutexLock lock(mu);
            if (first_answer[static_cast<std::size_t>(o)].empty()) {
              first_answer[static_cast<std::size_t>(o)] = r->body;
            }
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        twin.join();
      }
    });
  }
  for (auto& client : clients) client.join();
  chaos.join();
  if (mode == RedisMode::kRestarted) {
    // An instance that met the dead Redis leaves it alone for a second before trying again.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  t.Fault(R"({"fault":"none"})");

  // Exactly one charge per order, and every acknowledged payment is in the table.
  auto stats = http::Call(t.provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  ASSERT_TRUE(stats.has_value());
  json::object by_ref = t.ParseObject(stats->body)["charges_by_reference"].as_object();
  EXPECT_EQ(by_ref.size(), static_cast<std::size_t>(kOrders));
  for (const auto& kv : by_ref) EXPECT_EQ(kv.value().as_int64(), 1) << kv.key();
  for (int o = 0; o < kOrders; ++o) {
    const std::string& answer = first_answer[static_cast<std::size_t>(o)];
    ASSERT_FALSE(answer.empty()) << "order " << o << " never got a final answer";
    const std::string id = std::string(t.ParseObject(answer)["id"].as_string());
    EXPECT_EQ(PostgresSql("SELECT status FROM " + t.schema_ + ".payments WHERE id = '" + id + "'"),
              "succeeded");
    // Replays from every instance are byte-identical to the first answer.
    for (int i = 0; i < 3; ++i) {
      auto r =
          pay_at(i, "multi-key-" + std::to_string(o), IdemdTest::Body("ORD-M" + std::to_string(o)));
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->body, answer) << "instance " << i << " order " << o;
    }
  }
  if (mode == RedisMode::kRestarted) {
    // The replays above went through the cache: the restarted Redis holds records again.
    const std::string command = "redis-cli -p " + std::to_string(redis_port) + " DBSIZE";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char line[64] = {0};
    const bool read = std::fgets(line, sizeof line, pipe) != nullptr;
    pclose(pipe);
    ASSERT_TRUE(read);
    EXPECT_GT(std::atoi(line), 0) << "no record was cached in Redis";
  }
  // The reconcilers leave nothing PROCESSING.
  std::string processing;
  for (int i = 0; i < 50; ++i) {
    processing = PostgresSql("SELECT count(*) FROM " + t.schema_ +
                             ".idem_records WHERE state = 'PROCESSING'");
    if (processing == "0") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(processing, "0");
}

// The server processes serving connections named `name`, when they run on this machine. Waits
// (up to 2 s) for `expected` of them: a session that just closed goes away asynchronously.
std::vector<pid_t> LocalBackends(const std::string& name, std::size_t expected) {
  std::vector<pid_t> out;
  for (int i = 0; i < 100; ++i) {
    out.clear();
    std::istringstream in(PostgresSql(
        "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE application_name = '" +
        name + "'"));
    for (pid_t pid; in >> pid;) out.push_back(pid);
    if (out.size() == expected) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::erase_if(out, [](pid_t pid) { return !testing::IsLocalProcess(pid, "postgres"); });
  return out;
}

// The database stops answering under a running idemd: every server process serving it is
// stopped (SIGSTOP; only this test's, other tests share the server). /readyz says 503 not-ready
// within about a second, a payment 503 with Retry-After within the statement bound; once the
// database resumes, both serve again.
TEST_F(PostgresIdemdTest, AStalledDatabaseIsNotReadyWithinASecondAndUnavailableWithinItsBound) {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  constexpr milliseconds kStatementTimeout{1000};
  constexpr milliseconds kSlack{1500};
  StartIdemd({.store_url = store_url_ + "&application_name=" + schema_,
              .extra_store = "statement_timeout_ms = 1000\nlock_timeout_ms = 500\n"});
  ASSERT_EQ(Get("/readyz", "").status, 200);
  ASSERT_EQ(Pay("pg-stall-key-1", Body("ORD-PGS1")).status, 201);
  // The pool's four connections, the completion listener's and the readiness probe's.
  const std::vector<pid_t> backends = LocalBackends(schema_, 6);
  if (backends.empty()) IDEM_SKIP_OR_FAIL("the test server does not run on this machine");

  testing::StoppedProcesses stopped(backends);
  Clock::time_point start = Clock::now();
  const http::Response ready = Get("/readyz", "");
  const auto ready_took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_EQ(ready.status, 503) << "after " << ready_took.count() << " ms: " << ready.body;
  EXPECT_EQ(testing::TypeOf(ready), "urn:idem:problem:not-ready");
  EXPECT_EQ(testing::HeaderOf(ready, "Retry-After"), "1");
  EXPECT_LT(ready_took, milliseconds(1000) + milliseconds(500));

  start = Clock::now();
  const http::Response pay = Pay("pg-stall-key-2", Body("ORD-PGS2"));
  const auto pay_took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_EQ(pay.status, 503) << "after " << pay_took.count() << " ms: " << pay.body;
  EXPECT_EQ(testing::TypeOf(pay), "urn:idem:problem:unavailable");
  EXPECT_EQ(testing::HeaderOf(pay, "Retry-After"), "1");
  EXPECT_LT(pay_took, kStatementTimeout + milliseconds(1000) + kSlack);

  stopped.Continue();
  EXPECT_EQ(Get("/readyz", "").status, 200);
  EXPECT_EQ(Pay("pg-stall-key-2", Body("ORD-PGS2")).status, 201);
  EXPECT_EQ(Get("/healthz", "").status, 200);
}

// An idemd instance whose wall clock is `skew` off (libfaketime, preloaded into that process
// only; its monotonic clock is left alone), on the fixture's database and provider.
struct SkewedInstance {
  std::optional<testing::ChildProcess> process;
  http::Url url;
};

SkewedInstance StartSkewed(PostgresIdemdTest& t, const IdemdTest::IdemdOptions& options,
                           const std::string& skew) {
  SkewedInstance out;
  const std::string config = t.dir_.File("idemd-skewed.toml");
  t.WriteConfig(config, options);
  auto p = testing::ChildProcess::Spawn(
      {IDEMD_PATH, "--config", config},
      {{"IDEM_SECRETS", t.secrets_toml_},
       {"LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"},
       {"FAKETIME", skew},
       {"FAKETIME_DONT_FAKE_MONOTONIC", "1"},
       // Sanitizer builds: libfaketime comes before the sanitizer's runtime.
       {"ASAN_OPTIONS", "verify_asan_link_order=0"}},
      t.dir_.path().string(), t.dir_.File("idemd-skewed.log"));
  EXPECT_TRUE(p.has_value());
  if (!p) return out;
  out.process.emplace(std::move(*p));
  auto url = out.process->WaitForLine("idemd listening on ", std::chrono::seconds(10));
  EXPECT_TRUE(url.has_value()) << "the skewed instance did not start";
  if (url) out.url = *http::ParseHttpUrl(*url);
  return out;
}

// One clock: two instances on one database, one of them with its wall clock far ahead or far
// behind, and a provider that ignores idempotency keys. A payment is in flight at the provider
// through one instance while its retries reach the other: they are told it is in progress (409)
// or wait for its answer (Prefer: wait) — no instance takes a live lease over, whatever its
// clock says, and every order is charged once. Concurrent duplicates sent to both at once get
// one answer.
class ClockSkewTest : public PostgresIdemdTest,
                      public ::testing::WithParamInterface<const char*> {};

TEST_P(ClockSkewTest, NoInstanceTakesALiveLeaseOverWhateverItsClockSays) {
  const IdemdOptions options{.lease_ms = 6000,
                             .provider_timeout_ms = 4000,
                             .lease_margin_ms = 500,
                             .store_url = store_url_};
  StartIdemd(options);
  SkewedInstance skewed = StartSkewed(*this, options, GetParam());
  ASSERT_TRUE(skewed.process.has_value());
  const std::vector<http::Url> instances{idemd_url_, skewed.url};
  ProviderMode(/*ignore_keys=*/true);

  for (int from = 0; from < 2; ++from) {
    const http::Url& executor = instances[static_cast<std::size_t>(from)];
    const http::Url& other = instances[static_cast<std::size_t>(1 - from)];
    const std::string key = "skew-key-" + std::to_string(from);
    const std::string body = Body("ORD-SKEW-" + std::to_string(from));
    Fault(R"({"fault":"slow","delay_ms":2000,"times":1})");
    http::Response first;
    std::thread in_flight([&] { first = PayAt(executor, key, body); });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const http::Response retry = PayAt(other, key, body);
    EXPECT_EQ(retry.status, 409) << "from " << from << ": " << retry.body;
    EXPECT_EQ(testing::TypeOf(retry), "urn:idem:problem:request-in-progress");
    const http::Response waited = PayAt(other, key, body, "wait=10");
    in_flight.join();
    ASSERT_EQ(first.status, 201) << "from " << from << ": " << first.body;
    EXPECT_EQ(waited.status, 201) << "from " << from << ": " << waited.body;
    EXPECT_EQ(waited.body, first.body);
    EXPECT_EQ(ChargesFor(std::string(ParseObject(first.body)["id"].as_string())), 1)
        << "from " << from << ": the retry charged again";
  }

  // The skew was real: the skewed instance dated its payment's completion by its own wall clock
  // (a payment's creation is dated by the database's, as the claim is).
  const int64_t dated_normal = std::stoll(PostgresSql(
      "SELECT updated_at FROM " + schema_ + ".payments WHERE merchant_order_no = 'ORD-SKEW-0'"));
  const int64_t dated_skewed = std::stoll(PostgresSql(
      "SELECT updated_at FROM " + schema_ + ".payments WHERE merchant_order_no = 'ORD-SKEW-1'"));
  const int64_t apart_ms = dated_skewed - dated_normal;  // about 3 s of real time, plus the skew
  EXPECT_GT(GetParam()[0] == '+' ? apart_ms : -apart_ms, 30'000) << "the clock was not skewed";

  // Concurrent duplicates on both instances at once.
  Fault(R"({"fault":"slow","delay_ms":300})");
  for (int o = 0; o < 4; ++o) {
    const std::string key = "skew-dup-key-" + std::to_string(o);
    const std::string body = Body("ORD-SKEW-DUP-" + std::to_string(o));
    std::vector<http::Response> answers(4);
    std::vector<std::thread> copies;
    for (std::size_t i = 0; i < answers.size(); ++i) {
      copies.emplace_back([&, i] { answers[i] = PayAt(instances[i % 2], key, body, "wait=10"); });
    }
    for (auto& c : copies) c.join();
    for (const http::Response& a : answers) {
      EXPECT_EQ(a.status, 201) << "order " << o << ": " << a.body;
      EXPECT_EQ(a.body, answers[0].body);
    }
  }
  Fault(R"({"fault":"none"})");
  EXPECT_EQ(TotalCharges(), 6) << "an order was charged more than once";
}

INSTANTIATE_TEST_SUITE_P(Skew, ClockSkewTest, ::testing::Values("+45s", "-45s"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return std::string(param.param[0] == '+' ? "Ahead" : "Behind") + "45s";
                         });

TEST_F(PostgresIdemdTest, ThreeInstancesSurviveAKilledInstance) {
  ThreeInstances(*this, RedisMode::kNone);
}

TEST_F(PostgresIdemdTest, ThreeInstancesWithRedisRestartedMidRun) {
  ThreeInstances(*this, RedisMode::kRestarted);
}

TEST_F(PostgresIdemdTest, ThreeInstancesWithRedisDownThroughout) {
  ThreeInstances(*this, RedisMode::kDown);
}

}  // namespace
}  // namespace idem::itest
