// server/idemd/config/keys.cc — the table of idemd's config keys, and the readers and writers its
// entries point to: one generic pair per type of member (string, boolean, count, duration), and
// one for each key whose value is more than its member (an address, a list of codes, a choice).
#include "server/idemd/config/keys.h"

#include <algorithm>
#include <chrono>
#include <concepts>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "http/log.h"
#include "http/message.h"
#include "idem/outbox.h"
#include "server/idemd/gateway/route_config.h"

namespace idem::idemd {
namespace {

Error Bad(const std::string& where, const ConfigKey& key, const std::string& what) {
  return MakeError(Errc::kInvalidArgument, where + ": " + key.Name() + " " + what);
}

template <typename T>
inline constexpr bool kIsDuration = false;
template <typename Rep, typename Period>
inline constexpr bool kIsDuration<std::chrono::duration<Rep, Period>> = true;

// The value of an integer key within its bounds and its field's. `ceiling`: how far the field
// goes (its type's maximum, ten years for a duration).
Result<int64_t> Count(const ConfigKey& key, const toml::node& node, const std::string& where,
                      int64_t ceiling, std::string_view ceiling_note) {
  if (!node.is_integer() || node.as_integer()->get() < 0) {
    return Bad(where, key, "must be a non-negative integer");
  }
  // Not cut to the field's width: worker_threads = 4294967297 is no 1.
  const int64_t value = node.as_integer()->get();
  if (value > ceiling) {
    return Bad(where, key,
               "must be at most " + std::to_string(ceiling) + std::string(ceiling_note));
  }
  if (value < key.min || value > key.max) {
    return Bad(where, key,
               key.max == kFieldMax
                   ? "must be at least " + std::to_string(key.min)
                   : "must be " + std::to_string(key.min) + ".." + std::to_string(key.max));
  }
  return value;
}

Status ReadValue(const ConfigKey& key, const toml::node& node, const std::string& where,
                 std::string& out) {
  if (!node.is_string()) return Bad(where, key, "must be a string");
  out = node.as_string()->get();
  return Ok();
}

Status ReadValue(const ConfigKey& key, const toml::node& node, const std::string& where,
                 bool& out) {
  if (!node.is_boolean()) return Bad(where, key, "must be a boolean");
  out = node.as_boolean()->get();
  return Ok();
}

template <std::integral T>
Status ReadValue(const ConfigKey& key, const toml::node& node, const std::string& where, T& out) {
  const int64_t ceiling = std::in_range<int64_t>(std::numeric_limits<T>::max())
                              ? static_cast<int64_t>(std::numeric_limits<T>::max())
                              : kFieldMax;
  IDEM_ASSIGN_OR_RETURN(const int64_t value, Count(key, node, where, ceiling, ""));
  out = static_cast<T>(value);
  return Ok();
}

template <typename Duration>
requires kIsDuration<Duration> Status ReadValue(const ConfigKey& key, const toml::node& node,
                                                const std::string& where, Duration& out) {
  const int64_t ten_years = std::chrono::duration_cast<Duration>(kMaxConfigDuration).count();
  IDEM_ASSIGN_OR_RETURN(const int64_t value, Count(key, node, where, ten_years, " (ten years)"));
  out = Duration(value);
  return Ok();
}

toml::value<std::string> TomlOf(const std::string& value) {
  return toml::value<std::string>(value);
}
toml::value<bool> TomlOf(bool value) { return toml::value<bool>(value); }
template <std::integral T>
toml::value<int64_t> TomlOf(T value) {
  return toml::value<int64_t>(static_cast<int64_t>(value));
}
template <typename Duration>
requires kIsDuration<Duration> toml::value<int64_t> TomlOf(Duration value) {
  return toml::value<int64_t>(static_cast<int64_t>(value.count()));
}

template <typename T>
constexpr Kind KindOf() {
  if constexpr (std::is_same_v<T, std::string>) {
    return Kind::kString;
  } else if constexpr (std::is_same_v<T, bool>) {
    return Kind::kBoolean;
  } else {
    static_assert(std::is_integral_v<T> || kIsDuration<T>, "a member of no key type");
    return Kind::kInteger;
  }
}

// The member of Config at the end of `kPath` (&Config::store, &StoreConfig::timeouts,
// &PostgresTimeouts::lock), read and written by its type.
template <auto... kPath>
struct Member {
  static auto& Of(Config& c) { return (c.*....*kPath); }
  static const auto& Of(const Config& c) { return (c.*....*kPath); }
  using Type = std::remove_cvref_t<decltype(Of(std::declval<Config&>()))>;

  static Status Read(const ConfigKey& key, const toml::node& node, const std::string& where,
                     Config& config) {
    return ReadValue(key, node, where, Of(config));
  }
  static void Write(const ConfigKey& key, const Config& config, toml::table& section) {
    section.insert_or_assign(key.key, TomlOf(Of(config)));
  }
  // A URL, printed with its password replaced (RedactedUrl).
  static void WriteRedacted(const ConfigKey& key, const Config& config, toml::table& section) {
    section.insert_or_assign(key.key, RedactedUrl(Of(config)));
  }
};

// The key `section.key` of the member at `kPath`, of its type, within min..max.
template <auto... kPath>
constexpr ConfigKey Key(std::string_view section, std::string_view key, int64_t min = 0,
                        int64_t max = kFieldMax) {
  using M = Member<kPath...>;
  return {section, key, KindOf<typename M::Type>(), min, max, &M::Read, &M::Write};
}

// A URL key: a string, its password redacted when printed.
template <auto... kPath>
constexpr ConfigKey UrlKey(std::string_view section, std::string_view key) {
  using M = Member<kPath...>;
  return {section, key, Kind::kString, 0, kFieldMax, &M::Read, &M::WriteRedacted};
}

// ---- Keys whose value is more than its member

// [server] listen: host:port, host non-empty, port 0..65535.
Status ReadListen(const ConfigKey& key, const toml::node& node, const std::string& where,
                  Config& config) {
  std::string text;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, text));
  if (text.empty()) return Ok();
  auto address = http::ParseListenAddress(text);
  if (!address) {  // "listen must be ADDRESS:PORT (...), got '...': ..."
    return MakeError(Errc::kInvalidArgument,
                     where + ": " + std::string(key.section) + "." + address.error().message);
  }
  config.server.host = address->host;
  config.server.port = address->port;
  return Ok();
}

void WriteListen(const ConfigKey& key, const Config& config, toml::table& section) {
  section.insert_or_assign(key.key, http::Authority(config.server.host, config.server.port));
}

// Keys of the thread-per-request model: still type-checked, then ignored with a warning, so an
// older file starts (requests no longer hold threads; max_in_flight bounds them).
Status ReadRemoved(const ConfigKey& key, const toml::node& node, const std::string& where,
                   Config&) {
  int ignored = 0;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, ignored));
  http::Log(http::LogLevel::kWarn, "config key ignored",
            {{"key", key.Name()}, {"why", "requests hold no threads; see server.max_in_flight"}});
  return Ok();
}

// [idempotency] retention_hours: retention_ms in hours; retention_ms wins when both are set.
Status ReadRetentionHours(const ConfigKey& key, const toml::node& node, const std::string& where,
                          Config& config) {
  std::chrono::hours hours{0};
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, hours));
  config.idempotency.retention = hours;
  return Ok();
}

// [provider] nothing_charged_statuses: 5xx codes, as integers or as their three digits in a
// string (the form an IDEMD_PROVIDER_NOTHING_CHARGED_STATUSES list takes), each at most once.
Status ReadNothingChargedStatuses(const ConfigKey& key, const toml::node& node,
                                  const std::string& where, Config& config) {
  auto codes = FiveHundredsOf(node, "nothing was charged (a 2xx is a charge, a 402 a decline)");
  if (!codes) {
    return MakeError(Errc::kInvalidArgument,
                     where + ": " + key.Name() + ": " + codes.error().message);
  }
  config.provider.nothing_charged_statuses = std::move(*codes);
  return Ok();
}

void WriteNothingChargedStatuses(const ConfigKey& key, const Config& config, toml::table& section) {
  toml::array codes;
  for (int code : config.provider.nothing_charged_statuses) codes.push_back(int64_t{code});
  section.insert_or_assign(key.key, std::move(codes));
}

// [payments] currencies: ISO 4217 codes.
Status ReadCurrencies(const ConfigKey& key, const toml::node& node, const std::string& where,
                      Config& config) {
  const toml::array* array = node.as_array();
  if (array == nullptr) return Bad(where, key, "must be an array of ISO 4217 codes");
  std::vector<std::string> codes;
  for (const toml::node& n : *array) {
    auto code = n.value<std::string>();
    if (!code || code->size() != 3) {
      return MakeError(Errc::kInvalidArgument,
                       where + ": " + key.Name() + ": ISO 4217 codes expected");
    }
    codes.push_back(*code);
  }
  config.payments.currencies = std::move(codes);
  return Ok();
}

void WriteCurrencies(const ConfigKey& key, const Config& config, toml::table& section) {
  toml::array codes;
  for (const std::string& code : config.payments.currencies) codes.push_back(code);
  section.insert_or_assign(key.key, std::move(codes));
}

// [gateway] unmatched: "not_found" (404) or "forward" (to gateway.upstream).
Status ReadUnmatched(const ConfigKey& key, const toml::node& node, const std::string& where,
                     Config& config) {
  std::string text;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, text));
  if (text != "not_found" && text != "forward") {
    return Bad(where, key, "must be \"not_found\" or \"forward\", got '" + text + "'");
  }
  config.gateway.forward_unmatched = text == "forward";
  return Ok();
}

void WriteUnmatched(const ConfigKey& key, const Config& config, toml::table& section) {
  section.insert_or_assign(key.key, config.gateway.forward_unmatched ? "forward" : "not_found");
}

// [gateway] upstream: where unmatched requests go, as "scheme://host[:port]".
Status ReadUnmatchedUpstream(const ConfigKey& key, const toml::node& node, const std::string& where,
                             Config& config) {
  std::string text;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, text));
  if (text.empty()) return Ok();
  auto parsed = ParseUpstream(text);
  if (!parsed) return Bad(where, key, parsed.error().message);
  config.gateway.unmatched_upstream = std::move(*parsed);
  return Ok();
}

// [outbox] broker: "off", "redis" or "rabbitmq".
Status ReadOutboxBroker(const ConfigKey& key, const toml::node& node, const std::string& where,
                        Config& config) {
  std::string text;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, text));
  if (text != "off" && text != "redis" && text != "rabbitmq") {
    return Bad(where, key, "must be \"off\", \"redis\" or \"rabbitmq\", got '" + text + "'");
  }
  config.outbox.broker = std::move(text);
  return Ok();
}

// [gateway] principal_header: a header name, folded to lower case.
Status ReadPrincipalHeader(const ConfigKey& key, const toml::node& node, const std::string& where,
                           Config& config) {
  std::string header;
  IDEM_RETURN_IF_ERROR(ReadValue(key, node, where, header));
  header = http::ToLower(header);
  const bool token = std::all_of(header.begin(), header.end(), [](unsigned char ch) {
    return std::isalnum(ch) != 0 || ch == '-' || ch == '_';
  });
  if (!token || header.size() > 64 || IsUnforwardableHeader(header)) {
    return Bad(where, key,
               "must be a header name of at most 64 letters, digits, - and _, and not a "
               "credential or hop-by-hop header");
  }
  config.gateway.principal_header = std::move(header);
  return Ok();
}

using C = Config;
using Server = http::ServerOptions;
using Store = StoreConfig;
using Pg = PostgresTimeouts;
using Provider = ProviderConfig;
using Idempotency = IdempotencyConfig;
using Books = ReconciliationConfig;
using Outbox = OutboxConfig;
using Gateway = GatewayConfig;

constexpr int64_t kHour = 3'600'000;  // ms

// The order of docs/config.md. Bounds that hold between keys (a lease against a timeout, key
// lengths against each other) are LoadConfig's.
constexpr ConfigKey kKeys[] = {
    {"server", "listen", Kind::kString, 0, kFieldMax, &ReadListen, &WriteListen},
    Key<&C::server, &Server::io_threads>("server", "io_threads", 0, kIoThreadsCeiling),
    Key<&C::server, &Server::max_in_flight>("server", "max_in_flight", 1, kMaxInFlightCeiling),
    {"server", "worker_threads", Kind::kInteger, 0, kFieldMax, &ReadRemoved, nullptr},
    {"server", "max_queued", Kind::kInteger, 0, kFieldMax, &ReadRemoved, nullptr},
    Key<&C::server, &Server::max_connections>("server", "max_connections"),
    Key<&C::server, &Server::max_parked>("server", "max_parked", 0, limits::kParkedCeiling),
    // The largest body the fingerprint canonicalises.
    Key<&C::server, &Server::max_body_bytes>("server", "max_body_bytes", 1, limits::kJsonMaxBytes),
    Key<&C::server, &Server::read_timeout>("server", "read_timeout_ms", 1),
    Key<&C::server, &Server::drain_timeout>("server", "drain_timeout_ms"),

    UrlKey<&C::store, &Store::url>("store", "url"),
    Key<&C::store, &Store::pool_size>("store", "pool_size", 1, 256),
    Key<&C::store, &Store::threads>("store", "threads", 0, kStoreThreadsCeiling),
    Key<&C::store, &Store::read_threads>("store", "read_threads", 1, kStoreThreadsCeiling),
    Key<&C::store, &Store::replay_cache_bytes>("store", "replay_cache_bytes", 0,
                                               kReplayCacheCeiling),
    Key<&C::store, &Store::sqlite_cache_bytes>(
        "store", "sqlite_cache_bytes", kSqliteWriteCacheMinBytes, kSqliteWriteCacheMaxBytes),
    Key<&C::store, &Store::prepared_statements>("store", "prepared_statements"),
    Key<&C::store, &Store::notifications>("store", "notifications"),
    UrlKey<&C::store, &Store::listen_url>("store", "listen_url"),
    // Their bounds are ValidatePostgresTimeouts', the store's own.
    Key<&C::store, &Store::timeouts, &Pg::connect>("store", "connect_timeout_ms"),
    Key<&C::store, &Store::timeouts, &Pg::statement>("store", "statement_timeout_ms"),
    Key<&C::store, &Store::timeouts, &Pg::lock>("store", "lock_timeout_ms"),
    Key<&C::store, &Store::timeouts, &Pg::idle_in_transaction>("store",
                                                               "idle_in_transaction_timeout_ms"),
    Key<&C::store, &Store::timeouts, &Pg::keepalives_idle>("store", "keepalives_idle_s"),
    Key<&C::store, &Store::timeouts, &Pg::keepalives_interval>("store", "keepalives_interval_s"),
    Key<&C::store, &Store::timeouts, &Pg::keepalives_count>("store", "keepalives_count"),

    UrlKey<&C::redis, &RedisConfig::url>("redis", "url"),

    UrlKey<&C::provider, &Provider::url>("provider", "url"),
    Key<&C::provider, &Provider::timeout>("provider", "timeout_ms", 1),
    Key<&C::provider, &Provider::connect_timeout>("provider", "connect_timeout_ms", 1),
    Key<&C::provider, &Provider::max_connections>("provider", "max_connections", 1,
                                                  kMaxInFlightCeiling),
    Key<&C::provider, &Provider::ca_file>("provider", "ca_file"),
    {"provider", "nothing_charged_statuses", Kind::kArray, 0, kFieldMax,
     &ReadNothingChargedStatuses, &WriteNothingChargedStatuses},
    Key<&C::provider, &Provider::deduplicates_by_key>("provider", "deduplicates_by_key"),
    Key<&C::provider, &Provider::settle>("provider", "settle_ms"),

    Key<&C::secrets, &SecretsConfig::file>("secrets", "file"),
    Key<&C::secrets, &SecretsConfig::generate_if_missing>("secrets", "generate_if_missing"),

    Key<&C::idempotency, &Idempotency::lease>("idempotency", "lease_ms", 1),
    Key<&C::idempotency, &Idempotency::lease_margin>("idempotency", "lease_margin_ms", 1),
    {"idempotency", "retention_hours", Kind::kInteger, 0, kFieldMax, &ReadRetentionHours, nullptr},
    Key<&C::idempotency, &Idempotency::retention>("idempotency", "retention_ms"),
    Key<&C::idempotency, &Idempotency::max_processing>("idempotency", "max_processing", 1),
    Key<&C::idempotency, &Idempotency::max_retained>("idempotency", "max_retained", 1),
    Key<&C::idempotency, &Idempotency::max_new_keys_per_second>(
        "idempotency", "max_new_keys_per_second", 0, 1'000'000),
    Key<&C::idempotency, &Idempotency::wait_max>("idempotency", "wait_max_ms", 0,
                                                 limits::kWaitMax.count()),
    Key<&C::idempotency, &Idempotency::max_waiters_per_principal>(
        "idempotency", "max_waiters_per_principal", 0, limits::kParkedCeiling),
    Key<&C::idempotency, &Idempotency::key_min_length>("idempotency", "key_min_length", 1,
                                                       limits::kKeyMaxLength),
    Key<&C::idempotency, &Idempotency::key_max_length>("idempotency", "key_max_length", 1,
                                                       limits::kKeyMaxLength),
    Key<&C::idempotency, &Idempotency::sweep_interval>("idempotency", "sweep_interval_ms", 1),
    Key<&C::idempotency, &Idempotency::takeover_interval>("idempotency", "reconcile_interval_ms",
                                                          1),

    Key<&C::reconciliation, &Books::interval>("reconciliation", "interval_ms"),
    Key<&C::reconciliation, &Books::window>("reconciliation", "window_ms"),
    Key<&C::reconciliation, &Books::lag>("reconciliation", "lag_ms"),
    Key<&C::reconciliation, &Books::refund_duplicates>("reconciliation", "refund_duplicates"),
    Key<&C::reconciliation, &Books::refund_orphans>("reconciliation", "refund_orphans"),
    Key<&C::reconciliation, &Books::orphan_grace>("reconciliation", "orphan_grace_ms"),
    Key<&C::reconciliation, &Books::lease>("reconciliation", "lease_ms", 100),

    {"payments", "currencies", Kind::kArray, 0, kFieldMax, &ReadCurrencies, &WriteCurrencies},

    {"outbox", "broker", Kind::kString, 0, kFieldMax, &ReadOutboxBroker,
     &Member<&C::outbox, &Outbox::broker>::Write},
    UrlKey<&C::outbox, &Outbox::url>("outbox", "url"),
    Key<&C::outbox, &Outbox::stream>("outbox", "stream"),
    Key<&C::outbox, &Outbox::exchange>("outbox", "exchange"),
    Key<&C::outbox, &Outbox::routing_key>("outbox", "routing_key"),
    Key<&C::outbox, &Outbox::interval>("outbox", "interval_ms", 1, kHour),
    Key<&C::outbox, &Outbox::batch>("outbox", "batch", 1, limits::kOutboxPageMax),
    Key<&C::outbox, &Outbox::lease>("outbox", "lease_ms", 100, kHour),
    Key<&C::outbox, &Outbox::retention>("outbox", "retention_ms", 1),

    {"gateway", "unmatched", Kind::kString, 0, kFieldMax, &ReadUnmatched, &WriteUnmatched},
    {"gateway", "upstream", Kind::kString, 0, kFieldMax, &ReadUnmatchedUpstream,
     &Member<&C::gateway, &Gateway::unmatched_upstream>::Write},
    Key<&C::gateway, &Gateway::unmatched_timeout>("gateway", "timeout_ms", 1, kHour),
    {"gateway", "principal_header", Kind::kString, 0, kFieldMax, &ReadPrincipalHeader,
     &Member<&C::gateway, &Gateway::principal_header>::Write},
    Key<&C::gateway, &Gateway::max_connections>("gateway", "max_connections", 1,
                                                kMaxInFlightCeiling),
    Key<&C::gateway, &Gateway::ca_file>("gateway", "ca_file"),
};

}  // namespace

std::span<const ConfigKey> ConfigKeyTable() { return kKeys; }

Status ReadConfigKeys(const toml::table& file, const std::string& path,
                      const std::map<std::string, std::string>& from_env, Config& config) {
  for (const ConfigKey& key : kKeys) {
    const std::string name = key.Name();
    const toml::node* node = file.at_path(name).node();
    if (node == nullptr) continue;
    auto env = from_env.find(name);
    const std::string where = env != from_env.end()
                                  ? env->second
                                  : path + ":" + std::to_string(node->source().begin.line);
    IDEM_RETURN_IF_ERROR(key.read(key, *node, where, config));
  }
  return Ok();
}

void WriteConfigKeys(const Config& config, toml::table& out) {
  for (const ConfigKey& key : kKeys) {
    if (key.write == nullptr) continue;
    if (!out.contains(key.section)) out.insert(key.section, toml::table{});
    key.write(key, config, *out[key.section].as_table());
  }
}

}  // namespace idem::idemd
