// The optimized CPU attention driver: splits the batch into units of
// (request, query group, head group, KV split), runs each unit's SIMD kernel on the
// thread pool, and merges split partials with AttnState.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/token_set.h"
#include "cpu/attention_kernels.h"
#include "mlakv/attn_state.h"
#include "mlakv/thread_pool.h"

namespace mlakv {
namespace {

struct Group {
  int64_t b;
  int64_t i0, i1;  // queries [i0, i1)
  int64_t h0, h1;  // heads [h0, h1)
  int rows() const { return static_cast<int>((i1 - i0) * (h1 - h0)); }
};

std::vector<Group> make_groups(const MlaAttentionParams& p, int threads) {
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  // Dense queries of one request share their token prefix, so they share a unit (up to
  // kMaxUnitRows rows); sparse queries each have their own token list.
  const int64_t qpg = p.sparse() ? 1 : std::max<int64_t>(1, cpu::kMaxUnitRows / H);
  const int64_t q_groups = (s_q + qpg - 1) / qpg;
  // Heads are split only when H alone exceeds a unit, or when requests x query groups
  // x splits would leave threads idle (each head group dequantizes its tiles again).
  int64_t head_groups = (H + cpu::kMaxUnitRows - 1) / cpu::kMaxUnitRows;
  const int64_t base_units = B * q_groups * p.num_splits;
  if (base_units < threads) head_groups = std::max(head_groups, std::min<int64_t>(H, (threads + base_units - 1) / base_units));
  const int64_t hpg = (H + head_groups - 1) / head_groups;
  std::vector<Group> g;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i0 = 0; i0 < s_q; i0 += qpg) {
      for (int64_t h0 = 0; h0 < H; h0 += hpg) g.push_back({b, i0, std::min(s_q, i0 + qpg), h0, std::min(H, h0 + hpg)});
    }
  }
  return g;
}

}  // namespace

Status mla_attention_cpu(const MlaAttentionParams& p, const CpuAttentionOptions& opt) {
  MLAKV_RETURN_IF_ERROR(validate_mla_attention(p));
  if (p.cache.device.type != DeviceType::kCpu) {
    return invalid_argument(fmt::format("mla_attention_cpu: the cache is on {}, not the CPU", device_name(p.cache.device)));
  }
  const int threads = opt.pool ? opt.pool->num_threads() : 1;
  const std::vector<Group> groups = make_groups(p, threads);
  const int S = p.num_splits;
  const float scale = p.softmax_scale;

  // Split partials: per group, [S, rows, 512] and [S, rows].
  std::vector<std::vector<float>> part_o(groups.size()), part_lse(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    part_o[g].resize(static_cast<std::size_t>(S) * static_cast<std::size_t>(groups[g].rows()) * kLatentDim);
    part_lse[g].resize(static_cast<std::size_t>(S) * static_cast<std::size_t>(groups[g].rows()));
  }

  auto run_unit = [&](int64_t unit, int /*thread*/) {
    const std::size_t gi = static_cast<std::size_t>(unit / S);
    const int split = static_cast<int>(unit % S);
    const Group& g = groups[gi];
    const int rows = g.rows();
    const int64_t nh = g.h1 - g.h0;

    // The unit's token slots and each row's limit within them.
    std::vector<int64_t> slots, limit(static_cast<std::size_t>(rows));
    int64_t begin = 0, end = 0;
    if (p.sparse()) {
      std::vector<int64_t> valid;
      for (int64_t k = 0; k < attn::sparse_count(p, g.b); ++k) {
        const int64_t s = attn::sparse_slot(p, g.b, g.i0, k);
        if (s >= 0) valid.push_back(s);
      }
      const int64_t n = static_cast<int64_t>(valid.size()), chunk = (n + S - 1) / S;
      begin = std::min(n, split * chunk);
      end = std::min(n, begin + chunk);
      slots.assign(valid.begin() + begin, valid.begin() + end);
      std::fill(limit.begin(), limit.end(), end - begin);
    } else {
      int64_t n_max = 0;
      for (int64_t i = g.i0; i < g.i1; ++i) n_max = std::max(n_max, attn::visible_tokens(p, g.b, i));
      const int64_t chunk = (n_max + S - 1) / S;
      begin = std::min(n_max, split * chunk);
      end = std::min(n_max, begin + chunk);
      slots.resize(static_cast<std::size_t>(end - begin));
      for (int64_t pos = begin; pos < end; ++pos) slots[static_cast<std::size_t>(pos - begin)] = attn::dense_slot(p, g.b, pos);
      for (int r = 0; r < rows; ++r) {
        const int64_t i = g.i0 + r / nh;
        limit[static_cast<std::size_t>(r)] = std::clamp<int64_t>(attn::visible_tokens(p, g.b, i) - begin, 0, end - begin);
      }
    }

    std::vector<float> q(static_cast<std::size_t>(rows) * kQkDim);
    for (int r = 0; r < rows; ++r) {
      const int64_t i = g.i0 + r / nh, h = g.h0 + r % nh;
      float* dst = q.data() + static_cast<std::size_t>(r) * kQkDim;
      for (int d = 0; d < kQkDim; ++d) dst[d] = attn::q_at(p, g.b, i, h, d) * scale;
    }
    cpu::UnitArgs a;
    a.cache = &p.cache;
    a.slots = slots.data();
    a.n_tokens = end - begin;
    a.q = q.data();
    a.rows = rows;
    a.row_limit = limit.data();
    a.o = part_o[gi].data() + static_cast<std::size_t>(split) * static_cast<std::size_t>(rows) * kLatentDim;
    a.lse = part_lse[gi].data() + static_cast<std::size_t>(split) * static_cast<std::size_t>(rows);
    cpu::run_attention_unit(a);
  };

  const int64_t n_units = static_cast<int64_t>(groups.size()) * S;
  if (opt.pool) {
    opt.pool->parallel_for(n_units, run_unit);
  } else {
    for (int64_t u = 0; u < n_units; ++u) run_unit(u, 0);
  }

  // Merge the splits of every row into out / lse.
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    const int rows = g.rows();
    const int64_t nh = g.h1 - g.h0;
    for (int r = 0; r < rows; ++r) {
      const int64_t i = g.i0 + r / nh, h = g.h0 + r % nh;
      float* out = attn::out_row(p, g.b, i, h);
      std::memset(out, 0, sizeof(float) * kLatentDim);
      AttnState st;
      for (int k = 0; k < S; ++k) {
        const std::size_t row = static_cast<std::size_t>(k) * static_cast<std::size_t>(rows) + static_cast<std::size_t>(r);
        st.merge(out, part_o[gi].data() + row * kLatentDim, part_lse[gi][row], kLatentDim);
      }
      attn::lse_at(p, g.b, i, h) = st.lse;
    }
  }
  return Status::Ok();
}

}  // namespace mlakv
