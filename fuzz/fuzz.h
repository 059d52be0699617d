// fuzz/fuzz.h — what the libFuzzer targets of this directory share.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string_view>

// A property every input must keep. Violated, the target prints what and where and traps, so
// libFuzzer stops and writes the input out as a crash.
#define IDEM_FUZZ_CHECK(cond)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: fuzz property violated: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                       \
    }                                                                                         \
  } while (false)

namespace idem::fuzz {

inline std::string_view AsText(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace idem::fuzz
