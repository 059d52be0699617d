// tests/integration/idemd_fixture.h — real provider-sim and idemd processes on loopback (port 0),
// a fresh SQLite file per test, and small HTTP helpers.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <boost/json.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "http/client.h"
#include "idem/outbox.h"
#include "idem/store.h"
#include "testing/fakes.h"
#include "testing/process.h"
#include "testing/services.h"

namespace idem::itest {

inline constexpr const char* kAlice = "dev-acme-alice-7f3c9a1e";
inline constexpr const char* kBob = "dev-acme-bob-2b8d4e6f";
inline constexpr const char* kCarol = "dev-globex-carol-9e1a5c3d";

// The PostgreSQL server of the tests (IDEM_TEST_PG_URL, set by scripts/with-services), or "".
std::string PostgresServerUrl();
// The Redis of the tests (IDEM_TEST_REDIS_URL, set by scripts/with-services: redis://host:port),
// or "".
std::string RedisServerUrl();

struct RedisReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyFree>;
// One command with binary-safe arguments, on a connection of its own to the Redis on loopback
// `port`, or to the tests' Redis when `port` is 0. Fails the test and returns null when Redis
// cannot be reached or answers an error.
RedisReply RedisCommand(const std::vector<std::string>& args, uint16_t port = 0);
// Runs one statement on that server (directly, never through PgBouncer): the first column of its
// first row, "" if none. When it fails, the server's message goes to *error (if given), else the
// test fails.
std::string PostgresSql(const std::string& sql, std::string* error = nullptr);
// A fresh schema on that server, and the store URL that selects it; its name in *schema_out.
std::string FreshPostgresStoreUrl(std::string* schema_out = nullptr);
// The store behind `store_url`, opened as idemctl opens one: no migrations, one connection.
// Fails the test (and returns null) when it cannot be opened.
std::unique_ptr<Store> OpenExistingStore(const std::string& store_url);
// The outbox events of payment `payment_id` in the store behind `store_url`, in sequence order
// (include/idem/outbox.h). Fails the test when they cannot be read.
std::vector<OutboxEvent> OutboxEventsAt(const std::string& store_url,
                                        const std::string& payment_id);

// POST /v1/payments as alice to the idemd at `url` (another instance than the fixture's), with
// Prefer when `prefer` is set. A call that gets no answer fails the test and returns status 0.
http::Response PayAt(const http::Url& url, const std::string& key, const std::string& body,
                     const std::string& prefer = "");

class IdemdTest : public ::testing::Test {
 public:
  void SetUp() override;

  // Starts one of the test services (provider-sim, upstream-sim) on a free loopback port, its
  // output in `log` of the test's directory, into *process, and sets *url once it has printed
  // "<name> listening on URL". Fails the test (fatally) otherwise.
  void StartService(const char* path, const std::string& name, const std::string& log,
                    std::optional<testing::ChildProcess>* process, http::Url* url);

  struct IdemdOptions {
    std::string extra_idempotency{};  // lines appended to [idempotency], e.g. "max_retained = 3"
    std::string extra_server{};       // lines appended to [server], e.g. "max_parked = 10"
    int lease_ms = 3000;
    int provider_timeout_ms = 1000;
    int lease_margin_ms = 500;           // idemd refuses lease_ms <= provider_timeout_ms + this
    int settle_ms = 0;                   // [provider] settle_ms; 0: provider_timeout_ms + 1000
    int reconcile_interval_ms = 600000;  // effectively off unless a test wants it
    std::map<std::string, std::string> env{};  // e.g. IDEM_FAILPOINTS
    bool keep_config = false;                  // restart on the config file as it is now
    std::string store_url{};                   // default: a SQLite file in the test's directory
    std::string extra_store{};                 // lines appended to [store]
    std::string
        extra_provider{};     // lines appended to [provider], e.g. "deduplicates_by_key = true"
    std::string redis_url{};  // [redis] url, when set
    std::string
        extra_tables{};  // whole tables appended, e.g. "[reconciliation]\ninterval_ms = 500"
  };
  // Starts (or restarts) idemd on this test's database.
  void StartIdemd(const IdemdOptions& options);
  void StartIdemd() { StartIdemd(IdemdOptions{}); }
  void WriteConfig(const std::string& path, const IdemdOptions& options);
  // SIGKILL, no drain.
  void KillIdemd();

  http::Response Pay(const std::string& key, const std::string& body,
                     const std::string& api_key = kAlice,
                     const std::vector<std::pair<std::string, std::string>>& headers = {});
  http::Response Get(const std::string& path, const std::string& api_key = kAlice);
  http::Response Send(http::Request request);

  // idemctl with `argv` (IDEM_SECRETS set, plus `env`): its exit status and standard output.
  std::pair<int, std::string> RunIdemctl(std::vector<std::string> argv,
                                         const std::map<std::string, std::string>& env = {});

  // provider-sim admin calls.
  void Fault(const std::string& json_body);
  // A charge made at the provider as if outside idemd; returns its id. `created_at` (RFC 3339)
  // defaults to now.
  std::string InjectCharge(const std::string& reference, const std::string& amount,
                           const std::string& currency, const std::string& created_at = "");
  // Refunds made of one charge.
  int64_t RefundsOf(const std::string& charge_id);
  void ProviderMode(bool ignore_keys);
  int64_t ChargesFor(const std::string& reference);
  int64_t TotalCharges();

  static std::string Body(const std::string& order, const std::string& amount = "\"100.00\"",
                          const std::string& currency = "CNY");
  static boost::json::object ParseObject(const std::string& text);

  testing::TempDir dir_;
  std::optional<testing::ChildProcess> provider_;
  std::optional<testing::ChildProcess> idemd_;
  http::Url provider_url_;
  http::Url idemd_url_;
  std::string secrets_toml_;
};

}  // namespace idem::itest
