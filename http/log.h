// http/log.h — idem's one log format, for every line any of its programs writes to stderr:
// one JSON object per line, "time" (RFC 3339 UTC with milliseconds), "level" and "msg" first, then
// the line's own fields. One write per line, so lines of different threads never interleave.
#pragma once

#include <boost/json/object.hpp>
#include <functional>
#include <string_view>

namespace idem::http {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void Log(LogLevel level, std::string_view msg, const boost::json::object& fields = {});

// Where Log writes the lines of this thread instead of stderr, from now on (the simulator puts
// them in its trace); nullptr: stderr again. `sink` must outlive its use.
using LogSink = std::function<void(LogLevel, std::string_view msg, const boost::json::object&)>;
void SetLogSink(const LogSink* sink);

// The line Log writes at `unix_ms`, without its newline.
std::string LogLine(int64_t unix_ms, LogLevel level, std::string_view msg,
                    const boost::json::object& fields);

}  // namespace idem::http
