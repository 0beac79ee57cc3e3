// Deterministic elementary functions: exp, log, tanh, sin, cos, erf, erfc.
//
// Why not libm: glibc's exp/log/tanh differ between versions and between CPU dispatch
// paths (FMA vs non-FMA code), so a libm result that reaches a tensor makes the bits
// depend on the machine. These routines use only IEEE-754 double +, -, *, / (each
// exactly rounded) and bit manipulation, evaluated in a fixed order, and the project
// compiles with -ffp-contract=off, so every build on every x86-64 machine gives the same
// bits. They are accurate to about 1e-15 relative in double, so after rounding to fp32 they
// are within 1 ulp of the true value (usually correctly rounded).
//
// Range reduction uses Cody-Waite splits whose high parts have trailing zero bits, so
// k * HI is exact for the |k| that occur here.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace harness::numerics {

namespace detail {

// 2^k as a double for k in [-1022, 1023] (normal range), built from its bit pattern.
constexpr double pow2_normal(int k) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

// x * 2^k for any int k, in two exact steps when 2^k alone would leave the normal range.
constexpr double scale_by_pow2(double x, int k) {
  if (k > 1023) {
    x *= pow2_normal(1023);
    k -= 1023;
    if (k > 1023) k = 1023;
  } else if (k < -1022) {
    x *= pow2_normal(-1022);
    k += 1022;
    if (k < -1022) k = -1022;
  }
  return x * pow2_normal(k);
}

// Round to nearest integer, ties away from zero, without libm.
constexpr double round_half_away(double x) {
  return x >= 0 ? static_cast<double>(static_cast<std::int64_t>(x + 0.5))
                : static_cast<double>(static_cast<std::int64_t>(x - 0.5));
}

inline constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 0x3FE62E42FEE00000
inline constexpr double kLn2Lo = 1.90821492927058770002e-10;
inline constexpr double kLog2e = 1.44269504088896338700e+00;

}  // namespace detail

constexpr double det_exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -745.1332191019412) return 0.0;
  const double k = detail::round_half_away(x * detail::kLog2e);
  const double r = (x - k * detail::kLn2Hi) - k * detail::kLn2Lo;  // |r| <= ~0.347
  // Taylor series of e^r to degree 13: truncation error < 4e-18 on |r| <= 0.35.
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return detail::scale_by_pow2(p, static_cast<int>(k));
}

// Natural logarithm; x <= 0 gives -inf (x == 0) or NaN (x < 0), like log().
constexpr double det_log(double x) {
  if (x != x || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  int e = 0;
  if (x < 2.2250738585072014e-308) {  // subnormal: make it normal first
    x *= 18014398509481984.0;          // 2^54
    e = -54;
  }
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  e += static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  double m = std::bit_cast<double>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  if (m > 1.4142135623730951) {  // keep m in [sqrt(1/2), sqrt(2))
    m *= 0.5;
    e += 1;
  }
  // log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716: series to s^25.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 25.0;
  for (int n = 23; n >= 1; n -= 2) p = p * s2 + 1.0 / n;
  const double log_m = 2.0 * s * p;
  const double de = static_cast<double>(e);
  return (de * detail::kLn2Hi + log_m) + de * detail::kLn2Lo;
}

constexpr double det_tanh(double x) {
  if (x != x) return x;
  const double ax = x < 0 ? -x : x;
  double t;
  if (ax > 22.0) {
    t = 1.0;
  } else if (ax < 1.0 / 1024.0) {
    const double x2 = ax * ax;  // series: x - x^3/3 + 2x^5/15, error < x^7 * 0.054
    t = ax - ax * x2 * (1.0 / 3.0) + ax * x2 * x2 * (2.0 / 15.0);
  } else {
    const double e2 = det_exp(2.0 * ax);
    t = 1.0 - 2.0 / (e2 + 1.0);
  }
  return x < 0 ? -t : t;
}

namespace detail {
inline constexpr double kPiO2Hi = 1.57079632673412561417e+00;  // trailing zero bits
inline constexpr double kPiO2Mid = 6.07710050650619224932e-11;
inline constexpr double kPiO2Lo = 2.02226624879595063154e-21;
inline constexpr double k2OverPi = 6.36619772367581382433e-01;

// sin and cos on |r| <= pi/4 (Taylor to r^19 / r^18: error < 1e-17).
constexpr double sin_kernel(double r) {
  const double r2 = r * r;
  double p = -1.0 / 121645100408832000.0;  // -1/19!
  p = p * r2 + 1.0 / 355687428096000.0;
  p = p * r2 - 1.0 / 1307674368000.0;
  p = p * r2 + 1.0 / 6227020800.0;
  p = p * r2 - 1.0 / 39916800.0;
  p = p * r2 + 1.0 / 362880.0;
  p = p * r2 - 1.0 / 5040.0;
  p = p * r2 + 1.0 / 120.0;
  p = p * r2 - 1.0 / 6.0;
  return r + r * r2 * p;
}
constexpr double cos_kernel(double r) {
  const double r2 = r * r;
  double p = 1.0 / 6402373705728000.0;  // 1/18!
  p = p * r2 - 1.0 / 20922789888000.0;
  p = p * r2 + 1.0 / 87178291200.0;
  p = p * r2 - 1.0 / 479001600.0;
  p = p * r2 + 1.0 / 3628800.0;
  p = p * r2 - 1.0 / 40320.0;
  p = p * r2 + 1.0 / 720.0;
  p = p * r2 - 1.0 / 24.0;
  p = p * r2 + 0.5;
  return 1.0 - r2 * p;
}
// Reduce x to r in [-pi/4, pi/4] with x = r + n*pi/2; good for |x| < 2^20.
constexpr double reduce_half_pi(double x, int& quadrant) {
  const double n = round_half_away(x * k2OverPi);
  quadrant = static_cast<int>(static_cast<std::int64_t>(n) & 3);
  return ((x - n * kPiO2Hi) - n * kPiO2Mid) - n * kPiO2Lo;
}
}  // namespace detail

// sin and cos for |x| < 2^20 (the harness uses them on [0, 2*pi] and [0, pi]).
constexpr double det_sin(double x) {
  int q = 0;
  const double r = detail::reduce_half_pi(x, q);
  switch (q) {
    case 0: return detail::sin_kernel(r);
    case 1: return detail::cos_kernel(r);
    case 2: return -detail::sin_kernel(r);
    default: return -detail::cos_kernel(r);
  }
}
constexpr double det_cos(double x) {
  int q = 0;
  const double r = detail::reduce_half_pi(x, q);
  switch (q) {
    case 0: return detail::cos_kernel(r);
    case 1: return -detail::sin_kernel(r);
    case 2: return -detail::cos_kernel(r);
    default: return detail::sin_kernel(r);
  }
}

// erf and erfc in double, by the method and coefficients of FDLIBM's s_erf.c (Sun
// Microsystems, 1993: "Permission to use, copy, modify, and distribute this software is
// freely granted, provided that this notice is preserved"): rational fits on [0, 0.84375),
// [0.84375, 1.25) and, for erfc, x*erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2)/S(1/x^2)) beyond;
// its error is below 1 ulp. Its exp is det_exp, so the bits are the same everywhere.
// Exact GELU (docs/canary-files.md, `gelu = "erf"`) needs erfc: relative accuracy of
// 0.5 * x * erfc(-x/sqrt(2)) where x is very negative.
namespace detail {
// Coefficients named as in s_erf.c; each pair of comments is its IEEE bits (high, low).
inline constexpr double kErx = 8.45062911510467529297e-01;   // 3FEB0AC1 60000000
inline constexpr double kEfx8 = 1.02703333676410069053e+00;  // 3FF06EBA 8214DB69
// erf(x) = x + x * P(x^2) / Q(x^2) on |x| < 0.84375
inline constexpr double kPp[] = {1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
                                 -5.77027029648944159157e-03, -2.37630166566501626084e-05};
inline constexpr double kQq[] = {1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02,
                                 5.08130628187576562776e-03, 1.32494738004321644526e-04, -3.96022827877536812320e-06};
// erf(x) = erx + P(x - 1) / Q(x - 1) on 0.84375 <= x < 1.25
inline constexpr double kPa[] = {-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
                                 3.18346619901161753674e-01,  -1.10894694282396677476e-01, 3.54783043256182359371e-02,
                                 -2.16637559486879084300e-03};
inline constexpr double kQa[] = {1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
                                 1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02};
// x * erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) on 1.25 <= x < 1/0.35 (a) and beyond (b)
inline constexpr double kRa[] = {-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
                                 -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
                                 -8.12874355063065934246e+01, -9.81432934416914548592e+00};
inline constexpr double kSa[] = {1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
                                 6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
                                 6.57024977031928170135e+00, -6.04244152148580987438e-02};
inline constexpr double kRb[] = {-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
                                 -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
                                 -4.83519191608651397019e+02};
inline constexpr double kSb[] = {1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
                                 3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
                                 -2.24409524465858183362e+01};

// c[0] + x * (c[1] + x * (... + x * c[N-1])), Horner's order.
template <std::size_t N>
constexpr double horner(const double (&c)[N], double x) {
  double p = c[N - 1];
  for (std::size_t i = N - 1; i-- > 0;) p = p * x + c[i];
  return p;
}

// erfc(x) for 1.25 <= x < 28. z is x with its low 32 bits cleared, so z * z is exact.
constexpr double erfc_tail(double x) {
  const double s = 1.0 / (x * x);
  const bool near = x < 1.0 / 0.35;
  const double ratio = near ? horner(kRa, s) / horner(kSa, s) : horner(kRb, s) / horner(kSb, s);
  const double z = std::bit_cast<double>(std::bit_cast<std::uint64_t>(x) & 0xFFFFFFFF00000000ull);
  return det_exp(-z * z - 0.5625) * det_exp((z - x) * (z + x) + ratio) / x;
}
}  // namespace detail

constexpr double det_erf(double x) {
  if (x != x) return x;
  const double ax = x < 0 ? -x : x;
  if (ax < 0.84375) {
    if (ax < 0x1p-28) return 0.125 * (8.0 * x + detail::kEfx8 * x);
    const double z = x * x;
    return x + x * (detail::horner(detail::kPp, z) / detail::horner(detail::kQq, z));
  }
  double y = 1.0;  // |x| >= 6: erf rounds to +-1
  if (ax < 1.25) {
    const double s = ax - 1.0;
    y = detail::kErx + detail::horner(detail::kPa, s) / detail::horner(detail::kQa, s);
  } else if (ax < 6.0) {
    y = 1.0 - detail::erfc_tail(ax);
  }
  return x < 0 ? -y : y;
}

constexpr double det_erfc(double x) {
  if (x != x) return x;
  const double ax = x < 0 ? -x : x;
  if (ax < 0.84375) {
    if (ax < 0x1p-56) return 1.0 - x;
    const double z = x * x;
    const double y = detail::horner(detail::kPp, z) / detail::horner(detail::kQq, z);
    return x < 0.25 ? 1.0 - (x + x * y) : 0.5 - ((x - 0.5) + x * y);
  }
  if (ax < 1.25) {
    const double s = ax - 1.0;
    const double pq = detail::horner(detail::kPa, s) / detail::horner(detail::kQa, s);
    return x >= 0 ? (1.0 - detail::kErx) - pq : 1.0 + (detail::kErx + pq);
  }
  if (x <= -6.0) return 2.0;  // 2 - erfc(|x|) rounds to 2
  if (ax >= 28.0) return 0.0;  // below the smallest double
  const double tail = detail::erfc_tail(ax);
  return x >= 0 ? tail : 2.0 - tail;
}

// fp32 entry point used by kernels: evaluate in double, round once to fp32.
constexpr float det_logf(float x) { return static_cast<float>(det_log(x)); }

// tanh in fp32 as a rational function, branch-free so that it runs on vectors (GELU
// calls it 2M times a step). p(x)/q(x) with odd p of degree 13 and even q of degree 6 on
// x clamped to [-7.90531, 7.90531] (where tanh rounds to +-1 in fp32); |x| < 4e-4 returns
// x. The coefficients are the minimax fit used by Eigen and XLA. Only fp32 * + / and
// selects, in a fixed order, lane by lane: a scalar float and any vector width give the
// same bits. Measured accuracy (tests/unit/det_math_test.cpp): within 4 ulp for |x| <= 3,
// absolute error below 5e-7 everywhere (the fit loses a few ulp of 0.99998 near |x| = 6).
// `Real` is float or a GCC vector of floats (vector_size extension).
template <typename Real>
[[gnu::always_inline]] constexpr Real tanh_rational(Real x) {
  const Real zero = x - x;
  const Real clamp_hi = zero + 7.90531110763549805f, clamp_lo = zero - 7.90531110763549805f;
  const Real clamped = x > clamp_hi ? clamp_hi : (x < clamp_lo ? clamp_lo : x);
  const Real x2 = clamped * clamped;
  Real p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  p = clamped * p;
  Real q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  const Real ratio = p / q;
  const Real magnitude = x < zero ? -x : x;
  return magnitude < zero + 0.0004f ? x : ratio;
}
constexpr float det_tanhf_rational(float x) { return tanh_rational(x); }

// Four, eight and sixteen fp32 lanes (GCC/Clang vector extension). Lane-wise arithmetic on
// them is the same IEEE operation as on a scalar float, so vector and scalar code agree bit
// for bit at every width. Without the ISA in the function's target the compiler splits the
// wide types into 4-lane operations: the bits are the same, only slower
// (engines/kernels/vector_lanes.cpp runs them with their ISA, chosen at run time).
using Floats4 = float __attribute__((vector_size(16)));
using Ints4 = std::int32_t __attribute__((vector_size(16)));
using Floats8 = float __attribute__((vector_size(32)));
using Ints8 = std::int32_t __attribute__((vector_size(32)));
using Floats16 = float __attribute__((vector_size(64)));
using Ints16 = std::int32_t __attribute__((vector_size(64)));
[[gnu::always_inline]] inline std::int32_t float_bits(float x) { return std::bit_cast<std::int32_t>(x); }
[[gnu::always_inline]] inline float bits_float(std::int32_t b) { return std::bit_cast<float>(b); }
// The builtin, not std::bit_cast: a function template that is not inlined would pass a wide
// vector by the baseline ABI into code built for AVX (at -O0 it is not inlined: a crash).
[[gnu::always_inline]] inline Ints4 float_bits(Floats4 x) { return __builtin_bit_cast(Ints4, x); }
[[gnu::always_inline]] inline Floats4 bits_float(Ints4 b) { return __builtin_bit_cast(Floats4, b); }
[[gnu::always_inline]] inline Ints8 float_bits(Floats8 x) { return __builtin_bit_cast(Ints8, x); }
[[gnu::always_inline]] inline Floats8 bits_float(Ints8 b) { return __builtin_bit_cast(Floats8, b); }
[[gnu::always_inline]] inline Ints16 float_bits(Floats16 x) { return __builtin_bit_cast(Ints16, x); }
[[gnu::always_inline]] inline Floats16 bits_float(Ints16 b) { return __builtin_bit_cast(Floats16, b); }

// (t - s + 127) << 23 on fp32 bit patterns, in unsigned arithmetic: it wraps where a signed
// subtraction would overflow (the NaN lanes of exp_poly, whose result is discarded), which
// is undefined behaviour for scalars; the bits are those of two's complement either way.
using Uints4 = std::uint32_t __attribute__((vector_size(16)));
using Uints8 = std::uint32_t __attribute__((vector_size(32)));
using Uints16 = std::uint32_t __attribute__((vector_size(64)));
[[gnu::always_inline]] inline std::int32_t exponent_bits(std::int32_t t, std::int32_t s) {
  return static_cast<std::int32_t>((static_cast<std::uint32_t>(t) - static_cast<std::uint32_t>(s) + 127u) << 23);
}
[[gnu::always_inline]] inline Ints4 exponent_bits(Ints4 t, Ints4 s) {
  return __builtin_bit_cast(Ints4, (__builtin_bit_cast(Uints4, t) - __builtin_bit_cast(Uints4, s) + 127u) << 23);
}
[[gnu::always_inline]] inline Ints8 exponent_bits(Ints8 t, Ints8 s) {
  return __builtin_bit_cast(Ints8, (__builtin_bit_cast(Uints8, t) - __builtin_bit_cast(Uints8, s) + 127u) << 23);
}
[[gnu::always_inline]] inline Ints16 exponent_bits(Ints16 t, Ints16 s) {
  return __builtin_bit_cast(Ints16, (__builtin_bit_cast(Uints16, t) - __builtin_bit_cast(Uints16, s) + 127u) << 23);
}

// e^x in fp32, branch-free for vectors (softmax calls it ~400K times a step): Cody-Waite
// reduction x = n ln2 + r with n rounded to nearest by the 1.5*2^23 shifter (an exact
// IEEE addition, no rounding-mode or libm dependence), a degree-7 polynomial for e^r
// (Cephes expf coefficients), and 2^n built from its bit pattern. Domain: x is clamped
// to [-87.33, 88.0]; below -87.33 the result is 0, NaN stays NaN. Within about 2 ulp of
// the correctly rounded value (tests/unit/det_math_test.cpp measures it).
template <typename Real>
[[gnu::always_inline]] inline Real exp_poly(Real x) {
  const Real zero = x - x;
  const Real lo = zero - 87.3365478515625f, hi = zero + 88.0f, shifter = zero + 12582912.0f;
  const Real xc = x > hi ? hi : (x < lo ? lo : x);
  const Real t = xc * 1.44269504088896341f + shifter;
  const Real n = t - shifter;
  Real r = xc - n * 0.693359375f;  // 0.693359375 has 9 bits: n * it is exact
  r = r - n * -2.12194440e-4f;
  Real y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const Real scale = bits_float(exponent_bits(float_bits(t), float_bits(shifter)));
  const Real result = y * scale;
  return x < lo ? zero : (x != x ? x : result);
}

inline constexpr double kPi = 3.14159265358979311600e+00;

}  // namespace harness::numerics
