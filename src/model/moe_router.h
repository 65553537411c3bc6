// MoE routing exactly as transformers 5 does it (docs/reference.md section 11; checked
// against transformers 5.17 modeling_deepseek_v2.py / modeling_deepseek_v3.py and
// modeling_glm4_moe_lite.py, facts only):
//
// V3 (DeepseekV3TopkRouter, also Kimi K2, GLM-4.7-Flash, GLM-5, V3.2):
//   s = sigmoid(logits)            c = s + e_score_correction_bias
//   group score = sum of the top-2 c of each group of E / n_group experts
//   keep topk_group groups (torch.topk); the other groups' c become -inf
//   pick top_k experts by masked c (torch.topk); weights = s at those experts
//   norm_topk_prob: w /= (sum w + 1e-20);   w *= routed_scaling_factor
// V2 (DeepseekV2TopkRouter):
//   s = softmax(logits)
//   greedy: top_k of s;  group_limited_greedy: group score = max s of the group, keep
//   topk_group groups, the others' s become 0 (not -inf), then top_k of the masked s
//   w = s at those experts * routed_scaling_factor   (never renormalised)
//
// Ties: torch.topk on the CPU (aten TopKImpl.h) fills (value, index) pairs in index
// order and runs std::partial_sort when k * 64 <= n, else std::nth_element (then
// std::sort of the first k-1 when sorted), with "a before b iff a is NaN and b is not,
// or a > b". Which of several equal values wins is therefore whatever libstdc++'s
// introselect / heap selection leaves in front; torch_topk below runs those same
// standard algorithms with that comparator, so ties resolve as torch resolves them
// (torch's wheels and mlakv both use libstdc++).
#pragma once

#include <span>
#include <vector>

#include "mlakv/model.h"
#include "mlakv/status.h"

namespace mlakv::model {

// Indices of torch.topk(values, k, largest=True, sorted=sorted), in torch's order.
// Requires 1 <= k <= values.size().
std::vector<int> torch_topk(std::span<const float> values, int k, bool sorted);

// Checks the routing parameters (E >= 1, 1 <= top_k <= E, n_group >= 1 dividing E,
// 1 <= topk_group <= n_group, the V3 group rule needing >= 2 experts per group, enough
// experts in the kept groups for top_k, a finite positive routed_scaling_factor).
Status validate_routing(const MoeRouting& r);

struct Route {
  std::vector<int> experts;   // [top_k] in torch's order
  std::vector<float> weights; // [top_k] matching experts
};

// Routes one token. logits [E] f32 (x @ gate.weight^T in f32); bias [E] f32 for the
// sigmoid scoring (e_score_correction_bias; may be empty: zeros).
Route route_token(const MoeRouting& r, std::span<const float> logits, std::span<const float> bias);

}  // namespace mlakv::model
