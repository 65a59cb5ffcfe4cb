// Every name of emu's tables (emu/names.hpp) is what the front ends say: each table's
// names are unique and look themselves up, and the calculator's help texts and
// configs/README.md list every one (tests/python/test_core.py checks Python's lists).
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "emu/amp.hpp"
#include "emu/block.hpp"
#include "emu/format.hpp"
#include "emu/mma.hpp"
#include "emu/status.hpp"
#include "emu/unit.hpp"

namespace {

std::string file_text(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

// `name` in `text` as a word of its own (not inside a longer name such as fp8-e4m3fnuz).
bool has_word(const std::string& text, const std::string& name) {
  auto part_of_name = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  for (auto at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const bool starts = at == 0 || !part_of_name(text[at - 1]);
    const std::size_t end = at + name.size();
    const bool ends = end == text.size() || !part_of_name(text[end]) ||
                      (text[end] == '-' && (end + 1 == text.size() || !part_of_name(text[end + 1])));
    if (starts && ends) return true;
  }
  return false;
}

// A table's rows: unique non-empty names with help, each found by its name; an unknown
// name's message lists them all.
template <class T, class ByName>
std::vector<std::string> checked_names(emu::NameTable<T> table, ByName by_name) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const emu::Named<T>& row : table) {
    INFO(row.name);
    CHECK(std::string(row.name).size() > 0);
    CHECK(std::string(row.help).size() > 0);
    CHECK(seen.insert(row.name).second);
    CHECK(by_name(row.name) == row.value);
    names.emplace_back(row.name);
  }
  try {
    (void)by_name("no-such-name");
    FAIL("an unknown name was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("(known: " + emu::name_list(table) + ")"));
  }
  return names;
}

}  // namespace

TEST_CASE("every table's names are unique, look themselves up and are listed by the error", "[names]") {
  checked_names(emu::rounding_table(), emu::rounding_by_name);
  checked_names(emu::overflow_table(), emu::overflow_by_name);
  checked_names(emu::tininess_table(), emu::tininess_by_name);
  checked_names(emu::exception_mode_table(), emu::exception_mode_by_name);
  checked_names(emu::rng_kind_table(), emu::rng_kind_by_name);
  checked_names(emu::flag_table(), emu::flag_by_name);
  checked_names(emu::scale_rule_table(), emu::scale_rule_by_name);
  checked_names(emu::partials_type_table(), emu::partials_type_by_name);
  checked_names(emu::alignment_rounding_table(), emu::alignment_rounding_by_name);
  checked_names(emu::unit_table(), emu::unit_kind_by_name);
  checked_names(emu::block_format_table(), [](std::string_view n) { return &emu::block_format_by_name(n); });
  for (const auto& row : emu::format_table()) {
    INFO(row.name);
    CHECK(row.value().name() == row.name);  // the preset carries the table's name
    CHECK(emu::format_by_name(row.name) == row.value());
  }
  // The older nullptr-terminated lists are the tables'.
  std::size_t i = 0;
  for (const auto& row : emu::unit_table()) CHECK(std::string(emu::unit_names()[i++]) == row.name);
  CHECK(emu::unit_names()[i] == nullptr);
  i = 0;
  for (const auto& row : emu::format_table()) CHECK(std::string(emu::format_names()[i++]) == row.name);
  CHECK(emu::format_names()[i] == nullptr);
  i = 0;
  for (const auto& row : emu::block_format_table()) CHECK(std::string(emu::block_format_names()[i++]) == row.name);
  CHECK(emu::block_format_names()[i] == nullptr);
}

TEST_CASE("the calculator's help and configs/README.md name every format, block format, unit and mode", "[names]") {
  const std::string main_help = emu::cli::help_text(""), dot_help = emu::cli::help_text("dot");
  const std::string quantize_help = emu::cli::help_text("quantize"), round_help = emu::cli::help_text("round");
  const std::string readme = file_text(CONFIGS_README);
  for (const auto& row : emu::format_table()) {
    INFO(row.name);
    CHECK(has_word(main_help, row.name));
    CHECK(has_word(readme, row.name));
  }
  for (const auto& row : emu::block_format_table()) {
    INFO(row.name);
    CHECK(has_word(main_help, row.name));
    CHECK(has_word(quantize_help, row.name));
    CHECK_THAT(quantize_help, Catch::Contains(row.help));
    CHECK(has_word(readme, row.name));
  }
  for (const auto& row : emu::unit_table()) {
    INFO(row.name);
    CHECK(has_word(dot_help, row.name));
    CHECK_THAT(dot_help, Catch::Contains(row.help));
    CHECK(has_word(readme, row.name));
  }
  for (const auto& row : emu::rounding_table()) {
    INFO(row.name);
    CHECK(has_word(main_help, row.name));
    CHECK(has_word(round_help, row.name));
    CHECK(has_word(readme, row.name));
  }
  for (const auto& row : emu::scale_rule_table()) {
    INFO(row.name);
    CHECK(has_word(quantize_help, row.name));
    CHECK(has_word(readme, row.name));
  }
  for (const auto& row : emu::overflow_table()) CHECK(has_word(round_help, row.name));
  for (const auto& row : emu::tininess_table()) CHECK(has_word(round_help, row.name));
}
