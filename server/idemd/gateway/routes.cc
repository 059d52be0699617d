// server/idemd/gateway/routes.cc — matching the gateway's routes.
#include "server/idemd/gateway/routes.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace idem::idemd {
namespace {

// The path's segments between slashes ("/a/b" → a, b); nullopt for an empty one ("//", a
// trailing slash), which no pattern matches.
std::optional<std::vector<std::string_view>> Split(std::string_view path) {
  std::vector<std::string_view> out;
  if (path.empty() || path.front() != '/') return std::nullopt;
  path.remove_prefix(1);
  while (true) {
    const std::size_t slash = path.find('/');
    std::string_view segment = path.substr(0, slash);
    if (segment.empty() || out.size() == kMaxRouteSegments) return std::nullopt;
    out.push_back(segment);
    if (slash == std::string_view::npos) return out;
    path.remove_prefix(slash + 1);
  }
}

bool Matches(const GatewayRoute& route, std::string_view method,
             const std::vector<std::string_view>& segments) {
  if (route.method != method || route.segments.size() != segments.size()) return false;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (route.segments[i] && *route.segments[i] != segments[i]) return false;
  }
  return true;
}

bool LiteralSegmentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

}  // namespace

const GatewayRoute* MatchGatewayRoute(const std::vector<GatewayRoute>& routes,
                                      std::string_view method, std::string_view path) {
  auto segments = Split(path);
  if (!segments) return nullptr;
  for (const GatewayRoute& route : routes) {
    if (Matches(route, method, *segments)) return &route;
  }
  return nullptr;
}

std::string_view AmbiguousParameterSegment(const GatewayRoute& route, std::string_view path) {
  auto segments = Split(path);
  if (!segments || segments->size() != route.segments.size()) return {};
  for (std::size_t i = 0; i < segments->size(); ++i) {
    if (route.segments[i]) continue;  // a literal: matched as written
    const std::string_view s = (*segments)[i];
    std::string decoded_dots;  // the segment with %2E read as '.', to find a dot-segment
    for (std::size_t j = 0; j < s.size(); ++j) {
      if (s[j] == '\\') return s;
      if (s[j] == '%' && j + 2 < s.size()) {
        const char hi = s[j + 1];
        const char lo = static_cast<char>(std::tolower(static_cast<unsigned char>(s[j + 2])));
        if ((hi == '2' && lo == 'f') || (hi == '5' && lo == 'c')) return s;
        if (hi == '2' && lo == 'e') {
          decoded_dots += '.';
          j += 2;
          continue;
        }
      }
      decoded_dots += s[j];
    }
    if (decoded_dots == "." || decoded_dots == "..") return s;
  }
  return {};
}

bool GatewayRoutesOverlap(const GatewayRoute& a, const GatewayRoute& b) {
  if (a.method != b.method || a.segments.size() != b.segments.size()) return false;
  for (std::size_t i = 0; i < a.segments.size(); ++i) {
    if (a.segments[i] && b.segments[i] && *a.segments[i] != *b.segments[i]) return false;
  }
  return true;
}

std::string ParseGatewayMatch(std::string_view match, GatewayRoute& route) {
  const std::size_t space = match.find(' ');
  if (space == std::string_view::npos || match.find(' ', space + 1) != std::string_view::npos) {
    return "match must be \"METHOD /path\", e.g. \"POST /v1/orders\"";
  }
  const std::string_view method = match.substr(0, space);
  constexpr std::array<std::string_view, 4> kMethods = {"POST", "PUT", "PATCH", "DELETE"};
  if (std::find(kMethods.begin(), kMethods.end(), method) == kMethods.end()) {
    return "match's method must be POST, PUT, PATCH or DELETE (upper case), got '" +
           std::string(method) + "'";
  }
  const std::string_view pattern = match.substr(space + 1);
  auto segments = Split(pattern);
  if (!segments) {
    return "match's path must start with '/' and have at most " +
           std::to_string(kMaxRouteSegments) + " non-empty segments, got '" + std::string(pattern) +
           "'";
  }
  route.method = std::string(method);
  route.pattern = std::string(pattern);
  route.segments.clear();
  for (std::string_view s : *segments) {
    if (s.size() > 2 && s.front() == '{' && s.back() == '}') {
      const std::string_view name = s.substr(1, s.size() - 2);
      if (!std::all_of(name.begin(), name.end(), LiteralSegmentChar)) {
        return "bad parameter segment '" + std::string(s) + "' in match";
      }
      route.segments.emplace_back(std::nullopt);
    } else if (std::all_of(s.begin(), s.end(), LiteralSegmentChar)) {
      route.segments.emplace_back(std::string(s));
    } else {
      return "bad segment '" + std::string(s) +
             "' in match: letters, digits, - . _ ~, or a whole {name}";
    }
  }
  return "";
}

bool IsHopByHopHeader(std::string_view lower_name) {
  constexpr std::array<std::string_view, 12> kHop = {"connection",
                                                     "keep-alive",
                                                     "proxy-authenticate",
                                                     "proxy-authorization",
                                                     "te",
                                                     "trailer",
                                                     "transfer-encoding",
                                                     "upgrade",
                                                     "proxy-connection",
                                                     "host",
                                                     "content-length",
                                                     "expect"};
  return std::find(kHop.begin(), kHop.end(), lower_name) != kHop.end();
}

bool IsUnforwardableHeader(std::string_view lower_name) {
  constexpr std::array<std::string_view, 4> kNever = {"authorization", "cookie", "set-cookie",
                                                      "idempotency-key"};
  return IsHopByHopHeader(lower_name) ||
         std::find(kNever.begin(), kNever.end(), lower_name) != kNever.end();
}

}  // namespace idem::idemd
