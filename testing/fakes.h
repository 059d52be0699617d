// testing/fakes.h — deterministic time and randomness for tests and, later, the simulator.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include "idem/clock.h"
#include "idem/mutex.h"

namespace idem::testing {

// A clock that moves only when told. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Timestamp start = FromUnixMillis(1'800'000'000'000))
      : now_ms_(ToUnixMillis(start)) {}
  Timestamp Now() const override { return FromUnixMillis(now_ms_.load()); }
  void Advance(Millis d) { now_ms_ += d.count(); }

 private:
  std::atomic<int64_t> now_ms_;
};

// A monotonic clock that moves only when told. Thread-safe.
class FakeMonotonicClock final : public MonotonicClock {
 public:
  SteadyTime Now() const override { return SteadyTime(Millis(now_ms_.load())); }
  void Advance(Millis d) { now_ms_ += d.count(); }

 private:
  std::atomic<int64_t> now_ms_{1'000'000};
};

// Reproducible bytes from a seed. Thread-safe.
class SeededRandom final : public Random {
 public:
  explicit SeededRandom(uint64_t seed) : engine_(seed) {}
  void Fill(std::span<uint8_t> out) override {
    MutexLock lock(mu_);
    for (uint8_t& b : out) b = static_cast<uint8_t>(engine_());
  }

 private:
  Mutex mu_;
  std::mt19937_64 engine_ IDEM_GUARDED_BY(mu_);
};

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace idem::testing
