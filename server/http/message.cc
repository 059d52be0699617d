// server/http/message.cc — header lookups, query parsing, HTTP dates.
#include "server/http/message.h"

#include <cstdio>
#include <ctime>

namespace idem::http {

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

namespace {
bool NameEquals(std::string_view lower, std::string_view name) {
  if (lower.size() != name.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (lower[i] != c) return false;
  }
  return true;
}
}  // namespace

std::optional<std::string_view> Headers::Get(std::string_view name) const {
  for (const auto& [n, v] : fields) {
    if (NameEquals(n, name)) return std::string_view(v);
  }
  return std::nullopt;
}

int Headers::Count(std::string_view name) const {
  int count = 0;
  for (const auto& [n, v] : fields) count += NameEquals(n, name) ? 1 : 0;
  return count;
}

void Headers::Add(std::string_view name, std::string_view value) {
  fields.emplace_back(ToLower(name), std::string(value));
}

void Headers::Set(std::string_view name, std::string_view value) {
  std::erase_if(fields, [&](const auto& f) { return NameEquals(f.first, name); });
  Add(name, value);
}

std::string_view Request::Path() const {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

std::string_view Request::Query() const {
  std::string_view t = target;
  const std::size_t q = t.find('?');
  return q == std::string_view::npos ? std::string_view() : t.substr(q + 1);
}

std::optional<std::string_view> Request::QueryParam(std::string_view name) const {
  std::string_view q = Query();
  while (!q.empty()) {
    const std::size_t amp = q.find('&');
    std::string_view pair = q.substr(0, amp);
    const std::size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    }
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

namespace {
// `format` (strftime) of the UTC time `unix_ms`, to the second.
std::string FormatUtc(int64_t unix_ms, const char* format) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  return std::string(buf, std::strftime(buf, sizeof buf, format, &tm));
}
}  // namespace

std::string Rfc3339(int64_t unix_ms) {
  char millis[8];
  std::snprintf(millis, sizeof millis, ".%03dZ", static_cast<int>(unix_ms % 1000));
  return FormatUtc(unix_ms, "%Y-%m-%dT%H:%M:%S") + millis;
}

std::string HttpDate(int64_t unix_ms) { return FormatUtc(unix_ms, "%a, %d %b %Y %H:%M:%S GMT"); }

}  // namespace idem::http
