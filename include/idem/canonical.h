// include/idem/canonical.h — canonical JSON for request fingerprints.
//
// Two request bodies that mean the same business request must canonicalise to the same bytes, and
// two that do not must not. The output follows RFC 8785 (JCS) for structure, member order (UTF-16
// code units) and string escaping, with one deliberate difference: numbers are kept as exact
// decimals and never pass through a binary double (`1e2`, `100` and `100.0` are all `100`; a
// 30-digit integer keeps all of its digits).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/limits.h"
#include "idem/result.h"

namespace idem {

// Per-route canonicalisation rules. Value type. Paths are member names from the root object joined
// by '.', e.g. "amount" or "payer.trace_id" (member names containing '.' cannot be addressed).
struct CanonicalRules {
  // Stored with every record; bump it whenever a rule changes meaning, so a record made under
  // old rules is recomputed under those rules and not compared against new ones.
  uint32_t version = 1;
  // Money fields accept a JSON number or a string holding a JSON number ("100.00"); both
  // canonicalise to the same exact decimal number. Any other string is rejected.
  std::vector<std::string> money_fields;
  // Members that do not change the request's meaning (trace ids); removed before hashing, after
  // the defaults are filled in (so also from inside a default value).
  std::vector<std::string> removed_fields;
  // Members filled in when absent: path and the JSON text of the default value. A default is
  // applied only when the parent object exists.
  std::vector<std::pair<std::string, std::string>> defaults;

  // The body is bytes, not JSON (a gateway route with body = "bytes"): it counts exactly as it
  // came, at most max_bytes of it, and none of the rules above applies.
  bool opaque_body = false;

  std::size_t max_bytes = limits::kJsonMaxBytes;
  std::size_t max_depth = limits::kJsonMaxDepth;
  std::size_t max_container_size = limits::kJsonMaxContainerSize;
};

// Canonicalises a JSON text under `rules`.
// Errors: kTooLarge if `json` is longer than rules.max_bytes; kInvalidArgument for malformed JSON,
// invalid UTF-8 (raw or as lone surrogate escapes), duplicate member names, nesting deeper than
// max_depth, containers larger than max_container_size, numbers beyond the digit or exponent
// limits, a money field that is neither a number nor a decimal string, or a default that is not
// valid JSON. The message names the problem and, where known, the byte offset or path.
Result<std::string> Canonicalize(std::string_view json, const CanonicalRules& rules);

// The scalar at `path` after canonicalisation under `rules`: a number's (or money field's)
// canonical decimal text, or a string's text; nullopt when absent or not a number or string.
// Errors: those of Canonicalize().
Result<std::optional<std::string>> CanonicalScalar(std::string_view json, std::string_view path,
                                                   const CanonicalRules& rules);

// The canonical text of an exact decimal: a JSON number ("1e2" → "100", "-0.50" → "-0.5",
// "0" for any zero; very large or small magnitudes as "1.5e-60"). Accepts exactly the JSON number
// syntax (RFC 8259 §6). Errors: kInvalidArgument for anything else or beyond the digit and exponent
// limits of limits.h.
Result<std::string> CanonicalDecimal(std::string_view text);

}  // namespace idem
