// server/idemd/config/config_test.cc — TOML loading, flag overrides, secrets from file, environment
// or generation, and the errors an operator sees.
#include "server/idemd/config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "testing/fakes.h"

namespace idem::idemd {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("IDEM_SECRETS"); }
  void TearDown() override { unsetenv("IDEM_SECRETS"); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << text;
    return path;
  }
  std::string Minimal(const std::string& extra = "") {
    return "[secrets]\nfile = \"" + dir_.File("secrets.toml") + "\"\ngenerate_if_missing = true\n" +
           extra;
  }

  testing::TempDir dir_;
};

TEST_F(ConfigTest, ReadsTheFileAndFlagsOverrideIt) {
  const std::string path = Write("c.toml", Minimal(R"(
[server]
listen = "127.0.0.1:7000"
io_threads = 3
max_in_flight = 3
max_parked = 300
[store]
url = "sqlite://a.db"
threads = 6
connect_timeout_ms = 2000
statement_timeout_ms = 4000
lock_timeout_ms = 1000
idle_in_transaction_timeout_ms = 6000
keepalives_idle_s = 15
keepalives_interval_s = 5
keepalives_count = 4
[provider]
url = "http://127.0.0.1:9000"
timeout_ms = 1500
nothing_charged_statuses = [503, "502"]
[idempotency]
lease_ms = 20000
retention_hours = 24
max_processing = 7
max_waiters_per_principal = 5
[[principals]]
api_key_sha256 = "86F71C9CB79152AE8C4AFF86CD48DBFC35EEE594762141F8F00ECE58705547E5"
tenant = "acme"
user = "alice"
)"));
  auto c = LoadConfig(path, {"--listen", "0.0.0.0:0", "--store", "sqlite:///tmp/b.db", "--provider",
                             "http://10.0.0.1:1"});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->server.host, "0.0.0.0");
  EXPECT_EQ(c->server.port, 0);
  EXPECT_EQ(c->server.io_threads, 3);
  EXPECT_EQ(c->server.max_in_flight, 3);
  EXPECT_EQ(StoreThreads(c->store), 6);
  EXPECT_EQ(c->store.url, "sqlite:///tmp/b.db");
  EXPECT_EQ(c->provider.url, "http://10.0.0.1:1");
  EXPECT_EQ(c->provider.timeout, Millis(1500));
  EXPECT_EQ(c->provider.nothing_charged_statuses, (std::vector<int>{503, 502}));
  EXPECT_EQ(c->idempotency.lease, Millis(20000));
  EXPECT_EQ(c->idempotency.retention, Millis(24LL * 3600 * 1000));
  EXPECT_EQ(c->idempotency.max_processing, 7);
  EXPECT_EQ(c->idempotency.max_waiters_per_principal, 5);
  EXPECT_EQ(c->server.max_parked, 300);
  EXPECT_EQ(c->store.timeouts.connect, Millis(2000));
  EXPECT_EQ(c->store.timeouts.statement, Millis(4000));
  EXPECT_EQ(c->store.timeouts.lock, Millis(1000));
  EXPECT_EQ(c->store.timeouts.idle_in_transaction, Millis(6000));
  EXPECT_EQ(c->store.timeouts.keepalives_idle, std::chrono::seconds(15));
  EXPECT_EQ(c->store.timeouts.keepalives_interval, std::chrono::seconds(5));
  EXPECT_EQ(c->store.timeouts.keepalives_count, 4);
  ASSERT_EQ(c->principals.size(), 1u);
  EXPECT_EQ(c->principals[0].api_key_sha256,
            "86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5");
}

TEST_F(ConfigTest, DefaultsWhenKeysAreAbsent) {
  auto c = LoadConfig(Write("c.toml", Minimal()), {});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->server.host, "127.0.0.1");
  EXPECT_EQ(c->server.port, 8080);
  EXPECT_EQ(c->store.url, "sqlite://data/idem.db");
  EXPECT_EQ(c->idempotency.retention, Millis(7LL * 24 * 3600 * 1000));
  EXPECT_EQ(c->server.max_body_bytes, 64u * 1024);
  EXPECT_TRUE(c->provider.nothing_charged_statuses.empty())
      << "the conservative reading by default: every 5xx is an unknown outcome";
  // The printed defaults are docs/config.md's (TheReferenceGivesEachKeysDefault); these are
  // what the load makes of them.
  EXPECT_EQ(c->server.io_threads, IoThreadsPerCpu()) << "0: one I/O thread per CPU";
  EXPECT_GE(IoThreadsPerCpu(), 1);
  EXPECT_EQ(StoreThreads(c->store), c->store.pool_size + kSqliteGroupWriters)
      << "0 on SQLite: the readers, and writers to share each commit";
  c->store.url = "postgresql://idem@localhost/idem";
  EXPECT_EQ(StoreThreads(c->store), c->store.pool_size + 1)
      << "0 on PostgreSQL: the connections and one more";
}

TEST_F(ConfigTest, GeneratesDevelopmentSecretsOnceAndPrivately) {
  const std::string path = Write("c.toml", Minimal());
  auto first = LoadConfig(path, {});
  ASSERT_TRUE(first.has_value()) << first.error().message;
  struct stat st {};
  ASSERT_EQ(stat(dir_.File("secrets.toml").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto second = LoadConfig(path, {});
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->secrets.keys.hmac[0].bytes, first->secrets.keys.hmac[0].bytes)
      << "generated once";
  EXPECT_EQ(first->secrets.keys.hmac[0].bytes.size(), 32u);
  EXPECT_NE(first->secrets.keys.hmac[0].bytes, first->secrets.keys.seal[0].bytes);
}

TEST_F(ConfigTest, EnvironmentSecretsWin) {
  const std::string env = "hmac_current = 2\nseal_current = 1\n[[hmac]]\nid = 2\nkey = \"" +
                          std::string(64, 'e') + "\"\n[[seal]]\nid = 1\nkey = \"" +
                          std::string(64, 'f') + "\"\n";
  setenv("IDEM_SECRETS", env.c_str(), 1);
  auto c = LoadConfig(Write("c.toml", "[secrets]\nfile = \"/nonexistent/secrets.toml\"\n"), {});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->secrets.keys.hmac_current, 2u);
  EXPECT_EQ(c->secrets.keys.hmac[0].bytes, std::string(32, '\xee'));
}

TEST_F(ConfigTest, ErrorsNameTheProblem) {
  struct Case {
    std::string toml;
    std::vector<std::string> flags;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {Minimal("[server]\nlisten = \"nohostport\"\n"), {}, "listen"},
      {Minimal("[server]\nlisten = \"h:99999\"\n"), {}, "port"},
      {Minimal("[server]\nworker_threads = \"many\"\n"), {}, "worker_threads"},
      {Minimal(), {"--bogus", "x"}, "unknown flag"},
      {Minimal(), {"--listen"}, "needs a value"},
      {Minimal("[idempotency]\nkey_max_length = 300\n"),
       {},
       "c.toml:5: idempotency.key_max_length must be 1..255"},
      {Minimal("[idempotency]\nkey_min_length = 10\nkey_max_length = 9\n"), {}, "key lengths"},
      {Minimal("[idempotency]\nlease_ms = 0\n"), {}, "lease"},
      {Minimal("[[principals]]\napi_key_sha256 = \"abc\"\ntenant = \"t\"\nuser = \"u\"\n"),
       {},
       "principals"},
      {Minimal("[payments]\ncurrencies = [\"EURO\"]\n"), {}, "currencies"},
      {Minimal("[provider]\nnothing_charged_statuses = [402]\n"), {}, "only 5xx statuses"},
      {Minimal("[provider]\nnothing_charged_statuses = [\"5xx\"]\n"), {}, "only 5xx statuses"},
      {Minimal("[provider]\nnothing_charged_statuses = [503, 503]\n"), {}, "listed twice"},
      {Minimal("[provider]\nnothing_charged_statuses = 503\n"), {}, "an array of 5xx codes"},
      // The boolean of an earlier version says what replaced it.
      {Minimal("[provider]\n5xx_means_nothing_charged = true\n"),
       {},
       "replaced by provider.nothing_charged_statuses"},
      {"[secrets]\nfile = \"/nonexistent/x.toml\"\n", {}, "does not exist"},
      {"this is = not [toml\n", {}, "c.toml"},
      {Minimal("[store]\nlisten_url = \"postgresql://db/idem\"\n"), {}, "store.listen_url"},
      {Minimal("[store]\nurl = \"postgresql://pooler/idem\"\nlisten_url = \"redis://db\"\n"),
       {},
       "store.listen_url"},
      {Minimal("[store]\nurl = \"postgresql://db/idem\"\nnotifications = false\n"
               "listen_url = \"postgresql://db/idem\"\n"),
       {},
       "store.notifications = false"},
  };
  for (const Case& k : cases) {
    auto c = LoadConfig(Write("c.toml", k.toml), k.flags);
    ASSERT_FALSE(c.has_value()) << k.toml;
    EXPECT_EQ(c.error().code, Errc::kInvalidArgument);
    EXPECT_NE(c.error().message.find(k.expect), std::string::npos) << c.error().message;
  }
}

// Each limit a config can set is accepted at its value and refused one past it.
TEST_F(ConfigTest, LimitsHoldAtTheirValueAndOnePast) {
  struct Case {
    std::string at_limit;
    std::string past_limit;
    std::string expect;
  };
  const std::string max_body = std::to_string(limits::kJsonMaxBytes);
  const std::string wait_max = std::to_string(limits::kWaitMax.count());
  const std::string parked = std::to_string(limits::kParkedCeiling);
  const std::string parked_past = std::to_string(limits::kParkedCeiling + 1);
  const std::vector<Case> cases = {
      {"[idempotency]\nkey_max_length = 255\n", "[idempotency]\nkey_max_length = 256\n",
       "key_max_length must be 1..255"},
      {"[idempotency]\nkey_min_length = 1\n", "[idempotency]\nkey_min_length = 0\n",
       "key_min_length must be 1..255"},
      {"[server]\nmax_body_bytes = " + max_body + "\n",
       "[server]\nmax_body_bytes = " + max_body + "1\n", "max_body_bytes"},
      {"[server]\nmax_body_bytes = 1\n", "[server]\nmax_body_bytes = 0\n", "max_body_bytes"},
      {"[idempotency]\nwait_max_ms = " + wait_max + "\n",
       "[idempotency]\nwait_max_ms = " + std::to_string(limits::kWaitMax.count() + 1) + "\n",
       "wait_max_ms"},
      {"[idempotency]\nmax_processing = 1\n", "[idempotency]\nmax_processing = 0\n",
       "bad.toml:5: idempotency.max_processing must be at least 1"},
      {"[idempotency]\nmax_waiters_per_principal = " + parked + "\n",
       "[idempotency]\nmax_waiters_per_principal = " + parked_past + "\n",
       "max_waiters_per_principal"},
      {"[server]\nio_threads = 256\n", "[server]\nio_threads = 257\n", "io_threads"},
      {"[store]\nread_threads = 1\n", "[store]\nread_threads = 0\n", "read_threads"},
      {"[server]\nio_threads = 0\n", "[server]\nio_threads = -1\n", "io_threads"},
      {"[server]\nmax_parked = " + parked + "\n", "[server]\nmax_parked = " + parked_past + "\n",
       "max_parked"},
      {"[idempotency]\nmax_retained = 1\n", "[idempotency]\nmax_retained = 0\n",
       "bad.toml:5: idempotency.max_retained must be at least 1"},
      {"[idempotency]\nmax_new_keys_per_second = 1000000\n",
       "[idempotency]\nmax_new_keys_per_second = 1000001\n", "max_new_keys_per_second"},
      {"[idempotency]\nlease_ms = 59999\nretention_ms = 60000\n",
       "[idempotency]\nlease_ms = 60000\nretention_ms = 60000\n", "lease"},
      {"[store]\nconnect_timeout_ms = 1\n", "[store]\nconnect_timeout_ms = 0\n", "connect"},
      {"[store]\nstatement_timeout_ms = 3600000\n", "[store]\nstatement_timeout_ms = 3600001\n",
       "statement"},
      {"[store]\nlock_timeout_ms = 10000\n", "[store]\nlock_timeout_ms = 10001\n", "lock"},
      {"[store]\nidle_in_transaction_timeout_ms = 1\n",
       "[store]\nidle_in_transaction_timeout_ms = 0\n", "idle_in_transaction"},
      {"[store]\nkeepalives_idle_s = 32767\n", "[store]\nkeepalives_idle_s = 32768\n",
       "keepalives_idle"},
      {"[store]\nkeepalives_interval_s = 1\n", "[store]\nkeepalives_interval_s = 0\n",
       "keepalives_interval"},
      {"[store]\nkeepalives_count = 127\n", "[store]\nkeepalives_count = 128\n",
       "keepalives_count"},
      // Intervals and deadlines of 0: a loop that never sleeps, a call that times out at once.
      {"[idempotency]\nsweep_interval_ms = 1\n", "[idempotency]\nsweep_interval_ms = 0\n",
       "bad.toml:5: idempotency.sweep_interval_ms must be at least 1"},
      {"[idempotency]\nreconcile_interval_ms = 1\n", "[idempotency]\nreconcile_interval_ms = 0\n",
       "bad.toml:5: idempotency.reconcile_interval_ms must be at least 1"},
      {"[idempotency]\nlease_margin_ms = 1\n", "[idempotency]\nlease_margin_ms = 0\n",
       "bad.toml:5: idempotency.lease_margin_ms must be at least 1"},
      {"[server]\nread_timeout_ms = 1\n", "[server]\nread_timeout_ms = 0\n",
       "bad.toml:5: server.read_timeout_ms must be at least 1"},
      {"[provider]\ntimeout_ms = 1\n", "[provider]\ntimeout_ms = 0\n",
       "bad.toml:5: provider.timeout_ms must be at least 1"},
      {"[provider]\nconnect_timeout_ms = 1\n", "[provider]\nconnect_timeout_ms = 0\n",
       "bad.toml:5: provider.connect_timeout_ms must be at least 1"},
  };
  for (const Case& k : cases) {
    auto ok = LoadConfig(Write("ok.toml", Minimal(k.at_limit)), {});
    EXPECT_TRUE(ok.has_value()) << k.at_limit << ": " << ok.error().message;
    auto bad = LoadConfig(Write("bad.toml", Minimal(k.past_limit)), {});
    ASSERT_FALSE(bad.has_value()) << k.past_limit;
    EXPECT_EQ(bad.error().code, Errc::kInvalidArgument);
    EXPECT_NE(bad.error().message.find(k.expect), std::string::npos) << bad.error().message;
  }
}

// Found by fuzz/config_fuzz.cc (UBSan, fed extreme values): retention_hours =
// 9223372036854775807 overflowed on its way to milliseconds, and provider.timeout_ms +
// idempotency.lease_margin_ms overflowed in the lease check (undefined behaviour; wrapped
// negative, the check passed). The same kind, which no sanitizer sees: a count wider than its
// field was cut to it (worker_threads = 4294967297 ran one worker). Durations are now at most ten
// years and counts must fit their fields.
TEST_F(ConfigTest, HugeNumbersAreRefusedNotWrapped) {
  const int64_t ten_years = kMaxConfigDuration.count();
  const int64_t ten_years_h = ten_years / 3'600'000;
  struct Case {
    std::string toml;
    bool accepted;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"[idempotency]\nretention_ms = " + std::to_string(ten_years) + "\n", true, ""},
      {"[idempotency]\nretention_ms = " + std::to_string(ten_years + 1) + "\n", false,
       "retention_ms must be at most"},
      {"[idempotency]\nretention_hours = " + std::to_string(ten_years_h) + "\n", true, ""},
      {"[idempotency]\nretention_hours = " + std::to_string(ten_years_h + 1) + "\n", false,
       "retention_hours must be at most"},
      {"[idempotency]\nretention_hours = 9223372036854775807\n", false, "retention_hours"},
      {"[provider]\ntimeout_ms = 9223372036854775000\n[idempotency]\n"
       "lease_margin_ms = 9223372036854775000\n",
       false, "timeout_ms must be at most"},
      {"[reconciliation]\nwindow_ms = 9223372036854775807\n", false, "window_ms"},
      {"[store]\nkeepalives_idle_s = 9223372036854775807\n", false, "keepalives_idle_s"},
      {"[server]\nworker_threads = 2147483647\n", true, ""},  // ignored, with a warning
      {"[server]\nmax_in_flight = 1000000\n", true, ""},
      {"[server]\nmax_in_flight = 1000001\n", false, "max_in_flight must be 1..1000000"},
      {"[server]\nmax_in_flight = 0\n", false, "max_in_flight must be 1..1000000"},
      {"[store]\nthreads = 1024\n", true, ""},
      {"[store]\nthreads = 1025\n", false, "store.threads must be 0..1024"},
      {"[server]\nworker_threads = 4294967297\n", false, "worker_threads must be at most"},
      {"[store]\npool_size = 2147483648\n", false, "pool_size"},
  };
  for (const Case& k : cases) {
    auto c = LoadConfig(Write("c.toml", Minimal(k.toml)), {});
    if (k.accepted) {
      EXPECT_TRUE(c.has_value()) << k.toml << ": " << c.error().message;
      continue;
    }
    ASSERT_FALSE(c.has_value()) << k.toml;
    EXPECT_EQ(c.error().code, Errc::kInvalidArgument);
    EXPECT_NE(c.error().message.find(k.expect), std::string::npos) << c.error().message;
  }
}

// A charge is sent only under a lease that covers the provider's timeout plus the margin
// (docs/design.md), so a lease that cannot is refused at start-up: at the boundary, and
// accepted one millisecond past it.
TEST_F(ConfigTest, TheLeaseMustOutlastTheProviderTimeoutPlusTheMargin) {
  auto load = [&](int64_t lease_ms, const std::string& margin) {
    return LoadConfig(Write("c.toml", Minimal("[provider]\ntimeout_ms = 5000\n[idempotency]\n"
                                              "lease_ms = " +
                                              std::to_string(lease_ms) + "\n" + margin)),
                      {});
  };
  auto refused = load(7000, "lease_margin_ms = 2000\n");
  ASSERT_FALSE(refused.has_value()) << "lease_ms = provider timeout + margin was accepted";
  EXPECT_EQ(refused.error().code, Errc::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("lease_ms"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("lease_margin_ms"), std::string::npos)
      << refused.error().message;
  auto accepted = load(7001, "lease_margin_ms = 2000\n");
  ASSERT_TRUE(accepted.has_value()) << accepted.error().message;
  EXPECT_EQ(accepted->idempotency.lease_margin, Millis(2000));

  // Without the key, the margin is the library's default.
  const int64_t covered = 5000 + limits::kDefaultLeaseMargin.count();
  EXPECT_FALSE(load(covered, "").has_value());
  auto defaulted = load(covered + 1, "");
  ASSERT_TRUE(defaulted.has_value()) << defaulted.error().message;
  EXPECT_EQ(defaulted->idempotency.lease_margin, limits::kDefaultLeaseMargin);
  // No margin at all: nothing could ever leave after its covered advance.
  EXPECT_FALSE(load(5001, "lease_margin_ms = 0\n").has_value());
}

// The settle window is counted from sent_at, and a charge leaves up to the margin after it (a
// send whose covered advance answered later is not made), then may be out for the whole timeout:
// a window no longer than both ends while the call may still be out. Refused at the boundary,
// accepted one millisecond past it, and not checked for a provider that deduplicates by key.
TEST_F(ConfigTest, TheSettleWindowMustOutlastTheMarginPlusTheProviderTimeout) {
  auto load = [&](int64_t settle_ms, const std::string& extra) {
    return LoadConfig(
        Write("c.toml",
              Minimal("[provider]\ntimeout_ms = 5000\nsettle_ms = " + std::to_string(settle_ms) +
                      "\n" + extra + "[idempotency]\nlease_ms = 30000\nlease_margin_ms = 2000\n")),
        {});
  };
  auto refused = load(7000, "");
  ASSERT_FALSE(refused.has_value()) << "settle_ms = margin + provider timeout was accepted";
  EXPECT_EQ(refused.error().code, Errc::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("settle_ms"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("lease_margin_ms"), std::string::npos)
      << refused.error().message;
  auto accepted = load(7001, "");
  ASSERT_TRUE(accepted.has_value()) << accepted.error().message;
  EXPECT_EQ(accepted->provider.settle, Millis(7001));
  EXPECT_TRUE(load(0, "deduplicates_by_key = true\n").has_value());
}

TEST_F(ConfigTest, SecretsMustBeLongEnough) {
  setenv("IDEM_SECRETS",
         ("hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = \"abcd\"\n[[seal]]\nid = 1\n"
          "key = \"" +
          std::string(64, 'f') + "\"\n")
             .c_str(),
         1);
  auto c = LoadConfig(Write("c.toml", Minimal()), {});
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message.find("hmac"), std::string::npos) << c.error().message;
}

}  // namespace
}  // namespace idem::idemd

namespace idem::idemd {
namespace {

// Minimal() takes three lines: a route's table written right after it begins on line 4.
constexpr const char* kOrders = R"([[routes]]
name = "orders.create"
match = "POST /v1/orders"
upstream = "http://127.0.0.1:3000"
key = "optional"
fingerprint.ignore = ["trace_id", "client_ts"]
fingerprint.decimals = ["amount"]
final_statuses = ["2xx", 400, "402", 404, 409, 422]
store_headers = ["Location", "Content-Type"]
forward_key_header = "Idempotency-Key"
status_path = "/v1/orders?reference={key}"
lease_ms = 20000
timeout_ms = 5000
retention_hours = 24
)";

TEST_F(ConfigTest, GatewayRoutesAreReadWithEverySetting) {
  auto c = LoadConfig(Write("c.toml", Minimal(std::string(kOrders) + R"(
[[routes]]
name = "orders.capture"
match = "PUT /v1/orders/{id}/capture"
upstream = "https://orders.internal:8443/"
retention_ms = 90000
retention_hours = 2
nothing_done_statuses = [503, "502"]
)")),
                      {});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  ASSERT_EQ(c->gateway.routes.size(), 2u);
  const GatewayRoute& r = c->gateway.routes[0];
  EXPECT_EQ(r.name, "orders.create");
  EXPECT_EQ(r.RouteId(), "gw.orders.create");
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.pattern, "/v1/orders");
  EXPECT_EQ(r.upstream, "http://127.0.0.1:3000");
  EXPECT_FALSE(r.key_required);
  EXPECT_EQ(r.fingerprint_ignore, (std::vector<std::string>{"trace_id", "client_ts"}));
  EXPECT_EQ(r.fingerprint_decimals, std::vector<std::string>{"amount"});
  EXPECT_TRUE(r.success_final);
  EXPECT_EQ(r.final_statuses, (std::vector<int>{400, 402, 404, 409, 422}));
  EXPECT_EQ(r.store_headers, (std::vector<std::string>{"location", "content-type"}));
  EXPECT_EQ(r.forward_key_header, "Idempotency-Key");
  EXPECT_FALSE(r.upstream_deduplicates) << "unknown outcomes are held unless the route says so";
  EXPECT_EQ(r.status_path, "/v1/orders?reference={key}");
  EXPECT_EQ(r.lease, Millis(20000));
  EXPECT_EQ(r.timeout, Millis(5000));
  EXPECT_EQ(r.retention, Millis(24LL * 3600 * 1000));
  EXPECT_EQ(r.line, 4);
  const GatewayRoute& capture = c->gateway.routes[1];
  EXPECT_TRUE(capture.key_required) << "keys are required unless the route says otherwise";
  EXPECT_TRUE(r.json_body && capture.json_body)
      << "bodies are JSON unless the route says otherwise";
  EXPECT_EQ(capture.upstream, "https://orders.internal:8443");
  EXPECT_EQ(capture.retention, Millis(90000)) << "retention_ms wins over retention_hours";
  EXPECT_EQ(capture.nothing_done_statuses, (std::vector<int>{503, 502}));
  EXPECT_TRUE(r.nothing_done_statuses.empty()) << "no 5xx proves nothing was done unless declared";
  EXPECT_EQ(capture.line, 19);

  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "POST", "/v1/orders"), &c->gateway.routes[0]);
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "PUT", "/v1/orders/o-17/capture"),
            &c->gateway.routes[1]);
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "GET", "/v1/orders"), nullptr) << "another method";
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "POST", "/v1/orders/"), nullptr)
      << "trailing slash";
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "PUT", "/v1/orders//capture"), nullptr)
      << "an empty segment is no {id}";
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "PUT", "/v1/orders/a/b/capture"), nullptr);
  EXPECT_EQ(MatchGatewayRoute(c->gateway.routes, "POST", "/v1/order"), nullptr);
}

TEST_F(ConfigTest, BadGatewayRoutesAreStartUpErrorsWithTheirLine) {
  struct Case {
    std::string routes;  // from line 4
    std::string expect;
  };
  const std::string orders(kOrders);
  const std::vector<Case> cases = {
      {orders + "color = \"blue\"\n", ":18: [[routes]] orders.create: color: unknown key"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "final_statuses = [\"2xx\", 700]\n",
       ":8: [[routes]] a: final_statuses: 700 is neither"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "final_statuses = [\"3xx\"]\n",
       "final_statuses: \"3xx\" is neither"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "nothing_done_statuses = [404]\n",
       ":8: [[routes]] a: nothing_done_statuses: only 5xx statuses can prove that the upstream did "
       "nothing"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "nothing_done_statuses = [503, \"503\"]\n",
       "nothing_done_statuses: 503 is listed twice"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "nothing_done_statuses = 503\n",
       "nothing_done_statuses: must be an array of 5xx codes"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "final_statuses = [\"2xx\", 503]\nnothing_done_statuses = [503]\n",
       "503 is in final_statuses and in nothing_done_statuses"},
      {orders +
           "[[routes]]\nname = \"b\"\nmatch = \"POST /{v}/orders\"\nupstream = \"http://h:1\"\n",
       ":18: [[routes]] b: POST /{v}/orders overlaps orders.create (POST /v1/orders, line 4)"},
      {"[[routes]]\nname = \"p\"\nmatch = \"PATCH /v1/{kind}\"\nupstream = \"http://h:1\"\n",
       "would shadow idemd's own paths"},
      {orders +
           "[[routes]]\nname = \"orders.create\"\nmatch = \"PUT /x\"\nupstream = \"http://h:1\"\n",
       ":18: [[routes]] orders.create: name already used at line 4"},
      {"[[routes]]\nname = \"p\"\nmatch = \"POST /v1/payments\"\nupstream = \"http://h:1\"\n",
       "would shadow idemd's own paths"},
      {"[[routes]]\nname = \"p\"\nmatch = \"POST /healthz\"\nupstream = \"http://h:1\"\n",
       "would shadow idemd's own paths"},
      {"[[routes]]\nname = \"a\"\nmatch = \"GET /a\"\nupstream = \"http://h:1\"\n",
       "method must be POST, PUT, PATCH or DELETE"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST a\"\nupstream = \"http://h:1\"\n",
       "must start with '/'"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a/b%20c\"\nupstream = \"http://h:1\"\n",
       "bad segment 'b%20c'"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"ftp://h:1\"\n",
       ":7: [[routes]] a: upstream: must be http://host[:port]"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1/base\"\n",
       "without a path"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\n", "needs upstream"},
      {"[[routes]]\nname = \"a\"\nupstream = \"http://h:1\"\n", "needs match"},
      {"[[routes]]\nname = \"A B\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n",
       ":4: [[routes]] A B: name must be"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\nkey = "
       "\"maybe\"\n",
       "key: must be \"required\" or \"optional\""},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "store_headers = [\"Set-Cookie\"]\n",
       "'set-cookie' is never stored or replayed"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "fingerprint.sort = [\"x\"]\n",
       ":8: [[routes]] a: unknown key fingerprint.sort"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "lease_ms = 5000\ntimeout_ms = 5000\n",
       "lease_ms (5000) must be longer than timeout_ms (5000)"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "timeout_ms = 0\n",
       "timeout_ms: must be an integer 1..3600000"},
      {"[routes]\nname = \"a\"\n", "routes must be [[routes]] tables"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "lease_ms = 5000\ntimeout_ms = 1000\nretention_ms = 5000\n",
       "retention (retention_ms) must be longer than lease_ms"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "retention_ms = 0\n",
       ":8: [[routes]] a: retention_ms: must be an integer 1..315360000000"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "forward_key_header = \"K\"\nstatus_path = \"/status\"\n",
       ":9: [[routes]] a: status_path: must be a path"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "forward_key_header = \"K\"\nstatus_path = \"/s/{key}/{key}\"\n",
       "holding {key} once"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "status_path = \"/s/{key}\"\n",
       "status_path needs forward_key_header"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "forward_key_header = \"K\"\nstatus_path = \"/s/{key}#frag\"\n",
       "status_path: must be a path"},
      {"[[routes]]\nname = \"unmatched\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n",
       "name 'unmatched' is taken"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "body = \"xml\"\n",
       ":8: [[routes]] a: body: must be \"json\" or \"bytes\""},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "body = \"bytes\"\nfingerprint.ignore = [\"x\"]\n",
       "need body = \"json\""},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "forward_key_header = \"K\"\nstatus_path = \"/s/{key}\"\n"
       "status_auth_header = \"Authorization\"\n",
       "status_auth_header and status_auth_env go together"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "status_auth_header = \"Authorization\"\nstatus_auth_env = \"HOME\"\n",
       "status_auth_header needs status_path"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "status_auth_header = \"Connection\"\n",
       ":8: [[routes]] a: status_auth_header: must be a header name"},
      // The default lease_margin_ms is 2000: the lease must outlast the exchange and the margin.
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "lease_ms = 2500\ntimeout_ms = 500\n",
       ":4: [[routes]] a: lease_ms (2500) must be longer than timeout_ms (500) + "
       "idempotency.lease_margin_ms (2000)"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "upstream_deduplicates = true\n",
       "upstream_deduplicates needs forward_key_header"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "upstream_deduplicates = \"yes\"\n",
       ":8: [[routes]] a: upstream_deduplicates: must be true or false"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "status_unknown_max_ms = 0\n",
       ":8: [[routes]] a: status_unknown_max_ms: must be an integer 1..315360000000"},
      {"[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
       "late_execution_ms = -1\n",
       ":8: [[routes]] a: late_execution_ms: must be an integer 0..3600000"},
  };
  for (const Case& k : cases) {
    auto c = LoadConfig(Write("c.toml", Minimal(k.routes)), {});
    ASSERT_FALSE(c.has_value()) << k.routes;
    EXPECT_EQ(c.error().code, Errc::kInvalidArgument);
    EXPECT_NE(c.error().message.find(k.expect), std::string::npos)
        << "expected: " << k.expect << "\ngot: " << c.error().message;
  }
}

// A status URL's credential: a header name and the environment variable its value comes from,
// read at load; the value is never printed, and a variable that is not set stops the load.
TEST_F(ConfigTest, AStatusUrlCredentialComesFromTheEnvironmentAndIsNeverPrinted) {
  const std::string route =
      "[[routes]]\nname = \"a\"\nmatch = \"POST /a\"\nupstream = \"http://h:1\"\n"
      "forward_key_header = \"K\"\nstatus_path = \"/s/{key}\"\n"
      "status_auth_header = \"Authorization\"\nstatus_auth_env = \"IDEM_TEST_STATUS_TOKEN\"\n"
      "status_unknown_max_ms = 60000\nlate_execution_ms = 0\n";
  setenv("IDEM_TEST_STATUS_TOKEN", "Bearer very-secret", 1);
  auto c = LoadConfig(Write("c.toml", Minimal(route)), {});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  const GatewayRoute& r = c->gateway.routes[0];
  EXPECT_EQ(r.status_auth_header, "Authorization");
  EXPECT_EQ(r.status_auth_env, "IDEM_TEST_STATUS_TOKEN");
  EXPECT_EQ(r.status_auth_value, "Bearer very-secret");
  EXPECT_EQ(r.status_unknown_max, Millis(60000));
  EXPECT_EQ(r.late_execution, Millis(0));
  const std::string printed = EffectiveConfigToml(*c);
  EXPECT_EQ(printed.find("very-secret"), std::string::npos) << printed;
  EXPECT_NE(printed.find("status_auth_env = 'IDEM_TEST_STATUS_TOKEN'"), std::string::npos)
      << printed;
  auto again = LoadConfig(Write("printed.toml", printed), {});
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->gateway.routes[0].status_auth_value, "Bearer very-secret");
  EXPECT_EQ(again->gateway.routes[0].late_execution, Millis(0));

  unsetenv("IDEM_TEST_STATUS_TOKEN");
  auto unset = LoadConfig(Write("c.toml", Minimal(route)), {});
  ASSERT_FALSE(unset.has_value());
  EXPECT_NE(
      unset.error().message.find(":11: [[routes]] a: status_auth_env: the environment variable "
                                 "IDEM_TEST_STATUS_TOKEN is not set"),
      std::string::npos)
      << unset.error().message;
  // The default bound of "cannot tell".
  auto plain = LoadConfig(Write("c.toml", Minimal(std::string(kOrders))), {});
  ASSERT_TRUE(plain.has_value()) << plain.error().message;
  EXPECT_EQ(plain->gateway.routes[0].status_unknown_max, Millis(3'600'000));
  EXPECT_EQ(plain->gateway.routes[0].late_execution, Millis(30'000));
}

TEST_F(ConfigTest, TheGatewaySectionHasSafeDefaultsAndIsChecked) {
  auto plain = LoadConfig(Write("c.toml", Minimal()), {});
  ASSERT_TRUE(plain.has_value()) << plain.error().message;
  EXPECT_FALSE(plain->gateway.forward_unmatched) << "unmatched paths: 404 unless asked";
  EXPECT_TRUE(plain->gateway.principal_header.empty()) << "no trusted header unless asked";

  auto set = LoadConfig(Write("c.toml", Minimal("[gateway]\nunmatched = \"forward\"\n"
                                                "upstream = \"http://127.0.0.1:3000/\"\n"
                                                "timeout_ms = 2500\n"
                                                "principal_header = \"X-Authenticated-User\"\n"
                                                "max_connections = 64\nca_file = \"/ca.pem\"\n")),
                        {});
  ASSERT_TRUE(set.has_value()) << set.error().message;
  EXPECT_TRUE(set->gateway.forward_unmatched);
  EXPECT_EQ(set->gateway.unmatched_upstream, "http://127.0.0.1:3000");
  EXPECT_EQ(set->gateway.unmatched_timeout, Millis(2500));
  EXPECT_EQ(set->gateway.principal_header, "x-authenticated-user");
  EXPECT_EQ(set->gateway.max_connections, 64);
  EXPECT_EQ(set->gateway.ca_file, "/ca.pem");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[gateway]\nunmatched = \"forward\"\n", "needs gateway.upstream"},
      {"[gateway]\nunmatched = \"pass\"\n", "gateway.unmatched must be"},
      {"[gateway]\nupstream = \"http://h:1/base\"\n", "without a path"},
      {"[gateway]\ncolour = 1\n", ":5: unknown key gateway.colour"},
      {"[gateway]\nprincipal_header = \"Authorization\"\n", "not a credential"},
      {"[gateway]\nprincipal_header = \"X User\"\n", "principal_header must be"},
      {"[gateway]\nmax_connections = 0\n", "gateway.max_connections must be"},
      {"[gateway]\ntimeout_ms = 0\n", "gateway.timeout_ms must be"},
  };
  for (const auto& [toml, expect] : cases) {
    auto c = LoadConfig(Write("c.toml", Minimal(toml)), {});
    ASSERT_FALSE(c.has_value()) << toml;
    EXPECT_NE(c.error().message.find(expect), std::string::npos)
        << "expected: " << expect << "\ngot: " << c.error().message;
  }
}

// One row of docs/config.md's key tables: the section ("routes" for [[routes]]), the keys it
// names, and its type and default columns as written.
struct ReferenceRow {
  std::string section;
  std::vector<std::string> keys;
  std::string type;
  std::string default_value;
  bool array_of_tables = false;  // a [[section]]'s keys
};

std::vector<ReferenceRow> ReferenceRows() {
  std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/docs/config.md");
  EXPECT_TRUE(in.good()) << "docs/config.md";
  const std::regex heading(R"(^## `(\[\[?)([a-z_]+)\]\]?`)");
  const std::regex name("`([^`]+)`");
  std::vector<ReferenceRow> rows;
  std::string section, line;
  bool array_of_tables = false;
  bool in_table = false;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, heading)) {
      section = m[2];
      array_of_tables = m[1] == "[[";
    } else if (line.rfind("## ", 0) == 0) {
      section.clear();
    }
    if (line.rfind("| key | type | default | meaning |", 0) == 0) in_table = true;
    if (line.empty()) in_table = false;
    if (!in_table || section.empty() || line.rfind("| `", 0) != 0) continue;
    ReferenceRow row{section, {}, "", "", array_of_tables};
    const std::size_t bar = line.find(" | ", 2);
    const std::size_t type_end = line.find(" | ", bar + 3);
    const std::string keys = line.substr(2, bar - 2);
    row.type = line.substr(bar + 3, type_end - bar - 3);
    row.default_value = line.substr(type_end + 3, line.find(" | ", type_end + 3) - type_end - 3);
    for (auto it = std::sregex_iterator(keys.begin(), keys.end(), name);
         it != std::sregex_iterator(); ++it) {
      row.keys.push_back(section + "." + (*it)[1].str());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// docs/config.md lists exactly the keys idemd reads (ConfigKeys), each with its type: a key added
// to the code without its line in the reference fails here, and so does a documented key that no
// longer exists.
TEST_F(ConfigTest, TheReferenceListsEveryKeyWithItsTypeAndNothingElse) {
  std::map<std::string, std::string> documented;  // section.key → type
  for (const ReferenceRow& row : ReferenceRows()) {
    for (const std::string& key : row.keys) documented[key] = row.type;
  }
  const std::map<Kind, std::string> type_of = {{Kind::kString, "string"},
                                               {Kind::kInteger, "integer"},
                                               {Kind::kBoolean, "boolean"},
                                               {Kind::kArray, "array"}};
  for (const auto& [key, kind] : ConfigKeys()) {
    auto it = documented.find(key);
    if (it == documented.end()) {
      ADD_FAILURE() << key << " is read by idemd but not listed in docs/config.md";
    } else {
      EXPECT_EQ(it->second, type_of.at(kind)) << key << "'s type in docs/config.md";
    }
  }
  for (const auto& [key, type] : documented) {
    EXPECT_TRUE(ConfigKeys().contains(key))
        << key << " is in docs/config.md but idemd reads no such key";
  }
  EXPECT_GT(documented.size(), 70u) << "the reference's tables were not found";
}

// docs/config.md gives each key's default as --check-config prints it for a file that sets
// nothing: a default changed in the code without its line in the reference fails here.
TEST_F(ConfigTest, TheReferenceGivesEachKeysDefault) {
  // What an empty file loads to, as printed: "section.key" → the value, quotes and spaces gone.
  auto plain = [](std::string text) {
    std::erase_if(text, [](char ch) { return ch == '\'' || ch == '"' || ch == ' ' || ch == '`'; });
    return text;
  };
  Config defaults;
  std::map<std::string, std::string> printed;
  {
    std::istringstream in(EffectiveConfigToml(defaults));
    std::string section, line;
    while (std::getline(in, line)) {
      if (line.size() > 2 && line.front() == '[') section = line.substr(1, line.size() - 2);
      const std::size_t eq = line.find(" = ");
      if (eq != std::string::npos)
        printed[section + "." + line.substr(0, eq)] = plain(line.substr(eq + 3));
    }
  }
  int checked = 0;
  for (const ReferenceRow& row : ReferenceRows()) {
    if (row.array_of_tables) continue;  // entries have no defaults to print
    std::string column = row.default_value;
    if (column == "—" || column.ends_with(" h")) continue;  // removed keys; retention in hours
    if (column == "none" || column.rfind("(empty", 0) == 0) column = "''";
    // "30, 10, 3" for three keys; one value for one key (or for all of them).
    std::vector<std::string> values;
    std::istringstream parts(column);
    for (std::string part; std::getline(parts, part, ',');) values.push_back(plain(part));
    if (row.keys.size() == 1 || values.size() != row.keys.size()) values = {plain(column)};
    for (std::size_t i = 0; i < row.keys.size(); ++i) {
      auto it = printed.find(row.keys[i]);
      ASSERT_NE(it, printed.end()) << row.keys[i] << " is documented but not printed";
      EXPECT_EQ(values[values.size() == 1 ? 0 : i], it->second)
          << row.keys[i] << "'s default in docs/config.md is not the code's";
      ++checked;
    }
  }
  EXPECT_GE(checked, 55) << "the reference's tables were not found";
}

// Every listed key is read and checked: set to a value of no key's type (an inline table), each
// one stops the load with an error naming it. A key listed but never read would load.
TEST_F(ConfigTest, EveryListedKeyIsReadAndChecked) {
  const std::string route =
      "name = \"r\"\nmatch = \"POST /v1/r\"\nupstream = \"http://127.0.0.1:1\"\n";
  for (const auto& [key, kind] : ConfigKeys()) {
    const std::size_t dot = key.find('.');
    const std::string section = key.substr(0, dot);
    const std::string rest = key.substr(dot + 1);
    std::string toml;
    if (section == "routes") {
      toml =
          "[[routes]]\n" + route +
          (rest == "name" || rest == "match" || rest == "upstream" ? ""
                                                                   : rest + " = { probe = 1 }\n");
      if (rest == "name" || rest == "match" || rest == "upstream") {
        toml = "[[routes]]\n" +
               std::regex_replace(route, std::regex(rest + " = [^\n]*"), rest + " = { probe = 1 }");
      }
    } else if (section == "consumers") {
      // The consumer's own keys in its table, target.* in [consumers.target].
      const bool in_target = rest.rfind("target.", 0) == 0;
      const std::string name = in_target ? rest.substr(7) : rest;
      std::string own = "name = \"c\"\nurl = \"redis://127.0.0.1:1\"\nstream = \"s\"\n";
      std::string target = "request = \"POST /v1/c\"\nupstream = \"http://127.0.0.1:1\"\n";
      std::string& table = in_target ? target : own;
      const std::regex set("(^|\n)" + name + " = [^\n]*");
      table = std::regex_search(table, set)
                  ? std::regex_replace(table, set, "$1" + name + " = { probe = 1 }")
                  : table + name + " = { probe = 1 }\n";
      toml = "[[consumers]]\n" + own + "[consumers.target]\n" + target;
    } else if (section == "principals") {
      toml = "[[principals]]\napi_key_sha256 = \"" + std::string(64, 'a') +
             "\"\ntenant = \"t\"\nuser = \"u\"\n";
      toml = std::regex_replace(toml, std::regex(rest + " = [^\n]*"), rest + " = { probe = 1 }");
    } else {
      toml = "[" + section + "]\n" + rest + " = { probe = 1 }\n";
    }
    auto c = LoadConfig(Write("c.toml", section == "secrets" ? toml : Minimal(toml)), {});
    ASSERT_FALSE(c.has_value()) << key << " = { probe = 1 } was accepted";
    const std::string named = section == "principals" ? "principals"
                              : section == "consumers" && rest.rfind("target.", 0) == 0
                                  ? rest.substr(7)
                                  : rest;
    EXPECT_NE(c.error().message.find(named), std::string::npos) << key << ": " << c.error().message;
  }
}

// What --check-config prints is a config that loads back to itself, with passwords redacted.
TEST_F(ConfigTest, TheEffectiveConfigLoadsBackToTheSameConfigWithPasswordsRedacted) {
  const std::string path = Write("c.toml", Minimal(R"(
[server]
listen = "[::1]:7000"
io_threads = 3
max_parked = 300
[store]
url = "postgresql://idem:hunter2@db.internal:5432/idem"
listen_url = "postgresql://idem:hunter2@db-direct.internal/idem"
prepared_statements = false
statement_timeout_ms = 6000
keepalives_count = 4
[redis]
url = "redis://:s3cret@cache:6379/2"
[provider]
url = "https://provider.example/v2"
timeout_ms = 1500
nothing_charged_statuses = [503]
[idempotency]
lease_ms = 20000
retention_hours = 48
[reconciliation]
refund_orphans = true
[payments]
currencies = ["USD", "KRW"]
[gateway]
principal_header = "X-User"
[[principals]]
api_key_sha256 = "86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5"
tenant = "acme"
user = "alice"
[[routes]]
name = "orders.create"
match = "POST /v1/orders/{id}"
upstream = "http://127.0.0.1:3000"
key = "optional"
fingerprint.ignore = ["trace_id"]
final_statuses = ["2xx", 409]
store_headers = ["Location"]
forward_key_header = "X-Key"
status_path = "/v1/orders/by-key/{key}"
timeout_ms = 2000
lease_ms = 5000
retention_hours = 12
[[routes]]
name = "orders.cancel"
match = "DELETE /v1/orders/{id}"
upstream = "http://127.0.0.1:3000"
[[consumers]]
name = "orders"
url = "redis://idem:s3cret@127.0.0.1:6379/1"
stream = "orders"
key = "json:/order/id"
header_fields = ["x-trace"]
max_attempts = 4
[consumers.target]
request = "POST /v1/orders"
upstream = "http://127.0.0.1:3000"
forward_key_header = "X-Key"
retention_hours = 48
)"));
  auto first = LoadConfig(path, {});
  ASSERT_TRUE(first.has_value()) << first.error().message;
  const std::string printed = EffectiveConfigToml(*first);
  for (const char* secret : {"hunter2", "s3cret"}) {
    EXPECT_EQ(printed.find(secret), std::string::npos) << secret << " printed:\n" << printed;
  }
  EXPECT_NE(printed.find("postgresql://idem:REDACTED@db.internal:5432/idem"), std::string::npos)
      << printed;
  // Text Boost.URL does not take still loses what precedes the host.
  EXPECT_EQ(RedactedUrl("postgresql://idem:pw@db1:5432,db2:5432/idem"),
            "postgresql://idem:REDACTED@db1:5432,db2:5432/idem");
  EXPECT_EQ(RedactedUrl("redis://:p@ss@cache:6379/0"), "redis://:REDACTED@cache:6379/0");
  EXPECT_EQ(RedactedUrl("postgresql://db/idem?user=idem&password=pw"),
            "postgresql://db/idem?user=idem&password=REDACTED");
  EXPECT_EQ(RedactedUrl("redis://cache:6379/2"), "redis://cache:6379/2");
  EXPECT_EQ(RedactedUrl("host=db password=pw"), "REDACTED");
  EXPECT_EQ(RedactedUrl("sqlite:///var/lib/idem/idem.db"), "sqlite:///var/lib/idem/idem.db");
  for (const auto& [key, kind] : ConfigKeys()) {
    const std::string last = key.substr(key.rfind('.') + 1);
    if (key == "idempotency.retention_hours" || key == "routes.retention_hours" ||
        key == "consumers.target.retention_hours" || key.rfind("server.", 0) == 0) {
      continue;  // aliases: printed as retention_ms
    }
    EXPECT_NE(printed.find(last + " = "), std::string::npos) << key << " is not printed";
  }
  auto again = LoadConfig(Write("printed.toml", printed), {});
  ASSERT_TRUE(again.has_value()) << again.error().message << "\n" << printed;
  EXPECT_EQ(EffectiveConfigToml(*again), printed);
  EXPECT_EQ(again->server.host, "::1");
  EXPECT_EQ(again->idempotency.retention, std::chrono::hours(48));
  EXPECT_EQ(again->gateway.routes.at(0).final_statuses, std::vector<int>{409});
}

TEST_F(ConfigTest, UnknownKeysAndSectionsAreErrorsWithTheirLine) {
  auto top = LoadConfig(Write("c.toml", "listen = \"127.0.0.1:1\"\n" + Minimal()), {});
  ASSERT_FALSE(top.has_value());
  EXPECT_NE(top.error().message.find("c.toml:1: unknown key listen"), std::string::npos)
      << top.error().message;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[store]\nurll = \"sqlite://x.db\"\n", "c.toml:5: unknown key store.urll"},
      {"[servr]\nlisten = \"127.0.0.1:1\"\n", "c.toml:4: unknown key servr"},
      {"[[principals]]\ntenant = \"t\"\nuser = \"u\"\nkey = \"k\"\n",
       "c.toml:7: unknown key principals.key"},
  };
  for (const auto& [toml, expect] : cases) {
    auto c = LoadConfig(Write("c.toml", Minimal(toml)), {});
    ASSERT_FALSE(c.has_value()) << toml;
    EXPECT_NE(c.error().message.find(expect), std::string::npos)
        << "expected: " << expect << "\ngot: " << c.error().message;
  }
}

// IDEMD_<SECTION>_<KEY> over the file, typed as the key; flags over both.
TEST_F(ConfigTest, EnvironmentVariablesOverrideTheFileAndFlagsOverrideThem) {
  struct Env {
    Env(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
    ~Env() { unsetenv(name_); }
    const char* name_;
  };
  const std::string path = Write("c.toml", Minimal("[store]\npool_size = 2\n[server]\n"
                                                   "listen = \"127.0.0.1:7000\"\n"));
  {
    Env pool("IDEMD_STORE_POOL_SIZE", "7");
    Env fivexx("IDEMD_PROVIDER_NOTHING_CHARGED_STATUSES", "503, 504");
    Env currencies("IDEMD_PAYMENTS_CURRENCIES", "USD, EUR");
    Env empty("IDEMD_STORE_READ_THREADS", "");
    Env listen("IDEMD_SERVER_LISTEN", "[::1]:7001");
    Env url("IDEMD_STORE_URL", "postgresql://idem:pw@db/idem");
    auto c = LoadConfig(path, {"--store", "sqlite://flag.db"});
    ASSERT_TRUE(c.has_value()) << c.error().message;
    EXPECT_EQ(c->store.pool_size, 7);
    EXPECT_EQ(c->provider.nothing_charged_statuses, (std::vector<int>{503, 504}));
    EXPECT_EQ(c->payments.currencies, (std::vector<std::string>{"USD", "EUR"}));
    EXPECT_EQ(c->server.host, "::1");
    EXPECT_EQ(c->server.port, 7001);
    EXPECT_EQ(c->store.url, "sqlite://flag.db") << "a flag wins over the environment";
    EXPECT_EQ(c->store.read_threads, 2) << "an empty variable counts as unset";
  }
  const std::vector<std::tuple<const char*, const char*, std::string>> bad = {
      {"IDEMD_STORE_POOL_SIZ", "3", "IDEMD_STORE_POOL_SIZ names no configuration key"},
      {"IDEMD_STORE_POOL_SIZE", "many", "IDEMD_STORE_POOL_SIZE must be an integer"},
      {"IDEMD_STORE_PREPARED_STATEMENTS", "yes", "must be true or false"},
      {"IDEMD_STORE_POOL_SIZE", "0", "IDEMD_STORE_POOL_SIZE: store.pool_size must be 1..256"},
  };
  for (const auto& [name, value, expect] : bad) {
    Env env(name, value);
    auto c = LoadConfig(path, {});
    ASSERT_FALSE(c.has_value()) << name << "=" << value;
    EXPECT_NE(c.error().message.find(expect), std::string::npos) << c.error().message;
  }
}

}  // namespace
}  // namespace idem::idemd
