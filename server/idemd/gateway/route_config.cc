// server/idemd/gateway/route_config.cc — [[routes]] entries into GatewayRoutes, and back.
#include "server/idemd/gateway/route_config.h"

#include <algorithm>
#include <boost/url/parse.hpp>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <utility>

#include "http/message.h"
#include "server/idemd/config/config.h"
#include "server/idemd/routes.h"

namespace idem::idemd {
namespace {

toml::array Strings(const std::vector<std::string>& values) {
  toml::array out;
  for (const std::string& v : values) out.push_back(v);
  return out;
}

int64_t Ms(Millis m) { return m.count(); }

Error Bad(const std::string& origin, const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ": " + what);
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
    if (n.value<std::string>() == "2xx") {
      route.success_final = true;
      continue;
    }
    const std::optional<int64_t> code = StatusCodeOf(n);
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

// A [[routes]] entry, or with `consumer` set, the [consumers.target] of that consumer: its name
// is the consumer's, `request` replaces match (one fixed path), and name and key are not read.
Result<GatewayRoute> ReadGatewayRoute(const toml::table& t, const std::string& origin,
                                      const std::string* consumer = nullptr) {
  GatewayRoute r;
  r.line = t.source().begin.line;
  if (consumer != nullptr) {
    r.name = *consumer;
  } else if (auto name = t["name"].value<std::string>()) {
    r.name = *name;
  }
  const std::string section =
      consumer != nullptr ? "[[consumers]] " + *consumer + " target" : "[[routes]]";
  auto bad_at = [&](int64_t line, const std::string& what) {
    return MakeError(Errc::kInvalidArgument,
                     origin + ":" + std::to_string(line) + ": " + section +
                         (consumer == nullptr && !r.name.empty() ? " " + r.name : "") + ": " +
                         what);
  };
  auto bad = [&](const std::string& what) { return bad_at(r.line, what); };
  if (std::string problem = RouteNameProblem(r.name); !problem.empty()) return bad(problem);
  if (consumer == nullptr && (r.name == "unmatched" || r.name == "unknown")) {
    return bad("name '" + r.name +
               "' is taken: metrics and logs use it for requests no route "
               "matches");
  }
  std::optional<Millis> retention_ms;  // wins over retention_hours, as in [idempotency]
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    auto at = [&, line = node.source().begin.line](const std::string& what) {
      return bad_at(line, k + ": " + what);
    };
    if (consumer != nullptr && (k == "name" || k == "match" || k == "key")) {
      return at(k == "match" ? "unknown key (a consumer's target names its request = \"METHOD "
                               "/path\")"
                             : "unknown key (the consumer's own key names it)");
    }
    if (k == "name") continue;
    if (k == (consumer != nullptr ? "request" : "match")) {
      auto text = node.value<std::string>();
      if (!text) return at("must be a string");
      if (std::string error = ParseGatewayMatch(*text, r); !error.empty()) return at(error);
      const bool fixed = std::all_of(r.segments.begin(), r.segments.end(),
                                     [](const auto& segment) { return segment.has_value(); });
      if (consumer != nullptr && !fixed) return at("must name one path, without {name} segments");
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
          return bad_at(fn.source().begin.line, fk.str() == "ignore" || fk.str() == "decimals"
                                                    ? sub + ": " + field.error().message
                                                    : "unknown key " + sub);
        }
      }
    } else if (k == "final_statuses") {
      if (Status s = RouteStatuses(node, r); !s) return at(s.error().message);
    } else if (k == "nothing_done_statuses") {
      auto codes = FiveHundredsOf(node, "the upstream did nothing");
      if (!codes) return at(codes.error().message);
      r.nothing_done_statuses = std::move(*codes);
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
    } else if (k == "late_execution_ms") {
      auto value = node.value<int64_t>();
      if (!node.is_integer() || !value || *value < 0 || *value > 3'600'000) {
        return at("must be an integer 0..3600000");
      }
      r.late_execution = Millis(*value);
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
  if (r.method.empty()) {
    return bad(consumer != nullptr ? "needs request = \"METHOD /path\""
                                   : "needs match = \"METHOD /path\"");
  }
  if (r.upstream.empty()) return bad("needs upstream = \"http://host:port\"");
  if (consumer == nullptr && ShadowsIdemd(r)) {
    return bad("match " + r.pattern + " would shadow idemd's own paths");
  }
  if (r.lease <= r.timeout) {
    return bad("lease_ms (" + std::to_string(r.lease.count()) +
               ") must be longer than timeout_ms (" + std::to_string(r.timeout.count()) + ")");
  }
  if (r.retention <= r.lease) return bad("retention (retention_ms) must be longer than lease_ms");
  for (int s : r.nothing_done_statuses) {
    if (std::find(r.final_statuses.begin(), r.final_statuses.end(), s) != r.final_statuses.end()) {
      return bad(std::to_string(s) +
                 " is in final_statuses and in nothing_done_statuses: a final "
                 "answer is replayed, never forwarded again");
    }
  }
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

}  // namespace

std::string RouteNameProblem(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= kMaxRouteNameLength &&
                  std::all_of(name.begin(), name.end(), [](char ch) {
                    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                           ch == '_' || ch == '-';
                  });
  return ok ? ""
            : "name must be 1.." + std::to_string(kMaxRouteNameLength) +
                  " characters of a-z 0-9 . _ -";
}

Error BadRoute(const std::string& origin, int64_t line, const std::string& name,
               const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ":" + std::to_string(line) + ": [[routes]]" +
                                               (name.empty() ? "" : " " + name) + ": " + what);
}

std::optional<int64_t> StatusCodeOf(const toml::node& node) {
  if (auto text = node.value<std::string>()) {
    const bool digits = text->size() == 3 && std::all_of(text->begin(), text->end(), [](char ch) {
                          return ch >= '0' && ch <= '9';
                        });
    if (!digits) return std::nullopt;
    return std::stoi(*text);
  }
  return node.value<int64_t>();
}

Result<std::vector<int>> FiveHundredsOf(const toml::node& node, std::string_view proves) {
  const toml::array* array = node.as_array();
  if (array == nullptr || array->size() > 100) {
    return MakeError(Errc::kInvalidArgument, "must be an array of 5xx codes");
  }
  std::vector<int> out;
  for (const toml::node& n : *array) {
    std::optional<int64_t> code = StatusCodeOf(n);
    if (!n.is_integer() && !n.is_string()) code.reset();
    if (!code || *code < 500 || *code > 599) {
      return MakeError(Errc::kInvalidArgument,
                       "only 5xx statuses can prove that " + std::string(proves));
    }
    if (std::find(out.begin(), out.end(), *code) != out.end()) {
      return MakeError(Errc::kInvalidArgument, std::to_string(*code) + " is listed twice");
    }
    out.push_back(static_cast<int>(*code));
  }
  return out;
}

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

Result<GatewayRoute> ReadConsumerTarget(const toml::table& t, const std::string& origin,
                                        const std::string& consumer) {
  return ReadGatewayRoute(t, origin, &consumer);
}

toml::table TargetTable(const GatewayRoute& route) {
  toml::table out = RouteTable(route);
  out.erase("name");
  out.erase("key");
  out.erase("match");
  out.insert("request", route.method + " " + route.pattern);
  return out;
}

toml::table RouteTable(const GatewayRoute& r) {
  toml::array statuses;
  if (r.success_final) statuses.push_back("2xx");
  for (int s : r.final_statuses) statuses.push_back(int64_t{s});
  toml::array nothing_done;
  for (int s : r.nothing_done_statuses) nothing_done.push_back(int64_t{s});
  return toml::table{
      {"name", r.name},
      {"match", r.method + " " + r.pattern},
      {"upstream", r.upstream},
      {"key", r.key_required ? "required" : "optional"},
      {"body", r.json_body ? "json" : "bytes"},
      {"fingerprint", toml::table{{"ignore", Strings(r.fingerprint_ignore)},
                                  {"decimals", Strings(r.fingerprint_decimals)}}},
      {"final_statuses", statuses},
      {"nothing_done_statuses", nothing_done},
      {"store_headers", Strings(r.store_headers)},
      {"forward_key_header", r.forward_key_header},
      {"upstream_deduplicates", r.upstream_deduplicates},
      {"status_path", r.status_path},
      {"status_unknown_max_ms", Ms(r.status_unknown_max)},
      {"late_execution_ms", Ms(r.late_execution)},
      {"status_auth_header", r.status_auth_header},
      {"status_auth_env", r.status_auth_env},  // the variable's name; its value is never printed
      {"lease_ms", Ms(r.lease)},
      {"timeout_ms", Ms(r.timeout)},
      {"max_stored_bytes", static_cast<int64_t>(r.max_stored_bytes)},
      {"retention_ms", Ms(r.retention)},
  };
}

}  // namespace idem::idemd
