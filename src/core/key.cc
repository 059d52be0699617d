// src/core/key.cc — Idempotency-Key parsing and scope hashing.
#include "idem/key.h"

#include <openssl/evp.h>

#include <memory>

namespace idem {
namespace {

constexpr char kScopeSeparator = '\x1f';

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, printable ASCII only.
Result<std::string> DecodeSfString(std::string_view s) {
  if (s.size() < 2 || s.back() != '"') {
    return MakeError(Errc::kInvalidArgument, "Idempotency-Key: unterminated sf-string");
  }
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 1; i + 1 < s.size(); ++i) {
    char c = s[i];
    if (c == '\\') {
      if (i + 2 >= s.size() || (s[i + 1] != '"' && s[i + 1] != '\\')) {
        return MakeError(Errc::kInvalidArgument, "Idempotency-Key: bad escape in sf-string");
      }
      out.push_back(s[++i]);
    } else if (c == '"') {
      return MakeError(Errc::kInvalidArgument, "Idempotency-Key: unescaped quote in sf-string");
    } else if (c < 0x20 || c > 0x7e) {
      return MakeError(Errc::kInvalidArgument, "Idempotency-Key: non-printable character");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::bitset<256> KeyPolicy::Charset(std::string_view chars) {
  std::bitset<256> set;
  for (char c : chars) set.set(static_cast<unsigned char>(c));
  return set;
}

std::bitset<256> KeyPolicy::DefaultCharset() {
  return Charset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:");
}

Result<std::string> ParseIdempotencyKey(std::string_view header_value, const KeyPolicy& policy) {
  if (header_value.size() > limits::kKeyHeaderMaxBytes ||
      header_value.size() > 2 * policy.max_length + 2 + 64) {
    return MakeError(Errc::kInvalidArgument, "Idempotency-Key: longer than " +
                                                 std::to_string(policy.max_length) + " characters");
  }
  std::string_view v = TrimOws(header_value);
  if (v.empty()) return MakeError(Errc::kInvalidArgument, "Idempotency-Key: empty");
  std::string key;
  if (v.front() == '"') {
    IDEM_ASSIGN_OR_RETURN(key, DecodeSfString(v));
  } else {
    key.assign(v);
  }
  if (key.size() < policy.min_length) {
    return MakeError(Errc::kInvalidArgument, "Idempotency-Key: shorter than " +
                                                 std::to_string(policy.min_length) + " characters");
  }
  if (key.size() > policy.max_length) {
    return MakeError(Errc::kInvalidArgument, "Idempotency-Key: longer than " +
                                                 std::to_string(policy.max_length) + " characters");
  }
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (!policy.allowed.test(static_cast<unsigned char>(key[i]))) {
      return MakeError(Errc::kInvalidArgument, "Idempotency-Key: character at position " +
                                                   std::to_string(i) + " is not allowed");
    }
  }
  return key;
}

Result<ScopeHash> Scope::Hash() const {
  struct Part {
    const char* name;
    const std::string& value;
    std::size_t max;
  };
  for (const Part& p : {Part{"tenant", tenant, limits::kPrincipalMaxLength},
                        Part{"user", user, limits::kPrincipalMaxLength},
                        Part{"route", route, limits::kRouteMaxLength},
                        Part{"key", key, limits::kKeyMaxLength * 2}}) {
    if (p.value.empty() || p.value.size() > p.max ||
        p.value.find(kScopeSeparator) != std::string::npos) {
      return MakeError(Errc::kInvalidArgument,
                       std::string("scope: ") + p.name + " is empty, too long or contains 0x1f");
    }
  }
  const std::string_view separator(&kScopeSeparator, 1);
  return Sha256({tenant, separator, user, separator, route, separator, key});
}

std::array<uint8_t, 32> Sha256(std::initializer_list<std::string_view> parts) {
  struct Free {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  // Fetched once and kept for the life of the process.
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  thread_local const std::unique_ptr<EVP_MD_CTX, Free> ctx(EVP_MD_CTX_new());
  IDEM_CHECK(md != nullptr && ctx != nullptr && EVP_DigestInit_ex2(ctx.get(), md, nullptr) == 1);
  for (const std::string_view part : parts) {
    IDEM_CHECK(EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1);
  }
  std::array<uint8_t, 32> out{};
  unsigned int size = 0;
  IDEM_CHECK(EVP_DigestFinal_ex(ctx.get(), out.data(), &size) == 1 && size == out.size());
  return out;
}

std::string NewUuidV7(Clock& clock, Random& random) {
  std::array<uint8_t, 16> b;
  random.Fill(b);
  const auto ms = static_cast<uint64_t>(ToUnixMillis(clock.Now()));
  for (std::size_t i = 0; i < 6; ++i) b[i] = static_cast<uint8_t>(ms >> (40 - 8 * i));
  b[6] = static_cast<uint8_t>(0x70 | (b[6] & 0x0f));  // version 7
  b[8] = static_cast<uint8_t>(0x80 | (b[8] & 0x3f));  // variant 10
  // 8-4-4-4-12 lower-case hex digits, written in place.
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(36, '-');
  std::size_t at = 0;
  for (const uint8_t byte : b) {
    if (at == 8 || at == 13 || at == 18 || at == 23) ++at;
    out[at++] = kDigits[byte >> 4];
    out[at++] = kDigits[byte & 0xf];
  }
  return out;
}

std::string ToHex(const uint8_t* data, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

}  // namespace idem
