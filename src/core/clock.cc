// src/core/clock.cc — the one real clock and the one real random source.
#include "idem/clock.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>

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

// Bumped in a child after fork(): every thread's block (the forking thread's is the only one the
// child has) was also the parent's, and its bytes must not be given twice.
std::atomic<uint64_t> fork_generation{0};

// RAND_bytes costs about a microsecond a call however few bytes it gives (the DRBG's lock and
// per-call work), and every request asks for two or three small pieces (a request id, a span id,
// a seal's nonce). Small fills are served from a block of its output per thread instead: each
// byte is given once and wiped as it is, so what was handed out is not left in memory.
class OpenSslRandom final : public Random {
 public:
  OpenSslRandom() {
    IDEM_CHECK(pthread_atfork(nullptr, nullptr, [] {
                 fork_generation.fetch_add(1, std::memory_order_relaxed);
               }) == 0);
  }

  void Fill(std::span<uint8_t> out) override {
    if (out.size() > kLargest) {
      Draw(out);
      return;
    }
    thread_local Block block;
    const uint64_t generation = fork_generation.load(std::memory_order_relaxed);
    if (block.generation != generation || block.left < out.size()) {
      OPENSSL_cleanse(block.bytes.data(), block.bytes.size());
      Draw(block.bytes);
      block.left = block.bytes.size();
      block.generation = generation;
    }
    uint8_t* from = block.bytes.data() + (block.bytes.size() - block.left);
    std::copy_n(from, out.size(), out.data());
    OPENSSL_cleanse(from, out.size());
    block.left -= out.size();
  }

 private:
  static constexpr std::size_t kLargest = 64;  // larger fills go to RAND_bytes directly

  struct Block {
    std::array<uint8_t, 1024> bytes{};
    std::size_t left = 0;
    uint64_t generation = 0;
    Block() = default;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
  };

  static void Draw(std::span<uint8_t> out) {
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
