// http/log.cc — one JSON line per event on stderr.
#include "http/log.h"

#include <unistd.h>

#include <boost/json/serialize.hpp>
#include <cerrno>
#include <chrono>

#include "http/message.h"

namespace idem::http {
namespace {

std::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

std::string LogLine(int64_t unix_ms, LogLevel level, std::string_view msg,
                    const boost::json::object& fields) {
  std::string line = "{\"time\":\"" + Rfc3339(unix_ms) + "\",\"level\":\"";
  line += LevelName(level);
  line += "\",\"msg\":";
  line += boost::json::serialize(boost::json::string_view(msg.data(), msg.size()));
  for (const auto& field : fields) {
    const std::string_view key = field.key();
    if (key == "time" || key == "level" || key == "msg") continue;  // the line's own
    line += ',';
    line += boost::json::serialize(boost::json::string_view(key.data(), key.size()));
    line += ':';
    line += boost::json::serialize(field.value());
  }
  line += '}';
  return line;
}

namespace {
thread_local const LogSink* log_sink = nullptr;
}  // namespace

void SetLogSink(const LogSink* sink) { log_sink = sink; }

void Log(LogLevel level, std::string_view msg, const boost::json::object& fields) {
  if (log_sink != nullptr) {
    (*log_sink)(level, msg, fields);
    return;
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::string line = LogLine(now, level, msg, fields);
  line += '\n';
  // One write(2): stderr is unbuffered, and a line below PIPE_BUF reaches a pipe whole.
  std::string_view rest = line;
  while (!rest.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace idem::http
