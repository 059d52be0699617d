// include/idem/clock.h — the injected sources of time and randomness.
//
// Library code never reads the system clock or the system random source directly; it asks one of
// these, so tests and the simulator can drive time and tokens deterministically.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

namespace idem {

// Wall-clock time with millisecond resolution, as persisted in records (ms since the Unix epoch).
using Timestamp = std::chrono::sys_time<std::chrono::milliseconds>;
using Millis = std::chrono::milliseconds;

inline int64_t ToUnixMillis(Timestamp t) { return t.time_since_epoch().count(); }
inline Timestamp FromUnixMillis(int64_t ms) { return Timestamp(Millis(ms)); }

// A source of the current time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual Timestamp Now() const = 0;
};

// Elapsed time for deadlines, waits, polls and rest periods: it never jumps when the wall clock
// is set. Implementations are thread-safe.
using SteadyTime = std::chrono::steady_clock::time_point;
class MonotonicClock {
 public:
  virtual ~MonotonicClock() = default;
  virtual SteadyTime Now() const = 0;

  // Seconds from `start` (an earlier Now()) until now, for latency metrics.
  double SecondsSince(SteadyTime start) const {
    return std::chrono::duration<double>(Now() - start).count();
  }
};

// A source of unpredictable bytes (owner tokens, nonces, ids). Implementations are thread-safe.
class Random {
 public:
  virtual ~Random() = default;
  // Fills `out` completely. Aborts if the system cannot provide randomness (an environment failure
  // no caller can handle).
  virtual void Fill(std::span<uint8_t> out) = 0;
};

// The process-wide real implementations: system_clock, steady_clock and OpenSSL's RAND_bytes
// (fills of up to 64 bytes from a block of its output per thread, each byte given once, and none
// given again in a child after fork()).
Clock& SystemClock();
MonotonicClock& SystemMonotonicClock();
Random& SystemRandom();

}  // namespace idem
