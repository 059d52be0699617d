// src/core/canonical.cc — canonical JSON: Boost.JSON's SAX parser feeds a small tree that keeps
// numbers as text; rules are applied to the tree; the tree is written in RFC 8785 form.
#include "idem/canonical.h"

#include <algorithm>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <boost/json/basic_parser_impl.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace idem {
namespace {

// ---- Exact decimals -------------------------------------------------------------------------

// Digits written out in plain form before switching to exponent form.
constexpr int64_t kPlainDigitsMax = 40;

Result<std::string> DecimalFromJsonNumber(std::string_view s) {
  auto bad = [&](const char* why) {
    return MakeError(Errc::kInvalidArgument,
                     std::string("number '") + std::string(s.substr(0, 40)) + "': " + why);
  };
  std::size_t i = 0;
  bool negative = false;
  if (i < s.size() && s[i] == '-') {
    negative = true;
    ++i;
  }
  auto is_digit = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  std::string digits;
  std::size_t int_start = i;
  while (is_digit(i)) digits.push_back(s[i++]);
  if (i == int_start) return bad("expected a digit");
  if (i - int_start > 1 && s[int_start] == '0') return bad("leading zero");
  int64_t exponent = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t frac_start = i;
    while (is_digit(i)) digits.push_back(s[i++]);
    if (i == frac_start) return bad("expected a digit after '.'");
    exponent -= static_cast<int64_t>(i - frac_start);
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) exp_negative = s[i++] == '-';
    std::size_t exp_start = i;
    int64_t e = 0;
    while (is_digit(i)) {
      e = e * 10 + (s[i++] - '0');
      if (e > limits::kJsonMaxExponent) return bad("exponent out of range");
    }
    if (i == exp_start) return bad("expected a digit in the exponent");
    exponent += exp_negative ? -e : e;
  }
  if (i != s.size()) return bad("unexpected character");
  if (digits.size() > limits::kJsonMaxNumberDigits) return bad("too many digits");

  // Normalise: value = digits × 10^exponent with no leading or trailing zeros in digits.
  std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return std::string("0");
  std::size_t last = digits.find_last_not_of('0');
  exponent += static_cast<int64_t>(digits.size() - 1 - last);
  std::string d = digits.substr(first, last - first + 1);
  const int64_t n = static_cast<int64_t>(d.size());

  std::string out;
  if (negative) out.push_back('-');
  const int64_t point = n + exponent;  // digits before the decimal point
  if (exponent >= 0 && point <= kPlainDigitsMax) {
    out.append(d).append(static_cast<std::size_t>(exponent), '0');
  } else if (exponent < 0 && point > 0) {
    out.append(d, 0, static_cast<std::size_t>(point)).push_back('.');
    out.append(d, static_cast<std::size_t>(point));
  } else if (exponent < 0 && point > -kPlainDigitsMax) {
    // The canonical text is read again (CanonicalScalar's callers, a canonical body canonicalised
    // once more), so it stays within the limits too: "0." and the zeros count as digits.
    if (static_cast<std::size_t>(1 - point + n) > limits::kJsonMaxNumberDigits) {
      return bad("too many digits");
    }
    out.append("0.").append(static_cast<std::size_t>(-point), '0').append(d);
  } else {
    // Likewise its exponent: "110e999" is 1.1e1001, past the limit as much as that is.
    if (point - 1 > limits::kJsonMaxExponent || point - 1 < -limits::kJsonMaxExponent) {
      return bad("exponent out of range");
    }
    out.push_back(d[0]);
    if (n > 1) out.append(".").append(d, 1);
    out.append("e").append(std::to_string(point - 1));
  }
  return out;
}

// ---- The document: one arena of text and a flat array of nodes -----------------------------
//
// Canonicalising a request is on every request's path, so the tree costs a handful of
// allocations, not one per value: all strings, member names and numbers live in one arena, and
// nodes refer to each other by index (children as a singly linked list, kept sorted by name).

enum class Kind : uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject };

struct Slice {
  uint32_t offset = 0;
  uint32_t size = 0;
};

struct Node {
  Kind kind = Kind::kNull;
  Slice text;          // number: canonical decimal; string: decoded UTF-8
  Slice key;           // member name, when the node is an object member
  int32_t first = -1;  // first child
  int32_t last = -1;   // last child (appending while parsing)
  int32_t next = -1;   // next sibling
};

struct Doc {
  std::string arena;
  std::vector<Node> nodes;

  std::string_view View(Slice s) const { return std::string_view(arena).substr(s.offset, s.size); }
  Slice Append(std::string_view s) {
    Slice slice{static_cast<uint32_t>(arena.size()), static_cast<uint32_t>(s.size())};
    arena.append(s);
    return slice;
  }
};

// RFC 8785 §3.2.3: members sorted by their names' UTF-16 code units. For valid UTF-8, byte order
// is code point order, and UTF-16 order differs from it only where a character of U+E000..U+FFFF
// (lead byte 0xEE or 0xEF) meets one beyond U+FFFF (lead byte 0xF0..0xF4, a surrogate pair in
// UTF-16, which sorts lower). Equal prefixes end on a character boundary, so the first differing
// bytes are either both lead bytes or both continuation bytes of same-length characters.
bool KeyLess(std::string_view a, std::string_view b) {
  const std::size_t n = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == n) return a.size() < b.size();
  const auto x = static_cast<unsigned char>(a[i]);
  const auto y = static_cast<unsigned char>(b[i]);
  const bool x_high_bmp = x == 0xee || x == 0xef;
  const bool y_high_bmp = y == 0xee || y == 0xef;
  if (x_high_bmp && y >= 0xf0) return false;
  if (y_high_bmp && x >= 0xf0) return true;
  return x < y;
}

// ---- Boost.JSON SAX handler building the document -------------------------------------------

class DocBuilder {
 public:
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  DocBuilder(Doc& doc, std::size_t max_container) : doc_(doc), max_container_(max_container) {
    // Room for a usual body's nesting and members, so they do not grow one doubling at a time.
    open_.reserve(8);
    members_.reserve(16);
  }

  int32_t root = -1;    // the first node this parse made
  std::string failure;  // set when the handler itself refused the input

  bool on_document_begin(boost::json::error_code&) { return true; }
  bool on_document_end(boost::json::error_code&) { return true; }
  bool on_array_begin(boost::json::error_code& ec) { return Open(Kind::kArray, ec); }
  bool on_object_begin(boost::json::error_code& ec) { return Open(Kind::kObject, ec); }
  bool on_array_end(std::size_t, boost::json::error_code&) {
    Close();
    return true;
  }
  bool on_object_end(std::size_t, boost::json::error_code& ec) { return SortMembers(Close(), ec); }
  bool on_string_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    Part(s);
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t, boost::json::error_code& ec) {
    Part(s);
    const int32_t n = Place(Kind::kString, ec);
    if (n < 0) return false;
    doc_.nodes[static_cast<std::size_t>(n)].text = TakePart();
    return true;
  }
  bool on_key_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    Part(s);
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    Part(s);
    pending_key_ = TakePart();
    return true;
  }
  bool on_number_part(boost::json::string_view s, boost::json::error_code&) {
    number_.append(s.data(), s.size());
    return true;
  }
  bool on_int64(int64_t, boost::json::string_view s, boost::json::error_code& ec) {
    return Number(s, ec);
  }
  bool on_uint64(uint64_t, boost::json::string_view s, boost::json::error_code& ec) {
    return Number(s, ec);
  }
  bool on_double(double, boost::json::string_view s, boost::json::error_code& ec) {
    return Number(s, ec);
  }
  bool on_bool(bool b, boost::json::error_code& ec) {
    return Place(b ? Kind::kTrue : Kind::kFalse, ec) >= 0;
  }
  bool on_null(boost::json::error_code& ec) { return Place(Kind::kNull, ec) >= 0; }
  bool on_comment_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::json::error_code&) { return true; }

 private:
  bool Refuse(std::string why, boost::json::error_code& ec) {
    failure = std::move(why);
    ec = boost::json::error::syntax;
    return false;
  }

  // Strings and keys arrive in parts, appended straight to the arena.
  void Part(boost::json::string_view s) {
    if (part_start_ < 0) part_start_ = static_cast<int64_t>(doc_.arena.size());
    doc_.arena.append(s.data(), s.size());
  }
  Slice TakePart() {
    if (part_start_ < 0) part_start_ = static_cast<int64_t>(doc_.arena.size());
    Slice slice{static_cast<uint32_t>(part_start_),
                static_cast<uint32_t>(doc_.arena.size() - static_cast<std::size_t>(part_start_))};
    part_start_ = -1;
    return slice;
  }

  // Appends a node where the parser is: the root, the next array element, or the value of the
  // member whose key was just read. Returns its index, or -1 after refusing.
  int32_t Place(Kind kind, boost::json::error_code& ec) {
    const auto index = static_cast<int32_t>(doc_.nodes.size());
    Node node;
    node.kind = kind;
    if (open_.empty()) {
      root = index;
      doc_.nodes.push_back(node);
      return index;
    }
    const int32_t parent_index = open_.back().node;
    std::size_t& count = open_.back().entries;
    if (++count > max_container_) {
      Refuse("an array or object has more than " + std::to_string(max_container_) + " entries", ec);
      return -1;
    }
    if (doc_.nodes[static_cast<std::size_t>(parent_index)].kind == Kind::kObject) {
      node.key = pending_key_;
    }
    doc_.nodes.push_back(node);
    Node& parent = doc_.nodes[static_cast<std::size_t>(parent_index)];
    if (parent.last < 0) {
      parent.first = index;
    } else {
      doc_.nodes[static_cast<std::size_t>(parent.last)].next = index;
    }
    parent.last = index;
    return index;
  }

  bool Open(Kind kind, boost::json::error_code& ec) {
    const int32_t index = Place(kind, ec);
    if (index < 0) return false;
    open_.push_back(OpenContainer{index, 0});
    return true;
  }
  // Ends the innermost open container, and with it its count: the entries that follow count
  // against the container around it. Returns the closed container's node.
  int32_t Close() {
    const int32_t index = open_.back().node;
    open_.pop_back();
    return index;
  }

  // Relinks an object's members in canonical order; refuses duplicate names.
  bool SortMembers(int32_t obj, boost::json::error_code& ec) {
    members_.clear();
    for (int32_t c = doc_.nodes[static_cast<std::size_t>(obj)].first; c >= 0;
         c = doc_.nodes[static_cast<std::size_t>(c)].next) {
      members_.push_back(c);
    }
    if (members_.empty()) return true;
    auto key = [&](int32_t i) { return doc_.View(doc_.nodes[static_cast<std::size_t>(i)].key); };
    std::sort(members_.begin(), members_.end(),
              [&](int32_t a, int32_t b) { return KeyLess(key(a), key(b)); });
    for (std::size_t i = 0; i + 1 < members_.size(); ++i) {
      if (key(members_[i]) == key(members_[i + 1])) {
        return Refuse("duplicate member '" + std::string(key(members_[i])) + "'", ec);
      }
      doc_.nodes[static_cast<std::size_t>(members_[i])].next = members_[i + 1];
    }
    doc_.nodes[static_cast<std::size_t>(members_.back())].next = -1;
    Node& o = doc_.nodes[static_cast<std::size_t>(obj)];
    o.first = members_.front();
    o.last = members_.back();
    return true;
  }

  bool Number(boost::json::string_view s, boost::json::error_code& ec) {
    number_.append(s.data(), s.size());
    auto decimal = DecimalFromJsonNumber(number_);
    number_.clear();
    if (!decimal) return Refuse(decimal.error().message, ec);
    const int32_t n = Place(Kind::kNumber, ec);
    if (n < 0) return false;
    doc_.nodes[static_cast<std::size_t>(n)].text = doc_.Append(*decimal);
    return true;
  }

  Doc& doc_;
  std::size_t max_container_;
  // The containers being parsed, innermost last, each with the entries placed in it so far.
  struct OpenContainer {
    int32_t node;
    std::size_t entries;
  };
  std::vector<OpenContainer> open_;
  std::vector<int32_t> members_;
  std::string number_;
  Slice pending_key_;
  int64_t part_start_ = -1;
};

// Parses `json` into `doc` and returns the index of its root node.
Result<int32_t> ParseInto(Doc& doc, std::string_view json, const CanonicalRules& rules) {
  if (json.size() > rules.max_bytes) {
    return MakeError(Errc::kTooLarge,
                     "JSON body is larger than " + std::to_string(rules.max_bytes) + " bytes");
  }
  boost::json::parse_options options;
  options.max_depth = rules.max_depth;
  boost::json::basic_parser<DocBuilder> parser(options, doc, rules.max_container_size);
  boost::json::error_code ec;
  std::size_t used = parser.write_some(false, json.data(), json.size(), ec);
  if (!ec && used != json.size()) ec = boost::json::error::extra_data;
  if (ec) {
    std::string why = parser.handler().failure.empty() ? ec.message() : parser.handler().failure;
    if (ec == boost::json::error::too_deep) {
      why = "nesting deeper than " + std::to_string(rules.max_depth);
    }
    return MakeError(Errc::kInvalidArgument,
                     "invalid JSON at byte " + std::to_string(used) + ": " + why);
  }
  return parser.handler().root;
}

// ---- Rules ----------------------------------------------------------------------------------

// Where a member is, or would go, in an object's sorted member list.
struct MemberPos {
  int32_t parent = -1;  // the object; -1 when some step of the path is missing
  int32_t prev = -1;    // the member before it (or before the insertion point)
  int32_t found = -1;   // the member, if present
};

// The member at a dotted path ("a.b.c"), each step a member name.
MemberPos Locate(const Doc& doc, int32_t root, std::string_view path) {
  int32_t node = root;
  while (true) {
    const std::size_t dot = path.find('.');
    const std::string_view part = path.substr(0, dot);
    if (doc.nodes[static_cast<std::size_t>(node)].kind != Kind::kObject) return MemberPos{};
    int32_t prev = -1, found = -1;
    for (int32_t c = doc.nodes[static_cast<std::size_t>(node)].first; c >= 0;
         c = doc.nodes[static_cast<std::size_t>(c)].next) {
      const std::string_view name = doc.View(doc.nodes[static_cast<std::size_t>(c)].key);
      if (name == part) {
        found = c;
        break;
      }
      if (!KeyLess(name, part)) break;
      prev = c;
    }
    if (dot == std::string_view::npos) return MemberPos{node, prev, found};
    if (found < 0) return MemberPos{};
    node = found;
    path.remove_prefix(dot + 1);
  }
}

Status ApplyRules(Doc& doc, int32_t root, const CanonicalRules& rules) {
  auto at = [&](int32_t i) -> Node& { return doc.nodes[static_cast<std::size_t>(i)]; };
  for (const auto& [path, value_json] : rules.defaults) {
    const MemberPos pos = Locate(doc, root, path);
    if (pos.parent < 0 || pos.found >= 0) continue;
    auto parsed = ParseInto(doc, value_json, CanonicalRules{});
    if (!parsed) {
      return MakeError(Errc::kInvalidArgument,
                       "default for '" + path + "': " + parsed.error().message);
    }
    const int32_t value = *parsed;
    at(value).key = doc.Append(std::string_view(path).substr(path.rfind('.') + 1));
    if (pos.prev < 0) {
      at(value).next = at(pos.parent).first;
      at(pos.parent).first = value;
    } else {
      at(value).next = at(pos.prev).next;
      at(pos.prev).next = value;
    }
  }
  // Removals after the defaults, so a default cannot bring back a member that does not count
  // (a default holding a removed path): canonical output never holds a removed path.
  for (const std::string& path : rules.removed_fields) {
    const MemberPos pos = Locate(doc, root, path);
    if (pos.found < 0) continue;
    const int32_t after = at(pos.found).next;
    if (pos.prev < 0) {
      at(pos.parent).first = after;
    } else {
      at(pos.prev).next = after;
    }
  }
  for (const std::string& path : rules.money_fields) {
    const MemberPos pos = Locate(doc, root, path);
    if (pos.found < 0) continue;
    Node& money = at(pos.found);
    if (money.kind == Kind::kString) {
      auto decimal = DecimalFromJsonNumber(doc.View(money.text));
      if (!decimal) {
        return MakeError(Errc::kInvalidArgument,
                         "'" + path + "' must be a decimal number or a string holding one");
      }
      const Slice text = doc.Append(*decimal);
      at(pos.found).kind = Kind::kNumber;
      at(pos.found).text = text;
    } else if (money.kind != Kind::kNumber) {
      return MakeError(Errc::kInvalidArgument,
                       "'" + path + "' must be a decimal number or a string holding one");
    }
  }
  return Ok();
}

// ---- Output ---------------------------------------------------------------------------------

// The end of the run of characters from `i` that need no escape: no control character, '"' or
// '\\'. Many bytes at a time (SSE2 where there is, then SWAR), since long strings are most of a
// body's bytes.
std::size_t PlainRun(std::string_view s, std::size_t i) {
#if defined(__SSE2__)
  // Sixteen bytes at a time: flag bytes <= 0x1f, '"' and '\\'.
  const __m128i limit = _mm_set1_epi8(0x1f);
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  while (i + 16 <= s.size()) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data() + i));
    const __m128i control = _mm_cmpeq_epi8(_mm_max_epu8(v, limit), limit);
    const __m128i special =
        _mm_or_si128(control, _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
    const int mask = _mm_movemask_epi8(special);
    if (mask != 0) return i + static_cast<std::size_t>(__builtin_ctz(static_cast<unsigned>(mask)));
    i += 16;
  }
#endif
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHighs = 0x8080808080808080ULL;
  auto has_zero = [](uint64_t v) { return (v - kOnes) & ~v & kHighs; };
  while (i + 8 <= s.size()) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    // Bytes < 0x20 (ignoring bytes >= 0x80, which are never control characters), '"', '\\'.
    const uint64_t control = (v - kOnes * 0x20) & ~v & kHighs;
    if (control | has_zero(v ^ (kOnes * '"')) | has_zero(v ^ (kOnes * '\\'))) break;
    i += 8;
  }
  while (i < s.size()) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\') break;
    ++i;
  }
  return i;
}

// RFC 8785 §3.2.2.2: escape '"', '\\' and control characters; everything else as raw UTF-8.
// Runs of plain characters are appended whole: this loop is most of canonicalisation's cost.
void WriteString(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t run = PlainRun(s, i);
    out.append(s.data() + i, run - i);
    if (run == s.size()) break;
    const char c = s[run];
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        const char escape[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 0xf]};
        out.append(escape, sizeof escape);
      }
    }
    i = run + 1;
  }
  out.push_back('"');
}

void Write(const Doc& doc, int32_t index, std::string& out) {
  const Node& node = doc.nodes[static_cast<std::size_t>(index)];
  switch (node.kind) {
    case Kind::kNull:
      out.append("null");
      break;
    case Kind::kFalse:
      out.append("false");
      break;
    case Kind::kTrue:
      out.append("true");
      break;
    case Kind::kNumber:
      out.append(doc.View(node.text));
      break;
    case Kind::kString:
      WriteString(doc.View(node.text), out);
      break;
    case Kind::kArray:
    case Kind::kObject: {
      const bool object = node.kind == Kind::kObject;
      out.push_back(object ? '{' : '[');
      for (int32_t c = node.first; c >= 0; c = doc.nodes[static_cast<std::size_t>(c)].next) {
        if (c != node.first) out.push_back(',');
        if (object) {
          WriteString(doc.View(doc.nodes[static_cast<std::size_t>(c)].key), out);
          out.push_back(':');
        }
        Write(doc, c, out);
      }
      out.push_back(object ? '}' : ']');
      break;
    }
  }
}

}  // namespace

Result<std::string> CanonicalDecimal(std::string_view text) { return DecimalFromJsonNumber(text); }

Result<std::optional<std::string>> CanonicalScalar(std::string_view json, std::string_view path,
                                                   const CanonicalRules& rules) {
  Doc doc;
  IDEM_ASSIGN_OR_RETURN(const int32_t root, ParseInto(doc, json, rules));
  IDEM_RETURN_IF_ERROR(ApplyRules(doc, root, rules));
  const MemberPos pos = Locate(doc, root, path);
  if (pos.found < 0) return std::optional<std::string>();
  const Node& node = doc.nodes[static_cast<std::size_t>(pos.found)];
  if (node.kind != Kind::kNumber && node.kind != Kind::kString) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::string(doc.View(node.text)));
}

Result<std::string> Canonicalize(std::string_view json, const CanonicalRules& rules) {
  // One document per thread, cleared and reused: its buffers stay allocated and warm in cache.
  // A document grown by an unusually large body is dropped rather than kept per thread.
  constexpr std::size_t kKeepBytes = 256 * 1024;
  thread_local Doc doc;
  if (doc.arena.capacity() > kKeepBytes || doc.nodes.capacity() * sizeof(Node) > kKeepBytes) {
    doc = Doc{};
  }
  doc.arena.clear();
  doc.nodes.clear();
  doc.arena.reserve(json.size() + 64);
  doc.nodes.reserve(json.size() / 8 + 4);
  IDEM_ASSIGN_OR_RETURN(const int32_t root, ParseInto(doc, json, rules));
  IDEM_RETURN_IF_ERROR(ApplyRules(doc, root, rules));
  std::string out;
  out.reserve(json.size());
  Write(doc, root, out);
  return out;
}

}  // namespace idem
