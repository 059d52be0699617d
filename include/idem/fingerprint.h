// include/idem/fingerprint.h — the request fingerprint: HMAC-SHA-256 over the canonical request.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/canonical.h"
#include "idem/result.h"
#include "idem/secret.h"

namespace idem {

// What a request is made of, as it arrived. Views; the caller keeps the bytes alive.
struct RequestFacts {
  std::string_view method;
  std::string_view route;
  std::string_view content_type;  // the Content-Type value as sent; only MediaTypeOf it counts
  std::string_view api_version;
  std::string_view body;  // JSON text (bytes under CanonicalRules::opaque_body)
  std::string_view user;
  // The request's path and query where the route's pattern leaves parts of them open (gateway
  // routes); "" adds nothing, so fingerprints made without it are unchanged.
  std::string_view target = {};
};

// The MAC input of one request: everything in RequestFacts with the body canonicalised under the
// rules of `rules_version` and the content type reduced to its media type.
struct CanonicalRequest {
  uint32_t rules_version = 0;
  std::string method;
  std::string route;
  std::string content_type;
  std::string api_version;
  std::string body;
  std::string user;
  std::string target;  // RequestFacts::target
};

// The media type of a Content-Type value: the text before the first ';', without the white space
// around it, lower-cased ("Application/JSON ; charset=utf-8" → "application/json"). Parameters
// and case do not change what a request means, so a fingerprint covers this and nothing more.
std::string MediaTypeOf(std::string_view content_type);

// Canonicalises facts.body under `rules` and facts.content_type to MediaTypeOf it.
// Errors: those of Canonicalize().
Result<CanonicalRequest> MakeCanonicalRequest(const RequestFacts& facts,
                                              const CanonicalRules& rules);

// A stored fingerprint: which rules and which secret made it, and the MAC.
struct Fingerprint {
  uint32_t rules_version = 0;
  uint32_t secret_id = 0;
  std::array<uint8_t, 32> mac{};
};

// Computes and verifies fingerprints with a ring of HMAC secrets.
// Immutable after creation; safe for concurrent use.
class Fingerprinter {
 public:
  // Errors: kInvalidArgument if the secrets are invalid (see ValidateSecrets; at least 32 bytes).
  static Result<std::unique_ptr<Fingerprinter>> Create(std::vector<Secret> secrets,
                                                       uint32_t current_secret_id);
  virtual ~Fingerprinter() = default;

  // MAC of `request` under the current secret.
  virtual Fingerprint Sign(const CanonicalRequest& request) const = 0;

  // Whether `stored` is the fingerprint of `request`, recomputed with the secret that made it and
  // compared in constant time. The caller canonicalised `request` under stored.rules_version.
  // Errors: kInvalidArgument if request.rules_version differs from stored.rules_version;
  // kDataLoss if stored.secret_id is not in the ring (the secret was retired too early).
  virtual Result<bool> Verify(const CanonicalRequest& request, const Fingerprint& stored) const = 0;
};

}  // namespace idem
