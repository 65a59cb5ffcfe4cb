#include "config.hpp"

#include "python_experiment.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

namespace roundoff::sweep {

InputError config_error(const std::string& file, int line, int column, const std::string& key_path,
                        const std::string& message) {
  return InputError(file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + key_path +
                    ": " + message);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_distance) best = &c, best_distance = d;
  }
  // Close enough to be a typo: at most a third of the word, and at least one edit allowed.
  if (best && best_distance <= std::max<std::size_t>(1, word.size() / 3)) return " (did you mean '" + *best + "'?)";
  return "";
}

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

// What a YAML scalar is under the YAML 1.2 core schema; quoted scalars are strings.
enum class ScalarKind { null, boolean, integer, real, string };

const char* kind_name(ScalarKind k) {
  switch (k) {
    case ScalarKind::null: return "null";
    case ScalarKind::boolean: return "a bool";
    case ScalarKind::integer: return "an integer";
    case ScalarKind::real: return "a float";
    case ScalarKind::string: return "a string";
  }
  return "?";
}

ScalarKind plain_scalar_kind(const std::string& text) {
  static const std::regex null_re("~|null|Null|NULL|");
  static const std::regex bool_re("true|True|TRUE|false|False|FALSE");
  static const std::regex int_re("[-+]?[0-9]+");
  static const std::regex real_re(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (std::regex_match(text, null_re)) return ScalarKind::null;
  if (std::regex_match(text, bool_re)) return ScalarKind::boolean;
  if (std::regex_match(text, int_re)) return ScalarKind::integer;
  if (std::regex_match(text, real_re)) return ScalarKind::real;
  return ScalarKind::string;
}

// The first problem of the config text as YAML characters, with its 1-based line and byte
// column (yaml-cpp's columns count bytes too, and not a leading byte order mark): bytes
// that are not UTF-8 (overlong forms, surrogates and values past U+10FFFF included), and
// characters outside YAML's printable set (C0 and C1 controls but tab, line feed, carriage
// return and U+0085; DEL; U+FFFE and U+FFFF). They would otherwise reach the output's
// attributes, which are marked UTF-8 (and a NUL would cut the text short).
struct TextProblem {
  int line = 1, column = 1;
  std::string message;
};

std::optional<TextProblem> check_characters(const std::string& text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const std::size_t bom = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  int line = 1;
  std::size_t line_start = bom;
  for (std::size_t i = bom; i < text.size();) {
    const unsigned char b = byte(i);
    std::size_t length = 1;
    char32_t cp = b;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (b >= 0xC2 && b <= 0xDF) length = 2, cp = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) length = 3, cp = b & 0x0F, low = b == 0xE0 ? 0xA0 : 0x80, high = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) length = 4, cp = b & 0x07, low = b == 0xF0 ? 0x90 : 0x80, high = b == 0xF4 ? 0x8F : 0xBF;
    else if (b >= 0x80) length = 0;  // a continuation byte without a lead, or 0xC0 0xC1 0xF5..0xFF
    bool valid = length > 0 && i + length <= text.size();
    for (std::size_t k = 1; valid && k < length; ++k) {
      const unsigned char c = byte(i + k);
      valid = k == 1 ? (c >= low && c <= high) : (c >= 0x80 && c <= 0xBF);
      cp = (cp << 6) | (c & 0x3F);
    }
    const int column = static_cast<int>(i - line_start) + 1;
    if (!valid) {
      char message[48];
      std::snprintf(message, sizeof message, "not valid UTF-8 (byte 0x%02X)", b);
      return TextProblem{line, column, message};
    }
    const bool printable = cp == 0x09 || cp == 0x0A || cp == 0x0D || (cp >= 0x20 && cp <= 0x7E) || cp == 0x85 ||
                           (cp >= 0xA0 && cp <= 0xD7FF) || (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
    if (!printable) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
      return TextProblem{line, column, std::string("character ") + code +
                                           " is not allowed in YAML (only tab, line feed and carriage return of the "
                                           "control characters)"};
    }
    i += length;
    if (cp == 0x0A) ++line, line_start = i;
  }
  return std::nullopt;
}

// A YAML node with the place to report problems at and its key path.
struct Located {
  YAML::Node node;
  YAML::Mark mark;
  std::string path;
  YAML::Mark key_mark = YAML::Mark::null_mark();  // where its key is, for mappings' entries
};

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& path, const std::string& message) const {
    const bool known = !mark.is_null();
    throw config_error(file_, known ? mark.line + 1 : 1, known ? mark.column + 1 : 1, path, message);
  }
  [[noreturn]] void fail(const Located& at, const std::string& message) const { fail(at.mark, at.path, message); }

  // The entries of a mapping in file order; keys must be plain names, each at most once.
  std::vector<std::pair<std::string, Located>> entries(const Located& map) const {
    std::vector<std::pair<std::string, Located>> out;
    for (const auto& kv : map.node) {
      const YAML::Node& key = kv.first;
      const std::string prefix = map.path.empty() ? "" : map.path + ".";
      if (!key.IsScalar()) fail(key.Mark(), map.path.empty() ? "config" : map.path, "keys must be plain names");
      const std::string name = key.Scalar();
      for (const auto& [seen, at] : out)
        if (seen == name)
          fail(key.Mark(), prefix + name,
               "duplicate key '" + name + "' (first at line " + std::to_string(at.key_mark.line + 1) + ")");
      // A null value has no place of its own in yaml-cpp: report at its key.
      const YAML::Mark value_mark = kv.second.IsNull() || kv.second.Mark().is_null() ? key.Mark() : kv.second.Mark();
      out.emplace_back(name, Located{kv.second, value_mark, prefix + name, key.Mark()});
    }
    return out;
  }

  ScalarKind scalar_kind(const Located& at) const {
    if (at.node.IsNull()) return ScalarKind::null;
    if (!at.node.IsScalar()) fail(at, at.node.IsSequence() ? "expected a single value, got a list" : "expected a single value, got a mapping");
    const std::string& tag = at.node.Tag();
    if (tag == "?") return plain_scalar_kind(at.node.Scalar());
    if (tag == "!" || tag == "tag:yaml.org,2002:str") return ScalarKind::string;
    const std::string core = "tag:yaml.org,2002:";
    const std::pair<const char*, ScalarKind> core_tags[] = {
        {"int", ScalarKind::integer}, {"float", ScalarKind::real}, {"bool", ScalarKind::boolean}, {"null", ScalarKind::null}};
    for (const auto& [suffix, kind] : core_tags)
      if (tag == core + suffix) {
        if (plain_scalar_kind(at.node.Scalar()) != kind) fail(at, "'" + at.node.Scalar() + "' is not " + kind_name(kind));
        return kind;
      }
    fail(at, "unsupported YAML tag '" + tag + "' (only plain values, quoted strings and the core !!str !!int !!float !!bool tags)");
  }

  std::string describe(const Located& at, ScalarKind kind) const {
    if (kind == ScalarKind::null) return "null (no value)";
    return "'" + at.node.Scalar() + "' (" + kind_name(kind) + ")";
  }

  std::int64_t integer(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind != ScalarKind::integer) fail(at, "expected an integer, got " + describe(at, kind));
    std::string text = at.node.Scalar();
    if (text[0] == '+') text.erase(0, 1);
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) fail(at, "integer '" + at.node.Scalar() + "' is out of range");
    return value;
  }

  std::uint64_t unsigned_integer(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind != ScalarKind::integer) fail(at, "expected an integer, got " + describe(at, kind));
    std::string text = at.node.Scalar();
    if (text[0] == '-') fail(at, "must be >= 0, got " + text);
    if (text[0] == '+') text.erase(0, 1);
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) fail(at, "'" + at.node.Scalar() + "' is out of range (0 to 2^64-1)");
    return value;
  }

  double real(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind == ScalarKind::integer) {
      const std::int64_t i = integer(at);
      if (static_cast<std::int64_t>(static_cast<double>(i)) != i)
        fail(at, "integer " + at.node.Scalar() + " is not exactly representable as a float; write it as a float");
      return static_cast<double>(i);
    }
    if (kind != ScalarKind::real) fail(at, "expected a float, got " + describe(at, kind));
    std::string text = at.node.Scalar();
    const bool negative = text[0] == '-';
    if (text[0] == '+' || text[0] == '-') text.erase(0, 1);
    if (text[0] == '.' && (text[1] == 'i' || text[1] == 'I')) return negative ? -INFINITY : INFINITY;
    if (text[0] == '.' && (text[1] == 'n' || text[1] == 'N')) return std::numeric_limits<double>::quiet_NaN();
    double value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) fail(at, "float '" + at.node.Scalar() + "' is out of range");
    return negative ? -value : value;
  }

  bool boolean(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind != ScalarKind::boolean) fail(at, "expected true or false, got " + describe(at, kind));
    return at.node.Scalar()[0] == 't' || at.node.Scalar()[0] == 'T';
  }

  std::string string(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind != ScalarKind::string) fail(at, "expected a string, got " + describe(at, kind));
    return at.node.Scalar();
  }

  std::string string_or_number(const Located& at) const {
    const ScalarKind kind = scalar_kind(at);
    if (kind == ScalarKind::integer || kind == ScalarKind::real) return at.node.Scalar();
    return string(at);
  }

  // One value of a parameter, typed and checked by its spec.
  ParamValue param_value(const ParamSpec& spec, const Located& at) const {
    ParamValue value;
    switch (spec.type) {
      case ParamType::integer: value = integer(at); break;
      case ParamType::real: value = real(at); break;
      case ParamType::string: value = spec.numbers_as_text ? string_or_number(at) : string(at); break;
      case ParamType::boolean: value = boolean(at); break;
    }
    if (const auto* s = std::get_if<std::string>(&value); s && !spec.allowed.empty() &&
        std::find(spec.allowed.begin(), spec.allowed.end(), *s) == spec.allowed.end())
      fail(at, "unknown " + spec.name + " '" + *s + "'" + did_you_mean(*s, spec.allowed) + "; allowed: " + join(spec.allowed));
    if (spec.type == ParamType::integer || spec.type == ParamType::real) {
      const double x = spec.type == ParamType::integer ? static_cast<double>(std::get<std::int64_t>(value)) : std::get<double>(value);
      if (spec.min && !(x >= *spec.min)) fail(at, "must be >= " + to_string(*spec.min) + ", got " + at.node.Scalar());
      if (spec.max && !(x <= *spec.max)) fail(at, "must be <= " + to_string(*spec.max) + ", got " + at.node.Scalar());
    }
    if (spec.check)
      if (const std::string problem = spec.check(value); !problem.empty()) fail(at, problem);
    return value;
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// Whether the quoted scalar that starts at byte `start` of the source (after its tag or
// anchor, if any) is closed by its quote: yaml-cpp 0.7 ends one that never closes at the
// end of the file without an error. Escapes: \" in double quotes, '' in single quotes.
bool quoted_scalar_closes(const std::string& text, std::size_t start) {
  std::size_t i = start;
  // Properties before the content: !tag, &anchor, each followed by blanks or line breaks.
  while (i < text.size() && (text[i] == '!' || text[i] == '&')) {
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  }
  if (i >= text.size() || (text[i] != '"' && text[i] != '\'')) return true;  // not quoted
  const char quote = text[i];
  for (++i; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') ++i;  // skip the escaped character
    else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') ++i;  // '' is one quote
      else return true;
    }
  }
  return false;
}

// Checks every node of the document before any value is read: only the YAML 1.2 core
// tags (!!str !!int !!float !!bool !!null on values, !!seq !!map on lists and mappings;
// a scalar with !!int, !!float, !!bool or !!null must read as one), quoted scalars closed
// in the source, and no aliases that expand to more nodes than the file could spell out.
class NodeChecker {
 public:
  NodeChecker(const Reader& reader, const std::string& text)
      : reader_(reader), text_(text), bom_(text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0),
        budget_(2 * text.size() + 16) {}

  void check(const YAML::Node& node, const YAML::Mark& fallback, const std::string& path) {
    const YAML::Mark mark = node.Mark().is_null() ? fallback : node.Mark();
    if (budget_-- == 0)
      reader_.fail(YAML::Mark{}, "yaml", "aliases expand to more values than the file holds; write the values out");
    const std::string& tag = node.Tag();
    const std::string core = "tag:yaml.org,2002:";
    const auto refuse = [&] {
      const std::string shown = tag.rfind(core, 0) == 0 ? "!!" + tag.substr(core.size()) : tag;
      reader_.fail(mark, path, "unsupported YAML tag '" + shown +
                                   "' (only the core !!str !!int !!float !!bool !!null on values and !!seq !!map on "
                                   "lists and mappings)");
    };
    if (node.IsScalar()) {
      if (tag != "?" && tag != "!" && tag != core + "str") {
        const std::pair<const char*, ScalarKind> typed[] = {
            {"int", ScalarKind::integer}, {"float", ScalarKind::real}, {"bool", ScalarKind::boolean}, {"null", ScalarKind::null}};
        const auto it = std::find_if(std::begin(typed), std::end(typed), [&](const auto& t) { return tag == core + t.first; });
        if (it == std::end(typed)) refuse();
        if (plain_scalar_kind(node.Scalar()) != it->second)
          reader_.fail(mark, path, "'" + node.Scalar() + "' is not " + kind_name(it->second));
      }
      if (tag != "?" && !node.Mark().is_null() && !quoted_scalar_closes(text_, bom_ + node.Mark().pos))
        reader_.fail(mark, "yaml", "syntax error: quoted string not closed (it runs to the end of the file)");
    } else if (node.IsSequence()) {
      if (tag != "?" && tag != core + "seq") refuse();
      std::size_t index = 0;
      for (const YAML::Node& element : node) check(element, mark, path + "[" + std::to_string(index++) + "]");
    } else if (node.IsMap()) {
      if (tag != "?" && tag != core + "map") refuse();
      for (const auto& kv : node) {
        const std::string key_path =
            kv.first.IsScalar() ? (path == "config" ? "" : path + ".") + kv.first.Scalar() : path;
        check(kv.first, mark, key_path);
        check(kv.second, kv.first.Mark().is_null() ? mark : kv.first.Mark(), key_path);
      }
    } else if (!tag.empty() && tag != "?" && tag != "!" && tag != core + "null") {
      refuse();
    }
  }

 private:
  const Reader& reader_;
  const std::string& text_;
  std::size_t bom_, budget_;
};

// One varied dimension of the grid: a grid key, or all zip keys together.
struct Axis {
  std::vector<std::string> params;                 // one for a grid key; the zip keys for zip
  std::vector<std::vector<ParamValue>> values;     // [param][index]
  std::size_t size() const { return values.front().size(); }
};

const ParamSpec* find_param(const Experiment& e, const std::string& name) {
  for (const ParamSpec& p : e.params)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> param_names(const Experiment& e) {
  std::vector<std::string> names;
  for (const ParamSpec& p : e.params) names.push_back(p.name);
  return names;
}

void check_output_directory(const std::string& output, const std::function<void(const std::string&)>& fail) {
  namespace fs = std::filesystem;
  const fs::path path(output);
  if (output.empty()) fail("output path is empty");
  const fs::path directory = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) fail("directory '" + directory.string() + "' of output '" + output + "' does not exist");
  if (fs::is_directory(path, ec)) fail("output '" + output + "' is a directory");
}

// Where each YAML document of a text starts and its top node: where, and whether it is
// null (an empty document).
struct DocumentOutline {
  YAML::Mark start, node;
  bool null = false;
};

class Outliner : public YAML::EventHandler {
 public:
  std::vector<DocumentOutline> documents;

  void OnDocumentStart(const YAML::Mark& mark) override {
    documents.push_back({mark, YAML::Mark::null_mark(), false});
    depth_ = 0;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    node(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark, false);
    ++depth_;
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark, false);
    ++depth_;
  }
  void OnMapEnd() override { --depth_; }

 private:
  void node(const YAML::Mark& mark, bool null) {
    if (depth_ == 0) documents.back().node = mark, documents.back().null = null;
  }
  int depth_ = 0;
};

// The text's first YAML documents, three at most (a config is one). Not YAML::LoadAll: at
// a ',' where a document would start, yaml-cpp 0.7 consumes nothing and yields an empty
// document there, again and again, allocating until memory runs out (its issue #1040).
// A document that starts where the one before started is that loop: a syntax error.
std::vector<DocumentOutline> outline_documents(const std::string& text) {
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  Outliner outliner;
  auto& d = outliner.documents;
  while (d.size() < 3 && parser.HandleNextDocument(outliner)) {
    const YAML::Mark start = d.back().start;
    if (d.size() >= 2 && start.pos == d[d.size() - 2].start.pos)
      throw YAML::ParserException(start, "unexpected '" + text.substr(static_cast<std::size_t>(start.pos), 1) + "'");
  }
  return d;
}

}  // namespace

SweepPlan parse_plan(const std::string& config_text, const std::string& config_path,
                     const std::optional<std::string>& output_override, bool check_output_folder) {
  const Reader reader(config_path);
  SweepPlan plan;
  plan.config_path = config_path;
  plan.config_text = config_text;

  if (const auto problem = check_characters(config_text))
    throw config_error(config_path, problem->line, problem->column, "yaml", problem->message);
  std::vector<DocumentOutline> documents;
  YAML::Node root;
  try {
    documents = outline_documents(config_text);
    root = YAML::Load(config_text);  // the first document
  } catch (const YAML::ParserException& e) {
    throw config_error(config_path, e.mark.line + 1, e.mark.column + 1, "yaml", "syntax error: " + e.msg);
  }
  const YAML::Mark top{};  // line 0, column 0: the top of the file
  if (documents.size() > 1) {
    // At the second document's content; an empty one (a trailing ---) at the last line
    // that starts with a document marker.
    YAML::Mark mark = documents[1].node;
    if (documents[1].null || mark.is_null()) {
      mark = top;
      int line = 0;
      for (std::size_t start = 0; start < config_text.size(); ++line) {
        if (config_text.compare(start, 3, "---") == 0 || config_text.compare(start, 3, "...") == 0) mark.line = line;
        const std::size_t end = config_text.find('\n', start);
        start = end == std::string::npos ? config_text.size() : end + 1;
      }
    }
    reader.fail(mark, "yaml", "syntax error: a second YAML document (after '---' or '...'); a config is one document");
  }
  NodeChecker(reader, config_text).check(root, top, "config");
  if (!root.IsMap()) reader.fail(top, "config", "expected a mapping with at least 'experiment:' and usually 'grid:'");

  const std::vector<std::string> known_keys = {"experiment", "run", "description", "seed", "replicas", "output", "grid", "zip"};
  std::map<std::string, Located> given;
  for (auto& [name, at] : reader.entries(Located{root, top, ""})) {
    if (std::find(known_keys.begin(), known_keys.end(), name) == known_keys.end())
      reader.fail(at.key_mark, name,
                  "unknown key '" + name + "'" + did_you_mean(name, known_keys) + "; known keys: " + join(known_keys));
    given.emplace(name, at);
  }
  const auto get = [&](const std::string& name) -> const Located* {
    const auto it = given.find(name);
    return it == given.end() ? nullptr : &it->second;
  };

  const Located* experiment_at = get("experiment");
  if (!experiment_at) reader.fail(top, "experiment", "missing: name the experiment to run (sweep --list shows them)");
  const std::string experiment_name = reader.string(*experiment_at);
  const Located* run_at = get("run");
  if (experiment_name == kPythonExperiment) {
    if (!run_at) reader.fail(experiment_at->key_mark, "run", "missing: experiment: python needs run: PATH.py:FUNCTION or package.module:FUNCTION");
    // Relative to the config's folder, so that a config and its script travel together and
    // the run does not depend on the working directory.
    const std::string folder = std::filesystem::absolute(config_path).parent_path().string();
    try {
      plan.python_experiment = load_python_experiment(reader.string(*run_at), folder);
    } catch (const PythonLoadError& e) {
      reader.fail(*run_at, e.what());
    }
    plan.experiment = plan.python_experiment.get();
  } else {
    if (run_at) reader.fail(run_at->key_mark, "run", "only with experiment: python (it names the Python callable to run)");
    plan.experiment = find_experiment(experiment_name);
  }
  if (!plan.experiment) {
    std::vector<std::string> names;
    for (const Experiment& e : experiments()) names.push_back(e.name);
    names.push_back(kPythonExperiment);
    reader.fail(*experiment_at, "unknown experiment '" + experiment_name + "'" + did_you_mean(experiment_name, names) +
                                    "; known: " + join(names));
  }
  const Experiment& experiment = *plan.experiment;

  if (const Located* at = get("description")) {
    if (!at->node.IsNull() && !at->node.IsScalar()) reader.fail(*at, "expected text");
    plan.description = at->node.IsNull() ? "" : at->node.Scalar();
  }
  if (const Located* at = get("seed")) plan.seed = reader.unsigned_integer(*at);
  if (const Located* at = get("replicas")) {
    const std::int64_t replicas = reader.integer(*at);
    if (replicas < 1) reader.fail(*at, "must be >= 1, got " + std::to_string(replicas));
    if (static_cast<std::uint64_t>(replicas) > kMaxRuns)
      reader.fail(*at, "must be <= " + std::to_string(kMaxRuns) + " (the limit on runs per config)");
    plan.replicas = static_cast<std::uint32_t>(replicas);
  }

  // The config's own output is checked even when -o replaces it: a config that only runs
  // with -o is broken. Its directory matters only when it is used.
  const Located* output_at = get("output");
  if (output_at && reader.string(*output_at).empty()) reader.fail(*output_at, "output path is empty");
  const auto check_output = [&](const std::string& output, const std::function<void(const std::string&)>& fail) {
    if (check_output_folder) check_output_directory(output, fail);
  };
  if (output_override) {
    plan.output = *output_override;
    check_output(plan.output, [](const std::string& m) { throw InputError("sweep: -o: " + m); });
  } else if (const Located* at = output_at) {
    plan.output = reader.string(*at);
    check_output(plan.output, [&](const std::string& m) { reader.fail(*at, m); });
  } else {
    plan.output = "results/" + std::filesystem::path(config_path).stem().string() + ".h5";
    check_output(plan.output, [&](const std::string& m) {
      reader.fail(top, "output", "default output: " + m + "; create it, set 'output:' or pass -o");
    });
  }

  // Grid and zip: the axes, validated value by value.
  std::vector<Axis> axes;
  std::map<std::string, const Located*> grid_keys;
  std::vector<std::pair<std::string, Located>> grid_entries, zip_entries;
  const Located* grid_at = get("grid");
  const Located* zip_at = get("zip");
  const auto unknown_param = [&](const Located& at, const std::string& name) {
    reader.fail(at.key_mark, at.path,
                "unknown parameter '" + name + "' of experiment '" + experiment.name + "'" +
                    did_you_mean(name, param_names(experiment)) + "; its parameters: " + join(param_names(experiment)));
  };
  const auto list_values = [&](const ParamSpec& spec, const Located& at) {
    std::vector<ParamValue> values;
    std::size_t index = 0;
    for (const YAML::Node& element : at.node) {
      const YAML::Mark mark = element.IsNull() || element.Mark().is_null() ? at.mark : element.Mark();
      values.push_back(reader.param_value(spec, Located{element, mark, at.path + "[" + std::to_string(index++) + "]"}));
    }
    if (values.empty()) reader.fail(at, "empty list: give at least one value");
    return values;
  };
  if (grid_at && !grid_at->node.IsNull()) {
    if (!grid_at->node.IsMap()) reader.fail(*grid_at, "expected a mapping of parameter: value or [values]");
    grid_entries = reader.entries(*grid_at);
  }
  for (const auto& [name, at] : grid_entries) {
    const ParamSpec* spec = find_param(experiment, name);
    if (!spec) unknown_param(at, name);
    if (at.node.IsMap()) reader.fail(at, "expected a value or a list of values, got a mapping");
    Axis axis{{name}, {at.node.IsSequence() ? list_values(*spec, at) : std::vector<ParamValue>{reader.param_value(*spec, at)}}};
    axes.push_back(std::move(axis));
    grid_keys[name] = &at;
  }
  if (zip_at && !zip_at->node.IsNull()) {
    if (!zip_at->node.IsMap()) reader.fail(*zip_at, "expected a mapping of parameter: [values]");
    zip_entries = reader.entries(*zip_at);
  }
  if (!zip_entries.empty()) {
    Axis zipped;
    const std::pair<std::string, Located>* first = nullptr;
    for (const auto& entry : zip_entries) {
      const auto& [name, at] = entry;
      const ParamSpec* spec = find_param(experiment, name);
      if (!spec) unknown_param(at, name);
      if (const auto it = grid_keys.find(name); it != grid_keys.end())
        reader.fail(at, "'" + name + "' is also in grid (line " + std::to_string(it->second->key_mark.line + 1) +
                            "); vary each parameter in one place");
      if (!at.node.IsSequence()) reader.fail(at, "zip values must be lists (a fixed value belongs under grid)");
      std::vector<ParamValue> values = list_values(*spec, at);
      if (first && values.size() != zipped.size())
        reader.fail(at, "has " + std::to_string(values.size()) + " values but " + first->second.path + " has " +
                            std::to_string(zipped.size()) + "; zip lists must have equal lengths");
      if (!first) first = &entry;
      zipped.params.push_back(name);
      zipped.values.push_back(std::move(values));
    }
    axes.push_back(std::move(zipped));
  }

  // Size: points x replicas, computed without overflow.
  const YAML::Mark grid_mark = grid_at ? grid_at->key_mark : zip_at ? zip_at->key_mark : top;
  const std::string grid_path = grid_at ? "grid" : zip_at ? "zip" : "config";
  std::uint64_t n_points = 1;  // saturates just above the limit
  for (const Axis& axis : axes) n_points = std::min<std::uint64_t>(n_points * axis.size(), kMaxRuns + 1);
  if (n_points * plan.replicas > kMaxRuns)
    reader.fail(grid_mark, grid_path,
                (n_points > kMaxRuns ? "more than " + std::to_string(kMaxRuns) + " points"
                                     : std::to_string(n_points) + " points") +
                    " x " + std::to_string(plan.replicas) + " replicas is over the limit of " +
                    std::to_string(kMaxRuns) + " runs per config; split the sweep into several configs");

  // Expansion: the last axis varies fastest. Each point is checked as a whole, and the
  // traces it will record are counted against the limits.
  std::map<std::string, ParamValue> defaults;
  for (const ParamSpec& spec : experiment.params) defaults[spec.name] = spec.default_value;
  const auto point_problem = [&](std::uint64_t p, const Params& point, const std::string& problem) {
    std::string where;
    for (const Axis& axis : axes)
      for (const std::string& name : axis.params) where += (where.empty() ? "" : ", ") + name + "=" + to_string(point.at(name));
    reader.fail(grid_mark, grid_path, "point " + std::to_string(p) + (where.empty() ? "" : " (" + where + ")") + ": " + problem);
  };
  // At most kMaxRuns x kMaxTraceSamplesPerRun = 10^13: no overflow.
  std::uint64_t trace_values = 0;
  plan.points.reserve(n_points);
  for (std::uint64_t p = 0; p < n_points; ++p) {
    std::map<std::string, ParamValue> values = defaults;
    std::uint64_t rest = p;
    for (auto axis = axes.rbegin(); axis != axes.rend(); ++axis) {
      const std::size_t index = rest % axis->size();
      rest /= axis->size();
      for (std::size_t k = 0; k < axis->params.size(); ++k) values[axis->params[k]] = axis->values[k][index];
    }
    Params point(std::move(values));
    if (experiment.check_point)
      if (const std::string problem = experiment.check_point(point); !problem.empty()) point_problem(p, point, problem);
    if (experiment.trace_length) {
      const auto samples = static_cast<std::uint64_t>(std::max<std::int64_t>(0, experiment.trace_length(point)));
      if (samples > kMaxTraceSamplesPerRun)
        point_problem(p, point, "a run records " + std::to_string(samples) + " trace samples, over the limit of " +
                                    std::to_string(kMaxTraceSamplesPerRun) + " per run; record fewer (a larger trace_every or hist_every, fewer steps)");
      trace_values += samples * plan.replicas;
      plan.trace_lengths.push_back(static_cast<std::int64_t>(samples));
    }
    plan.points.push_back(std::move(point));
  }
  if (trace_values > kMaxTraceValues)
    reader.fail(grid_mark, grid_path,
                "the traces of this sweep would hold " + std::to_string(trace_values) +
                    " values (points x replicas x samples per run), over the limit of " + std::to_string(kMaxTraceValues) +
                    " (2 GiB of float64) per config; record fewer (a larger trace_every or hist_every, fewer steps) or split the sweep");
  return plan;
}

SweepPlan load_plan(const std::string& config_path, const std::optional<std::string>& output_override,
                    bool check_output_folder) {
  const auto cannot_read = [&](int error) { return InputError(config_path + ": config: cannot read: " + std::strerror(error)); };
  const int fd = open(config_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw cannot_read(errno);
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  struct stat info {};
  if (fstat(fd, &info) != 0) throw cannot_read(errno);
  if (S_ISDIR(info.st_mode)) throw cannot_read(EISDIR);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw cannot_read(errno);
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return parse_plan(text, config_path, output_override, check_output_folder);
}

}  // namespace roundoff::sweep
