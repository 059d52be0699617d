// fuzz/key_fuzz.cc — Idempotency-Key parsing (ParseIdempotencyKey) under three policies: idemd's
// default, a strict one (lower-case hex and '-', 16..64) and a loose one (any printable ASCII).
//
// Properties: a parsed key keeps its policy (length, charset); its own spellings parse back to
// it (as an sf-string always, bare when that is unambiguous); its scope hashes. Refusals are
// kInvalidArgument, never anything else.
#include <string>

#include "fuzz/fuzz.h"
#include "idem/key.h"

namespace {

using idem::KeyPolicy;

KeyPolicy Strict() {
  KeyPolicy p;
  p.min_length = 16;
  p.max_length = 64;
  p.allowed = KeyPolicy::Charset("0123456789abcdef-");
  return p;
}

KeyPolicy Loose() {
  KeyPolicy p;
  p.min_length = 1;
  p.max_length = idem::limits::kKeyMaxLength;
  p.allowed.reset();
  for (int c = 0x20; c <= 0x7e; ++c) p.allowed.set(static_cast<std::size_t>(c));
  return p;
}

// The RFC 8941 sf-string of `key`.
std::string Quote(const std::string& key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

void Check(std::string_view header, const KeyPolicy& policy) {
  auto key = idem::ParseIdempotencyKey(header, policy);
  if (!key) {
    IDEM_FUZZ_CHECK(key.error().code == idem::Errc::kInvalidArgument);
    return;
  }
  IDEM_FUZZ_CHECK(key->size() >= policy.min_length && key->size() <= policy.max_length);
  for (char c : *key) IDEM_FUZZ_CHECK(policy.allowed.test(static_cast<unsigned char>(c)));

  auto quoted = idem::ParseIdempotencyKey(Quote(*key), policy);
  IDEM_FUZZ_CHECK(quoted && *quoted == *key);
  const bool bare_is_unambiguous = key->front() != '"' && key->front() != ' ' &&
                                   key->front() != '\t' && key->back() != ' ' &&
                                   key->back() != '\t';
  if (bare_is_unambiguous) {
    auto bare = idem::ParseIdempotencyKey(*key, policy);
    IDEM_FUZZ_CHECK(bare && *bare == *key);
  }
  const idem::Scope scope{"acme", "alice", "payments.create", *key};
  IDEM_FUZZ_CHECK(scope.Hash().has_value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const KeyPolicy kDefault;
  static const KeyPolicy kStrict = Strict();
  static const KeyPolicy kLoose = Loose();
  const std::string_view header = idem::fuzz::AsText(data, size);
  Check(header, kDefault);
  Check(header, kStrict);
  Check(header, kLoose);
  return 0;
}
