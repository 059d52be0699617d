// bench/request_bench.cc — what every request pays for its ids and times, beside the way each was
// made before: SystemRandom's small fills against RAND_bytes per call, and Rfc3339 and HttpDate
// against gmtime_r with snprintf or strftime.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <ctime>

#include "http/log.h"
#include "http/message.h"
#include "idem/clock.h"
#include "idem/key.h"

namespace idem {
namespace {

constexpr int64_t kSomeTime = 1'796'118'123'456;  // 2026-12-01T09:42:03.456Z

// A request's three small draws: a UUIDv7's 16 bytes, a span id's 8, a seal nonce's 12.
void BM_SystemRandomPerRequest(benchmark::State& state) {
  std::array<uint8_t, 16> bytes{};
  for (auto _ : state) {
    SystemRandom().Fill(std::span<uint8_t>(bytes.data(), 16));
    SystemRandom().Fill(std::span<uint8_t>(bytes.data(), 8));
    SystemRandom().Fill(std::span<uint8_t>(bytes.data(), 12));
    benchmark::DoNotOptimize(bytes);
  }
}
BENCHMARK(BM_SystemRandomPerRequest);

void BM_RandBytesPerRequest(benchmark::State& state) {  // as SystemRandom drew before
  std::array<uint8_t, 16> bytes{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(RAND_bytes(bytes.data(), 16));
    benchmark::DoNotOptimize(RAND_bytes(bytes.data(), 8));
    benchmark::DoNotOptimize(RAND_bytes(bytes.data(), 12));
    benchmark::DoNotOptimize(bytes);
  }
}
BENCHMARK(BM_RandBytesPerRequest);

void BM_NewUuidV7(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(NewUuidV7(SystemClock(), SystemRandom()));
}
BENCHMARK(BM_NewUuidV7);

void BM_Rfc3339(benchmark::State& state) {
  int64_t ms = kSomeTime;
  for (auto _ : state) benchmark::DoNotOptimize(http::Rfc3339(ms++));
}
BENCHMARK(BM_Rfc3339);

std::tm Gm(int64_t ms) {
  const auto t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return tm;
}

void BM_Rfc3339ByGmtimeAndSnprintf(benchmark::State& state) {  // as Rfc3339 wrote before
  int64_t ms = kSomeTime;
  char buf[48];
  for (auto _ : state) {
    const std::tm tm = Gm(ms);
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms % 1000));
    benchmark::DoNotOptimize(std::string(buf));
    ++ms;
  }
}
BENCHMARK(BM_Rfc3339ByGmtimeAndSnprintf);

void BM_HttpDate(benchmark::State& state) {
  int64_t ms = kSomeTime;
  for (auto _ : state) benchmark::DoNotOptimize(http::HttpDate(ms += 1000));
}
BENCHMARK(BM_HttpDate);

void BM_HttpDateByGmtimeAndStrftime(benchmark::State& state) {  // as HttpDate wrote before
  int64_t ms = kSomeTime;
  char buf[64];
  for (auto _ : state) {
    const std::tm tm = Gm(ms += 1000);
    benchmark::DoNotOptimize(
        std::string(buf, std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm)));
  }
}
BENCHMARK(BM_HttpDateByGmtimeAndStrftime);

// A request's access-log line through the buffered log (its writer thread writing to /dev/null
// here): the line built, taken into the buffer, and its share of the writes.
void BM_AccessLogLine(benchmark::State& state) {
  const int saved = dup(STDERR_FILENO);
  const int null = open("/dev/null", O_WRONLY);
  dup2(null, STDERR_FILENO);
  {
    http::BufferedLog buffered(http::BufferedLogOptions{});
    const boost::json::object fields = {{"request_id", "0193a5d2-6b1e-7c3a-9f41-2d8e5b7a1c90"},
                                        {"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"},
                                        {"span_id", "00f067aa0ba902b7"},
                                        {"method", "POST"},
                                        {"route", "payments.create"},
                                        {"outcome", "replayed"},
                                        {"status", 201},
                                        {"latency_us", 412}};
    for (auto _ : state) http::Log(http::LogLevel::kInfo, "request", fields);
  }
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(null);
}
BENCHMARK(BM_AccessLogLine)->UseRealTime();

}  // namespace
}  // namespace idem
