// server/idemd/config/config.h — idemd's configuration: a TOML file, then command-line overrides.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "http/server.h"
#include "idem/clock.h"
#include "idem/key.h"
#include "idem/limits.h"
#include "idem/result.h"
#include "idem/secret.h"
#include "idem/store/postgres.h"
#include "idem/store/sqlite.h"
#include "server/idemd/consumers/consumer_route.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// The longest duration a configuration may set, any key: ten years. Longer ones are refused at
// load, so no sum of durations (a lease against provider timeout + margin) and no deadline (now +
// an interval) can overflow.
inline constexpr Millis kMaxConfigDuration{10LL * 365 * 24 * 3600 * 1000};

struct PrincipalEntry {
  std::string api_key_sha256;  // lower-case hex of SHA-256(api key)
  std::string tenant;
  std::string user;
};

struct Secrets {
  std::vector<Secret> hmac;
  uint32_t hmac_current = 0;
  std::vector<Secret> seal;
  uint32_t seal_current = 0;
};

// Bounds of [server] io_threads, max_in_flight and [store] threads.
inline constexpr int kIoThreadsCeiling = 256;
inline constexpr int kMaxInFlightCeiling = 1'000'000;
inline constexpr int kStoreThreadsCeiling = 1024;
inline constexpr int64_t kReplayCacheCeiling = int64_t{1} << 40;

inline constexpr std::string_view kDefaultStoreUrl = "sqlite://data/idem.db";

// [store] (docs/config.md, "[store]").
struct StoreConfig {
  // "sqlite:///path/idem.db", "postgresql://user@host/db"; an empty url is this default too.
  std::string url = std::string(kDefaultStoreUrl);
  int pool_size = 4;
  // Threads that run the store's blocking calls; 0: a default by backend (StoreThreads).
  int threads = 0;
  // Threads of their own for snapshot reads (replays not held in memory, parked requests' polls,
  // GETs), so that they never queue behind claims and completions.
  int read_threads = 2;
  // Bytes of finished records kept in memory for replays (Redis or not); 0 turns it off.
  int64_t replay_cache_bytes = 64 << 20;
  // SQLite: the write connection's page cache (SqliteStoreOptions::write_cache_bytes).
  int64_t sqlite_cache_bytes = kSqliteWriteCacheBytes;
  // PostgreSQL: server-side prepared statements (off behind PgBouncer transaction pooling).
  bool prepared_statements = true;
  // PostgreSQL: completions announced to other instances (NOTIFY/LISTEN); off, they poll.
  bool notifications = true;
  // PostgreSQL: where the listener for other instances' completions connects; empty: url.
  // Behind a transaction pooler, the database itself (notifications do not pass the pooler).
  std::string listen_url;
  // PostgreSQL: connect, statement, lock and idle-in-transaction timeouts and TCP keepalives.
  PostgresTimeouts timeouts;
};

// [redis]: the replay cache and in-flight markers; no url, none.
struct RedisConfig {
  std::string url;
};

// [provider]: where charges go, how long they may take, and the provider's declared semantics.
struct ProviderConfig {
  std::string url = "http://127.0.0.1:8090";
  Millis timeout{5000};          // one exchange: writing the request and reading the answer
  Millis connect_timeout{2000};  // waiting for a free connection, connecting, the TLS handshake
  int max_connections = 1024;    // keep-alive connections open to the provider at most
  std::string ca_file;           // https: the CAs to trust (PEM); empty: the system's
  // The 5xx statuses of a charge's answer that prove nothing was charged (e.g. {503} for a
  // provider that documents 503 as "not processed"). Empty (the default): every 5xx after the
  // request left is an unknown outcome, like a timeout; the charge is looked up, once its send
  // has settled, before anything is charged again (docs/idemd.md, "Ambiguous failures").
  std::vector<int> nothing_charged_statuses;
  // A repeated charge with the same reference (its idempotency key) charges at most once. On, a
  // charge whose outcome is unknown is sent again at once; off (the default), only after settle.
  bool deduplicates_by_key = false;
  // After an unknown outcome nothing is sent again until this long after the last send and a
  // lookup still finds nothing: it must exceed timeout plus how long the provider may still
  // execute a request after its caller timed out (checked against timeout at load).
  Millis settle{30000};
};

// [secrets]: where the HMAC and sealing secrets come from, and (after the load) the secrets.
struct SecretsConfig {
  // The IDEM_SECRETS environment variable (TOML text) wins; else this file; a development config
  // may ask for the file to be generated when missing.
  std::string file;
  bool generate_if_missing = false;
  Secrets keys;  // loaded; not a config key, never printed
};

// [idempotency]: the protocol's leases, retention, quotas and loops, for payments and the
// gateway's routes alike.
struct IdempotencyConfig {
  Millis lease{limits::kDefaultLease};
  // The lease must outlast provider.timeout by more than this (checked at load).
  Millis lease_margin{limits::kDefaultLeaseMargin};
  Millis retention{limits::kDefaultRetention};
  int64_t max_processing = limits::kMaxProcessingPerPrincipal;
  int64_t max_retained = limits::kMaxRetainedPerPrincipal;
  // Requests a principal may bring to the claim each second, per route and instance (0: no
  // limit); FilterPolicy::max_new_keys_per_second.
  int64_t max_new_keys_per_second = limits::kMaxNewKeysPerSecondPerPrincipal;
  Millis wait_max{10000};
  int64_t max_waiters_per_principal = limits::kMaxWaitersPerPrincipal;
  std::size_t key_min_length = limits::kKeyMinLength;
  std::size_t key_max_length = limits::kKeyMaxLength;
  Millis sweep_interval{60000};
  Millis takeover_interval{5000};  // the key is reconcile_interval_ms, its name of old
};

// [reconciliation]: the books (docs/reconciliation.md): every `interval` (0: off), the charges
// the provider made in [now - lag - window, now - lag).
struct ReconciliationConfig {
  Millis interval{600'000};
  Millis window{24 * 3'600'000};
  Millis lag{600'000};
  bool refund_duplicates = true;
  bool refund_orphans = false;
  Millis orphan_grace{24 * 3'600'000};
  Millis lease{60'000};  // a crashed runner's window is taken over this long after it
};

// [outbox]: the relay of the payment events (docs/outbox.md): every `interval`, unless `broker`
// is "off", the events not yet published go to the Redis stream `stream`, or the RabbitMQ
// exchange `exchange` (routed by `routing_key`, or each by its type), at `url`, `batch` at a
// time, under a lease of `lease`; published events are swept `retention` after.
struct OutboxConfig {
  std::string broker = "off";  // "off", "redis" or "rabbitmq"
  std::string url;
  std::string stream = "payments.events";
  std::string exchange;
  std::string routing_key;
  Millis interval{1000};
  int batch = 100;
  Millis lease{30'000};
  Millis retention{7LL * 24 * 3'600'000};
};

// [payments].
struct PaymentsConfig {
  std::vector<std::string> currencies = {"CNY", "USD", "EUR", "JPY"};
};

// One member per section of the file (docs/config.md), and the arrays of tables.
struct Config {
  http::ServerOptions server{.io_threads = 0};  // 0: one per CPU (IoThreadsPerCpu, at load)
  StoreConfig store;
  RedisConfig redis;
  ProviderConfig provider;
  SecretsConfig secrets;
  IdempotencyConfig idempotency;
  ReconciliationConfig reconciliation;
  PaymentsConfig payments;
  OutboxConfig outbox;
  std::vector<PrincipalEntry> principals;
  // The gateway ([gateway] and [[routes]], docs/gateway.md).
  GatewayConfig gateway;
  // The queue consumers ([[consumers]], docs/consumers.md).
  std::vector<ConsumerRoute> consumers;
};

// The longest wait a latency histogram may see under `config`: the provider's timeout, each
// gateway route's timeout_ms and the unmatched upstream's, PostgreSQL's statement and lock
// timeouts, and wait_max (a parked request's whole answer).
Millis LongestTimeout(const Config& config);

// Reads `path` (TOML), then the IDEMD_<SECTION>_<KEY> environment variables over it (e.g.
// IDEMD_STORE_URL, IDEMD_PROVIDER_TIMEOUT_MS), then `overrides` (--listen, --store, --redis,
// --provider) over both, then loads the secrets. Errors: kInvalidArgument naming where the value
// came from (the file and its line, the environment variable or the flag), the key and the
// problem.
Result<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides);

// The configuration in effect, every key with its value (defaults included), as a TOML document
// that LoadConfig reads back to the same Config (what `idemd --check-config` prints). Secrets are
// not part of it (they are not config keys); passwords in the store, listener, Redis and provider
// URLs are replaced by "REDACTED".
std::string EffectiveConfigToml(const Config& config);

// `url` with its password replaced by "REDACTED", for what is printed or logged: the password of
// the user info, a `password` query parameter, and, in text Boost.URL does not parse (libpq's
// multi-host URLs, an unencoded '@'), everything before the authority's last '@'.
std::string RedactedUrl(const std::string& url);

// Every key a config file may set, "section.key" ("routes.fingerprint.ignore" for keys of
// [[routes]] entries), with its TOML type: what the unknown-key check and the environment
// overrides accept, and what docs/config.md lists.
enum class Kind { kString, kInteger, kBoolean, kArray };
const std::map<std::string, Kind>& ConfigKeys();

// Writers a SQLite store lets wait for its writer by default: those waiting when one commits
// share the next commit (group commit), so more waiting writers mean fewer syncs per write.
inline constexpr int kSqliteGroupWriters = 16;

// [server] io_threads = 0: one I/O thread per CPU the process may run on, at least one.
int IoThreadsPerCpu();

// The threads for the store's blocking calls: [store] threads; when it is 0, pool_size + 1 on
// PostgreSQL (its connections and one more to queue on them), pool_size + kSqliteGroupWriters on
// SQLite (its readers, and writers to share each commit).
inline int StoreThreads(const StoreConfig& store) {
  if (store.threads > 0) return store.threads;
  const bool sqlite = store.url.rfind("sqlite:", 0) == 0;
  return store.pool_size + (sqlite ? kSqliteGroupWriters : 1);
}

// Parses secrets from TOML text: hmac_current, seal_current, [[hmac]] / [[seal]] tables with
// `id` and hex `key`. Errors: kInvalidArgument.
Result<Secrets> ParseSecrets(std::string_view toml_text, const std::string& origin);

// Fresh development secrets as TOML text (32 random bytes each, id 1).
std::string GenerateSecretsToml(Random& random);

}  // namespace idem::idemd
