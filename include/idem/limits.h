// include/idem/limits.h — every default limit of libidem in one place.
//
// Each limit is a default for a field of an options struct; deployments change them through
// configuration. Tests exercise each at the limit and one past it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace idem::limits {

// Idempotency-Key length in characters (after sf-string decoding).
inline constexpr std::size_t kKeyMinLength = 8;
inline constexpr std::size_t kKeyMaxLength = 255;
// Raw header value length accepted before any parsing (quotes and escapes included).
inline constexpr std::size_t kKeyHeaderMaxBytes = 2 * kKeyMaxLength + 2;

// Request bodies fed to the canonicaliser.
inline constexpr std::size_t kJsonMaxBytes = 64 * 1024;
inline constexpr std::size_t kJsonMaxDepth = 32;
// Members of one object / elements of one array.
inline constexpr std::size_t kJsonMaxContainerSize = 4096;
// Digits of one number (before normalisation) and magnitude of its exponent.
inline constexpr std::size_t kJsonMaxNumberDigits = 100;
inline constexpr int64_t kJsonMaxExponent = 1000;

// Plaintext of one stored (sealed) response.
inline constexpr std::size_t kSealedResponseMaxBytes = 16 * 1024;

// Principal identity and route id lengths.
inline constexpr std::size_t kPrincipalMaxLength = 128;
inline constexpr std::size_t kRouteMaxLength = 128;
// Recovery point and resource id lengths.
inline constexpr std::size_t kRecoveryPointMaxLength = 64;
inline constexpr std::size_t kResourceIdMaxLength = 128;

// Quotas per principal.
inline constexpr int64_t kMaxProcessingPerPrincipal = 100;
inline constexpr int64_t kMaxRetainedPerPrincipal = 100000;

// Sweeper batch size.
inline constexpr int kSweepBatch = 500;

}  // namespace idem::limits
