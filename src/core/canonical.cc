// src/core/canonical.cc — canonical JSON: Boost.JSON's SAX parser feeds a small tree that keeps
// numbers as text; rules are applied to the tree; the tree is written in RFC 8785 form.
#include "include/idem/canonical.h"

#include <algorithm>
#include <cstring>
#include <boost/json/basic_parser_impl.hpp>
#include <string>
#include <vector>

namespace idem {
namespace {

// ---- Exact decimals -------------------------------------------------------------------------

// Digits written out in plain form before switching to exponent form.
constexpr int64_t kPlainDigitsMax = 40;

Result<std::string> DecimalFromJsonNumber(std::string_view s) {
  auto bad = [&](const char* why) {
    return MakeError(Errc::kInvalidArgument, std::string("number '") +
                                                 std::string(s.substr(0, 40)) + "': " + why);
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
    out.append("0.").append(static_cast<std::size_t>(-point), '0').append(d);
  } else {
    out.push_back(d[0]);
    if (n > 1) out.append(".").append(d, 1);
    out.append("e").append(std::to_string(point - 1));
  }
  return out;
}

// ---- The tree -------------------------------------------------------------------------------

struct Node {
  enum class Kind : uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  std::string text;                // number: canonical decimal; string: decoded UTF-8
  std::vector<std::string> keys;   // object member names, sorted
  std::vector<Node> children;      // array elements, or object member values parallel to keys
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

// Sorts an object's members and reports whether two share a name.
bool SortMembers(Node& obj, std::string* duplicate) {
  const std::size_t n = obj.keys.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return KeyLess(obj.keys[x], obj.keys[y]); });
  std::vector<std::string> keys;
  std::vector<Node> children;
  keys.reserve(n);
  children.reserve(n);
  for (std::size_t i : order) {
    if (!keys.empty() && keys.back() == obj.keys[i]) {
      *duplicate = obj.keys[i];
      return false;
    }
    keys.push_back(std::move(obj.keys[i]));
    children.push_back(std::move(obj.children[i]));
  }
  obj.keys = std::move(keys);
  obj.children = std::move(children);
  return true;
}

// ---- Boost.JSON SAX handler building the tree -----------------------------------------------

class TreeBuilder {
 public:
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  explicit TreeBuilder(std::size_t max_container) : max_container_(max_container) {}

  Node root;
  std::string failure;  // set when the handler itself refused the input

  bool on_document_begin(boost::json::error_code&) { return true; }
  bool on_document_end(boost::json::error_code&) { return true; }
  bool on_array_begin(boost::json::error_code& ec) { return Open(Node::Kind::kArray, ec); }
  bool on_object_begin(boost::json::error_code& ec) { return Open(Node::Kind::kObject, ec); }
  bool on_array_end(std::size_t, boost::json::error_code& ec) { return Close(ec); }
  bool on_object_end(std::size_t, boost::json::error_code& ec) { return Close(ec); }
  bool on_string_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    buffer_.append(s.data(), s.size());
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t, boost::json::error_code& ec) {
    buffer_.append(s.data(), s.size());
    return Leaf(Node::Kind::kString, ec);
  }
  bool on_key_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    buffer_.append(s.data(), s.size());
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    buffer_.append(s.data(), s.size());
    stack_.back()->keys.push_back(std::move(buffer_));
    buffer_.clear();
    return true;
  }
  bool on_number_part(boost::json::string_view s, boost::json::error_code&) {
    buffer_.append(s.data(), s.size());
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
    return Leaf(b ? Node::Kind::kTrue : Node::Kind::kFalse, ec);
  }
  bool on_null(boost::json::error_code& ec) { return Leaf(Node::Kind::kNull, ec); }
  bool on_comment_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::json::error_code&) { return true; }

 private:
  bool Refuse(std::string why, boost::json::error_code& ec) {
    failure = std::move(why);
    ec = boost::json::error::syntax;
    return false;
  }

  // Places a new node where the parser is: the root, the next array element, or the value of the
  // member whose key was just read.
  Node* Place(boost::json::error_code& ec) {
    if (stack_.empty()) return &root;
    Node* parent = stack_.back();
    if (parent->children.size() >= max_container_) {
      Refuse("an array or object has more than " + std::to_string(max_container_) + " entries",
             ec);
      return nullptr;
    }
    return &parent->children.emplace_back();
  }

  bool Open(Node::Kind kind, boost::json::error_code& ec) {
    Node* node = Place(ec);
    if (node == nullptr) return false;
    node->kind = kind;
    stack_.push_back(node);
    return true;
  }

  bool Close(boost::json::error_code& ec) {
    Node* node = stack_.back();
    stack_.pop_back();
    if (node->kind == Node::Kind::kObject) {
      std::string duplicate;
      if (!SortMembers(*node, &duplicate)) return Refuse("duplicate member '" + duplicate + "'", ec);
    }
    return true;
  }

  bool Leaf(Node::Kind kind, boost::json::error_code& ec) {
    Node* node = Place(ec);
    if (node == nullptr) return false;
    node->kind = kind;
    if (kind == Node::Kind::kString) {
      node->text = std::move(buffer_);
      buffer_.clear();
    }
    return true;
  }

  bool Number(boost::json::string_view s, boost::json::error_code& ec) {
    buffer_.append(s.data(), s.size());
    auto decimal = DecimalFromJsonNumber(buffer_);
    buffer_.clear();
    if (!decimal) return Refuse(decimal.error().message, ec);
    Node* node = Place(ec);
    if (node == nullptr) return false;
    node->kind = Node::Kind::kNumber;
    node->text = std::move(*decimal);
    return true;
  }

  std::size_t max_container_;
  std::vector<Node*> stack_;
  std::string buffer_;
};

Result<Node> ParseTree(std::string_view json, const CanonicalRules& rules) {
  if (json.size() > rules.max_bytes) {
    return MakeError(Errc::kTooLarge,
                     "JSON body is larger than " + std::to_string(rules.max_bytes) + " bytes");
  }
  boost::json::parse_options options;
  options.max_depth = rules.max_depth;
  boost::json::basic_parser<TreeBuilder> parser(options, rules.max_container_size);
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
  return std::move(parser.handler().root);
}

// ---- Rules ----------------------------------------------------------------------------------

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> parts;
  while (true) {
    std::size_t dot = path.find('.');
    parts.push_back(path.substr(0, dot));
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  return parts;
}

// The object that holds the last member of `path`, or null if some step is missing.
Node* ParentOf(Node& root, const std::vector<std::string_view>& parts) {
  Node* node = &root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (node->kind != Node::Kind::kObject) return nullptr;
    auto it = std::lower_bound(node->keys.begin(), node->keys.end(), parts[i], KeyLess);
    if (it == node->keys.end() || *it != parts[i]) return nullptr;
    node = &node->children[static_cast<std::size_t>(it - node->keys.begin())];
  }
  return node->kind == Node::Kind::kObject ? node : nullptr;
}

// Index of member `name` in `obj`, or the position to insert it at with found = false.
std::size_t FindMember(const Node& obj, std::string_view name, bool* found) {
  auto it = std::lower_bound(obj.keys.begin(), obj.keys.end(), name, KeyLess);
  *found = it != obj.keys.end() && *it == name;
  return static_cast<std::size_t>(it - obj.keys.begin());
}

Status ApplyRules(Node& root, const CanonicalRules& rules) {
  for (const std::string& path : rules.removed_fields) {
    auto parts = SplitPath(path);
    Node* parent = ParentOf(root, parts);
    if (parent == nullptr) continue;
    bool found;
    std::size_t i = FindMember(*parent, parts.back(), &found);
    if (!found) continue;
    parent->keys.erase(parent->keys.begin() + static_cast<std::ptrdiff_t>(i));
    parent->children.erase(parent->children.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (const auto& [path, value_json] : rules.defaults) {
    auto parts = SplitPath(path);
    Node* parent = ParentOf(root, parts);
    if (parent == nullptr) continue;
    bool found;
    std::size_t i = FindMember(*parent, parts.back(), &found);
    if (found) continue;
    CanonicalRules plain;
    auto value = ParseTree(value_json, plain);
    if (!value) {
      return MakeError(Errc::kInvalidArgument,
                       "default for '" + path + "': " + value.error().message);
    }
    parent->keys.insert(parent->keys.begin() + static_cast<std::ptrdiff_t>(i),
                        std::string(parts.back()));
    parent->children.insert(parent->children.begin() + static_cast<std::ptrdiff_t>(i),
                            std::move(*value));
  }
  for (const std::string& path : rules.money_fields) {
    auto parts = SplitPath(path);
    Node* parent = ParentOf(root, parts);
    if (parent == nullptr) continue;
    bool found;
    std::size_t i = FindMember(*parent, parts.back(), &found);
    if (!found) continue;
    Node& money = parent->children[i];
    if (money.kind == Node::Kind::kString) {
      auto decimal = DecimalFromJsonNumber(money.text);
      if (!decimal) {
        return MakeError(Errc::kInvalidArgument,
                         "'" + path + "' must be a decimal number or a string holding one");
      }
      money.kind = Node::Kind::kNumber;
      money.text = std::move(*decimal);
    } else if (money.kind != Node::Kind::kNumber) {
      return MakeError(Errc::kInvalidArgument,
                       "'" + path + "' must be a decimal number or a string holding one");
    }
  }
  return Ok();
}

// ---- Output ---------------------------------------------------------------------------------

// The end of the run of characters from `i` that need no escape: no control character, '"' or
// '\\'. Eight bytes at a time (SWAR), since long strings are most of a body's bytes.
std::size_t PlainRun(std::string_view s, std::size_t i) {
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
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
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

void Write(const Node& node, std::string& out) {
  switch (node.kind) {
    case Node::Kind::kNull: out.append("null"); break;
    case Node::Kind::kFalse: out.append("false"); break;
    case Node::Kind::kTrue: out.append("true"); break;
    case Node::Kind::kNumber: out.append(node.text); break;
    case Node::Kind::kString: WriteString(node.text, out); break;
    case Node::Kind::kArray:
      out.push_back('[');
      for (std::size_t i = 0; i < node.children.size(); ++i) {
        if (i > 0) out.push_back(',');
        Write(node.children[i], out);
      }
      out.push_back(']');
      break;
    case Node::Kind::kObject:
      out.push_back('{');
      for (std::size_t i = 0; i < node.children.size(); ++i) {
        if (i > 0) out.push_back(',');
        WriteString(node.keys[i], out);
        out.push_back(':');
        Write(node.children[i], out);
      }
      out.push_back('}');
      break;
  }
}

}  // namespace

Result<std::string> CanonicalDecimal(std::string_view text) { return DecimalFromJsonNumber(text); }

Result<std::string> Canonicalize(std::string_view json, const CanonicalRules& rules) {
  IDEM_ASSIGN_OR_RETURN(Node root, ParseTree(json, rules));
  IDEM_RETURN_IF_ERROR(ApplyRules(root, rules));
  std::string out;
  out.reserve(json.size());
  Write(root, out);
  return out;
}

}  // namespace idem
