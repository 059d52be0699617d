// http/message_test.cc — header lists, RFC 3339 and HTTP dates both ways.
#include "http/message.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <future>
#include <iterator>
#include <random>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "http/log.h"
#include "testing/fakes.h"

namespace idem::http {
namespace {

// RFC 9110 §5.6.1: a list may span several fields, with whitespace around and empty elements
// between its commas; names match whatever their case.
TEST(Headers, ListJoinsTheElementsOfEveryFieldOfTheName) {
  Headers h;
  h.Add("Prefer", " wait=5 ,, respond-async");
  h.Add("Other", "x, y");
  h.Add("PREFER", "\thandling=lenient\t");
  EXPECT_EQ(h.List("prefer"),
            (std::vector<std::string_view>{"wait=5", "respond-async", "handling=lenient"}));
  EXPECT_TRUE(h.List("absent").empty());
  h.Add("Empty", " , ");
  EXPECT_TRUE(h.List("empty").empty());
}

Request WithHeader(const std::string& name, const std::string& value) {
  Request r{"GET", "/", {}, {}};
  r.headers.Add(name, value);
  return r;
}

TEST(RequestId, IsTheClientsSaneTokenElseAFreshUuidV7) {
  testing::FakeClock clock;
  testing::SeededRandom random(3);
  EXPECT_EQ(RequestId(WithHeader("X-Request-Id", "abc-123.x_y"), clock, random), "abc-123.x_y");
  const std::regex uuid7("^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  std::set<std::string> seen;
  for (const Request& r : {WithHeader("X-Request-Id", "has space"),
                           WithHeader("X-Request-Id", std::string(65, 'a')), Request{}}) {
    const std::string id = RequestId(r, clock, random);
    EXPECT_TRUE(std::regex_match(id, uuid7)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 3u) << "fresh ids differ even within one millisecond";
  // The first 48 bits are the clock's milliseconds: ids sort by time.
  const std::string id = RequestId(Request{}, clock, random);
  EXPECT_EQ(std::stoll(id.substr(0, 8) + id.substr(9, 4), nullptr, 16), ToUnixMillis(clock.Now()));
}

TEST(Trace, AValidTraceparentIsContinuedWithANewSpan) {
  testing::SeededRandom random(5);
  const TraceContext t = ContinueTrace(
      WithHeader("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), random);
  EXPECT_EQ(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(t.parent_id, "00f067aa0ba902b7");
  EXPECT_TRUE(t.sampled);
  EXPECT_EQ(t.span_id.size(), 16u);
  EXPECT_NE(t.span_id, t.parent_id);
  EXPECT_EQ(t.Traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-" + t.span_id + "-01");
  EXPECT_EQ(t.CallerTraceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  // A later version may add fields after the flags; they are not passed on.
  const TraceContext later = ContinueTrace(
      WithHeader("traceparent", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra"),
      random);
  EXPECT_EQ(later.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_FALSE(later.sampled);
}

TEST(Trace, AMissingOrMalformedTraceparentStartsANewTrace) {
  testing::SeededRandom random(6);
  const std::string id = "4bf92f3577b34da6a3ce929d0e0e4736";
  std::vector<Request> requests = {
      Request{},
      WithHeader("traceparent", "00-" + id + "-00f067aa0ba902b7-01-extra"),  // 00 has no extra
      WithHeader("traceparent", "ff-" + id + "-00f067aa0ba902b7-01"),        // invalid version
      WithHeader("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
      WithHeader("traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
      WithHeader("traceparent", "00-" + id + "-0000000000000000-01"),
      WithHeader("traceparent", "00-" + id + "-00f067aa0ba902b7-0g"),
      WithHeader("traceparent", "00_" + id + "-00f067aa0ba902b7-01"),
  };
  Request twice = WithHeader("traceparent", "00-" + id + "-00f067aa0ba902b7-01");
  twice.headers.Add("traceparent", "00-" + id + "-00f067aa0ba902b8-01");
  requests.push_back(twice);
  for (const Request& r : requests) {
    const TraceContext t = ContinueTrace(r, random);
    EXPECT_NE(t.trace_id, id) << r.headers.Get("traceparent").value_or("(none)");
    EXPECT_TRUE(std::regex_match(t.trace_id, std::regex("^[0-9a-f]{32}$")));
    EXPECT_TRUE(t.parent_id.empty());
    EXPECT_FALSE(t.sampled);
  }
}

TEST(Log, ASinkTakesThisThreadsLinesInsteadOfStderr) {
  std::vector<std::string> lines;
  const LogSink sink = [&](LogLevel level, std::string_view msg, const boost::json::object& f) {
    lines.push_back(std::to_string(static_cast<int>(level)) + " " + std::string(msg) + " " +
                    boost::json::serialize(f));
  };
  SetLogSink(&sink);
  Log(LogLevel::kError, "charge lost", {{"payment", "pay_1"}});
  std::thread([] { Log(LogLevel::kDebug, "another thread's line goes to stderr"); }).join();
  SetLogSink(nullptr);
  Log(LogLevel::kDebug, "after the sink: stderr");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "3 charge lost {\"payment\":\"pay_1\"}");
}

// Points stderr at a file of its own while it lives; Text() reads what reached it.
class CapturedStderr {
 public:
  CapturedStderr() : path_(::testing::TempDir() + "/stderr-" + std::to_string(::getpid())) {
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~CapturedStderr() {
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    std::remove(path_.c_str());
  }
  std::string Text() const {
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  std::string path_;
  int saved_;
};

TEST(Log, ABufferedLogWritesInfoLinesLaterWarningsAtOnceInOrderAndAllOnStop) {
  CapturedStderr err;
  {
    // An interval no test waits for: only a warning, a full batch or the stop writes.
    BufferedLog buffered({.interval = std::chrono::hours(1), .flush_bytes = 1 << 20});
    Log(LogLevel::kInfo, "first");
    std::thread([] { Log(LogLevel::kInfo, "second"); }).join();
    EXPECT_EQ(err.Text(), "") << "an info line waited for stderr";
    Log(LogLevel::kWarn, "third");
    const std::string text = err.Text();
    const auto first = text.find("\"first\"");
    const auto second = text.find("\"second\"");
    const auto third = text.find("\"third\"");
    ASSERT_NE(third, std::string::npos) << "a warning was not written at once: " << text;
    EXPECT_LT(first, second) << text;
    EXPECT_LT(second, third) << "the buffered lines come before the warning: " << text;
    Log(LogLevel::kInfo, "fourth");
    EXPECT_EQ(err.Text().find("\"fourth\""), std::string::npos);
  }
  const std::string text = err.Text();
  EXPECT_NE(text.find("\"fourth\""), std::string::npos) << "the stop lost a line: " << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;
  // Without a BufferedLog, a line is written before Log returns.
  Log(LogLevel::kInfo, "fifth");
  EXPECT_NE(err.Text().find("\"fifth\""), std::string::npos);
}

TEST(Log, AnInfoLineNeverWaitsForAStalledStderrEvenWhileAWarningDoes) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[1]);
  bool info_done = false;
  std::thread drain;
  {
    BufferedLog buffered({.interval = std::chrono::milliseconds(1), .flush_bytes = 1});
    // Nobody reads the pipe: once its 64 KiB are full, the writer is stuck in write(2).
    const std::string filler(100, 'x');
    for (int i = 0; i < 2000; ++i) Log(LogLevel::kInfo, filler);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::thread warning([] { Log(LogLevel::kWarn, "waits for the pipe"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the warning now waits
    auto infos = std::async(std::launch::async, [] {
      for (int i = 0; i < 100; ++i) Log(LogLevel::kInfo, "a request's line");
    });
    info_done = infos.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
    drain = std::thread([fd = fds[0]] {  // reads until the last write end is gone
      char buf[65536];
      while (::read(fd, buf, sizeof buf) > 0) {
      }
    });
    warning.join();
    infos.wait();
  }                              // the stop writes the rest into the pipe
  ::dup2(saved, STDERR_FILENO);  // the pipe's last write end: the drain ends
  ::close(saved);
  drain.join();
  ::close(fds[0]);
  EXPECT_TRUE(info_done) << "an info line waited behind a warning for a stalled stderr";
}

TEST(Log, AFullBufferDropsLinesCountsThemAndSaysSo) {
  CapturedStderr err;
  const uint64_t before = LogLinesDropped();
  {
    BufferedLog buffered(
        {.interval = std::chrono::hours(1), .flush_bytes = 1 << 20, .max_bytes = 300});
    for (int i = 0; i < 10; ++i) Log(LogLevel::kInfo, "line " + std::to_string(i));
    // A second one while the first lives buffers nothing and stops nothing.
    { BufferedLog second; }
    Log(LogLevel::kInfo, "after the second");
  }
  const uint64_t dropped = LogLinesDropped() - before;
  const std::string text = err.Text();
  const auto kept = static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
  EXPECT_GE(dropped, 5u) << text;
  EXPECT_NE(text.find("\"line 0\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"msg\":\"log lines dropped\",\"dropped\":" + std::to_string(dropped)),
            std::string::npos)
      << text;
  EXPECT_EQ(kept + dropped, 12u) << "11 lines logged, and the writer's note: " << text;
}

TEST(Log, EveryLineIsOneJsonObjectWithTimeLevelAndMessageFirst) {
  const std::string line = LogLine(1796118123456, LogLevel::kWarn, "a \"quoted\" message",
                                   {{"n", 3}, {"level", "spoofed"}, {"what", "x\ny"}});
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line: newlines in values are escaped";
  EXPECT_EQ(line.rfind(R"({"time":"2026-12-01T)", 0), 0u) << line;
  const boost::json::object o = boost::json::parse(line).as_object();
  EXPECT_EQ(o.at("time").as_string(), Rfc3339(1796118123456));
  EXPECT_EQ(o.at("level").as_string(), "warn") << "a field cannot replace the line's own";
  EXPECT_EQ(o.at("msg").as_string(), "a \"quoted\" message");
  EXPECT_EQ(o.at("n").as_int64(), 3);
  EXPECT_EQ(o.at("what").as_string(), "x\ny");
  EXPECT_EQ(o.size(), 5u);
}

TEST(ListenAddress, TakesIpv4AndBracketedIpv6AddressesWithAPort) {
  auto v4 = ParseListenAddress("0.0.0.0:8080");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->host, "0.0.0.0");
  EXPECT_EQ(v4->port, 8080);
  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.has_value()) << v6.error().message;
  EXPECT_EQ(v6->host, "::1") << "without brackets, as binding takes it";
  EXPECT_EQ(v6->port, 0);
  for (const char* bad : {"nohostport", "[::1]", "::1:8080", "localhost:8080", "1.2.3.4:65536",
                          "1.2.3.4:", "1.2.3.4:80x", "u@1.2.3.4:80", ""}) {
    auto parsed = ParseListenAddress(bad);
    EXPECT_FALSE(parsed.has_value()) << bad;
    if (!parsed) {
      EXPECT_NE(parsed.error().message.find("listen"), std::string::npos);
    }
  }
  EXPECT_EQ(Authority("::1", 8080), "[::1]:8080");
  EXPECT_EQ(Authority("127.0.0.1", 80), "127.0.0.1:80");
}

TEST(Rfc3339, ReadsWhatItWritesAndOffsets) {
  const int64_t ms = 1'796'000'000'123;
  EXPECT_EQ(ParseRfc3339(Rfc3339(ms)), ms);
  EXPECT_EQ(ParseRfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(ParseRfc3339("1970-01-01T08:00:00+08:00"), 0);
  EXPECT_EQ(ParseRfc3339("1969-12-31T23:30:00.5-00:30"), 500);
  EXPECT_EQ(ParseRfc3339("2026-11-30T13:37:25.0320001Z"), ParseRfc3339("2026-11-30T13:37:25.033Z"))
      << "fractions beyond milliseconds round up";
  EXPECT_EQ(ParseRfc3339("2026-11-30T13:37:25.0320000Z"), ParseRfc3339("2026-11-30T13:37:25.032Z"));
  EXPECT_EQ(ParseRfc3339("2024-02-29t00:00:00z"), ParseRfc3339("2024-02-29T00:00:00Z"));
}

// Found by fuzz/message_fuzz.cc: before 1970 the milliseconds were written negative
// ("1969-12-31T23:59:59.999Z" came out as "1970-01-01T00:00:00.-01Z"), and years before 1000
// with fewer than four digits; neither read back.
TEST(Rfc3339, WritesTimesBefore1970AndEarlyYearsReadably) {
  EXPECT_EQ(Rfc3339(-1), "1969-12-31T23:59:59.999Z");
  EXPECT_EQ(Rfc3339(-1000), "1969-12-31T23:59:59.000Z");
  EXPECT_EQ(Rfc3339(-1001), "1969-12-31T23:59:58.999Z");
  for (const char* text : {"1969-12-31T23:59:59.999Z", "0999-01-02T03:04:05.006Z",
                           "0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z"}) {
    const auto ms = ParseRfc3339(text);
    ASSERT_TRUE(ms.has_value()) << text;
    EXPECT_EQ(Rfc3339(*ms), text);
  }
  EXPECT_EQ(HttpDate(-1), "Wed, 31 Dec 1969 23:59:59 GMT") << "rounded down, as documented";
}

// Rfc3339 and HttpDate compute the calendar themselves (no gmtime_r, no strftime): they write
// what gmtime_r and strftime write (four digits of year always), across the years 0000..9999,
// leap days and the edges.
TEST(Rfc3339, WritesWhatTheCLibraryWrites) {
  auto reference = [](int64_t ms, bool http) {
    int64_t seconds = ms / 1000, rest = ms % 1000;
    if (rest < 0) rest += 1000, seconds -= 1;
    const auto t = static_cast<std::time_t>(seconds);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[64];
    if (http) {  // strftime's %Y writes years before 1000 with fewer digits than IMF-fixdate's four
      std::string out(buf, std::strftime(buf, sizeof buf, "%a, %d %b ", &tm));
      std::snprintf(buf, sizeof buf, "%04d", tm.tm_year + 1900);
      out += buf;
      return out + std::string(buf, std::strftime(buf, sizeof buf, " %H:%M:%S GMT", &tm));
    }
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(rest));
    return std::string(buf);
  };
  std::vector<int64_t> times = {0,
                                -1,
                                1,
                                951'782'400'000 /* 2000-02-29 */,
                                4'107'542'399'999,
                                -62'167'219'200'000,
                                -62'167'219'199'999,
                                253'402'300'799'999,
                                -2'208'988'800'000 /* 1900-01-01 */,
                                1'796'118'123'456};
  std::mt19937_64 random(7);
  std::uniform_int_distribution<int64_t> any(-62'167'219'200'000, 253'402'300'799'999);
  for (int i = 0; i < 20000; ++i) times.push_back(any(random));
  for (int64_t day = -800; day < 800; ++day) times.push_back(day * 86'400'000 + 86'399'999);
  for (const int64_t ms : times) {
    ASSERT_EQ(Rfc3339(ms), reference(ms, false)) << ms;
    ASSERT_EQ(HttpDate(ms), reference(ms, true)) << ms;
  }
}

TEST(Rfc3339, RefusesWhatIsNotOne) {
  for (const char* bad :
       {"", "2026-11-30", "2026-11-30T13:37:25", "2026-11-30 13:37:25Z", "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T13:37:25.Z",
        "2026-11-30T13:37:25+0800", "2026-11-30T13:37:25Zjunk", "２026-11-30T13:37:25Z"}) {
    EXPECT_FALSE(ParseRfc3339(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace idem::http
