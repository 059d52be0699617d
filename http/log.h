// http/log.h — idem's one log format, for every line any of its programs writes to stderr:
// one JSON object per line, "time" (RFC 3339 UTC with milliseconds), "level" and "msg" first, then
// the line's own fields. Lines are written whole (one write per line, or per buffered batch of
// whole lines), so lines of different threads never interleave.
#pragma once

#include <boost/json/object.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace idem::http {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void Log(LogLevel level, std::string_view msg, const boost::json::object& fields = {});

// Where Log writes the lines of this thread instead of stderr, from now on (the simulator puts
// them in its trace); nullptr: stderr again. `sink` must outlive its use.
using LogSink = std::function<void(LogLevel, std::string_view msg, const boost::json::object&)>;
void SetLogSink(const LogSink* sink);

// While one lives, Log hands the lines of kInfo and below (a request's access line, above all)
// to a buffer that a thread of its own writes to stderr every `interval` or once `flush_bytes`
// wait, so that a request never waits for write(2). Warnings and errors are written before Log
// returns, after what is buffered, so stderr keeps the order lines were logged in. A line the
// full buffer (`max_bytes`) cannot take is dropped rather than waited for, and counted
// (LogLinesDropped); the writer then logs how many went. Destroying it writes everything
// buffered: a clean stop loses no line; a process killed loses at most the last interval's
// buffered lines. One at a time per process (a second while one lives buffers nothing).
struct BufferedLogOptions {
  std::chrono::milliseconds interval{20};
  std::size_t flush_bytes = 64 * 1024;
  std::size_t max_bytes = 8 * 1024 * 1024;
};
class BufferedLog {
 public:
  explicit BufferedLog(BufferedLogOptions options = {});
  ~BufferedLog();
  BufferedLog(const BufferedLog&) = delete;
  BufferedLog& operator=(const BufferedLog&) = delete;

 private:
  bool owns_;
};

// Lines dropped because the buffer was full, since the process started.
uint64_t LogLinesDropped();

// The line Log writes at `unix_ms`, without its newline.
std::string LogLine(int64_t unix_ms, LogLevel level, std::string_view msg,
                    const boost::json::object& fields);

}  // namespace idem::http
