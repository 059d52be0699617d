// http/message.cc — header lookups, query parsing, HTTP dates.
#include "http/message.h"

#include <algorithm>
#include <array>
#include <boost/url/parse.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "idem/key.h"

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

std::vector<std::string_view> Headers::List(std::string_view name) const {
  std::vector<std::string_view> elements;
  for (const auto& [n, v] : fields) {
    if (!NameEquals(n, name)) continue;
    std::string_view rest = v;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      std::string_view element = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      while (!element.empty() && (element.front() == ' ' || element.front() == '\t')) {
        element.remove_prefix(1);
      }
      while (!element.empty() && (element.back() == ' ' || element.back() == '\t')) {
        element.remove_suffix(1);
      }
      if (!element.empty()) elements.push_back(element);
    }
  }
  return elements;
}

void Headers::Add(std::string_view name, std::string_view value) {
  // Room for a message's usual fields at the first: one allocation instead of one per doubling.
  if (fields.capacity() == 0) fields.reserve(kUsualFields);
  fields.emplace_back(ToLower(name), std::string(value));
}

void Headers::Set(std::string_view name, std::string_view value) {
  Remove(name);
  Add(name, value);
}

void Headers::Remove(std::string_view name) {
  std::erase_if(fields, [&](const auto& f) { return NameEquals(f.first, name); });
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

std::string RequestId(const Request& request, Clock& clock, Random& random) {
  if (auto id = request.headers.Get("x-request-id")) {
    bool sane = !id->empty() && id->size() <= 64;
    for (char c : *id) {
      sane &= (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '_' || c == '.';
    }
    if (sane) return std::string(*id);
  }
  return NewUuidV7(clock, random);
}

namespace {

std::string RandomHex(Random& random, std::size_t bytes) {
  std::array<uint8_t, 16> b{};
  for (;;) {  // W3C: an id of zeros is invalid
    random.Fill(std::span<uint8_t>(b.data(), bytes));
    if (std::any_of(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(bytes),
                    [](uint8_t x) { return x != 0; })) {
      return ToHex(b.data(), bytes);
    }
  }
}

// `n` lower-case hex digits, not all zero.
bool TraceId(std::string_view s, std::size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string_view::npos &&
         s.find_first_not_of('0') != std::string_view::npos;
}

}  // namespace

std::string TraceContext::Traceparent() const {
  std::string out;
  out.reserve(55);  // version, trace id, span id and flags with their dashes
  out.append("00-").append(trace_id).append("-").append(span_id).append(sampled ? "-01" : "-00");
  return out;
}

std::string TraceContext::CallerTraceparent() const {
  return parent_id.empty() ? "" : "00-" + trace_id + "-" + parent_id + (sampled ? "-01" : "-00");
}

TraceContext ContinueTrace(const Request& request, Random& random) {
  TraceContext trace;
  trace.span_id = RandomHex(random, 8);
  // version "-" trace-id "-" parent-id "-" flags; a later version may append "-" and more.
  const std::optional<std::string_view> header = request.headers.Get("traceparent");
  if (header && request.headers.Count("traceparent") == 1 && header->size() >= 55) {
    const std::string_view h = *header;
    const std::string_view version = h.substr(0, 2), id = h.substr(3, 32),
                           parent = h.substr(36, 16), flags = h.substr(53, 2);
    const bool hex_version =
        version.find_first_not_of("0123456789abcdef") == std::string_view::npos && version != "ff";
    const bool shape = h[2] == '-' && h[35] == '-' && h[52] == '-' &&
                       (version == "00" ? h.size() == 55 : h.size() == 55 || h[55] == '-');
    if (hex_version && shape && TraceId(id, 32) && TraceId(parent, 16) &&
        flags.find_first_not_of("0123456789abcdef") == std::string_view::npos) {
      trace.trace_id = id;
      trace.parent_id = parent;
      trace.sampled = (std::stoi(std::string(flags), nullptr, 16) & 1) != 0;
      return trace;
    }
  }
  trace.trace_id = RandomHex(random, 16);
  return trace;
}

namespace {
// The UTC calendar time of `unix_ms`: the second it falls in (also before 1970: the second that
// began before it) and the milliseconds past that second. Plain arithmetic (std::chrono's civil
// calendar): gmtime_r takes glibc's time-zone lock on every call, and every request's log line
// and many answers' headers format a time.
struct UtcTime {
  int year, month, day, weekday;  // weekday 0 = Sunday
  int hour, minute, second, millis;

  explicit UtcTime(int64_t unix_ms) {
    using namespace std::chrono;
    const sys_time<milliseconds> t{milliseconds(unix_ms)};
    const sys_days date = floor<days>(t);
    const year_month_day ymd(date);
    year = static_cast<int>(ymd.year());
    month = static_cast<int>(static_cast<unsigned>(ymd.month()));
    day = static_cast<int>(static_cast<unsigned>(ymd.day()));
    weekday = static_cast<int>(std::chrono::weekday(date).c_encoding());
    const int64_t in_day = (t - date).count();  // 0 .. 86'399'999
    hour = static_cast<int>(in_day / 3'600'000);
    minute = static_cast<int>(in_day / 60'000 % 60);
    second = static_cast<int>(in_day / 1000 % 60);
    millis = static_cast<int>(in_day % 1000);
  }
};

// Writes `value` (0 <= value < 10^digits) as exactly `digits` decimal digits at `at`.
char* Digits(char* at, int value, int digits) {
  for (int i = digits - 1; i >= 0; --i) {
    at[i] = static_cast<char>('0' + value % 10);
    value /= 10;
  }
  return at + digits;
}

// Times in years 0000..9999 (every time ParseRfc3339 reads) are written in place; others, which
// only a caller's arithmetic can make, as before: gmtime_r and snprintf.
bool InFourDigitYears(int64_t unix_ms) {
  return unix_ms >= -62'167'219'200'000 && unix_ms < 253'402'300'800'000;
}

std::tm GmTime(int64_t unix_ms, int* millis) {
  int64_t seconds = unix_ms / 1000;
  int64_t rest = unix_ms % 1000;
  if (rest < 0) {
    rest += 1000;
    seconds -= 1;
  }
  *millis = static_cast<int>(rest);
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return tm;
}
}  // namespace

std::string Rfc3339(int64_t unix_ms) {
  if (!InFourDigitYears(unix_ms)) {
    int millis = 0;
    const std::tm tm = GmTime(unix_ms, &millis);
    char buf[48];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
    return buf;
  }
  const UtcTime t(unix_ms);
  std::string out(24, '-');  // YYYY-MM-DDTHH:MM:SS.mmmZ
  char* at = out.data();
  at = Digits(at, t.year, 4) + 1;
  at = Digits(at, t.month, 2) + 1;
  at = Digits(at, t.day, 2);
  *at++ = 'T';
  at = Digits(at, t.hour, 2);
  *at++ = ':';
  at = Digits(at, t.minute, 2);
  *at++ = ':';
  at = Digits(at, t.second, 2);
  *at++ = '.';
  at = Digits(at, t.millis, 3);
  *at = 'Z';
  return out;
}

std::optional<int64_t> ParseRfc3339(std::string_view s) {
  // The n-digit number at `at`, or -1.
  auto number = [s](std::size_t at, std::size_t n) -> int {
    if (at + n > s.size()) return -1;
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return -1;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  auto is = [s](std::size_t at, char upper) {
    return at < s.size() && (s[at] == upper || s[at] == upper - 'A' + 'a');
  };
  if (s.size() < 20 || s[4] != '-' || s[7] != '-' || !is(10, 'T') || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  const int year = number(0, 4), month = number(5, 2), day = number(8, 2);
  const int hour = number(11, 2), minute = number(14, 2), second = number(17, 2);
  const std::chrono::year_month_day date{std::chrono::year(year),
                                         std::chrono::month(static_cast<unsigned>(month)),
                                         std::chrono::day(static_cast<unsigned>(day))};
  if (year < 0 || month < 0 || day < 0 || !date.ok() || hour < 0 || hour > 23 || minute < 0 ||
      minute > 59 || second < 0 || second > 60) {
    return std::nullopt;
  }
  std::size_t at = 19;
  int64_t millis = 0;
  bool finer = false;  // a nonzero digit below the millisecond
  if (at < s.size() && s[at] == '.') {
    int digits = 0;
    for (++at; at < s.size() && s[at] >= '0' && s[at] <= '9'; ++at, ++digits) {
      if (digits < 3) {
        millis = millis * 10 + (s[at] - '0');
      } else if (s[at] != '0') {
        finer = true;
      }
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 3; ++digits) millis *= 10;
  }
  int64_t offset_minutes = 0;
  if (is(at, 'Z')) {
    ++at;
  } else if (at < s.size() && (s[at] == '+' || s[at] == '-')) {
    const int hours = number(at + 1, 2), minutes = number(at + 4, 2);
    if (hours < 0 || hours > 23 || minutes < 0 || minutes > 59 || s[at + 3] != ':') {
      return std::nullopt;
    }
    offset_minutes = (s[at] == '-' ? -1 : 1) * (hours * 60 + minutes);
    at += 6;
  } else {
    return std::nullopt;
  }
  if (at != s.size()) return std::nullopt;
  const int64_t days = std::chrono::sys_days(date).time_since_epoch().count();
  const int64_t seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
  return seconds * 1000 + millis + (finer ? 1 : 0);
}

std::string HttpDate(int64_t unix_ms) {
  static constexpr std::array<std::string_view, 7> kDays = {"Sun", "Mon", "Tue", "Wed",
                                                            "Thu", "Fri", "Sat"};
  static constexpr std::array<std::string_view, 12> kMonths = {
      "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  if (!InFourDigitYears(unix_ms)) {
    int millis = 0;
    const std::tm tm = GmTime(unix_ms, &millis);
    char buf[64];
    return std::string(buf, std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm));
  }
  const UtcTime t(unix_ms);
  std::string out(29, ' ');  // "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110's IMF-fixdate)
  char* at = out.data();
  at = std::copy_n(kDays[static_cast<std::size_t>(t.weekday)].data(), 3, at);
  *at = ',';
  at = Digits(at + 2, t.day, 2) + 1;
  at = std::copy_n(kMonths[static_cast<std::size_t>(t.month - 1)].data(), 3, at) + 1;
  at = Digits(at, t.year, 4) + 1;
  at = Digits(at, t.hour, 2);
  *at++ = ':';
  at = Digits(at, t.minute, 2);
  *at++ = ':';
  at = Digits(at, t.second, 2) + 1;
  std::copy_n("GMT", 3, at);
  return out;
}

Result<HostPort> ParseListenAddress(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return MakeError(Errc::kInvalidArgument,
                     "listen must be ADDRESS:PORT (\"127.0.0.1:8080\", "
                     "\"[::1]:8080\"), got '" +
                         std::string(text) + "': " + why);
  };
  auto authority = boost::urls::parse_authority(text);
  if (!authority || authority->has_userinfo()) return bad("not an address and a port");
  if (!authority->has_port() || authority->port().empty()) return bad("no port");
  const std::string_view port = authority->port();
  if (port.size() > 5 || std::stoul(std::string(port)) > 65535)
    return bad("the port is past 65535");
  HostPort out;
  switch (authority->host_type()) {
    case boost::urls::host_type::ipv4:
    case boost::urls::host_type::ipv6:
      out.host = authority->host_address();
      break;
    default:
      return bad("the host must be an IP address");
  }
  out.port = static_cast<uint16_t>(std::stoul(std::string(port)));
  return out;
}

std::string Authority(std::string_view host, uint16_t port) {
  const std::string p = ":" + std::to_string(port);
  if (host.find(':') != std::string_view::npos) return "[" + std::string(host) + "]" + p;
  return std::string(host) + p;
}

}  // namespace idem::http
