// The tables of names: one per kind of name (formats, block formats, units, rounding
// modes, flags, overflow policies, scale rules, ...), each the single source of its
// names, their one-line help and the "known: ..." list of the error for a name it does
// not hold. Every front end (the emu calculator, sweep configs, Python) parses a name
// through its table once, at the border, and passes the typed value on.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace emu {

// One name of a table: the value it stands for, the name, and what it means in one line.
template <class T>
struct Named {
  T value;
  const char* name;
  const char* help;
};

template <class T>
using NameTable = std::span<const Named<T>>;

// Rows of an enum's table in the enum's order, one per value from 0: code that indexes
// by the enum (or lists values in order) relies on it. For static_assert beside a table.
template <class E, std::size_t N>
constexpr bool in_enum_order(const Named<E> (&rows)[N]) {
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(rows[i].value) != i) return false;
  return true;
}

// "a b c": the table's names in order, as the error messages and help texts list them.
template <class T>
std::string name_list(NameTable<T> table, std::string_view separator = " ") {
  std::string s;
  for (const Named<T>& row : table) {
    if (!s.empty()) s += separator;
    s += row.name;
  }
  return s;
}

// The table's names, nullptr-terminated (for the older const char* const* lists).
template <class T>
std::vector<const char*> name_array(NameTable<T> table) {
  std::vector<const char*> names;
  for (const Named<T>& row : table) names.push_back(row.name);
  names.push_back(nullptr);
  return names;
}

// "unknown WHAT 'NAME' (known: KNOWN)" as std::invalid_argument.
[[noreturn]] void throw_unknown_name(std::string_view what, std::string_view name, const std::string& known);

// The row named `name`, or nullptr.
template <class T>
const Named<T>* find_name(NameTable<T> table, std::string_view name) {
  for (const Named<T>& row : table)
    if (name == row.name) return &row;
  return nullptr;
}

// The value named `name`; throws std::invalid_argument "unknown WHAT 'NAME' (known: ...)".
template <class T>
const T& value_by_name(NameTable<T> table, std::string_view name, std::string_view what) {
  if (const Named<T>* row = find_name(table, name)) return row->value;
  throw_unknown_name(what, name, name_list(table));
}

}  // namespace emu
