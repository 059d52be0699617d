// include/idem/secret.h — a server secret with an id, for HMAC keys and sealing keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "idem/result.h"

namespace idem {

// One secret. The id is stored beside everything made with the secret, so secrets can rotate:
// new records use the current secret, older records keep verifying under theirs.
struct Secret {
  uint32_t id = 0;
  std::string bytes;  // raw key material, at least 32 bytes
};

// Decodes hex ("0a1b...") into raw bytes. Errors: kInvalidArgument for odd length or non-hex.
Result<std::string> DecodeHex(std::string_view hex);

// Checks a set of secrets: ids unique, `current` among them, every secret at least `min_bytes`
// long (exactly `exact_bytes` when non-zero). Errors: kInvalidArgument naming the problem.
Status ValidateSecrets(const std::vector<Secret>& secrets, uint32_t current, std::size_t min_bytes,
                       std::size_t exact_bytes);

}  // namespace idem
