// src/core/clock.cc — the one real clock and the one real random source.
#include "idem/clock.h"

#include <openssl/rand.h>

#include "idem/result.h"

namespace idem {
namespace {

class RealClock final : public Clock {
 public:
  Timestamp Now() const override {
    return std::chrono::time_point_cast<Millis>(std::chrono::system_clock::now());
  }
};

class SteadyClock final : public MonotonicClock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
};

class OpenSslRandom final : public Random {
 public:
  void Fill(std::span<uint8_t> out) override {
    IDEM_CHECK(RAND_bytes(out.data(), static_cast<int>(out.size())) == 1);
  }
};

}  // namespace

Clock& SystemClock() {
  static RealClock clock;
  return clock;
}

MonotonicClock& SystemMonotonicClock() {
  static SteadyClock clock;
  return clock;
}

Random& SystemRandom() {
  static OpenSslRandom random;
  return random;
}

}  // namespace idem
