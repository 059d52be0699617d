// include/idem/key.h — Idempotency-Key parsing and the record scope.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/limits.h"
#include "idem/result.h"

namespace idem {

// What an Idempotency-Key may look like. Value type; copy freely.
struct KeyPolicy {
  std::size_t min_length = limits::kKeyMinLength;
  std::size_t max_length = limits::kKeyMaxLength;
  // Bytes allowed in a decoded key. Default: A-Z a-z 0-9 - _ . :
  std::bitset<256> allowed = DefaultCharset();

  static std::bitset<256> DefaultCharset();
  // A charset from a list of characters, e.g. "abc-" (ranges are not interpreted).
  static std::bitset<256> Charset(std::string_view chars);
};

// Parses an Idempotency-Key header value: a bare token or an RFC 8941 sf-string ("..."), with
// optional surrounding SP/HTAB. Returns the decoded key, or kInvalidArgument saying what is wrong
// (empty, too short, too long, a character outside the policy, a broken sf-string).
Result<std::string> ParseIdempotencyKey(std::string_view header_value, const KeyPolicy& policy);

// SHA-256 of a scope: the records table's primary key.
using ScopeHash = std::array<uint8_t, 32>;

// Who and where a key belongs: tenant + user + route + key. Two principals or two routes never
// share a record. Tenant and user come from authentication, never from the request.
struct Scope {
  std::string tenant;
  std::string user;
  std::string route;
  std::string key;

  // Validates the parts (non-empty, bounded, no 0x1f separator) and hashes
  // tenant 0x1f user 0x1f route 0x1f key with SHA-256.
  Result<ScopeHash> Hash() const;
};

// A fresh UUIDv7 (RFC 9562: 48 bits of Unix milliseconds from `clock`, then 74 random bits from
// `random`), lower-case with dashes: ids that sort by time and do not collide across processes
// and restarts — operation keys (idempotency keys) and request ids.
std::string NewUuidV7(Clock& clock, Random& random);

// SHA-256 of the parts, concatenated. One fetched algorithm for the process and one context per
// thread: OpenSSL 3's one-shot SHA256() fetches the algorithm on every call, which costs more than
// hashing an input of a few hundred bytes.
std::array<uint8_t, 32> Sha256(std::initializer_list<std::string_view> parts);

// Lower-case hex of bytes, for logs and ids.
std::string ToHex(const uint8_t* data, std::size_t size);
template <std::size_t N>
std::string ToHex(const std::array<uint8_t, N>& bytes) {
  return ToHex(bytes.data(), N);
}

}  // namespace idem
