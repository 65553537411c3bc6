// Overflow-checked size arithmetic for sizes that come from files or the command line
// (tensor shapes, grid sizes, record sizes, byte counts). Each helper returns nullopt
// instead of wrapping; callers turn that into a Status naming the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <type_traits>

namespace mlakv::checked {

template <class T>
std::optional<T> mul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

template <class T>
std::optional<T> add(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of all factors; nullopt on overflow or a negative factor.
inline std::optional<int64_t> product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(r, f, &r)) return std::nullopt;
  }
  return r;
}

// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1 (which wraps for huge b).
inline std::optional<int64_t> ceil_div(int64_t a, int64_t b) {
  if (a < 0 || b <= 0) return std::nullopt;
  return a / b + (a % b != 0 ? 1 : 0);
}

// A value narrowed to a smaller integer type, or nullopt when it does not fit.
template <class To, class From>
std::optional<To> narrow(From v) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  if constexpr (std::is_signed_v<From> == std::is_signed_v<To>) {
    if (v < static_cast<From>(std::numeric_limits<To>::min()) || v > static_cast<From>(std::numeric_limits<To>::max()))
      return std::nullopt;
  } else if constexpr (std::is_signed_v<From>) {
    if (v < 0 || static_cast<std::make_unsigned_t<From>>(v) > std::numeric_limits<To>::max()) return std::nullopt;
  } else {
    if (v > static_cast<std::make_unsigned_t<To>>(std::numeric_limits<To>::max())) return std::nullopt;
  }
  return static_cast<To>(v);
}

// floor(x) as int64 when x is finite and floor(x) lies in [lo, hi]; nullopt otherwise
// (NaN, inf, 1e20). A plain static_cast of an out-of-range double is undefined.
inline std::optional<int64_t> floor_to_int64(double x, int64_t lo = std::numeric_limits<int64_t>::min(),
                                             int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (!std::isfinite(x)) return std::nullopt;
  const double f = std::floor(x);
  // 2^63 is exactly representable; every double below it converts without overflow.
  if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0)) return std::nullopt;
  const auto v = static_cast<int64_t>(f);
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// A byte count x * unit (x in GiB, MiB, ...) as size_t, when finite, >= 0 and <= max.
inline std::optional<std::size_t> bytes_from_units(double x, double unit,
                                                   std::size_t max = std::numeric_limits<std::size_t>::max() / 2) {
  if (!std::isfinite(x) || x < 0 || !std::isfinite(unit) || unit <= 0) return std::nullopt;
  const double b = std::floor(x * unit);
  if (!std::isfinite(b) || b > static_cast<double>(max)) return std::nullopt;
  return static_cast<std::size_t>(b);
}

}  // namespace mlakv::checked
