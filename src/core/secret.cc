// src/core/secret.cc — secret validation and hex decoding.
#include "idem/secret.h"

#include <set>

namespace idem {

Result<std::string> DecodeHex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return MakeError(Errc::kInvalidArgument, "hex: odd length");
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return MakeError(Errc::kInvalidArgument, "hex: not a hex digit");
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

Status ValidateSecrets(const std::vector<Secret>& secrets, uint32_t current, std::size_t min_bytes,
                       std::size_t exact_bytes) {
  std::set<uint32_t> ids;
  bool has_current = false;
  for (const Secret& s : secrets) {
    if (!ids.insert(s.id).second) {
      return MakeError(Errc::kInvalidArgument, "secret id " + std::to_string(s.id) + " repeated");
    }
    if (s.bytes.size() < min_bytes || (exact_bytes != 0 && s.bytes.size() != exact_bytes)) {
      return MakeError(Errc::kInvalidArgument,
                       "secret " + std::to_string(s.id) + " has " + std::to_string(s.bytes.size()) +
                           " bytes; need " + std::to_string(exact_bytes ? exact_bytes : min_bytes) +
                           (exact_bytes ? "" : " or more"));
    }
    has_current |= s.id == current;
  }
  if (!has_current) {
    return MakeError(Errc::kInvalidArgument,
                     "current secret id " + std::to_string(current) + " is not configured");
  }
  return Ok();
}

}  // namespace idem
