// MoE routing (src/model/moe_router.h) against transformers and against hand-worked
// cases.
//
//  * torch.topk tie order: expected index lists printed by torch 2.11 on the CPU for
//    the inputs below (equal values everywhere, so only the tie rule decides).
//  * routing.json (tools/make_model_parity_fixtures.py): transformers' own
//    DeepseekV3TopkRouter / DeepseekV2TopkRouter on 24 logit rows per setup drawn from a
//    grid of step 1/4 (ties in nearly every row; row 0 all equal). Experts must match in
//    torch's order exactly; weights within 8 ulp (2^-21 relative): sigmoid / softmax /
//    the norm_topk_prob division are each a correctly rounded or 1-ulp float32 result in
//    both implementations, so a few ulp separate them, never more.
//  * Hand cases: the group rule, masked groups (-inf for V3, 0 for V2), the weight
//    normalisation and scaling, worked out in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/moe_router.h"

namespace mlakv::model {
namespace {

TEST(MoeTopk, TiesFollowTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<float> v;
    int k;
    std::vector<int> want;
  };
  std::vector<float> big(67, 1.0f);
  big[0] = 2.0f;
  const std::vector<Case> cases = {
      {{1, 1, 1, 1}, 1, {2}},
      {{1, 1, 1, 1}, 2, {2, 3}},
      {{1, 1, 1, 1}, 3, {2, 3, 0}},
      {{0.5f, 1, 1, 0.5f, 1, 0.2f}, 1, {2}},
      {{0.5f, 1, 1, 0.5f, 1, 0.2f}, 2, {2, 4}},
      {{0.5f, 1, 1, 0.5f, 1, 0.2f}, 3, {2, 4, 1}},
      {big, 1, {0}},
      {big, 2, {0, 45}},  // k * 64 <= n: the partial_sort branch
      {big, 3, {0, 45, 43}},
      {{-inf, -inf, -inf, -inf, 1, 2}, 4, {3, 5, 4, 0}},
      {std::vector<float>(256, 1.0f), 8, {172, 169, 170, 171, 174, 175, 168, 173}},
      {std::vector<float>(8, 1.0f), 4, {6, 5, 4, 7}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(torch_topk(c.v, c.k, false), c.want) << "n " << c.v.size() << " k " << c.k;
  }
}

MoeRouting routing_from(const nlohmann::json& cfg) {
  MoeRouting r;
  r.num_experts = cfg.at("n_routed_experts").get<int>();
  r.top_k = cfg.at("num_experts_per_tok").get<int>();
  r.n_group = cfg.at("n_group").get<int>();
  r.topk_group = cfg.at("topk_group").get<int>();
  r.routed_scaling_factor = cfg.at("routed_scaling_factor").get<double>();
  if (cfg.at("model_type") == "deepseek_v3") {
    r.scoring = MoeScoring::kSigmoid;
    r.method = MoeTopkMethod::kNoAuxTc;
    r.norm_topk_prob = cfg.at("norm_topk_prob").get<bool>();
  } else {
    r.scoring = MoeScoring::kSoftmax;
    r.method = cfg.at("topk_method") == "greedy" ? MoeTopkMethod::kGreedy : MoeTopkMethod::kGroupLimitedGreedy;
  }
  return r;
}

TEST(MoeRouting, MatchesTransformers) {
  std::ifstream f(std::string(MLAKV_TEST_DATA_DIR) + "/model_parity/routing.json");
  ASSERT_TRUE(f.good()) << "tests/data/model_parity/routing.json is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(ss.str());
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& c : cases) {
    const MoeRouting r = routing_from(c.at("config"));
    ASSERT_TRUE(validate_routing(r).ok()) << c.at("name");
    const std::vector<float> bias = c.at("bias").get<std::vector<float>>();
    const auto logits = c.at("logits").get<std::vector<std::vector<float>>>();
    const auto experts = c.at("experts").get<std::vector<std::vector<int>>>();
    const auto weights = c.at("weights").get<std::vector<std::vector<float>>>();
    for (std::size_t t = 0; t < logits.size(); ++t) {
      const Route got = route_token(r, logits[t], bias);
      EXPECT_EQ(got.experts, experts[t]) << c.at("name") << " row " << t;
      ASSERT_EQ(got.weights.size(), weights[t].size());
      for (std::size_t j = 0; j < got.weights.size(); ++j) {
        EXPECT_NEAR(got.weights[j], weights[t][j], std::ldexp(std::fabs(weights[t][j]), -21))
            << c.at("name") << " row " << t << " slot " << j;
      }
    }
  }
}

// V3, E = 8 in 4 groups of 2, keep 2 groups, top 2, norm, scale 2.
// logits chosen so sigmoid values are simple: logit 0 -> 0.5. Bias shifts choice only.
TEST(MoeRouting, V3GroupsAndBiasByHand) {
  MoeRouting r;
  r.num_experts = 8;
  r.top_k = 2;
  r.n_group = 4;
  r.topk_group = 2;
  r.norm_topk_prob = true;
  r.routed_scaling_factor = 2.0;
  ASSERT_TRUE(validate_routing(r).ok());
  // s = sigmoid(logits); with all logits 0, s = 0.5 everywhere and c = 0.5 + bias.
  const std::vector<float> logits(8, 0.0f);
  // Biases: group 0 (experts 0,1): 0.30, -0.30 -> c 0.80, 0.20, group sum 1.00
  //         group 1 (2,3):         0.10,  0.10 -> 0.60, 0.60, sum 1.20
  //         group 2 (4,5):         0.40, -0.40 -> 0.90, 0.10, sum 1.00 - 1e-7ish? no: exactly 1.00
  //         group 3 (6,7):         0.00,  0.05 -> 0.50, 0.55, sum 1.05
  // Groups kept: 1 (1.20) and 3 (1.05). Expert 4 has the highest single c (0.90) but
  // its group is masked to -inf, so the picks are 2 and 3 (c 0.60 each; then 7 at 0.55).
  const std::vector<float> bias = {0.30f, -0.30f, 0.10f, 0.10f, 0.40f, -0.40f, 0.0f, 0.05f};
  const Route got = route_token(r, logits, bias);
  std::vector<int> sorted = got.experts;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{2, 3}));
  // Weights are s (0.5 each), not c: normalised 0.5 / (1.0 + 1e-20) = 0.5, times 2 = 1.
  for (float w : got.weights) EXPECT_EQ(w, 1.0f);

  // Without renormalisation: 0.5 * 2 = 1 as well; make the sigmoids differ instead.
  r.norm_topk_prob = false;
  std::vector<float> l2(8, 0.0f);
  l2[2] = std::log(3.0f);  // sigmoid = 0.75
  const Route g2 = route_token(r, l2, bias);
  ASSERT_EQ(g2.experts.size(), 2u);
  for (std::size_t j = 0; j < 2; ++j) {
    if (g2.experts[j] == 2) {
      EXPECT_NEAR(g2.weights[j], 1.5f, 1e-6f);
    } else {
      EXPECT_EQ(g2.weights[j], 1.0f) << g2.experts[j];
    }
  }
}

// V3 with top_k larger than one group: a masked group's experts (-inf) never appear.
TEST(MoeRouting, V3MaskedGroupsNeverPicked) {
  MoeRouting r;
  r.num_experts = 8;
  r.top_k = 4;
  r.n_group = 4;
  r.topk_group = 2;
  r.norm_topk_prob = true;
  r.routed_scaling_factor = 1.0;
  // logits: group 0 strong (2, 2), group 2 strong (3, -3: one high expert; top-2 sum
  // s(3)+s(-3) = 1.0 exactly), group 1 (1, 1), group 3 (0, 0).
  // Group sums: g0 2 s(2) = 1.762, g1 2 s(1) = 1.462, g2 1.000, g3 1.000.
  // Kept: g0, g1, so expert 4 (the single largest score s(3) = 0.953) is excluded.
  const std::vector<float> logits = {2, 2, 1, 1, 3, -3, 0, 0};
  const Route got = route_token(r, logits, {});
  std::vector<int> sorted = got.experts;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3}));
  double sum = 0;
  for (float w : got.weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-6);  // renormalised, scale 1
}

// V2 group-limited: masked scores become 0 (not -inf); V2 never renormalises.
TEST(MoeRouting, V2GroupLimitedByHand) {
  MoeRouting r;
  r.scoring = MoeScoring::kSoftmax;
  r.method = MoeTopkMethod::kGroupLimitedGreedy;
  r.num_experts = 4;
  r.top_k = 2;
  r.n_group = 2;
  r.topk_group = 1;
  r.routed_scaling_factor = 3.0;
  ASSERT_TRUE(validate_routing(r).ok());
  // logits ln(1), ln(2), ln(3), ln(4): softmax 0.1, 0.2, 0.3, 0.4. Group maxes 0.2, 0.4:
  // group 1 kept; picks 3 (0.4) and 2 (0.3); weights * 3 = 1.2, 0.9.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const Route got = route_token(r, logits, {});
  std::vector<std::pair<int, float>> p;
  for (std::size_t j = 0; j < 2; ++j) p.emplace_back(got.experts[j], got.weights[j]);
  std::sort(p.begin(), p.end());
  EXPECT_EQ(p[0].first, 2);
  EXPECT_NEAR(p[0].second, 0.9f, 1e-6f);
  EXPECT_EQ(p[1].first, 3);
  EXPECT_NEAR(p[1].second, 1.2f, 1e-6f);
  // top_k 3 with only 2 experts in the kept group: the third pick is a masked expert
  // with weight 0 (transformers masks V2 scores to 0.0 and still takes top_k).
  r.top_k = 3;
  const Route g3 = route_token(r, logits, {});
  ASSERT_EQ(g3.weights.size(), 3u);
  float zero_weights = 0;
  for (float w : g3.weights) zero_weights += (w == 0.0f) ? 1 : 0;
  EXPECT_EQ(zero_weights, 1);
}

TEST(MoeRouting, ValidateNamesTheField) {
  MoeRouting r;
  r.num_experts = 8;
  r.top_k = 9;
  EXPECT_NE(validate_routing(r).message().find("num_experts_per_tok"), std::string::npos);
  r.top_k = 2;
  r.n_group = 3;
  EXPECT_NE(validate_routing(r).message().find("n_group"), std::string::npos);
  r.n_group = 8;  // 1 expert per group: the V3 top-2 group score is undefined
  r.topk_group = 2;
  EXPECT_NE(validate_routing(r).message().find("at least 2"), std::string::npos);
  r.n_group = 4;
  r.topk_group = 5;
  EXPECT_NE(validate_routing(r).message().find("topk_group"), std::string::npos);
  r.topk_group = 1;
  r.top_k = 3;  // 1 kept group of 2 experts cannot supply 3 picks
  EXPECT_NE(validate_routing(r).message().find("exceeds"), std::string::npos);
  r.top_k = 2;
  r.routed_scaling_factor = 0.0;
  EXPECT_NE(validate_routing(r).message().find("routed_scaling_factor"), std::string::npos);
}

}  // namespace
}  // namespace mlakv::model
