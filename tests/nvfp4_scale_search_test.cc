// The nvfp4 scale search (Nvfp4ScaleMode::kSearch, mlakv/codec.h; the spec is
// codec::nvfp4_search_scale_code in src/format/record_codec.h):
//   * the scalar codec against an independent encoder written here from the definition in
//     float64 (e4m3 and e2m1 grids built from their bit layouts, nearest value with ties to
//     the even code, errors summed in float64), byte for byte on every group where the
//     definition is unambiguous: no quotient within 1e-6 (relative) of a rounding midpoint
//     without being exactly on it, the best two candidates' errors more than 1e-5 apart, and
//     the squares inside float32's range. Exact midpoints are kept (ties to even on both
//     sides) and the excluded share is bounded, so the test cannot pass on nothing;
//   * the SIMD writer (every Highway target this machine has) and the cache writers against
//     the scalar codec, byte for byte, on random, adversarial (values at e2m1 midpoints,
//     group maxima on e4m3 midpoints and one ulp either side, zeros, float32 subnormals,
//     huge values) inputs;
//   * what the records decode to: every group's squared error at most the RN encoder's;
//   * the rejected combinations (per-token scale mode, non-nvfp4 formats) and the record
//     file's flag.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/formats.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"
#include "model/record_writer.h"

namespace mlakv {
namespace {

namespace NV = layout::nvfp4_ds_mla;
constexpr KvFormat kNvfp4Formats[] = {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                                      KvFormat::kNvfp4DsMlaInt8Rope};

// ---- the independent reference ----------------------------------------------------------

// e4m3 magnitudes by code 0..126 from the bit layout: subnormal m 2^-9, else (1 + m/8) 2^(e-7).
std::vector<double> e4m3_grid() {
  std::vector<double> v(127);
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, m = c & 7;
    v[static_cast<std::size_t>(c)] = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  }
  return v;
}
// e2m1 magnitudes by code 0..7: subnormal m / 2, else (1 + m/2) 2^(e-1).
std::vector<double> e2m1_grid() {
  std::vector<double> v(8);
  for (int c = 0; c < 8; ++c) {
    const int e = c >> 1, m = c & 1;
    v[static_cast<std::size_t>(c)] = e == 0 ? 0.5 * m : std::ldexp(2 + m, e - 2);
  }
  return v;
}

// Nearest grid value to x >= 0 (ties to the even code, saturating at the top). `near` is set
// when x is within 1e-6 (relative) of a midpoint without being exactly on it (the exactness
// tested by x_num == mid * x_den, both sides exact in float64 for these operands).
int nearest(const std::vector<double>& grid, double num, double den, bool& near) {
  const double x = num / den;
  const int n = static_cast<int>(grid.size());
  if (x >= grid[static_cast<std::size_t>(n - 1)]) return n - 1;
  int c = 0;
  while (c + 1 < n && grid[static_cast<std::size_t>(c + 1)] <= x) ++c;
  const double lo = grid[static_cast<std::size_t>(c)], hi = grid[static_cast<std::size_t>(c + 1)];
  const double mid = 0.5 * (lo + hi);
  if (num == mid * den) return (c % 2 == 0) ? c : c + 1;  // an exact tie: the even code
  if (std::abs(x - mid) <= 1e-6 * mid) near = true;
  return x < mid ? c : c + 1;
}

struct RefGroup {
  uint8_t code = 0;
  uint8_t bytes[8] = {};
  bool ambiguous = false;
};

// One group from its 16 quotients y (the record's y = latent / s, a float32 division by the
// format's definition).
RefGroup reference_group(const float* y) {
  static const std::vector<double> e4 = e4m3_grid(), e2 = e2m1_grid();
  RefGroup g;
  double amax = 0;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::abs(static_cast<double>(y[i])));
  // The squares must stay inside float32's normal range for the writers' float errors to
  // mean the same as these (and the group not all zero or subnormal).
  if (amax > 1e18 || (amax > 0 && amax < 1e-17)) g.ambiguous = true;
  const int c0 = nearest(e4, amax, 6.0, g.ambiguous);
  // Each candidate's error and reconstruction (a_i -> e2m1(m_i) sf).
  struct Cand {
    int code;
    double err;
    uint8_t mags[16];
    double rec[16];
  };
  auto eval = [&](int c) {
    Cand k{c, 0.0, {}, {}};
    const double sf = e4[static_cast<std::size_t>(c)];
    for (int i = 0; i < 16; ++i) {
      const double a = std::abs(static_cast<double>(y[i]));
      int m = 0;
      if (sf > 0) m = nearest(e2, a, sf, g.ambiguous);
      k.mags[i] = static_cast<uint8_t>(m);
      k.rec[i] = e2[static_cast<std::size_t>(m)] * sf;
      const double d = a - k.rec[i];
      k.err += d * d;
    }
    return k;
  };
  // c0 first, then c0 - 1, then c0 + 1, each replacing the best only when strictly less.
  std::vector<Cand> cands = {eval(c0)};
  for (int c : {c0 - 1, c0 + 1}) {
    if (c >= 1 && c <= 0x7E) cands.push_back(eval(c));
  }
  std::size_t bi = 0;
  for (std::size_t i = 1; i < cands.size(); ++i) {
    if (cands[i].err < cands[bi].err) bi = i;
  }
  const Cand& b = cands[bi];
  // Ambiguous: another candidate within 1e-5 of the best error whose reconstruction differs
  // (identical reconstructions have identical float32 errors too: an exact tie, resolved by
  // the rule above on both sides).
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (i == bi || std::abs(cands[i].err - b.err) > 1e-5 * std::max(cands[i].err, b.err) + 1e-37) continue;
    if (!std::equal(std::begin(cands[i].rec), std::end(cands[i].rec), std::begin(b.rec))) g.ambiguous = true;
  }
  const int best = b.code;
  const uint8_t* best_m = b.mags;
  g.code = static_cast<uint8_t>(best);
  for (int i = 0; i < 16; i += 2) {
    auto nib = [&](int k) -> uint8_t {
      if (best == 0) return 0;  // scale 0: zero codes, no sign
      return static_cast<uint8_t>(best_m[k] | (std::signbit(y[k]) ? 8 : 0));
    };
    g.bytes[i / 2] = static_cast<uint8_t>(nib(i) | (nib(i + 1) << 4));
  }
  return g;
}

// ---- inputs ------------------------------------------------------------------------------

std::vector<std::vector<float>> random_latents(std::mt19937& rng, int n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<double> decade(-6.0, 4.0);
  std::vector<std::vector<float>> out;
  for (int t = 0; t < n; ++t) {
    std::vector<float> l(kLatentDim);
    for (int g = 0; g < NV::kNumGroups; ++g) {
      const double s = std::pow(10.0, decade(rng));
      const bool heavy = (t + g) % 3 == 0;  // a heavy tail: one large value among small ones
      for (int i = 0; i < 16; ++i) {
        float v = static_cast<float>(nd(rng) * s);
        if (heavy && i == (g * 7) % 16) v *= 8.0f;
        l[static_cast<std::size_t>(g * 16 + i)] = v;
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

// Groups built on the rounding boundaries (at outer scale 1): e2m1 midpoints times an e4m3
// scale with the group maximum 6 sf (RN code exactly sf's), maxima exactly on e4m3 midpoints
// (6 times the midpoint; ties to the even code) and one ulp either side, zeros, float32
// subnormals, a zero group next to a tiny one, huge values.
std::vector<std::vector<float>> adversarial_latents() {
  const std::vector<double> e4 = e4m3_grid();
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  std::vector<std::vector<float>> out;
  std::vector<float> l(kLatentDim, 0.0f);
  int g = 0;
  auto flush = [&] {
    if (g == NV::kNumGroups) {
      out.push_back(l);
      std::fill(l.begin(), l.end(), 0.0f);
      g = 0;
    }
  };
  for (int c = 1; c <= 0x7E; c += 3) {  // e2m1 midpoints under scale code c
    const float sf = static_cast<float>(e4[static_cast<std::size_t>(c)]);
    for (int i = 0; i < 16; ++i) {
      const float v = i == 0 ? 6.0f * sf : mids[i % 7] * sf;
      l[static_cast<std::size_t>(g * 16 + i)] = (i & 1) ? -v : v;
    }
    ++g;
    flush();
  }
  for (int c = 0; c + 1 <= 0x7E; c += 2) {  // group maxima on e4m3 midpoints (and +-1 ulp)
    const float top = static_cast<float>(6.0 * 0.5 * (e4[static_cast<std::size_t>(c)] + e4[static_cast<std::size_t>(c + 1)]));
    for (float mx : {top, std::nextafter(top, 0.0f), std::nextafter(top, 1e30f)}) {
      for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = i == 5 ? -mx : mx * (0.05f * static_cast<float>(i));
      ++g;
      flush();
    }
  }
  // zeros, subnormals, a tiny group (RN code 0: candidates 0 and 1), huge values
  for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = 0.0f;
  ++g;
  flush();
  for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = (i % 2 ? -1.0f : 1.0f) * 1e-40f * static_cast<float>(i);
  ++g;
  flush();
  for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = 4e-4f * static_cast<float>(i % 5);  // amax/6 < 2^-10
  ++g;
  flush();
  for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = (i % 3 ? 1.0f : -1.0f) * 3e38f / static_cast<float>(i + 1);
  ++g;
  flush();
  for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = 2500.0f + static_cast<float>(i);  // saturating scale
  ++g;
  flush();
  while (g != 0) {  // pad the last latent with random-ish groups
    for (int i = 0; i < 16; ++i) l[static_cast<std::size_t>(g * 16 + i)] = 0.1f * static_cast<float>((i * 7 + g) % 11) - 0.5f;
    ++g;
    flush();
  }
  return out;
}

std::vector<float> rope_for(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> r(kRopeDim);
  for (float& x : r) x = nd(rng);
  return r;
}

std::vector<uint8_t> spec_record(KvFormat f, const std::vector<float>& lat, const std::vector<float>& rope, float outer,
                                 Nvfp4ScaleMode mode) {
  std::vector<uint8_t> rec(static_cast<std::size_t>(record_bytes(f)), 0xAA);
  codec::encode_record(f, lat.data(), rope.data(), outer, Fp8ScaleMode::kPow2, rec.data(), false, mode);
  return rec;
}

// ---- tests -------------------------------------------------------------------------------

TEST(Nvfp4ScaleSearch, SpecMatchesIndependentReference) {
  std::mt19937 rng(2026);
  auto lats = random_latents(rng, 200);
  const auto adv = adversarial_latents();
  const std::size_t n_random = lats.size();
  lats.insert(lats.end(), adv.begin(), adv.end());
  int64_t compared = 0, ambiguous = 0, moved = 0, groups = 0, exact_ties_kept = 0;
  for (float outer : {1.0f, 0.37f, 3e-3f}) {
    for (std::size_t li = 0; li < lats.size(); ++li) {
      if (li >= n_random && outer != 1.0f) continue;  // the adversarial groups are built at s = 1
      const std::vector<float>& lat = lats[li];
      const std::vector<float> rope(kRopeDim, 0.5f);
      const auto rec = spec_record(KvFormat::kNvfp4DsMla, lat, rope, outer, Nvfp4ScaleMode::kSearch);
      const auto rn = spec_record(KvFormat::kNvfp4DsMla, lat, rope, outer, Nvfp4ScaleMode::kRn);
      for (int g = 0; g < NV::kNumGroups; ++g) {
        float y[16];
        for (int i = 0; i < 16; ++i) y[i] = lat[static_cast<std::size_t>(g * 16 + i)] / outer;
        const RefGroup r = reference_group(y);
        ++groups;
        if (rec[static_cast<std::size_t>(NV::kScaleOffset + g)] != rn[static_cast<std::size_t>(NV::kScaleOffset + g)]) ++moved;
        if (r.ambiguous) {
          ++ambiguous;
          continue;
        }
        ++compared;
        if (li >= n_random) ++exact_ties_kept;
        ASSERT_EQ(rec[static_cast<std::size_t>(NV::kScaleOffset + g)], r.code)
            << "latent " << li << " group " << g << " outer " << outer;
        for (int k = 0; k < 8; ++k) {
          ASSERT_EQ(rec[static_cast<std::size_t>(NV::kLatentOffset + g * 8 + k)], r.bytes[k])
              << "latent " << li << " group " << g << " byte " << k << " outer " << outer;
        }
      }
    }
  }
  std::printf("[scale search] %lld groups: %lld compared with the reference, %lld ambiguous (skipped), %lld adversarial "
              "compared; the search moved %lld scale codes off RN\n",
              static_cast<long long>(groups), static_cast<long long>(compared), static_cast<long long>(ambiguous),
              static_cast<long long>(exact_ties_kept), static_cast<long long>(moved));
  EXPECT_GE(compared, groups * 95 / 100);       // the exclusions are rare
  EXPECT_GE(exact_ties_kept, 60);               // the exact midpoints are compared, not skipped
  EXPECT_GE(moved, groups / 5);                  // the search does move codes (~half on such data)
}

TEST(Nvfp4ScaleSearch, TieRulesAndCandidates) {
  // An all-zero group keeps code 0 (codes 0 and 1 tie: RN wins).
  float zero[16] = {};
  uint32_t mag[2];
  EXPECT_EQ(codec::nvfp4_search_scale_code(zero, 0, mag), 0);
  // A group whose every quotient rounds to 0 under code 1 too: the same error, RN (0) kept.
  float tiny[16];
  for (int i = 0; i < 16; ++i) tiny[i] = 1e-5f * static_cast<float>(i % 3);  // q < 0.25 at sf = 2^-9
  EXPECT_EQ(codec::nvfp4_search_scale_code(tiny, 0, mag), 0);
  // A group exactly on the grid of its RN scale (error 0) keeps it.
  float exact[16];
  const float grid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int i = 0; i < 16; ++i) exact[i] = grid[i % 8] * 0.75f;  // sf = 0.75 = code 0x36 ... RN of 4.5 / 6
  const uint8_t c_exact = codec::nvfp4_group_scale_code(4.5f);
  ASSERT_EQ(e4m3_to_f32(c_exact), 0.75f);
  EXPECT_EQ(codec::nvfp4_search_scale_code(exact, c_exact, mag), c_exact);
  EXPECT_EQ(codec::nvfp4_group_sq_error(exact, c_exact, mag), 0.0f);
  // The saturated code 0x7E has no upper candidate (0x7F is NaN): never chosen.
  float big[16];
  for (int i = 0; i < 16; ++i) big[i] = 2688.0f * (i == 0 ? 1.0f : 0.4f);
  EXPECT_LE(codec::nvfp4_search_scale_code(big, 0x7E, mag), 0x7E);
  // Code 1's lower neighbour (0) is never a candidate unless it is the RN code.
  float small[16];
  for (int i = 0; i < 16; ++i) small[i] = i == 0 ? 0.01171875f : 0.001f;  // amax / 6 = 2^-9: code 1
  const uint8_t c_small = codec::nvfp4_group_scale_code(small[0]);
  ASSERT_EQ(c_small, 1);
  EXPECT_GE(codec::nvfp4_search_scale_code(small, c_small, mag), 1);
}

// The CUDA writer's group function (codec::nvfp4_group_search_fast: its own quotient paths -
// the product by RN(1/s) for powers of two, div_rn_by_reciprocal, the IEEE fallback) run on
// the host against the spec's records, with outer scales on every path (the device-only
// pieces, the division by the group scale and the e2m1 code, are the writer primitives the
// harness checks exhaustively on the device).
TEST(Nvfp4ScaleSearch, WriterGroupFunctionMatchesSpecOnTheHost) {
  std::mt19937 rng(19);
  auto lats = random_latents(rng, 40);
  const auto adv = adversarial_latents();
  lats.insert(lats.end(), adv.begin(), adv.end());
  const std::vector<float> rope(kRopeDim, 1.0f);
  int64_t groups = 0;
  for (float outer : {1.0f, 0.125f, 0x1p-70f, 0x1p70f, 0.3f, 7.44e-6f, 1e-20f, 1e35f}) {
    for (std::size_t li = 0; li < lats.size(); ++li) {
      const auto want = spec_record(KvFormat::kNvfp4DsMla, lats[li], rope, outer, Nvfp4ScaleMode::kSearch);
      for (int g = 0; g < NV::kNumGroups; ++g) {
        const float* x = lats[li].data() + g * 16;
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::abs(x[i]));
        uint32_t w[2];
        const uint8_t c = codec::nvfp4_group_search_fast(x, outer, amax, w);
        ASSERT_EQ(c, want[static_cast<std::size_t>(NV::kScaleOffset + g)]) << "latent " << li << " group " << g
                                                                            << " outer " << outer;
        uint8_t bytes[8];
        std::memcpy(bytes, w, 8);
        for (int k = 0; k < 8; ++k)
          ASSERT_EQ(bytes[k], want[static_cast<std::size_t>(NV::kLatentOffset + g * 8 + k)])
              << "latent " << li << " group " << g << " outer " << outer << " byte " << k;
        ++groups;
      }
    }
  }
  EXPECT_GT(groups, 10000);
}

// The CUDA writers' screened search (codec::nvfp4_search_group, "the nvfp4 scale search's
// screened path" in record_codec.h) against the spec, on the host (the same float32
// operations the device runs): wherever it decides (returns a code), the code is the spec's
// and the 8 code bytes are the spec's, unfolded (|y| and the candidates' values) and folded
// (|x| = |y| s for powers of two s in [2^-16, 2^16], the values times s, the reciprocals over
// s). Groups: random (Gaussian, Laplace-like, one large value among small ones, decades of
// scale), the adversarial latents, groups of values on the three candidates' e2m1 midpoints
// and values and a few ulps either side, and near ties: one element moved along the floats to
// where two candidates' errors cross (exact float32 ties among them), where the screen must
// leave the group undecided or decide it right.
TEST(Nvfp4ScaleSearch, ScreenedSearchIsTheSpecWhereItDecides) {
  std::mt19937 rng(71);
  std::normal_distribution<float> nd;
  int64_t eligible = 0, decided = 0, exact_ties = 0, tie_groups = 0, tie_undecided = 0;
  // The spec's code and bytes for |y| = a (signs from y), c0 its RN code.
  auto check = [&](const float* y, bool near_tie) {
    float a[16], amax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      a[i] = std::abs(y[i]);
      amax = std::max(amax, a[i]);
    }
    const uint32_t c0 = codec::nvfp4_group_scale_code(amax);
    if (!codec::nvfp4_search_fast_applies(c0, amax)) return;
    ++eligible;
    uint32_t mag[2];
    const int want = codec::nvfp4_search_scale_code(a, c0, mag);
    uint32_t want_w[2] = {mag[0], mag[1]};
    for (int i = 0; i < 16; ++i) {
      if (std::signbit(y[i])) want_w[i / 8] |= 8u << (4 * (i % 8));
    }
    uint32_t m2[2];
    const float e0 = codec::nvfp4_group_sq_error(a, c0, m2), em = codec::nvfp4_group_sq_error(a, c0 - 1, m2);
    const float ep = c0 < 0x7E ? codec::nvfp4_group_sq_error(a, c0 + 1, m2) : -1.0f;
    if (e0 == em || e0 == ep || em == ep) ++exact_ties;
    uint32_t signs[2];
    codec::nvfp4_group_signs(y, signs);
    for (float s : {1.0f, 0x1p-16f, 0.125f, 32.0f, 0x1p16f}) {
      ASSERT_TRUE(codec::nvfp4_search_folds(s));
      float sf[3], rsf[3], xs[16];
      for (int k = 0; k < 3; ++k) {
        const uint32_t c = c0 - 1 + static_cast<uint32_t>(k);
        const float v = c <= 0x7E ? e4m3_to_f32(static_cast<uint8_t>(c)) : 0.0f;
        sf[k] = v * s;
        rsf[k] = v != 0.0f ? codec::reciprocal_rn(v) / s : 0.0f;
      }
      for (int i = 0; i < 16; ++i) xs[i] = a[i] * s;  // exact: no subnormal |y| among these groups' nonzeros
      uint32_t w[2];
      const int got = codec::nvfp4_search_group(xs, c0, sf, rsf, signs, w);
      if (s == 1.0f) {
        if (got >= 0) ++decided;
        if (near_tie) {
          ++tie_groups;
          if (got < 0) ++tie_undecided;
        }
      }
      if (got < 0) continue;
      ASSERT_EQ(got, want) << "c0 " << c0 << " s " << s << " errors " << em << " " << e0 << " " << ep;
      ASSERT_EQ(w[0], want_w[0]) << "c0 " << c0 << " s " << s;
      ASSERT_EQ(w[1], want_w[1]) << "c0 " << c0 << " s " << s;
    }
  };
  // Random groups over decades of scale.
  int64_t random_eligible = 0, random_decided = 0;
  for (int it = 0; it < 60000; ++it) {
    float y[16];
    const float sc = std::pow(10.0f, std::uniform_real_distribution<float>(-1.5f, 2.5f)(rng));
    for (int i = 0; i < 16; ++i) {
      float v = nd(rng) * sc;
      if (it % 3 == 1) v = std::exponential_distribution<float>(1.0f)(rng) * sc * (nd(rng) > 0 ? 1.0f : -1.0f);
      if (it % 3 == 2 && i == it % 16) v *= 8.0f;
      y[i] = v;
    }
    const int64_t e = eligible, d = decided;
    check(y, false);
    random_eligible += eligible - e;
    random_decided += decided - d;
  }
  // The adversarial latents (the eligible groups among them).
  for (const auto& lat : adversarial_latents()) {
    for (int g = 0; g < NV::kNumGroups; ++g) check(lat.data() + 16 * g, false);
  }
  // Values on the candidates' e2m1 midpoints and values, +-2 ulps, the maximum near 6 sf_c0.
  const float points[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 2.25f, 4.5f, 1.0f, 3.0f};
  std::uniform_int_distribution<int> code(codec::kNvfp4SearchMinCode, 0x7E), nb(-2, 2), pick(0, 12), cand(-1, 1);
  for (int it = 0; it < 20000; ++it) {
    const int c = code(rng);
    float y[16];
    for (int i = 0; i < 16; ++i) {
      const int cc = std::min(c + cand(rng), 0x7E);
      float v = points[pick(rng)] * e4m3_to_f32(static_cast<uint8_t>(cc));
      if (i == 0) v = 6.0f * e4m3_to_f32(static_cast<uint8_t>(c)) * (0.94f + 0.12f * static_cast<float>(it % 1000) / 1000.0f);
      v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(nb(rng)));
      y[i] = (i % 3 == 1) ? -v : v;
    }
    check(y, false);
  }
  // Near ties: element j (not the maximum) swept to a sign change of E_a - E_b (bisection on
  // its float32 bits), then the 9 floats around the change.
  for (int it = 0; it < 1500; ++it) {
    float y[16], amax = 0.0f;
    int im = 0;
    const float sc = std::pow(10.0f, std::uniform_real_distribution<float>(-1.0f, 2.0f)(rng));
    for (int i = 0; i < 16; ++i) {
      y[i] = nd(rng) * sc;
      if (std::abs(y[i]) > amax) amax = std::abs(y[i]), im = i;
    }
    const uint32_t c0 = codec::nvfp4_group_scale_code(amax);
    if (!codec::nvfp4_search_fast_applies(c0, amax)) continue;
    const int j = (im + 1 + it % 15) % 16;
    const int pair = it % 3;  // (RN - 1, RN), (RN + 1, RN), (RN + 1, RN - 1)
    const uint32_t ca = pair == 0 ? c0 - 1 : c0 + 1, cb = pair == 2 ? c0 - 1 : c0;
    if (ca > 0x7E) continue;
    auto diff = [&](float v) {
      float a[16];
      for (int i = 0; i < 16; ++i) a[i] = std::abs(i == j ? v : y[i]);
      uint32_t m[2];
      return codec::nvfp4_group_sq_error(a, ca, m) - codec::nvfp4_group_sq_error(a, cb, m);
    };
    float lo = -1.0f, hi = -1.0f, prev = diff(0.0f);
    for (int k = 1; k <= 64; ++k) {
      const float v = amax * 0.999f * static_cast<float>(k) / 64.0f, d = diff(v);
      if ((d < 0.0f) != (prev < 0.0f)) {
        lo = amax * 0.999f * static_cast<float>(k - 1) / 64.0f;
        hi = v;
        break;
      }
      prev = d;
    }
    if (lo < 0.0f) continue;
    uint32_t blo = std::bit_cast<uint32_t>(lo), bhi = std::bit_cast<uint32_t>(hi);
    const bool neg_lo = diff(lo) < 0.0f;
    while (bhi - blo > 1) {
      const uint32_t mid = blo + (bhi - blo) / 2;
      if ((diff(std::bit_cast<float>(mid)) < 0.0f) == neg_lo) blo = mid; else bhi = mid;
    }
    for (uint32_t b = blo - 4; b <= bhi + 4; ++b) {
      float z[16];
      std::copy(y, y + 16, z);
      z[j] = std::copysign(std::bit_cast<float>(b), y[j]);
      check(z, true);
    }
  }
  std::printf("[screened search] %lld eligible groups, %lld decided; random: %lld of %lld undecided; near ties: %lld "
              "groups, %lld undecided, %lld groups with an exact float32 tie\n",
              static_cast<long long>(eligible), static_cast<long long>(decided),
              static_cast<long long>(random_eligible - random_decided), static_cast<long long>(random_eligible),
              static_cast<long long>(tie_groups), static_cast<long long>(tie_undecided), static_cast<long long>(exact_ties));
  EXPECT_GT(random_eligible, 50000);
  EXPECT_LE(random_eligible - random_decided, random_eligible / 1000);  // the screen decides nearly every group
  EXPECT_GT(tie_undecided, 100);  // the near ties do reach the fallback
  EXPECT_GT(exact_ties, 100);     // and exact float32 ties are among them
  EXPECT_GT(tie_groups - tie_undecided, 1000);  // ... and many of them are decided (right)
}

std::vector<int64_t> simd_targets() {
  std::vector<int64_t> out;
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t bit = 1; bit != 0 && bit <= supported; bit <<= 1)
    if (supported & bit) out.push_back(bit);
  return out;
}

TEST(Nvfp4ScaleSearch, SimdWriterMatchesSpecOnEveryTarget) {
  std::mt19937 rng(7);
  auto lats = random_latents(rng, 24);
  const auto adv = adversarial_latents();
  lats.insert(lats.end(), adv.begin(), adv.end());
  for (int64_t t : simd_targets()) {
    hwy::SetSupportedTargetsForTest(t);
    for (KvFormat f : kNvfp4Formats) {
      for (float outer : {1.0f, 0.37f, 1e-3f, 100.0f}) {
        for (std::size_t li = 0; li < lats.size(); ++li) {
          const std::vector<float> rope = rope_for(rng);
          const auto want = spec_record(f, lats[li], rope, outer, Nvfp4ScaleMode::kSearch);
          std::vector<uint8_t> got(want.size(), 0x55);
          model::encode_record_simd(f, lats[li].data(), kLatentDim, rope.data(), kRopeDim, outer, false, got.data(),
                                    false, Nvfp4ScaleMode::kSearch);
          ASSERT_EQ(got, want) << format_name(f) << " target " << hwy::TargetName(t) << " latent " << li << " outer "
                               << outer;
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(Nvfp4ScaleSearch, CacheWritersMatchSpec) {
  // KvCache::write (the checked scalar codec) and the model runner's SIMD writer
  // (write_cache_records, threaded) give the spec's bytes in a cache whose layer is in
  // search mode, on shuffled slots with padding.
  std::mt19937 rng(11);
  const auto lats = random_latents(rng, 150);
  const int64_t n = static_cast<int64_t>(lats.size());
  std::vector<float> lat, rope;
  for (const auto& l : lats) lat.insert(lat.end(), l.begin(), l.end());
  for (int64_t i = 0; i < n; ++i) {
    const auto r = rope_for(rng);
    rope.insert(rope.end(), r.begin(), r.end());
  }
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = i + 3;
  std::shuffle(slots.begin(), slots.end(), rng);
  slots[5] = -1;
  ThreadPool pool(2);
  for (KvFormat f : kNvfp4Formats) {
    KvCache::Config cfg;
    cfg.num_blocks = 4;
    cfg.block_size = 64;
    cfg.layers = {LayerFormat{f, 0.37f, false, Nvfp4ScaleMode::kSearch}};
    auto a = KvCache::create_cpu(cfg);
    auto b = KvCache::create_cpu(cfg);
    ASSERT_TRUE(a.ok() && b.ok());
    (*a)->fill(0xEE);
    (*b)->fill(0xEE);
    ASSERT_TRUE((*a)->write(0, TensorView::contiguous(slots.data(), DType::kI64, {n}),
                            TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                            TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}))
                    .ok());
    ASSERT_TRUE(model::write_cache_records(**b, 0, slots, lat.data(), rope.data(), &pool).ok());
    const CacheLayerView va = *(*a)->layer(0), vb = *(*b)->layer(0);
    ASSERT_EQ(va.nvfp4_scales, Nvfp4ScaleMode::kSearch);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = slots[static_cast<std::size_t>(i)];
      if (s < 0) continue;
      const std::vector<float> l(lat.begin() + i * kLatentDim, lat.begin() + (i + 1) * kLatentDim);
      const std::vector<float> r(rope.begin() + i * kRopeDim, rope.begin() + (i + 1) * kRopeDim);
      const auto want = spec_record(f, l, r, 0.37f, Nvfp4ScaleMode::kSearch);
      ASSERT_EQ(0, std::memcmp(va.record(s), want.data(), want.size())) << format_name(f) << " token " << i;
      ASSERT_EQ(0, std::memcmp(vb.record(s), want.data(), want.size())) << format_name(f) << " token " << i;
    }
  }
}

TEST(Nvfp4ScaleSearch, DecodedGroupsNeverWorseThanRn) {
  // Through the ordinary decoder: each group's squared error (float64) with the searched
  // scale is at most the RN record's, and the mean relative error is lower by > 5%.
  std::mt19937 rng(3);
  const auto lats = random_latents(rng, 60);
  const std::vector<float> rope(kRopeDim, 0.25f);
  double total_rn = 0, total_search = 0;
  for (const auto& lat : lats) {
    for (float outer : {1.0f, 0.02f}) {
      const auto s = spec_record(KvFormat::kNvfp4DsMla, lat, rope, outer, Nvfp4ScaleMode::kSearch);
      const auto r = spec_record(KvFormat::kNvfp4DsMla, lat, rope, outer, Nvfp4ScaleMode::kRn);
      std::vector<float> ds(kLatentDim), dr(kLatentDim), rp(kRopeDim);
      CodecParams p{KvFormat::kNvfp4DsMla, outer};
      ASSERT_TRUE(decode_records(p, TensorView::contiguous(const_cast<uint8_t*>(s.data()), DType::kU8, {1, 432}),
                                 TensorView::contiguous(ds.data(), DType::kF32, {1, kLatentDim}),
                                 TensorView::contiguous(rp.data(), DType::kF32, {1, kRopeDim}))
                      .ok());
      ASSERT_TRUE(decode_records(p, TensorView::contiguous(const_cast<uint8_t*>(r.data()), DType::kU8, {1, 432}),
                                 TensorView::contiguous(dr.data(), DType::kF32, {1, kLatentDim}),
                                 TensorView::contiguous(rp.data(), DType::kF32, {1, kRopeDim}))
                      .ok());
      for (int g = 0; g < NV::kNumGroups; ++g) {
        double es = 0, er = 0;
        for (int i = g * 16; i < g * 16 + 16; ++i) {
          const double x = lat[static_cast<std::size_t>(i)];
          es += (x - ds[static_cast<std::size_t>(i)]) * (x - ds[static_cast<std::size_t>(i)]);
          er += (x - dr[static_cast<std::size_t>(i)]) * (x - dr[static_cast<std::size_t>(i)]);
        }
        EXPECT_LE(es, er * (1 + 1e-4) + 1e-30) << "group " << g;
        double energy = 0;
        for (int i = g * 16; i < g * 16 + 16; ++i) energy += static_cast<double>(lat[static_cast<std::size_t>(i)]) * lat[static_cast<std::size_t>(i)];
        if (energy > 0) {  // relative errors: every group counts alike
          total_rn += er / energy;
          total_search += es / energy;
        }
      }
    }
  }
  EXPECT_LT(total_search, 0.95 * total_rn);
}

TEST(Nvfp4ScaleSearch, RejectedCombinations) {
  // The per-token scale mode is the fork's encoder: its group scales stay RN.
  CodecParams p{KvFormat::kNvfp4DsMla, 1.0f, Fp8ScaleMode::kPow2, kLatentDim, kRopeDim, true, Nvfp4ScaleMode::kSearch};
  auto rb = codec_record_bytes(p);
  ASSERT_FALSE(rb.ok());
  EXPECT_NE(rb.status().message().find("per-token scale mode"), std::string::npos) << rb.status().message();
  // Not an nvfp4 format.
  for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kF32}) {
    CodecParams q{f, 1.0f, Fp8ScaleMode::kPow2, kLatentDim, kRopeDim, false, Nvfp4ScaleMode::kSearch};
    auto r = codec_record_bytes(q);
    ASSERT_FALSE(r.ok()) << format_name(f);
    EXPECT_NE(r.status().message().find("encoder option of the nvfp4 formats"), std::string::npos);
  }
  // An unknown enum value.
  CodecParams u{KvFormat::kNvfp4DsMla};
  u.nvfp4_scales = static_cast<Nvfp4ScaleMode>(7);
  EXPECT_FALSE(codec_record_bytes(u).ok());
  // The cache refuses the combination at creation, and a view carrying it.
  KvCache::Config cfg;
  cfg.num_blocks = 1;
  cfg.layers = {LayerFormat{KvFormat::kNvfp4DsMla, 1.0f, true, Nvfp4ScaleMode::kSearch}};
  EXPECT_FALSE(KvCache::create_cpu(cfg).ok());
  std::vector<uint8_t> buf(64 * 432);
  CacheLayerView v;
  v.data = buf.data();
  v.num_blocks = 1;
  v.block_size = 64;
  v.record_bytes = 432;
  v.format = KvFormat::kNvfp4DsMla;
  v.token_scale = true;
  v.nvfp4_scales = Nvfp4ScaleMode::kSearch;
  EXPECT_FALSE(check_cache_view(v, "cache").ok());
  v.token_scale = false;
  EXPECT_TRUE(check_cache_view(v, "cache").ok());
  // Names.
  EXPECT_EQ(*parse_nvfp4_scale_mode("search"), Nvfp4ScaleMode::kSearch);
  EXPECT_EQ(*parse_nvfp4_scale_mode("rn"), Nvfp4ScaleMode::kRn);
  EXPECT_FALSE(parse_nvfp4_scale_mode("Search").ok());
  EXPECT_FALSE(parse_nvfp4_scale_mode("").ok());
  EXPECT_EQ(nvfp4_scale_mode_name(Nvfp4ScaleMode::kSearch), "search");
}

TEST(Nvfp4ScaleSearch, RecordFileFlag) {
  namespace R = layout::record_file;
  for (Nvfp4ScaleMode m : {Nvfp4ScaleMode::kRn, Nvfp4ScaleMode::kSearch}) {
    CodecParams p{KvFormat::kNvfp4DsMlaInt8Rope, 0.5f};
    p.nvfp4_scales = m;
    auto h = record_file_header(p, 0);
    ASSERT_TRUE(h.ok());
    uint32_t flags = 0;
    std::memcpy(&flags, h->data() + R::kFlagsOffset, 4);
    EXPECT_EQ(flags, m == Nvfp4ScaleMode::kSearch ? R::kFlagNvfp4ScaleSearch : 0u);
    auto info = parse_record_file(*h, "f.rec");
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_EQ(info->params.nvfp4_scales, m);
  }
  // The flag on a bf16 file is the rejected combination (data loss naming the header).
  CodecParams p{KvFormat::kNvfp4DsMla, 1.0f};
  auto h = record_file_header(p, 0);
  ASSERT_TRUE(h.ok());
  const uint32_t fid = static_cast<uint32_t>(KvFormat::kBf16), flags = R::kFlagNvfp4ScaleSearch, rb = 1152;
  std::memcpy(h->data() + R::kFormatOffset, &fid, 4);
  std::memcpy(h->data() + R::kRecordBytesOffset, &rb, 4);
  std::memcpy(h->data() + R::kFlagsOffset, &flags, 4);
  auto bad = parse_record_file(*h, "f.rec");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace mlakv
