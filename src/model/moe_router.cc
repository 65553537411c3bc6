// MoE routing (src/model/moe_router.h).
#include "model/moe_router.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace mlakv::model {

std::vector<int> torch_topk(std::span<const float> values, int k, bool sorted) {
  using Elem = std::pair<float, int64_t>;
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<Elem> q(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[static_cast<std::size_t>(j)] = {values[static_cast<std::size_t>(j)], j};
  const auto before = [](const Elem& a, const Elem& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
  };
  if (int64_t{k} * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), before);
  } else {
    std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), before);
    if (sorted) std::sort(q.begin(), q.begin() + (k - 1), before);
  }
  std::vector<int> out(static_cast<std::size_t>(k));
  for (int j = 0; j < k; ++j) out[static_cast<std::size_t>(j)] = static_cast<int>(q[static_cast<std::size_t>(j)].second);
  return out;
}

Status validate_routing(const MoeRouting& r) {
  const int E = r.num_experts;
  if (E < 1) return invalid_argument(fmt::format("n_routed_experts = {} must be >= 1", E));
  if (r.top_k < 1 || r.top_k > E)
    return invalid_argument(fmt::format("num_experts_per_tok = {} must be in [1, n_routed_experts = {}]", r.top_k, E));
  const bool grouped = r.method != MoeTopkMethod::kGreedy;
  if (grouped) {
    if (r.n_group < 1 || E % r.n_group != 0)
      return invalid_argument(fmt::format("n_group = {} must be >= 1 and divide n_routed_experts = {}", r.n_group, E));
    if (r.topk_group < 1 || r.topk_group > r.n_group)
      return invalid_argument(fmt::format("topk_group = {} must be in [1, n_group = {}]", r.topk_group, r.n_group));
    if (r.method == MoeTopkMethod::kNoAuxTc && E / r.n_group < 2)
      return invalid_argument(fmt::format(
          "n_routed_experts / n_group = {} / {}: the V3 router scores each group by its top-2 experts, so every "
          "group needs at least 2",
          E, r.n_group));
    if (r.method == MoeTopkMethod::kNoAuxTc && r.top_k > r.topk_group * (E / r.n_group))
      return invalid_argument(fmt::format(
          "num_experts_per_tok = {} exceeds the {} experts of the topk_group = {} kept groups", r.top_k,
          r.topk_group * (E / r.n_group), r.topk_group));
  }
  if ((r.method == MoeTopkMethod::kNoAuxTc) != (r.scoring == MoeScoring::kSigmoid))
    return unimplemented("the sigmoid scoring goes with the V3 group rule (noaux_tc) and softmax with the V2 "
                         "methods; this combination is not a transformers router");
  if (!(r.routed_scaling_factor > 0.0) || !std::isfinite(r.routed_scaling_factor))
    return invalid_argument(fmt::format("routed_scaling_factor = {} must be finite and > 0", r.routed_scaling_factor));
  return Status::Ok();
}

namespace {

// Marks the kept groups: group_keep[g] = 1 for the topk_group best group scores.
std::vector<char> keep_groups(std::span<const float> group_scores, int topk_group) {
  std::vector<char> keep(group_scores.size(), 0);
  for (int g : torch_topk(group_scores, topk_group, false)) keep[static_cast<std::size_t>(g)] = 1;
  return keep;
}

}  // namespace

Route route_token(const MoeRouting& r, std::span<const float> logits, std::span<const float> bias) {
  const int E = r.num_experts;
  const int per_group = r.method == MoeTopkMethod::kGreedy ? E : E / r.n_group;
  const int groups = r.method == MoeTopkMethod::kGreedy ? 1 : r.n_group;
  std::vector<float> s(static_cast<std::size_t>(E));
  Route out;
  if (r.scoring == MoeScoring::kSigmoid) {
    for (int e = 0; e < E; ++e) {
      s[static_cast<std::size_t>(e)] =
          static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[static_cast<std::size_t>(e)]))));
    }
    std::vector<float> c(s);
    if (!bias.empty())
      for (int e = 0; e < E; ++e) c[static_cast<std::size_t>(e)] = s[static_cast<std::size_t>(e)] + bias[static_cast<std::size_t>(e)];
    std::vector<float> gs(static_cast<std::size_t>(groups));
    for (int g = 0; g < groups; ++g) {
      const std::span<const float> grp(c.data() + static_cast<std::ptrdiff_t>(g) * per_group, static_cast<std::size_t>(per_group));
      // Sum of the top-2 values (ties do not change the values).
      float a = -std::numeric_limits<float>::infinity(), b = a;
      for (float v : grp) {
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gs[static_cast<std::size_t>(g)] = a + b;
    }
    const std::vector<char> keep = keep_groups(gs, r.topk_group);
    for (int e = 0; e < E; ++e)
      if (!keep[static_cast<std::size_t>(e / per_group)]) c[static_cast<std::size_t>(e)] = -std::numeric_limits<float>::infinity();
    out.experts = torch_topk(c, r.top_k, false);
    for (int e : out.experts) out.weights.push_back(s[static_cast<std::size_t>(e)]);
    if (r.norm_topk_prob) {
      float sum = 0.0f;
      for (float w : out.weights) sum += w;
      const float den = sum + 1e-20f;
      for (float& w : out.weights) w /= den;
    }
  } else {
    // softmax in float32 as torch returns it: max-subtracted exp, computed in float64
    // here and rounded once.
    double m = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e) m = std::max(m, static_cast<double>(logits[static_cast<std::size_t>(e)]));
    double sum = 0.0;
    std::vector<double> ex(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) sum += ex[static_cast<std::size_t>(e)] = std::exp(static_cast<double>(logits[static_cast<std::size_t>(e)]) - m);
    for (int e = 0; e < E; ++e) s[static_cast<std::size_t>(e)] = static_cast<float>(ex[static_cast<std::size_t>(e)] / sum);
    std::vector<float> c(s);
    if (r.method == MoeTopkMethod::kGroupLimitedGreedy) {
      std::vector<float> gs(static_cast<std::size_t>(groups), -std::numeric_limits<float>::infinity());
      for (int e = 0; e < E; ++e) gs[static_cast<std::size_t>(e / per_group)] = std::max(gs[static_cast<std::size_t>(e / per_group)], s[static_cast<std::size_t>(e)]);
      const std::vector<char> keep = keep_groups(gs, r.topk_group);
      for (int e = 0; e < E; ++e)
        if (!keep[static_cast<std::size_t>(e / per_group)]) c[static_cast<std::size_t>(e)] = 0.0f;
    }
    out.experts = torch_topk(c, r.top_k, false);
    for (int e : out.experts) out.weights.push_back(c[static_cast<std::size_t>(e)]);
  }
  const float scale = static_cast<float>(r.routed_scaling_factor);
  for (float& w : out.weights) w *= scale;
  return out;
}

}  // namespace mlakv::model
