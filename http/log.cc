// http/log.cc — one JSON line per event on stderr, buffered while a BufferedLog lives.
#include "http/log.h"

#include <unistd.h>

#include <atomic>
#include <boost/json/serializer.hpp>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "http/message.h"
#include "idem/mutex.h"
#include "idem/thread_name.h"

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

// Appends `value`'s JSON text to `line` through a buffer on the stack (serialize() would make a
// string of each value on the heap first).
template <class Value>
void AppendJson(std::string& line, const Value& value) {
  boost::json::serializer writer;
  writer.reset(value);
  char chunk[256];
  while (!writer.done()) line.append(writer.read(chunk, sizeof chunk));
}

}  // namespace

std::string LogLine(int64_t unix_ms, LogLevel level, std::string_view msg,
                    const boost::json::object& fields) {
  std::string line;
  line.reserve(256);  // a request's line, in one allocation
  line += "{\"time\":\"";
  line += Rfc3339(unix_ms);
  line += "\",\"level\":\"";
  line += LevelName(level);
  line += "\",\"msg\":";
  AppendJson(line, boost::json::string_view(msg.data(), msg.size()));
  for (const auto& field : fields) {
    const std::string_view key = field.key();
    if (key == "time" || key == "level" || key == "msg") continue;  // the line's own
    line += ',';
    AppendJson(line, boost::json::string_view(key.data(), key.size()));
    line += ':';
    AppendJson(line, &field.value());
  }
  line += '}';
  return line;
}

namespace {

thread_local const LogSink* log_sink = nullptr;

int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Writes all of `text` to stderr, through EINTR; gives up on any other error (nothing to log to).
void WriteAll(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

// The process's one buffer (BufferedLog). Lock order: io_mu_, then mu_. Whoever writes holds
// io_mu_ from before it takes the buffer's text until that text is written, so batches reach
// stderr in the order taken; mu_ is never held during a write or while waiting for io_mu_, so
// Buffer (an info line) never waits for stderr, even while a warning waits for a stalled one.
class LogBuffer {
 public:
  static LogBuffer& Get() {
    static LogBuffer* const buffer = new LogBuffer();  // never destroyed: any thread may log late
    return *buffer;
  }

  bool Start(const BufferedLogOptions& options) {
    MutexLock lock(mu_);
    if (running_) return false;
    options_ = options;
    running_ = true;
    stopping_ = false;
    thread_ = std::thread([this] {
      NameThisThread("log-writer");
      Run();
    });
    return true;
  }

  void Stop() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      wake_.NotifyAll();
    }
    thread_.join();
    MutexLock io(io_mu_);
    MutexLock lock(mu_);
    running_ = false;
    WriteTaken(DroppedNote());
  }

  // Takes `line` (newline included) for the writer; false when no writer runs, so the caller
  // writes it itself.
  bool Buffer(std::string_view line) {
    MutexLock lock(mu_);
    if (!running_) return false;
    if (text_.size() + line.size() > options_.max_bytes) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    text_.append(line);
    if (text_.size() >= options_.flush_bytes) wake_.NotifyOne();
    return true;
  }

  // Writes what is buffered, then `line`, before returning.
  void WriteNow(std::string_view line) {
    MutexLock io(io_mu_);
    MutexLock lock(mu_);
    WriteTaken(line);
  }

  uint64_t Dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  void Run() {
    MutexLock lock(mu_);
    while (!stopping_) {
      wake_.WaitFor(mu_, options_.interval, [this]() IDEM_REQUIRES(mu_) {
        return stopping_ || text_.size() >= options_.flush_bytes;
      });
      lock.Unlock();  // io_mu_ first (the lock order)
      MutexLock io(io_mu_);
      lock.Lock();
      WriteTaken(DroppedNote());
    }
  }

  // A warning of the lines dropped since the last one, or "" when none were.
  std::string DroppedNote() IDEM_REQUIRES(mu_) {
    const uint64_t dropped = dropped_.load(std::memory_order_relaxed);
    if (dropped == reported_) return "";
    const uint64_t since = dropped - reported_;
    reported_ = dropped;
    return LogLine(NowMillis(), LogLevel::kWarn, "log lines dropped",
                   {{"dropped", since}, {"reason", "the log buffer was full"}}) +
           "\n";
  }

  // Writes the buffered text and then `line`, releasing mu_ while it writes (and taking it again).
  // The text is swapped with the spare buffer, which keeps its capacity once written: the buffer
  // taking lines never grows again from nothing, and no large block is freed per write (glibc
  // consolidates its free lists on every free of 64 KiB or more).
  void WriteTaken(std::string_view line) IDEM_REQUIRES(io_mu_, mu_) {
    if (text_.empty() && line.empty()) return;
    spare_.swap(text_);
    mu_.Unlock();
    WriteAll(spare_);
    WriteAll(line);
    spare_.clear();
    mu_.Lock();
    // A stalled stderr can have grown the text to max_bytes: that much is not kept for ever.
    if (spare_.capacity() > 2 * options_.flush_bytes) std::string().swap(spare_);
  }

  Mutex mu_;
  CondVar wake_;
  bool running_ IDEM_GUARDED_BY(mu_) = false;
  bool stopping_ IDEM_GUARDED_BY(mu_) = false;
  BufferedLogOptions options_ IDEM_GUARDED_BY(mu_);
  std::string text_ IDEM_GUARDED_BY(mu_);
  std::thread thread_;
  Mutex io_mu_;  // held by whoever writes to stderr through the buffer
  std::string spare_ IDEM_GUARDED_BY(io_mu_);  // empty between writes; the text while written
  std::atomic<uint64_t> dropped_{0};
  uint64_t reported_ IDEM_GUARDED_BY(mu_) = 0;  // dropped_ as the last note had it
};

}  // namespace

void SetLogSink(const LogSink* sink) { log_sink = sink; }

BufferedLog::BufferedLog(BufferedLogOptions options) : owns_(LogBuffer::Get().Start(options)) {}

BufferedLog::~BufferedLog() {
  if (owns_) LogBuffer::Get().Stop();
}

uint64_t LogLinesDropped() { return LogBuffer::Get().Dropped(); }

void Log(LogLevel level, std::string_view msg, const boost::json::object& fields) {
  if (log_sink != nullptr) {
    (*log_sink)(level, msg, fields);
    return;
  }
  std::string line = LogLine(NowMillis(), level, msg, fields);
  line += '\n';
  LogBuffer& buffer = LogBuffer::Get();
  if (level <= LogLevel::kInfo && buffer.Buffer(line)) return;
  buffer.WriteNow(line);
}

}  // namespace idem::http
