// server/idemd/config/effective.cc — the effective configuration as TOML (what `idemd
// --check-config` prints), and the one list of keys a config file may set (ConfigKeys: the table's,
// and those of [[principals]] and [[routes]] entries).
#include <toml++/toml.h>

#include <boost/url/parse.hpp>
#include <boost/url/url.hpp>
#include <sstream>

#include "server/idemd/config/config.h"
#include "server/idemd/config/keys.h"
#include "server/idemd/consumers/consumer_config.h"
#include "server/idemd/gateway/route_config.h"

namespace idem::idemd {
namespace {

constexpr std::string_view kRedacted = "REDACTED";

toml::table EffectiveTable(const Config& c) {
  toml::table out;
  WriteConfigKeys(c, out);
  toml::array principals;
  for (const PrincipalEntry& p : c.principals) {
    principals.push_back(
        toml::table{{"api_key_sha256", p.api_key_sha256}, {"tenant", p.tenant}, {"user", p.user}});
  }
  toml::array routes;
  for (const GatewayRoute& r : c.gateway.routes) routes.push_back(RouteTable(r));
  if (!principals.empty()) out.insert("principals", std::move(principals));
  if (!routes.empty()) out.insert("routes", std::move(routes));
  toml::array consumers;
  for (const ConsumerRoute& consumer : c.consumers) consumers.push_back(ConsumerTable(consumer));
  if (!consumers.empty()) out.insert("consumers", std::move(consumers));
  return out;
}

// The keys of an entry of an array of tables, "section.key" (and "section.sub.key" for its
// inline tables), with their types.
void AddEntryKeys(const toml::table& table, const std::string& prefix,
                  std::map<std::string, Kind>& out) {
  for (const auto& [key, node] : table) {
    const std::string name = prefix + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      AddEntryKeys(*sub, name + ".", out);
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
    std::map<std::string, Kind> out;
    for (const ConfigKey& key : ConfigKeyTable()) out[key.Name()] = key.kind;
    // The entries of the arrays of tables, as printed; and an alias of their reader.
    AddEntryKeys(toml::table{{"api_key_sha256", ""}, {"tenant", ""}, {"user", ""}}, "principals.",
                 out);
    AddEntryKeys(RouteTable(GatewayRoute{}), "routes.", out);
    out["routes.retention_hours"] = Kind::kInteger;
    AddEntryKeys(ConsumerTable(ConsumerRoute{}), "consumers.", out);
    out["consumers.target.retention_hours"] = Kind::kInteger;
    return out;
  }();
  return keys;
}

}  // namespace idem::idemd
