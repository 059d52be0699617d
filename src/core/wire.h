// src/core/wire.h — the length-prefixed byte encoding behind stored responses and cache entries:
// each field is a 4-byte big-endian length and the bytes. Internal to libidem's targets.
#pragma once

#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace idem::wire {

inline void PutU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

inline void PutBytes(std::string& out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

template <std::size_t N>
void PutBytes(std::string& out, const std::array<uint8_t, N>& a) {
  PutBytes(out, std::string_view(reinterpret_cast<const char*>(a.data()), N));
}

// An integer as its decimal text (readable in redis-cli, no endianness questions).
inline void PutInt(std::string& out, int64_t v) { PutBytes(out, std::to_string(v)); }

// Reads what the Put functions wrote; every method returns false on malformed input.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = 0;
    for (std::size_t i = 0; i < 4; ++i) *v = (*v << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(4);
    return true;
  }
  bool Bytes(std::string* s) {
    uint32_t n;
    if (!U32(&n) || in_.size() < n) return false;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return true;
  }
  template <std::size_t N>
  bool Bytes(std::array<uint8_t, N>* out) {
    std::string s;
    if (!Bytes(&s) || s.size() != N) return false;
    for (std::size_t i = 0; i < N; ++i) (*out)[i] = static_cast<uint8_t>(s[i]);
    return true;
  }
  bool Int(int64_t* v) {
    std::string s;
    if (!Bytes(&s) || s.empty() || s.size() > 20) return false;
    char* end = nullptr;
    *v = std::strtoll(s.c_str(), &end, 10);
    return *end == '\0';
  }
  bool Done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

}  // namespace idem::wire
