// Numbers as the emu calculator reads and prints them: exact parsing of decimal and
// hexadecimal text (so that a literal is rounded once into a format, never through
// double first), and the printed forms of results (JSON round-trip doubles, bit
// patterns, shortest decimals that read back to the same format value).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "emu/format.hpp"
#include "emu/round.hpp"

namespace emu::cli {

// Malformed text where a number was expected; what() says why (without the input,
// which the caller names together with its place).
class NumberError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses one number, the whole of `text` (no surrounding spaces):
//   decimal    [+-] digits [. digits] [e [+-] digits]    (or [+-] . digits ...)
//   hex-float  [+-] 0x hexdigits [. hexdigits] [p [+-] digits]
//   inf, infinity, nan, with an optional sign, in any letter case.
// The result is the exact value as emu::round() takes it: hi = the nearest double (ties
// to even, as strtod), lo = the residual x - hi (times 2^lo_scale when it lies below
// double's normal range) rounded to the nearest double, except that an inexact residual
// is never left on a power of two (it is stepped one double toward the exact value:
// emu/round.hpp), so every format and mode, fp64 included, rounds x once. Values from
// DBL_MAX + half its ulp up to 2^1024 have hi = DBL_MAX; from 2^1024 on, beyond_double.
// Nonzero values up to half the least double (2^-1075) and from 2^-1127 (hex) or 10^-339
// (decimal) up have hi = +-2^-1074 and lo = x - hi (so 2^-1075 is a tie and sr sees its
// probability); nonzero values below that have hi = +-0 and lo = +-2^-1074 (only the
// sign: an sr probability under 2^-52 is taken as zero).
// Throws NumberError for anything else, and for text longer than kMaxNumberLength (an
// exact double needs at most 1,100 or so characters; the limit bounds the big-integer
// work, which grows with the square of the length).
inline constexpr std::size_t kMaxNumberLength = 10000;
Exact parse_number(std::string_view text);

// The value as a JSON number that reads back to the same double (the shortest %.Ng
// that strtod returns unchanged), or the JSON strings "inf", "-inf", "nan".
std::string json_number(double value);

// The bit pattern as lower-case hex with 0x, zero-padded to the format's width
// (fp16: 4 digits, tf32's 19 bits: 5 digits).
std::string hex_bits(const Format& f, std::uint64_t bits);

// For people: the shortest decimal d such that rounding d (rne, exactly) into f gives
// back `value` (a value of f): 0.00048828125 in fp16 prints as 0.0004883. Non-finite
// values print as inf, -inf, nan, -nan (a NaN with its sign bit set, as its bits show;
// JSON keeps the contract's single "nan").
std::string shortest_decimal(const Format& f, double value);

// Rounds x into f with round-to-nearest-even (no random source needed).
double round_nearest(const Format& f, const Exact& x);

// JSON string literal (quotes and escapes).
std::string json_string(std::string_view s);

}  // namespace emu::cli
