// server/idemd/config/effective.cc — the effective configuration as TOML (what `idemd
// --check-config` prints), and from it the one list of keys a config file may set: the unknown-key
// check, the IDEMD_<SECTION>_<KEY> environment overrides and docs/config.md's test all read it.
#include <toml++/toml.h>

#include <boost/url/parse.hpp>
#include <boost/url/url.hpp>
#include <sstream>

#include "http/message.h"
#include "server/idemd/config/config.h"

namespace idem::idemd {
namespace {

constexpr std::string_view kRedacted = "REDACTED";

toml::array Strings(const std::vector<std::string>& values) {
  toml::array out;
  for (const std::string& v : values) out.push_back(v);
  return out;
}

toml::array Integers(const std::vector<int>& values) {
  toml::array out;
  for (int v : values) out.push_back(int64_t{v});
  return out;
}

int64_t Ms(Millis m) { return m.count(); }

toml::table RouteTable(const GatewayRoute& r) {
  toml::array statuses;
  if (r.success_final) statuses.push_back("2xx");
  for (int s : r.final_statuses) statuses.push_back(int64_t{s});
  return toml::table{
      {"name", r.name},
      {"match", r.method + " " + r.pattern},
      {"upstream", r.upstream},
      {"key", r.key_required ? "required" : "optional"},
      {"body", r.json_body ? "json" : "bytes"},
      {"fingerprint", toml::table{{"ignore", Strings(r.fingerprint_ignore)},
                                  {"decimals", Strings(r.fingerprint_decimals)}}},
      {"final_statuses", statuses},
      {"store_headers", Strings(r.store_headers)},
      {"forward_key_header", r.forward_key_header},
      {"upstream_deduplicates", r.upstream_deduplicates},
      {"status_path", r.status_path},
      {"status_unknown_max_ms", Ms(r.status_unknown_max)},
      {"status_auth_header", r.status_auth_header},
      {"status_auth_env", r.status_auth_env},  // the variable's name; its value is never printed
      {"lease_ms", Ms(r.lease)},
      {"timeout_ms", Ms(r.timeout)},
      {"max_stored_bytes", static_cast<int64_t>(r.max_stored_bytes)},
      {"retention_ms", Ms(r.retention)},
  };
}

toml::table EffectiveTable(const Config& c) {
  const http::ServerOptions& s = c.server;
  const PostgresTimeouts& pg = c.store_timeouts;
  toml::array principals;
  for (const PrincipalEntry& p : c.principals) {
    principals.push_back(
        toml::table{{"api_key_sha256", p.api_key_sha256}, {"tenant", p.tenant}, {"user", p.user}});
  }
  toml::array routes;
  for (const GatewayRoute& r : c.gateway.routes) routes.push_back(RouteTable(r));
  toml::table out{
      {"server",
       toml::table{
           {"listen", http::Authority(s.host, s.port)},
           {"io_threads", int64_t{s.io_threads}},
           {"max_in_flight", int64_t{s.max_in_flight}},
           {"max_connections", int64_t{s.max_connections}},
           {"max_parked", int64_t{s.max_parked}},
           {"max_body_bytes", static_cast<int64_t>(s.max_body_bytes)},
           {"read_timeout_ms", Ms(s.read_timeout)},
           {"drain_timeout_ms", Ms(s.drain_timeout)},
       }},
      {"store",
       toml::table{
           {"url", RedactedUrl(c.store_url)},
           {"pool_size", int64_t{c.store_pool_size}},
           {"threads", int64_t{c.store_threads}},
           {"read_threads", int64_t{c.store_read_threads}},
           {"replay_cache_bytes", c.replay_cache_bytes},
           {"prepared_statements", c.store_prepared_statements},
           {"listen_url", RedactedUrl(c.store_listen_url)},
           {"connect_timeout_ms", Ms(pg.connect)},
           {"statement_timeout_ms", Ms(pg.statement)},
           {"lock_timeout_ms", Ms(pg.lock)},
           {"idle_in_transaction_timeout_ms", Ms(pg.idle_in_transaction)},
           {"keepalives_idle_s", static_cast<int64_t>(pg.keepalives_idle.count())},
           {"keepalives_interval_s", static_cast<int64_t>(pg.keepalives_interval.count())},
           {"keepalives_count", int64_t{pg.keepalives_count}},
       }},
      {"redis", toml::table{{"url", RedactedUrl(c.redis_url)}}},
      {"provider",
       toml::table{
           {"url", RedactedUrl(c.provider_url)},
           {"timeout_ms", Ms(c.provider_timeout)},
           {"connect_timeout_ms", Ms(c.provider_connect_timeout)},
           {"max_connections", int64_t{c.provider_max_connections}},
           {"ca_file", c.provider_ca_file},
           {"nothing_charged_statuses", Integers(c.provider_nothing_charged_statuses)},
           {"deduplicates_by_key", c.provider_deduplicates_by_key},
           {"settle_ms", Ms(c.provider_settle)},
       }},
      {"secrets",
       toml::table{{"file", c.secrets_file}, {"generate_if_missing", c.generate_secrets}}},
      {"idempotency",
       toml::table{
           {"lease_ms", Ms(c.lease)},
           {"lease_margin_ms", Ms(c.lease_margin)},
           {"retention_ms", Ms(c.retention)},
           {"max_processing", c.max_processing},
           {"max_retained", c.max_retained},
           {"wait_max_ms", Ms(c.wait_max)},
           {"max_waiters_per_principal", c.max_waiters_per_principal},
           {"max_new_keys_per_second", c.max_new_keys_per_second},
           {"key_min_length", static_cast<int64_t>(c.key_min_length)},
           {"key_max_length", static_cast<int64_t>(c.key_max_length)},
           {"sweep_interval_ms", Ms(c.sweep_interval)},
           {"reconcile_interval_ms", Ms(c.reconcile_interval)},
       }},
      {"reconciliation",
       toml::table{
           {"interval_ms", Ms(c.books_interval)},
           {"window_ms", Ms(c.books_window)},
           {"lag_ms", Ms(c.books_lag)},
           {"refund_duplicates", c.refund_duplicates},
           {"refund_orphans", c.refund_orphans},
           {"orphan_grace_ms", Ms(c.orphan_grace)},
           {"lease_ms", Ms(c.books_lease)},
       }},
      {"payments", toml::table{{"currencies", Strings(c.currencies)}}},
      {"gateway",
       toml::table{
           {"unmatched", c.gateway.forward_unmatched ? "forward" : "not_found"},
           {"upstream", c.gateway.unmatched_upstream},
           {"timeout_ms", Ms(c.gateway.unmatched_timeout)},
           {"principal_header", c.gateway.principal_header},
           {"max_connections", int64_t{c.gateway.max_connections}},
           {"ca_file", c.gateway.ca_file},
       }},
  };
  if (!principals.empty()) out.insert("principals", std::move(principals));
  if (!routes.empty()) out.insert("routes", std::move(routes));
  return out;
}

// Keys accepted but not printed: another spelling of a printed key, or keys of an older model
// that are still read and ignored with a warning.
constexpr std::string_view kAcceptedAliases[] = {"idempotency.retention_hours",
                                                 "routes.retention_hours", "server.worker_threads",
                                                 "server.max_queued"};

void AddKeys(const toml::table& table, const std::string& prefix,
             std::map<std::string, Kind>& out) {
  for (const auto& [key, node] : table) {
    const std::string name = prefix + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      AddKeys(*sub, name + ".", out);
    } else if (const toml::array* array = node.as_array();
               array != nullptr && !array->empty() && array->front().is_table()) {
      AddKeys(*array->front().as_table(), name + ".", out);
    } else {
      out[name] = node.is_string()    ? Kind::kString
                  : node.is_boolean() ? Kind::kBoolean
                  : node.is_array()   ? Kind::kArray
                                      : Kind::kInteger;
    }
  }
}

}  // namespace

std::string RedactedUrl(const std::string& url) {
  const std::size_t scheme = url.find("://");
  if (scheme == std::string::npos) {  // a libpq keyword string
    return url.find("password") == std::string::npos ? url : std::string(kRedacted);
  }
  // The user info by hand: everything up to the authority's last '@', which also covers what
  // Boost.URL reads otherwise or not at all (an unencoded '@' in a password, libpq's multi-host
  // "h1:5432,h2:5432"). The user stays; what follows its ':' goes.
  std::string out = url;
  const std::size_t from = scheme + 3;
  const std::size_t host_end = url.find_first_of("/?#", from);
  const std::size_t at = url.rfind('@', host_end == std::string::npos ? url.size() : host_end);
  if (at != std::string::npos && at >= from) {
    const std::size_t colon = url.find(':', from);
    if (colon < at) out = url.substr(0, colon + 1) + std::string(kRedacted) + url.substr(at);
  }
  auto parsed = boost::urls::parse_absolute_uri(out);
  if (!parsed) {
    return out.find("password=") == std::string::npos ? out : std::string(kRedacted);
  }
  boost::urls::url copy(*parsed);
  auto params = copy.params();
  for (auto it = params.begin(); it != params.end(); ++it) {
    if ((*it).key == "password") it = params.replace(it, {"password", kRedacted});
  }
  return std::string(copy.buffer());
}

std::string EffectiveConfigToml(const Config& config) {
  std::ostringstream out;
  out << EffectiveTable(config) << "\n";
  return out.str();
}

const std::map<std::string, Kind>& ConfigKeys() {
  static const std::map<std::string, Kind> keys = [] {
    // A config with one entry in each array of tables, so their keys are listed too.
    Config sample;
    sample.principals.emplace_back();
    sample.gateway.routes.emplace_back();
    std::map<std::string, Kind> out;
    AddKeys(EffectiveTable(sample), "", out);
    for (std::string_view alias : kAcceptedAliases) out[std::string(alias)] = Kind::kInteger;
    return out;
  }();
  return keys;
}

}  // namespace idem::idemd
