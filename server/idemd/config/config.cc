// server/idemd/config/config.cc — TOML (toml++) into Config, flag overrides, secrets.
#include "server/idemd/config/config.h"

#include <sched.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <boost/url/parse.hpp>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

#include "http/log.h"
#include "server/idemd/routes.h"

namespace idem::idemd {
namespace {

Error Bad(const std::string& origin, const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ": " + what);
}

// host:port, host non-empty, port 0..65535.
Status ParseListen(const std::string& text, http::ServerOptions& server,
                   const std::string& origin) {
  auto address = http::ParseListenAddress(text);
  if (!address) return Bad(origin, address.error().message);
  server.host = address->host;
  server.port = address->port;
  return Ok();
}

template <typename T>
Status Read(const toml::table& t, std::string_view section, std::string_view key, T& out,
            const std::string& origin) {
  const std::string name = std::string(section) + "." + std::string(key);
  if (!ConfigKeys().contains(name)) {
    // A key read here must be listed (printed by EffectiveConfigToml), or files could not set it.
    return Bad(origin, name + " is read but not listed in ConfigKeys (a bug)");
  }
  const toml::node* node = t.at_path(name).node();
  if (node == nullptr) return Ok();
  if constexpr (std::is_same_v<T, std::string>) {
    if (!node->is_string())
      return Bad(origin, std::string(section) + "." + std::string(key) + " must be a string");
    out = node->as_string()->get();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!node->is_boolean())
      return Bad(origin, std::string(section) + "." + std::string(key) + " must be a boolean");
    out = node->as_boolean()->get();
  } else {
    if (!node->is_integer() || node->as_integer()->get() < 0) {
      return Bad(origin,
                 std::string(section) + "." + std::string(key) + " must be a non-negative integer");
    }
    // Not cut to the field's width: worker_threads = 4294967297 is no 1.
    const int64_t value = node->as_integer()->get();
    if (!std::in_range<T>(value)) {
      return Bad(origin, std::string(section) + "." + std::string(key) + " must be at most " +
                             std::to_string(std::numeric_limits<T>::max()));
    }
    out = static_cast<T>(value);
  }
  return Ok();
}

// A duration in Duration's unit, at most kMaxConfigDuration.
template <typename Duration>
Status ReadDuration(const toml::table& t, std::string_view section, std::string_view key,
                    Duration& out, const std::string& origin) {
  int64_t count = out.count();
  IDEM_RETURN_IF_ERROR(Read(t, section, key, count, origin));
  const int64_t max = std::chrono::duration_cast<Duration>(kMaxConfigDuration).count();
  if (count > max) {
    return Bad(origin, std::string(section) + "." + std::string(key) + " must be at most " +
                           std::to_string(max) + " (ten years)");
  }
  out = Duration(count);
  return Ok();
}

Status ReadMillis(const toml::table& t, std::string_view section, std::string_view key, Millis& out,
                  const std::string& origin) {
  return ReadDuration(t, section, key, out, origin);
}

// ReadMillis for an interval or a deadline that 0 would break (a loop that never sleeps, a call
// that times out before it starts): at least 1 ms. Errors name the key and its line.
Status ReadPositiveMillis(const toml::table& t, std::string_view section, std::string_view key,
                          Millis& out, const std::string& origin) {
  IDEM_RETURN_IF_ERROR(ReadMillis(t, section, key, out, origin));
  if (out.count() > 0) return Ok();
  const std::string name = std::string(section) + "." + std::string(key);
  const toml::node* node = t.at_path(name).node();
  const int64_t line = node != nullptr ? node->source().begin.line : 0;
  // A value set by an IDEMD_ variable has no line in the file.
  return Bad(line > 0 ? origin + ":" + std::to_string(line) : origin + " (or its IDEMD_ variable)",
             name + " must be at least 1");
}

Status ReadSeconds(const toml::table& t, std::string_view section, std::string_view key,
                   std::chrono::seconds& out, const std::string& origin) {
  return ReadDuration(t, section, key, out, origin);
}

// [provider] nothing_charged_statuses: 5xx codes, as integers or as their three digits in a
// string (the form an IDEMD_PROVIDER_NOTHING_CHARGED_STATUSES list takes), each at most once.
Status ReadNothingChargedStatuses(const toml::table& t, std::vector<int>& out,
                                  const std::string& origin) {
  constexpr std::string_view kName = "provider.nothing_charged_statuses";
  const toml::node* node = t.at_path(kName).node();
  if (node == nullptr) return Ok();
  const toml::array* array = node->as_array();
  if (array == nullptr) return Bad(origin, std::string(kName) + " must be an array of 5xx codes");
  out.clear();
  for (const toml::node& n : *array) {
    std::optional<int64_t> code = n.value<int64_t>();
    if (auto text = n.value<std::string>();
        text && text->size() == 3 && std::all_of(text->begin(), text->end(), ::isdigit)) {
      code = std::stoi(*text);
    }
    if (!n.is_integer() && !n.is_string()) code.reset();
    if (!code || *code < 500 || *code > 599) {
      return Bad(origin, std::string(kName) +
                             ": only 5xx statuses can prove that nothing was charged (a 2xx is "
                             "a charge, a 402 a decline)");
    }
    if (std::find(out.begin(), out.end(), *code) != out.end()) {
      return Bad(origin, std::string(kName) + ": " + std::to_string(*code) + " is listed twice");
    }
    out.push_back(static_cast<int>(*code));
  }
  return Ok();
}

Result<std::vector<Secret>> ReadSecretArray(const toml::table& t, const char* name,
                                            const std::string& origin) {
  std::vector<Secret> out;
  const toml::array* array = t[name].as_array();
  if (array == nullptr) return Bad(origin, std::string("missing [[") + name + "]] entries");
  for (const toml::node& entry : *array) {
    const toml::table* e = entry.as_table();
    if (e == nullptr) return Bad(origin, std::string(name) + " entries must be tables");
    auto id = (*e)["id"].value<int64_t>();
    auto key = (*e)["key"].value<std::string>();
    if (!id || !key || *id < 0 || *id > 0xffffffffLL) {
      return Bad(origin, std::string(name) + " entries need an id and a hex key");
    }
    auto bytes = DecodeHex(*key);
    if (!bytes) return Bad(origin, std::string(name) + " key " + std::to_string(*id) + ": not hex");
    out.push_back(Secret{static_cast<uint32_t>(*id), std::move(*bytes)});
  }
  return out;
}

// toml++ reports errors by exception or by value depending on how it was built; either way
// they become a Result here.
Result<toml::table> ParseToml(std::string_view text, const std::string& origin, bool is_file) {
#if TOML_EXCEPTIONS
  try {
    return is_file ? toml::parse_file(origin) : toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return Bad(origin, std::string(e.description()) + " at " + where.str());
  }
#else
  toml::parse_result parsed = is_file ? toml::parse_file(origin) : toml::parse(text, origin);
  if (!parsed) {
    std::ostringstream where;
    where << parsed.error().source().begin;
    return Bad(origin, std::string(parsed.error().description()) + " at " + where.str());
  }
  return std::move(parsed).table();
#endif
}

}  // namespace

Result<Secrets> ParseSecrets(std::string_view toml_text, const std::string& origin) {
  IDEM_ASSIGN_OR_RETURN(const toml::table t, ParseToml(toml_text, origin, false));
  Secrets s;
  auto hmac_current = t["hmac_current"].value<int64_t>();
  auto seal_current = t["seal_current"].value<int64_t>();
  if (!hmac_current || !seal_current)
    return Bad(origin, "hmac_current and seal_current are required");
  s.hmac_current = static_cast<uint32_t>(*hmac_current);
  s.seal_current = static_cast<uint32_t>(*seal_current);
  IDEM_ASSIGN_OR_RETURN(s.hmac, ReadSecretArray(t, "hmac", origin));
  IDEM_ASSIGN_OR_RETURN(s.seal, ReadSecretArray(t, "seal", origin));
  if (auto st = ValidateSecrets(s.hmac, s.hmac_current, 32, 0); !st)
    return Bad(origin, "hmac: " + st.error().message);
  if (auto st = ValidateSecrets(s.seal, s.seal_current, 32, 32); !st)
    return Bad(origin, "seal: " + st.error().message);
  return s;
}

std::string GenerateSecretsToml(Random& random) {
  auto fresh = [&] {
    std::array<uint8_t, 32> bytes;
    random.Fill(bytes);
    return ToHex(bytes);
  };
  return "# Development secrets for idemd, generated once. Never commit this file.\n"
         "hmac_current = 1\nseal_current = 1\n\n[[hmac]]\nid = 1\nkey = \"" +
         fresh() + "\"\n\n[[seal]]\nid = 1\nkey = \"" + fresh() + "\"\n";
}

// "file:LINE: [[routes]] NAME: what".
Error BadRoute(const std::string& origin, int64_t line, const std::string& name,
               const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ":" + std::to_string(line) + ": [[routes]]" +
                                               (name.empty() ? "" : " " + name) + ": " + what);
}

// An array of strings of at most kMaxRouteListEntries; `lower` folds them to lower case.
Result<std::vector<std::string>> RouteStrings(const toml::node& node, bool lower) {
  const toml::array* array = node.as_array();
  if (array == nullptr || array->size() > kMaxRouteListEntries) {
    return MakeError(Errc::kInvalidArgument, "must be an array of at most " +
                                                 std::to_string(kMaxRouteListEntries) + " strings");
  }
  std::vector<std::string> out;
  for (const toml::node& n : *array) {
    auto text = n.value<std::string>();
    if (!text || text->empty() || text->size() > 255) {
      return MakeError(Errc::kInvalidArgument, "must hold non-empty strings of at most 255 bytes");
    }
    if (lower)
      std::transform(text->begin(), text->end(), text->begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    out.push_back(std::move(*text));
  }
  return out;
}

// "2xx" or a status code 100..599 (a number, or its digits as a string).
Status RouteStatuses(const toml::node& node, GatewayRoute& route) {
  const toml::array* array = node.as_array();
  if (array == nullptr || array->size() > kMaxRouteListEntries) {
    return MakeError(Errc::kInvalidArgument, "must be an array of \"2xx\" and status codes");
  }
  route.success_final = false;
  for (const toml::node& n : *array) {
    std::optional<int64_t> code = n.value<int64_t>();
    if (auto text = n.value<std::string>()) {
      if (*text == "2xx") {
        route.success_final = true;
        continue;
      }
      if (text->size() == 3 && std::all_of(text->begin(), text->end(), ::isdigit)) {
        code = std::stoi(*text);
      }
    }
    if (!code || *code < 100 || *code > 599) {
      const std::string shown = n.is_string()    ? "\"" + *n.value<std::string>() + "\""
                                : n.is_integer() ? std::to_string(*n.value<int64_t>())
                                                 : "an entry of another type";
      return MakeError(Errc::kInvalidArgument, shown + " is neither \"2xx\" nor a status 100..599");
    }
    route.final_statuses.push_back(static_cast<int>(*code));
  }
  return Ok();
}

// An upstream's URL as "scheme://host[:port]": http or https, a host, no path, query or user.
Result<std::string> ParseUpstream(const std::string& text) {
  auto url = boost::urls::parse_absolute_uri(text);
  if (!url || (url->scheme() != "http" && url->scheme() != "https") || url->host().empty() ||
      !(url->path().empty() || url->path() == "/") || url->has_query() || url->has_userinfo()) {
    return MakeError(
        Errc::kInvalidArgument,
        "must be http://host[:port] or https://host[:port], without a path, got '" + text + "'");
  }
  return std::string(url->scheme()) + "://" + std::string(url->encoded_host_and_port());
}

// Whether `route` could match one of idemd's own paths (with any method).
bool ShadowsIdemd(const GatewayRoute& route) {
  for (const OwnRouteEntry& own : kOwnRoutes) {
    GatewayRoute idemd;
    if (ParseGatewayMatch(route.method + " " + std::string(own.pattern), idemd).empty() &&
        GatewayRoutesOverlap(route, idemd)) {
      return true;
    }
  }
  return false;
}

Result<GatewayRoute> ReadGatewayRoute(const toml::table& t, const std::string& origin) {
  GatewayRoute r;
  r.line = t.source().begin.line;
  if (auto name = t["name"].value<std::string>()) r.name = *name;
  auto bad = [&](const std::string& what) { return BadRoute(origin, r.line, r.name, what); };
  const bool name_ok = !r.name.empty() && r.name.size() <= kMaxRouteNameLength &&
                       std::all_of(r.name.begin(), r.name.end(), [](char ch) {
                         return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                                ch == '_' || ch == '-';
                       });
  if (!name_ok) {
    return bad("name must be 1.." + std::to_string(kMaxRouteNameLength) +
               " characters of a-z 0-9 . _ -");
  }
  if (r.name == "unmatched" || r.name == "unknown") {
    return bad("name '" + r.name +
               "' is taken: metrics and logs use it for requests no route "
               "matches");
  }
  std::optional<Millis> retention_ms;  // wins over retention_hours, as in [idempotency]
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    auto at = [&, line = node.source().begin.line](const std::string& what) {
      return BadRoute(origin, line, r.name, k + ": " + what);
    };
    if (k == "name") continue;
    if (k == "match") {
      auto text = node.value<std::string>();
      if (!text) return at("must be a string");
      if (std::string error = ParseGatewayMatch(*text, r); !error.empty()) return at(error);
    } else if (k == "upstream") {
      auto text = node.value<std::string>();
      if (!text) return at("must be a string");
      auto upstream = ParseUpstream(*text);
      if (!upstream) return at(upstream.error().message);
      r.upstream = std::move(*upstream);
    } else if (k == "key") {
      auto text = node.value<std::string>();
      if (!text || (*text != "required" && *text != "optional")) {
        return at("must be \"required\" or \"optional\"");
      }
      r.key_required = *text == "required";
    } else if (k == "body") {
      auto text = node.value<std::string>();
      if (!text || (*text != "json" && *text != "bytes")) {
        return at("must be \"json\" or \"bytes\"");
      }
      r.json_body = *text == "json";
    } else if (k == "fingerprint") {
      const toml::table* f = node.as_table();
      if (f == nullptr) return at("must be a table (fingerprint.ignore, fingerprint.decimals)");
      for (const auto& [fk, fn] : *f) {
        auto field = RouteStrings(fn, false);
        if (fk.str() == "ignore" && field) {
          r.fingerprint_ignore = std::move(*field);
        } else if (fk.str() == "decimals" && field) {
          r.fingerprint_decimals = std::move(*field);
        } else {
          const std::string sub = "fingerprint." + std::string(fk.str());
          return BadRoute(origin, fn.source().begin.line, r.name,
                          fk.str() == "ignore" || fk.str() == "decimals"
                              ? sub + ": " + field.error().message
                              : "unknown key " + sub);
        }
      }
    } else if (k == "final_statuses") {
      if (Status s = RouteStatuses(node, r); !s) return at(s.error().message);
    } else if (k == "store_headers") {
      auto headers = RouteStrings(node, true);
      if (!headers) return at(headers.error().message);
      for (const std::string& h : *headers) {
        if (IsUnforwardableHeader(h)) return at("'" + h + "' is never stored or replayed");
      }
      r.store_headers = std::move(*headers);
    } else if (k == "forward_key_header") {
      auto text = node.value<std::string>();
      if (!text || text->size() > 64) return at("must be a header name");
      r.forward_key_header = *text;
    } else if (k == "status_path" && node.value<std::string>() == std::string()) {
      r.status_path.clear();  // none, as when absent
    } else if (k == "status_path") {
      auto text = node.value<std::string>();
      const std::size_t at_key = text ? text->find("{key}") : std::string::npos;
      // A path and query as sent, with {key} in place of the key (64 hex digits).
      std::string sample = text ? *text : "";
      if (at_key != std::string::npos) sample.replace(at_key, 5, std::string(64, 'a'));
      if (!text || text->size() > 255 || at_key == std::string::npos ||
          text->find("{key}", at_key + 1) != std::string::npos ||
          !boost::urls::parse_origin_form(sample)) {
        return at(
            "must be a path (and query) starting with '/' holding {key} once, e.g. "
            "\"/v1/orders/by-key/{key}\"");
      }
      r.status_path = *text;
    } else if (k == "status_auth_header" || k == "status_auth_env") {
      auto text = node.value<std::string>();
      const bool header = k == "status_auth_header";
      const bool ok = text && text->size() <= 64 &&
                      std::all_of(text->begin(), text->end(), [&](unsigned char ch) {
                        return std::isalnum(ch) != 0 || ch == '-' || ch == '_';
                      });
      if (!ok || (header && IsHopByHopHeader(http::ToLower(*text)))) {
        return at(header ? "must be a header name of at most 64 letters, digits, - and _, not "
                           "a hop-by-hop header"
                         : "must be an environment variable's name of at most 64 letters, "
                           "digits and _");
      }
      (header ? r.status_auth_header : r.status_auth_env) = *text;
      if (!header && !text->empty()) {
        // Read once here (and at each reload); never printed or logged.
        const char* value = std::getenv(text->c_str());
        if (value == nullptr || *value == '\0') {
          return at("the environment variable " + *text + " is not set (or empty)");
        }
        r.status_auth_value = value;
      }
    } else if (k == "upstream_deduplicates") {
      auto value = node.value<bool>();
      if (!node.is_boolean() || !value) return at("must be true or false");
      r.upstream_deduplicates = *value;
    } else if (k == "status_unknown_max_ms") {
      auto value = node.value<int64_t>();
      if (!node.is_integer() || !value || *value < 1 || *value > kMaxConfigDuration.count()) {
        return at("must be an integer 1.." + std::to_string(kMaxConfigDuration.count()));
      }
      r.status_unknown_max = Millis(*value);
    } else if (k == "lease_ms" || k == "timeout_ms" || k == "retention_hours" ||
               k == "retention_ms") {
      auto value = node.value<int64_t>();
      const int64_t max = k == "retention_hours" ? 10LL * 365 * 24
                          : k == "retention_ms"  ? kMaxConfigDuration.count()
                                                 : 3'600'000;
      if (!node.is_integer() || !value || *value < 1 || *value > max) {
        return at("must be an integer 1.." + std::to_string(max));
      }
      if (k == "retention_ms") {
        retention_ms = Millis(*value);
      } else {
        (k == "lease_ms"     ? r.lease
         : k == "timeout_ms" ? r.timeout
                             : r.retention) =
            Millis(k == "retention_hours" ? *value * 3'600'000 : *value);
      }
    } else if (k == "max_stored_bytes") {
      auto value = node.value<int64_t>();
      if (!node.is_integer() || !value || *value < int64_t{kMinStoredBytes} ||
          *value > static_cast<int64_t>(limits::kSealedResponseCeiling)) {
        return at("must be an integer " + std::to_string(kMinStoredBytes) + ".." +
                  std::to_string(limits::kSealedResponseCeiling));
      }
      r.max_stored_bytes = static_cast<std::size_t>(*value);
    } else {
      return at("unknown key");
    }
  }
  if (retention_ms) r.retention = *retention_ms;
  if (r.method.empty()) return bad("needs match = \"METHOD /path\"");
  if (r.upstream.empty()) return bad("needs upstream = \"http://host:port\"");
  if (ShadowsIdemd(r)) return bad("match " + r.pattern + " would shadow idemd's own paths");
  if (r.lease <= r.timeout) {
    return bad("lease_ms (" + std::to_string(r.lease.count()) +
               ") must be longer than timeout_ms (" + std::to_string(r.timeout.count()) + ")");
  }
  if (r.retention <= r.lease) return bad("retention (retention_ms) must be longer than lease_ms");
  if (!r.json_body && (!r.fingerprint_ignore.empty() || !r.fingerprint_decimals.empty())) {
    return bad("fingerprint.ignore and fingerprint.decimals need body = \"json\"");
  }
  if (!r.status_path.empty() && r.forward_key_header.empty()) {
    return bad("status_path needs forward_key_header: the upstream must know each request's key");
  }
  if (r.upstream_deduplicates && r.forward_key_header.empty()) {
    return bad("upstream_deduplicates needs forward_key_header: the upstream deduplicates by it");
  }
  if (r.status_auth_header.empty() != r.status_auth_env.empty()) {
    return bad("status_auth_header and status_auth_env go together");
  }
  if (!r.status_auth_header.empty() && r.status_path.empty()) {
    return bad("status_auth_header needs status_path");
  }
  return r;
}

// [gateway]: what happens to requests no route matches, where principals come from, and the
// upstream pools' bounds.
Status ReadGatewaySection(const toml::table& t, const std::string& origin, GatewayConfig& out) {
  const toml::node* node = t.get("gateway");
  if (node == nullptr) return Ok();
  const toml::table* g = node->as_table();
  if (g == nullptr) return Bad(origin, "gateway must be a table");
  std::string unmatched = "not_found";
  IDEM_RETURN_IF_ERROR(Read(t, "gateway", "unmatched", unmatched, origin));
  if (unmatched != "not_found" && unmatched != "forward") {
    return Bad(origin,
               "gateway.unmatched must be \"not_found\" or \"forward\", got '" + unmatched + "'");
  }
  out.forward_unmatched = unmatched == "forward";
  std::string upstream;
  IDEM_RETURN_IF_ERROR(Read(t, "gateway", "upstream", upstream, origin));
  if (!upstream.empty()) {
    auto parsed = ParseUpstream(upstream);
    if (!parsed) return Bad(origin, "gateway.upstream " + parsed.error().message);
    out.unmatched_upstream = std::move(*parsed);
  }
  if (out.forward_unmatched && out.unmatched_upstream.empty()) {
    return Bad(origin, "gateway.unmatched = \"forward\" needs gateway.upstream");
  }
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "gateway", "timeout_ms", out.unmatched_timeout, origin));
  if (out.unmatched_timeout < Millis(1) || out.unmatched_timeout > Millis(3'600'000)) {
    return Bad(origin, "gateway.timeout_ms must be 1..3600000");
  }
  IDEM_RETURN_IF_ERROR(Read(t, "gateway", "principal_header", out.principal_header, origin));
  std::transform(out.principal_header.begin(), out.principal_header.end(),
                 out.principal_header.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const bool token =
      std::all_of(out.principal_header.begin(), out.principal_header.end(),
                  [](unsigned char ch) { return std::isalnum(ch) != 0 || ch == '-' || ch == '_'; });
  if (!token || out.principal_header.size() > 64 || IsUnforwardableHeader(out.principal_header)) {
    return Bad(origin,
               "gateway.principal_header must be a header name of at most 64 letters, "
               "digits, - and _, and not a credential or hop-by-hop header");
  }
  IDEM_RETURN_IF_ERROR(Read(t, "gateway", "max_connections", out.max_connections, origin));
  if (out.max_connections < 1 || out.max_connections > kMaxInFlightCeiling) {
    return Bad(origin, "gateway.max_connections must be 1.." + std::to_string(kMaxInFlightCeiling));
  }
  IDEM_RETURN_IF_ERROR(Read(t, "gateway", "ca_file", out.ca_file, origin));
  return Ok();
}

Status ReadGatewayRoutes(const toml::table& t, const std::string& origin,
                         std::vector<GatewayRoute>& out) {
  const toml::node* node = t.get("routes");
  if (node == nullptr) return Ok();
  const toml::array* routes = node->as_array();
  if (routes == nullptr || routes->size() > kMaxGatewayRoutes) {
    return Bad(origin,
               "routes must be [[routes]] tables, at most " + std::to_string(kMaxGatewayRoutes));
  }
  for (const toml::node& n : *routes) {
    const toml::table* table = n.as_table();
    if (table == nullptr) return Bad(origin, "[[routes]] entries must be tables");
    IDEM_ASSIGN_OR_RETURN(GatewayRoute route, ReadGatewayRoute(*table, origin));
    for (const GatewayRoute& before : out) {
      if (before.name == route.name) {
        return BadRoute(origin, route.line, route.name,
                        "name already used at line " + std::to_string(before.line));
      }
      if (GatewayRoutesOverlap(before, route)) {
        return BadRoute(origin, route.line, route.name,
                        route.method + " " + route.pattern + " overlaps " + before.name + " (" +
                            before.method + " " + before.pattern + ", line " +
                            std::to_string(before.line) + ")");
      }
    }
    out.push_back(std::move(route));
  }
  return Ok();
}

// Every key of the file must be one LoadConfig reads (ConfigKeys): a misspelt key would
// otherwise leave its setting at the default without a word. [[routes]] entries are checked by
// their reader, which names the route.
Status CheckKnownKeys(const toml::table& t, const std::string& origin) {
  const std::map<std::string, Kind>& known = ConfigKeys();
  auto unknown = [&](const std::string& name, const toml::node& n) {
    // A key of an earlier version says what replaced it.
    const std::string replaced =
        name == "provider.5xx_means_nothing_charged"
            ? " (replaced by provider.nothing_charged_statuses: the 5xx statuses the provider "
              "documents as \"nothing was charged\", e.g. [503]; docs/config.md)"
            : "";
    return Bad(origin + ":" + std::to_string(n.source().begin.line),
               "unknown key " + name + replaced);
  };
  auto check_table = [&](const toml::table& table, const std::string& prefix) -> Status {
    for (const auto& [key, node] : table) {
      const std::string name = prefix + "." + std::string(key.str());
      if (!known.contains(name)) return unknown(name, node);
    }
    return Ok();
  };
  for (const auto& [key, node] : t) {
    const std::string section(key.str());
    if (section == "routes") continue;
    const auto first = known.lower_bound(section + ".");
    if (first == known.end() || first->first.rfind(section + ".", 0) != 0) {
      return unknown(section, node);
    }
    if (const toml::table* table = node.as_table()) {
      IDEM_RETURN_IF_ERROR(check_table(*table, section));
    } else if (const toml::array* array = node.as_array()) {
      for (const toml::node& entry : *array) {
        if (const toml::table* element = entry.as_table()) {
          IDEM_RETURN_IF_ERROR(check_table(*element, section));
        }
      }
    } else {
      return Bad(origin + ":" + std::to_string(node.source().begin.line),
                 section + " must be a table");
    }
  }
  return Ok();
}

// IDEMD_<SECTION>_<KEY> (upper case) sets section.key over the file, typed as the key is: an
// integer, true/false, a string as it is, or a list separated by commas. Keys of [[principals]]
// and [[routes]] entries have none. An IDEMD_ variable that names no key is an error.
Status ApplyEnvironment(toml::table& t) {
  std::map<std::string, std::pair<std::string, Kind>> by_variable;
  for (const auto& [name, kind] : ConfigKeys()) {
    const std::size_t dot = name.find('.');
    const std::string section = name.substr(0, dot);
    if (section == "principals" || section == "routes") continue;
    std::string variable = "IDEMD_" + name;
    for (char& ch : variable) {
      ch = ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
    by_variable[variable] = {name, kind};
  }
  for (char** env = environ; *env != nullptr; ++env) {
    const std::string_view entry(*env);
    if (entry.rfind("IDEMD_", 0) != 0) continue;
    const std::size_t eq = entry.find('=');
    const std::string variable(entry.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? "" : entry.substr(eq + 1));
    auto it = by_variable.find(variable);
    if (it == by_variable.end()) {
      return Bad("environment", variable + " names no configuration key (docs/config.md)");
    }
    if (value.empty()) continue;  // as if unset: an empty template line changes nothing
    const std::string& name = it->second.first;
    const std::size_t dot = name.find('.');
    const std::string section = name.substr(0, dot);
    if (!t.contains(section)) t.insert(section, toml::table{});
    toml::table* table = t[section].as_table();
    if (table == nullptr) return Bad("environment", variable + ": " + section + " is not a table");
    const std::string key = name.substr(dot + 1);
    switch (it->second.second) {
      case Kind::kString:
        table->insert_or_assign(key, value);
        break;
      case Kind::kBoolean:
        if (value != "true" && value != "false") {
          return Bad("environment", variable + " must be true or false");
        }
        table->insert_or_assign(key, value == "true");
        break;
      case Kind::kInteger: {
        int64_t n = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || end != value.data() + value.size()) {
          return Bad("environment", variable + " must be an integer");
        }
        table->insert_or_assign(key, n);
        break;
      }
      case Kind::kArray: {
        toml::array list;
        std::string_view rest(value);
        while (!rest.empty()) {
          const std::size_t comma = rest.find(',');
          std::string_view element = rest.substr(0, comma);
          while (!element.empty() && element.front() == ' ') element.remove_prefix(1);
          while (!element.empty() && element.back() == ' ') element.remove_suffix(1);
          list.push_back(std::string(element));
          rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
        }
        table->insert_or_assign(key, std::move(list));
        break;
      }
    }
  }
  return Ok();
}

int IoThreadsPerCpu() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
    return std::min(CPU_COUNT(&allowed), kIoThreadsCeiling);
  }
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kIoThreadsCeiling);
}

Result<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  IDEM_ASSIGN_OR_RETURN(toml::table t, ParseToml({}, path, true));
  const std::string& o = path;
  IDEM_RETURN_IF_ERROR(CheckKnownKeys(t, o));
  IDEM_RETURN_IF_ERROR(ApplyEnvironment(t));

  std::string listen;
  IDEM_RETURN_IF_ERROR(Read(t, "server", "listen", listen, o));
  if (!listen.empty()) IDEM_RETURN_IF_ERROR(ParseListen(listen, c.server, o));
  c.server.io_threads = 0;  // one per CPU unless the file says
  IDEM_RETURN_IF_ERROR(Read(t, "server", "io_threads", c.server.io_threads, o));
  IDEM_RETURN_IF_ERROR(Read(t, "server", "max_in_flight", c.server.max_in_flight, o));
  // Keys of the thread-per-request model: still type-checked, then ignored with a warning, so an
  // older file starts (requests no longer hold threads; max_in_flight bounds them).
  for (const char* removed : {"worker_threads", "max_queued"}) {
    int ignored = 0;
    IDEM_RETURN_IF_ERROR(Read(t, "server", removed, ignored, o));
    if (t.at_path(std::string("server.") + removed).node() != nullptr) {
      http::Log(http::LogLevel::kWarn, "config key ignored",
                {{"key", std::string("server.") + removed},
                 {"why", "requests hold no threads; see server.max_in_flight"}});
    }
  }
  IDEM_RETURN_IF_ERROR(Read(t, "server", "max_connections", c.server.max_connections, o));
  IDEM_RETURN_IF_ERROR(Read(t, "server", "max_parked", c.server.max_parked, o));
  IDEM_RETURN_IF_ERROR(Read(t, "server", "max_body_bytes", c.server.max_body_bytes, o));
  IDEM_RETURN_IF_ERROR(
      ReadPositiveMillis(t, "server", "read_timeout_ms", c.server.read_timeout, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "server", "drain_timeout_ms", c.server.drain_timeout, o));

  IDEM_RETURN_IF_ERROR(Read(t, "store", "url", c.store_url, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "pool_size", c.store_pool_size, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "threads", c.store_threads, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "read_threads", c.store_read_threads, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "replay_cache_bytes", c.replay_cache_bytes, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "prepared_statements", c.store_prepared_statements, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "listen_url", c.store_listen_url, o));
  PostgresTimeouts& timeouts = c.store_timeouts;
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "store", "connect_timeout_ms", timeouts.connect, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "store", "statement_timeout_ms", timeouts.statement, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "store", "lock_timeout_ms", timeouts.lock, o));
  IDEM_RETURN_IF_ERROR(
      ReadMillis(t, "store", "idle_in_transaction_timeout_ms", timeouts.idle_in_transaction, o));
  IDEM_RETURN_IF_ERROR(ReadSeconds(t, "store", "keepalives_idle_s", timeouts.keepalives_idle, o));
  IDEM_RETURN_IF_ERROR(
      ReadSeconds(t, "store", "keepalives_interval_s", timeouts.keepalives_interval, o));
  IDEM_RETURN_IF_ERROR(Read(t, "store", "keepalives_count", timeouts.keepalives_count, o));
  IDEM_RETURN_IF_ERROR(Read(t, "redis", "url", c.redis_url, o));
  IDEM_RETURN_IF_ERROR(Read(t, "provider", "url", c.provider_url, o));
  IDEM_RETURN_IF_ERROR(ReadPositiveMillis(t, "provider", "timeout_ms", c.provider_timeout, o));
  IDEM_RETURN_IF_ERROR(
      ReadPositiveMillis(t, "provider", "connect_timeout_ms", c.provider_connect_timeout, o));
  IDEM_RETURN_IF_ERROR(Read(t, "provider", "max_connections", c.provider_max_connections, o));
  IDEM_RETURN_IF_ERROR(Read(t, "provider", "ca_file", c.provider_ca_file, o));
  IDEM_RETURN_IF_ERROR(ReadNothingChargedStatuses(t, c.provider_nothing_charged_statuses, o));
  IDEM_RETURN_IF_ERROR(
      Read(t, "provider", "deduplicates_by_key", c.provider_deduplicates_by_key, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "provider", "settle_ms", c.provider_settle, o));
  IDEM_RETURN_IF_ERROR(Read(t, "secrets", "file", c.secrets_file, o));
  IDEM_RETURN_IF_ERROR(Read(t, "secrets", "generate_if_missing", c.generate_secrets, o));

  IDEM_RETURN_IF_ERROR(ReadMillis(t, "idempotency", "lease_ms", c.lease, o));
  IDEM_RETURN_IF_ERROR(ReadPositiveMillis(t, "idempotency", "lease_margin_ms", c.lease_margin, o));
  std::chrono::hours retention_hours = std::chrono::duration_cast<std::chrono::hours>(c.retention);
  IDEM_RETURN_IF_ERROR(ReadDuration(t, "idempotency", "retention_hours", retention_hours, o));
  c.retention = retention_hours;
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "idempotency", "retention_ms", c.retention, o));
  IDEM_RETURN_IF_ERROR(Read(t, "idempotency", "max_processing", c.max_processing, o));
  IDEM_RETURN_IF_ERROR(Read(t, "idempotency", "max_retained", c.max_retained, o));
  IDEM_RETURN_IF_ERROR(
      Read(t, "idempotency", "max_new_keys_per_second", c.max_new_keys_per_second, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "idempotency", "wait_max_ms", c.wait_max, o));
  IDEM_RETURN_IF_ERROR(
      Read(t, "idempotency", "max_waiters_per_principal", c.max_waiters_per_principal, o));
  IDEM_RETURN_IF_ERROR(Read(t, "idempotency", "key_min_length", c.key_min_length, o));
  IDEM_RETURN_IF_ERROR(Read(t, "idempotency", "key_max_length", c.key_max_length, o));
  IDEM_RETURN_IF_ERROR(
      ReadPositiveMillis(t, "idempotency", "sweep_interval_ms", c.sweep_interval, o));
  IDEM_RETURN_IF_ERROR(
      ReadPositiveMillis(t, "idempotency", "reconcile_interval_ms", c.reconcile_interval, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "reconciliation", "interval_ms", c.books_interval, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "reconciliation", "window_ms", c.books_window, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "reconciliation", "lag_ms", c.books_lag, o));
  IDEM_RETURN_IF_ERROR(Read(t, "reconciliation", "refund_duplicates", c.refund_duplicates, o));
  IDEM_RETURN_IF_ERROR(Read(t, "reconciliation", "refund_orphans", c.refund_orphans, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "reconciliation", "orphan_grace_ms", c.orphan_grace, o));
  IDEM_RETURN_IF_ERROR(ReadMillis(t, "reconciliation", "lease_ms", c.books_lease, o));
  if (c.books_lease < Millis(100)) return Bad(o, "reconciliation.lease_ms must be at least 100");
  if (c.books_interval.count() > 0 && c.books_window.count() == 0) {
    return Bad(o, "reconciliation.window_ms must be positive when interval_ms is");
  }

  if (const toml::node* node = t.at_path("payments.currencies").node();
      node != nullptr && !node->is_array()) {
    return Bad(o, "payments.currencies must be an array of ISO 4217 codes");
  }
  if (const toml::array* currencies = t.at_path("payments.currencies").as_array()) {
    c.currencies.clear();
    for (const toml::node& n : *currencies) {
      auto code = n.value<std::string>();
      if (!code || code->size() != 3) return Bad(o, "payments.currencies: ISO 4217 codes expected");
      c.currencies.push_back(*code);
    }
  }
  if (const toml::array* principals = t["principals"].as_array()) {
    for (const toml::node& n : *principals) {
      const toml::table* p = n.as_table();
      if (p == nullptr) return Bad(o, "[[principals]] entries must be tables");
      PrincipalEntry e;
      e.api_key_sha256 = (*p)["api_key_sha256"].value_or(std::string());
      e.tenant = (*p)["tenant"].value_or(std::string());
      e.user = (*p)["user"].value_or(std::string());
      if (e.api_key_sha256.size() != 64 || !DecodeHex(e.api_key_sha256) || e.tenant.empty() ||
          e.user.empty()) {
        return Bad(o, "each [[principals]] needs api_key_sha256 (64 hex), tenant and user");
      }
      for (char& ch : e.api_key_sha256) ch = static_cast<char>(std::tolower(ch));
      c.principals.push_back(std::move(e));
    }
  }

  IDEM_RETURN_IF_ERROR(ReadGatewaySection(t, o, c.gateway));
  IDEM_RETURN_IF_ERROR(ReadGatewayRoutes(t, o, c.gateway.routes));
  for (const GatewayRoute& r : c.gateway.routes) {
    if (r.lease <= r.timeout + c.lease_margin) {
      // As for charges: a request is forwarded only under a lease that covers the whole exchange
      // (AdvanceBeforeCall), so a shorter one would refuse every forward (503).
      return BadRoute(o, r.line, r.name,
                      "lease_ms (" + std::to_string(r.lease.count()) +
                          ") must be longer than timeout_ms (" + std::to_string(r.timeout.count()) +
                          ") + idempotency.lease_margin_ms (" +
                          std::to_string(c.lease_margin.count()) +
                          "): a request is forwarded only under a lease that covers the exchange");
    }
  }

  for (std::size_t i = 0; i < overrides.size(); ++i) {
    const std::string& flag = overrides[i];
    if (i + 1 >= overrides.size()) return Bad("command line", flag + " needs a value");
    const std::string& value = overrides[++i];
    if (flag == "--listen") {
      IDEM_RETURN_IF_ERROR(ParseListen(value, c.server, "--listen"));
    } else if (flag == "--store") {
      c.store_url = value;
    } else if (flag == "--redis") {
      c.redis_url = value;
    } else if (flag == "--provider") {
      c.provider_url = value;
    } else {
      return Bad("command line", "unknown flag " + flag);
    }
  }
  if (c.store_url.empty()) c.store_url = "sqlite://data/idem.db";
  if (!c.store_listen_url.empty()) {
    auto postgres = [](const std::string& url) {
      return url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0;
    };
    if (!postgres(c.store_url) || !postgres(c.store_listen_url)) {
      return Bad(o,
                 "store.listen_url is for a PostgreSQL store: both it and store.url must be "
                 "postgresql:// URLs");
    }
  }
  if (c.key_min_length < 1 || c.key_max_length < c.key_min_length ||
      c.key_max_length > limits::kKeyMaxLength) {
    return Bad(o, "idempotency key lengths must satisfy 1 <= min <= max <= 255");
  }
  if (c.lease.count() <= 0 || c.retention <= c.lease) {
    return Bad(o, "lease must be positive and shorter than retention");
  }
  if (c.server.max_body_bytes < 1 || c.server.max_body_bytes > limits::kJsonMaxBytes) {
    return Bad(o, "server.max_body_bytes must be 1.." + std::to_string(limits::kJsonMaxBytes) +
                      " (the largest body the fingerprint canonicalises)");
  }
  if (c.wait_max > limits::kWaitMax) {
    return Bad(
        o, "idempotency.wait_max_ms must be at most " + std::to_string(limits::kWaitMax.count()));
  }
  if (c.server.max_in_flight < 1 || c.server.max_in_flight > kMaxInFlightCeiling) {
    return Bad(o, "server.max_in_flight must be 1.." + std::to_string(kMaxInFlightCeiling));
  }
  if (c.provider_max_connections < 1 || c.provider_max_connections > kMaxInFlightCeiling) {
    return Bad(o, "provider.max_connections must be 1.." + std::to_string(kMaxInFlightCeiling));
  }
  if (c.replay_cache_bytes > kReplayCacheCeiling) {
    return Bad(o, "store.replay_cache_bytes must be 0.." + std::to_string(kReplayCacheCeiling));
  }
  if (c.server.io_threads < 0 || c.server.io_threads > kIoThreadsCeiling) {
    return Bad(o, "server.io_threads must be 0.." + std::to_string(kIoThreadsCeiling) +
                      " (0: one per CPU)");
  }
  if (c.server.io_threads == 0) c.server.io_threads = IoThreadsPerCpu();
  if (c.store_pool_size < 1 || c.store_pool_size > 256) {
    return Bad(o, "store.pool_size must be 1..256");
  }
  if (c.store_read_threads < 1 || c.store_read_threads > kStoreThreadsCeiling) {
    return Bad(o, "store.read_threads must be 1.." + std::to_string(kStoreThreadsCeiling));
  }
  if (c.store_threads > kStoreThreadsCeiling) {
    return Bad(o, "store.threads must be 0.." + std::to_string(kStoreThreadsCeiling));
  }
  if (c.server.max_parked < 0 || c.server.max_parked > limits::kParkedCeiling) {
    return Bad(o, "server.max_parked must be 0.." + std::to_string(limits::kParkedCeiling));
  }
  if (c.max_new_keys_per_second > 1'000'000) {
    return Bad(o, "idempotency.max_new_keys_per_second must be 0..1000000");
  }
  if (c.max_waiters_per_principal < 0 || c.max_waiters_per_principal > limits::kParkedCeiling) {
    return Bad(o, "idempotency.max_waiters_per_principal must be 0.." +
                      std::to_string(limits::kParkedCeiling));
  }
  if (c.max_processing < 1 || c.max_retained < 1) {
    return Bad(o, "idempotency quotas max_processing and max_retained must be at least 1");
  }
  if (auto bounds = ValidatePostgresTimeouts(c.store_timeouts); !bounds) {
    return Bad(o, "[store] " + bounds.error().message);
  }
  if (c.lease <= c.provider_timeout + c.lease_margin) {
    // A charge is sent only under a lease that outlasts the whole call; a shorter lease could be
    // taken over while the charge is out, and with a provider that ignores keys, charge twice.
    return Bad(o, "idempotency.lease_ms (" + std::to_string(c.lease.count()) +
                      ") must be longer than provider.timeout_ms (" +
                      std::to_string(c.provider_timeout.count()) +
                      ") + idempotency.lease_margin_ms (" + std::to_string(c.lease_margin.count()) +
                      "): a charge is sent only under a lease that covers the whole call");
  }
  if (!c.provider_deduplicates_by_key && c.provider_settle <= c.lease_margin + c.provider_timeout) {
    // Counted from sent_at: a charge leaves up to the margin after it (Payments::Execute) and
    // may be out for the whole timeout; a shorter window ends while the call may still be out.
    return Bad(o, "provider.settle_ms (" + std::to_string(c.provider_settle.count()) +
                      ") must be longer than idempotency.lease_margin_ms (" +
                      std::to_string(c.lease_margin.count()) + ") + provider.timeout_ms (" +
                      std::to_string(c.provider_timeout.count()) +
                      ") unless provider.deduplicates_by_key is true");
  }

  // Secrets: environment first, then the file (generated for development when asked to).
  if (const char* env = std::getenv("IDEM_SECRETS"); env != nullptr && *env != '\0') {
    IDEM_ASSIGN_OR_RETURN(c.secrets, ParseSecrets(env, "IDEM_SECRETS"));
  } else {
    if (c.secrets_file.empty()) return Bad(o, "no secrets: set IDEM_SECRETS or secrets.file");
    std::filesystem::path file = c.secrets_file;
    if (!std::filesystem::exists(file)) {
      if (!c.generate_secrets) return Bad(o, "secrets file " + c.secrets_file + " does not exist");
      std::error_code ec;
      if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
      std::ofstream out(file);
      out << GenerateSecretsToml(SystemRandom());
      out.close();
      if (!out) return Bad(o, "cannot write secrets file " + c.secrets_file);
      ::chmod(file.c_str(), 0600);
    }
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    IDEM_ASSIGN_OR_RETURN(c.secrets, ParseSecrets(text.str(), c.secrets_file));
  }
  return c;
}

}  // namespace idem::idemd
