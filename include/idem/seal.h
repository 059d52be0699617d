// include/idem/seal.h — sealing stored responses with AES-256-GCM.
//
// A stored response is encrypted and authenticated with additional data = the record's scope hash
// and the key id, so a leaked records table reveals no payment data and a sealed body cannot be
// moved to another record.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/limits.h"
#include "idem/result.h"
#include "idem/secret.h"

namespace idem {

// Immutable after creation; safe for concurrent use. Borrows `random`, which must outlive it.
class Sealer {
 public:
  // `keys`: 32-byte AES keys with ids; new seals use `current_key_id`.
  // Errors: kInvalidArgument for invalid keys (see ValidateSecrets).
  static Result<std::unique_ptr<Sealer>> Create(
      std::vector<Secret> keys, uint32_t current_key_id, Random& random,
      std::size_t max_plaintext_bytes = limits::kSealedResponseMaxBytes);
  virtual ~Sealer() = default;

  // Encrypts `plaintext` bound to `scope`. Errors: kTooLarge past the plaintext cap.
  virtual Result<std::string> Seal(const ScopeHash& scope, std::string_view plaintext) const = 0;

  // Decrypts what Seal made for the same scope. Errors: kDataLoss if the bytes are truncated,
  // altered, sealed for another scope, or under a key id that is no longer configured.
  virtual Result<std::string> Open(const ScopeHash& scope, std::string_view sealed) const = 0;
};

}  // namespace idem
