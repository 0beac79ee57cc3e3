// Rounding-error bounds of ops computed in fp32 through an elementary function whose worst
// case is measured, not derived: a softmax and an attention core (exp), GELU (tanh or erf),
// SiLU and SwiGLU, the mean cross-entropy (exp and log) (docs/oracle.md, "Attention", "The
// attention core at its output", "GELU", "SwiGLU" and "The loss"). As in
// rounding_bounds.h: absolute bounds for one op on its own inputs, the model
// fl(x) = x (1 + d), |d| <= u, with u fp32's 2^-24.
//
// A softmax row p_j = exp(s_j - m) / sum_k exp(s_k - m), m = max s, as every stack the
// harness meets computes it (cpu-ref's kernels, ATen's, Inductor's and XLA's lowering: the
// max, exp of the rounded difference, the sum of the n positive terms in any order, then a
// divide or 1/sum and a multiply), from scores s^_j within delta_j of the exact s_j:
//   eta_j = delta_j + max delta + u z_j / (1 - u),  z_j = (|s_j - m| + delta_j + max delta)(1 + u)
// bounds how far the exponent the kernel takes exp of is from the exact one (the max it
// subtracts is a computed score: shift-invariance makes its error count once more), and
//   |p^_j - p_j| <= (F_j - 1) p_j + 2^-125,
//   F_j = exp(eta_j + max eta) (1 + e) (1 + u)^2 / ((1 - e) (1 - gamma_{n-1}) - n 2^-126)
// with e the exp's relative error (2 u per ulp: an ulp at y is at most 2 u |y|); 2^-125 for
// an exp that fell to the subnormals (the sum is at least exp(0) = 1 within e).
#pragma once

#include <cstdint>
#include <span>

namespace harness::numerics {

// exp's worst case on the Python stacks, in ulps (bench/libm_accuracy.py; docs/oracle.md,
// "Functions as each stack computes them"): over softmax's domain, ATen's CPU kernels under
// each capability (default, AVX2, AVX-512; torch 1.13 and 2.9) and Inductor's within 0.98
// (every 8th input), XLA's CPU exp (torch_xla's and JAX's) 1.0103 over every input. A stack
// measured worse raises it here.
inline constexpr double kStackExpUlps = 1.011;

// GELU's tanh and erf as the stacks compute them, e_f of gelu_output_bound below, in units of
// u = 2^-24, measured the same way: the larger of the function's own worst absolute error
// (over [-10, 10] and [-5, 5]; XLA's CPU approximations the worst, 4.90 u and 6.64 u) and
// GELU's deviation |y^ - y| / (|x| / 2) over |x| in [2^-125, 10] (the function's error as the
// kernel shows it, its roundings included: a kernel may call another erf than torch.erf, as
// torch 2.9's GELU does). The worst, each over every input: the tanh form 7.041 u (XLA's),
// the erf form 12.762 u (torch 2.9's eager kernel).
inline constexpr double kStackGeluTanhError = 7.041 * 0x1p-24;
inline constexpr double kStackGeluErfError = 12.762 * 0x1p-24;

// SiLU's (x sigma(x) = x / (1 + exp(-x)), SwiGLU's) worst relative error on the Python
// stacks, e_s below, in units of u, measured the same way over every x in [-87.33, 20] (less
// |x| < 2^-125, whose result is subnormal): XLA's CPU code 3.387 u, ATen's (torch 1.13 and
// 2.9) and Inductor's 2.926 u. Below x = -87.34 the stacks lose SiLU's value (exp(-x)
// overflows fp32, or XLA's logistic underflows): there the absolute error is below 2^-119.5
// (measured), which the bounds allow apart, as kSiluLost.
inline constexpr double kSiluLost = 0x1p-119;
inline constexpr double kStackSiluError = 3.387 * 0x1p-24;

// log's worst case on the Python stacks, in ulps, measured the same way over every x in
// [1, 2^20] (a softmax's sum, cross-entropy's log-sum-exp): XLA's CPU code 1.181 ulps, ATen's
// (torch 1.13 and 2.9, each capability) at most 0.974, Inductor's 0.628.
inline constexpr double kStackLogUlps = 1.181;

// How far an fp32 attention score s^ = fl(fl(q . k) * fl(scale)) is from q . k * scale with
// the exact scale: the dot's gamma_hs of sum |q_d k_d|, the scale's two roundings (its
// reciprocal square root and its conversion to fp32) and the multiply's, gamma_3:
//   Delta = scale (gamma_hs S (1 + gamma_3) + gamma_3 |q . k|),  S = sum |q_d k_d|.
// Holds as well where a compiler folds the scale into q first (one rounding per term more,
// within the gamma_3). Throws std::invalid_argument where gamma_hs says nothing.
double attention_score_error(std::int64_t head_size, double abs_products, double abs_dot, double scale);

// eta_j above, from delta_j, max delta and |s_j - m| (the exact scores' distance from their max).
double softmax_exponent_error(double delta, double max_delta, double distance_from_max);

// F_j above for a row of n terms, from eta_j, max eta and exp's worst case in ulps.
double softmax_probability_factor(double eta, double max_eta, std::int64_t n, double exp_ulps);

// The absolute error a probability may have from an exp that fell to the subnormals.
inline constexpr double kSoftmaxUnderflow = 0x1p-125;

// |p^_j - p_j| <= (F_j - 1) p_j + 2^-125 above: a probability p_j's bound in a row of n.
double softmax_probability_bound(double p, double eta, double max_eta, std::int64_t n, double exp_ulps);

// An attention core seen only at its output (a module's: PyTorch eager, Inductor, XLA):
// o_c = sum_j p_j v_jc over the row's n keys (the causal ones), with p the softmax of the
// scores, which the oracle does not see. With every p^_j within (F - 1) p_j + 2^-125, F the
// factor of the row's largest eta (eta_max for every j: an upper bound of each F_j), and
// the n products added in fp32 in any order:
//   |o^_c - o_c| <= (F - 1) M + 2^-125 V + gamma_n (F M + 2^-125 V) + (n + 1) 2^-126,
//   M = sum_j p_j |v_jc|, V = sum_j |v_jc|
// ((n + 1) 2^-126: products and a sum that fell to the subnormals, flushed to zero).
// eta_max takes Delta at the row's largest sum |q k_j| and |q . k_j| (each the max over j,
// so an upper bound of every Delta_j) and the row's spread max_j |s_j - m|; a row of one key
// takes exp of exactly 0 (its score less itself), eta 0.
struct AttentionOutputTerms {
  std::int64_t head_size = 0;  // hs: the scores' dot products' length
  std::int64_t keys = 0;       // n: the row's keys (t + 1 in causal row t)
  double scale = 0;            // 1 / sqrt(hs), exact
  double abs_products = 0;     // max_j sum_d |q_d k_jd|
  double abs_dot = 0;          // max_j |q . k_j|
  double spread = 0;           // max_j |s_j - m|, the exact scores
  double magnitude = 0;        // M
  double abs_values = 0;       // V
  double exp_ulps = kStackExpUlps;
};
double attention_output_bound(const AttentionOutputTerms& terms);

// GELU, y = x/2 (1 + f(a)), in fp32: the tanh form, f = tanh, a = sqrt(2/pi) (x + 0.044715 x^3),
// or the exact one, f = erf, a = x / sqrt(2).
//   argument: |a^ - a| <= Da = gamma_r |a|: r = 7 for tanh's (x^2, x^3, 0.044715's rounding and
//             its product, the add, sqrt(2/pi)'s rounding and its product; the two terms have
//             one sign, so no cancellation), 2 for erf's (1/sqrt(2)'s rounding and the product)
//   function: |f^(a^) - f(a)| <= E = f'(z) Da + e_f, z = max(0, |a| - Da) (f' falls with |xi|:
//             sech^2 for tanh, 2/sqrt(pi) exp(-xi^2) for erf), e_f the function's measured
//             worst absolute error
//   output:   |y^ - y| <= |x|/2 (E (1 + gamma_2) + gamma_2 (1 + |f(a)| + E)) + 2^-126
// the last two roundings those of 1 + f^ and the product with x/2 (exact), or of x/2 f^ and
// the sum x/2 + x/2 f^, as a compiler may expand it; 2^-126 for a subnormal result that a
// stack flushes to zero (XLA's CPU code does).
enum class GeluForm : std::uint8_t { Tanh, Erf };
struct GeluTerms {
  GeluForm form = GeluForm::Tanh;
  double x = 0;               // the input
  double argument = 0;        // a, exact
  double function = 0;        // f(a), exact
  double function_error = 0;  // e_f
};
// r above: the roundings of the form's argument.
std::int64_t gelu_argument_roundings(GeluForm form);
double gelu_output_bound(const GeluTerms& terms);

// GELU's backward in the erf form, r = g D with D = Phi(x) + x phi(x) (torch's CPU kernel:
// cdf = 0.5 (1 + erf(x fl(1/sqrt 2))), pdf = fl(beta) exp(x x (-0.5)), g (cdf + x pdf)), from
// the input x and gradient g it was given:
//   cdf:   |c^ - Phi| <= e_c = (E + u (1 + |erf(a)| + E)) / 2, E as GELU's (r = 2, e_f erf's
//          measured worst absolute error)
//   pdf:   relative rho_p = exp(u x^2 / 2) (1 + e) (1 + u)^2 - 1 (x x rounded in exp's argument,
//          exp within e = 2 u exp_ulps, beta's rounding and the product), x pdf one more
//   D:     |D^ - D| <= e_D = e_c + t rho_t + u (Phi + t + e_c + t rho_t),  t = |x| phi
//   r:     |r^ - r| <= |g| e_D (1 + u) + u |g D| + |g| (1 + |x|) 2^-126 (an exp that underflows)
//          + 2^-149 (a product g D^ below the least normal value, a subnormal gradient's)
struct GeluBackwardTerms {
  double x = 0, grad = 0;  // the input and the gradient it was given
  double cdf = 0, pdf = 0;  // Phi(x) and phi(x), exact
};
double gelu_erf_backward_bound(const GeluBackwardTerms& terms, double erf_error, double exp_ulps);

// SiLU s = x sigma(x) within its measured relative error e_s, and 2^-119 where a stack loses
// its value (kSiluLost; a subnormal result flushed to zero is within it):
//   |s^ - s| <= e_s |s| + 2^-119.
double silu_output_bound(double abs_silu, double silu_error);
// SwiGLU, y = silu(g) up: SiLU's error carried through the product and its rounding,
//   |y^ - y| <= (e_s + u + e_s u) |silu(g) up| + 2^-119 |up| (1 + u) + 2^-126.
double swiglu_output_bound(double abs_product, double abs_up, double silu_error);

// The mean cross-entropy of N rows of V logits z with targets t, L = (1/N) sum_i l_i,
// l_i = m_i + log S_i - z_{i,t_i} >= 0, m_i = max z_i, S_i = sum_j exp(z_ij - m_i) >= 1, as the
// stacks compute it (log_softmax, then the negated target's mean; or fused):
//   log-sum:  |log S^ - log S| <= rho = u R / (1 - u) + l(e) + l(gamma_{V-1}) + l(V 2^-126),
//             l(x) = x / (1 - x) (at least -log(1 - x): a factor within 1 +- x as a log, with no
//             libm); V 2^-126 for exps that fell to the subnormals (S >= 1),
//             R = max_j |z_j - m| (each exponent's rounding), e exp's relative worst case
//   its log:  |L^_i - log S| <= E_i = rho + e_l (log S + rho), e_l log's relative worst case
//   a row:    |l^_i - l_i| <= E_i (1 + gamma_2) + gamma_2 (|m| + log S + |z_t|)
//             (z_t - m less log S, as ATen's log_softmax, or z_t less m + log S: two roundings
//             either way)
//   the mean: |L^ - L| <= (1/N) (sum_i err_i (1 + gamma_{N+1}) + gamma_{N+1} sum_i l_i)
//             (N terms in any order and the divide, or 1/N and a multiply)
// The row's error, E_i (1 + gamma_2) + gamma_2 (|m| + log S + |z|), is also each output's
// of a log-softmax, y_j = z_j - m - log S, from the scores it was given (ATen's _log_softmax,
// z = z_j): log_softmax_bound, with the row's m, log S and R.
struct CrossEntropyRow {
  double max = 0;      // m_i
  double log_sum = 0;  // log S_i, exact
  double target = 0;   // z_{i,t_i}
  double spread = 0;   // R_i
};
double cross_entropy_mean_bound(std::span<const CrossEntropyRow> rows, std::int64_t classes, double exp_ulps,
                                double log_ulps);
double log_softmax_bound(const CrossEntropyRow& row, std::int64_t classes, double exp_ulps, double log_ulps);

// A log-softmax's backward, g_j - p_j a with p_j = exp(y_j) from the outputs y it was given
// and a = sum_k g_k (ATen's _log_softmax_backward_data): the sum within gamma_{n-1} A
// (A = sum |g|), exp within its relative worst case e (2 u exp_ulps), the product's and the
// difference's roundings:
//   |r^_j - r_j| <= (1 + u) (p_j gamma_{n-1} A (1 + e) (1 + u) + p_j |a| ((1 + e)(1 + u) - 1) + D) + u |r_j|
// with D = exp_ulps 2^-149 (|a| + gamma_{n-1} A) + 2^-150 where exp or the product lands
// below the least normal value (a one-hot g off its target, logits parted by 87 or more).
double log_softmax_backward_bound(double probability, double abs_sum, double sum_abs, double abs_result,
                                  std::int64_t n, double exp_ulps);

}  // namespace harness::numerics
