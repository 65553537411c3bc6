// mlakv eval's pieces on a tiny fixture model (tests/data/model_parity/v3_moe, vocab 96)
// and on the shipped model's needle fixture (the Python reference's trials).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "mlakv/eval.h"
#include "mlakv/model.h"
#include "mlakv/tokenizer.h"

namespace mlakv {
namespace {

const std::string kData = MLAKV_TEST_DATA_DIR;
const std::string kTiny = kData + "/model_parity/v3_moe";
const std::string kShipped = std::string(MLAKV_SOURCE_DIR) + "/models/mlakv-ds3-tiny";

std::unique_ptr<Model> tiny() {
  auto m = Model::load(kTiny, {.threads = 2});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

TEST(EvalWindows, ConsecutiveSlicesAndTooShortInput) {
  std::vector<int32_t> t(100);
  for (int i = 0; i < 100; ++i) t[static_cast<std::size_t>(i)] = i;
  auto w = eval_windows(t, 30, 3);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->size(), 3u);
  EXPECT_EQ((*w)[2][0], 60);
  EXPECT_EQ((*w)[2].size(), 30u);
  auto bad = eval_windows(t, 30, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("100 tokens"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("need 120"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(eval_windows(t, 30, 3, 20).ok());  // 20 + 90 > 100
  EXPECT_FALSE(eval_windows(t, 1, 3).ok());
  EXPECT_FALSE(eval_windows(t, 30, 0).ok());
}

TEST(Evaluate, KnownAnswersOnATinyModel) {
  auto m = tiny();
  ASSERT_TRUE(m);
  const auto toks = random_tokens(3 * 64, m->vocab_size(), 9);
  std::vector<EvalCacheSpec> specs = {
      {KvFormat::kBf16, {}, "none"}, {KvFormat::kNvfp4DsMla, {}, "none"}, {KvFormat::kF32, {}, "none"}};
  auto rep = evaluate(*m, toks, specs, {.context = 64, .windows = 3, .block_size = 16});
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->reference.count(), 3 * 64);
  EXPECT_EQ(rep->reference.nll_count(), 3 * 63);  // the last position of a window has no target
  EXPECT_EQ(rep->reference.kld_max(), 0.0);       // the reference against itself
  // bf16 rounds the cache: a small, non-zero cost, and nvfp4 a larger one.
  const double kb = rep->rows[0].kld.kld_mean(), kn = rep->rows[1].kld.kld_mean();
  EXPECT_GT(kb, 0.0);
  EXPECT_GT(kn, kb);
  EXPECT_LT(kb, 1e-3);
  // The unquantized f32 records are the reference's: KLD 0 and full agreement, exactly.
  EXPECT_EQ(rep->rows[2].kld.kld_max(), 0.0);
  EXPECT_EQ(rep->rows[2].kld.kld_mean(), 0.0);
  EXPECT_EQ(rep->rows[2].kld.top1_agree(), 1.0);
  EXPECT_EQ(rep->rows[2].kld.ppl_q(), rep->reference.ppl_ref());
  // Perplexity of the reference from its own NLLs: exp(mean NLL), recomputed here from logits.
  EXPECT_GT(rep->reference.ppl_ref(), 1.0);
  EXPECT_LT(rep->reference.ppl_ref(), 2.0 * m->vocab_size());
}

TEST(Calibrate, EqualsMaxAbsOver2688OfTheCapturedLatents) {
  auto m = tiny();
  ASSERT_TRUE(m);
  const auto toks = random_tokens(2 * 48, m->vocab_size(), 11);
  auto s = calibrate_outer_scales(*m, toks, 48, 2);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  // Capture kv_c_normed independently through the observer and take max |.| per layer, on
  // the cache calibration runs through (the paged f32 one, eval.cc's reference spec): layers
  // after the first see attention outputs, which the float32 ReferenceKvCache's kernels give
  // to within an ulp but not bit for bit on every CPU (on a Zen 3 AVX2 machine one layer's
  // max differed by 1 ulp), and the check is of max / 2688, not of the attention kernels.
  std::vector<double> mx(static_cast<std::size_t>(m->num_layers()), 0.0);
  auto ref = m->create_cache({{KvFormat::kF32, 1.0f}}, 48, kDefaultBlockSize);
  ASSERT_TRUE(ref.ok());
  std::vector<float> logits(static_cast<std::size_t>(m->vocab_size()));
  for (int w = 0; w < 2; ++w) {
    const SeqId seq = (*ref)->add_sequence();
    ForwardOptions fo;
    fo.last_token_only = true;
    fo.observer = [&](int layer, const TensorView& kv) {
      for (int64_t i = 0; i < kv.numel(); ++i) {
        mx[static_cast<std::size_t>(layer)] = std::max(mx[static_cast<std::size_t>(layer)],
                                                       std::fabs(static_cast<double>(kv.ptr<const float>()[i])));
      }
    };
    ASSERT_TRUE(m->forward(**ref, seq, std::span<const int32_t>(toks).subspan(static_cast<std::size_t>(48 * w), 48),
                           TensorView::contiguous(logits.data(), DType::kF32, {1, m->vocab_size()}), fo)
                    .ok());
    ASSERT_TRUE((*ref)->free(seq).ok());
  }
  ASSERT_EQ(s->num_layers(), m->num_layers());
  for (int l = 0; l < m->num_layers(); ++l) {
    EXPECT_DOUBLE_EQ(s->max_abs[static_cast<std::size_t>(l)], mx[static_cast<std::size_t>(l)]);
    EXPECT_DOUBLE_EQ(s->scales[static_cast<std::size_t>(l)], mx[static_cast<std::size_t>(l)] / 2688.0);
  }
}

TEST(Generate, GreedyIsDeterministicAndStopsAtTheLimit) {
  auto m = tiny();
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  EvalCacheSpec spec{KvFormat::kFp8DsMla, {}, "none"};
  auto a = generate_greedy(*m, prompt, 6, &spec);
  auto b = generate_greedy(*m, prompt, 6, &spec);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens.size(), 6u);
  EXPECT_EQ(a->tokens, b->tokens);
  // Each generated token is the argmax of a full prefill of everything before it.
  auto ref = m->create_reference_cache();
  std::vector<int32_t> ctx = prompt;
  auto r = generate_greedy(*m, prompt, 3, nullptr);
  ASSERT_TRUE(r.ok());
  for (int g = 0; g < 3; ++g) {
    std::vector<float> logits(static_cast<std::size_t>(m->vocab_size()));
    const SeqId seq = (*ref)->add_sequence();
    ForwardOptions fo;
    fo.last_token_only = true;
    ASSERT_TRUE(m->forward(**ref, seq, ctx, TensorView::contiguous(logits.data(), DType::kF32, {1, m->vocab_size()}), fo)
                    .ok());
    ASSERT_TRUE((*ref)->free(seq).ok());
    const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(r->tokens[static_cast<std::size_t>(g)], best) << "step " << g;
    ctx.push_back(best);
  }
  EXPECT_FALSE(generate_greedy(*m, {}, 3, nullptr).ok());
}

// The C++ trials equal the Python reference's (tools/train_model/needle.py) token for token.
TEST(Needle, TrialsMatchThePythonReference) {
  std::ifstream f(kData + "/needle/mlakv-ds3-tiny.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json fx = nlohmann::json::parse(f);
  auto tok = Tokenizer::load(kShipped);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::ifstream t(kShipped + "/eval.txt", std::ios::binary);
  std::stringstream ss;
  ss << t.rdbuf();
  auto ids = tok->encode(ss.str(), false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(static_cast<int64_t>(ids->size()), fx["eval_tokens"].get<int64_t>());
  const int n = static_cast<int>(fx["trials"].size());
  auto trials = make_needle_trials(*tok, *ids, fx["max_position_embeddings"].get<int64_t>(), n);
  ASSERT_TRUE(trials.ok()) << trials.status().to_string();
  for (int i = 0; i < n; ++i) {
    const auto& e = fx["trials"][static_cast<std::size_t>(i)];
    const NeedleTrial& tr = (*trials)[static_cast<std::size_t>(i)];
    SCOPED_TRACE(i);
    EXPECT_EQ(tr.length, e["context_len"].get<int64_t>());
    EXPECT_DOUBLE_EQ(tr.depth, e["depth"].get<double>());
    EXPECT_EQ(tr.key, e["keys"][0].get<std::string>());
    EXPECT_EQ(tr.value, e["values"][0].get<std::string>());
    ASSERT_EQ(static_cast<int64_t>(tr.prompt.size()), e["prompt_len"].get<int64_t>());
    const auto head = e["prompt_head"].get<std::vector<int32_t>>();
    const auto tail = e["prompt_tail"].get<std::vector<int32_t>>();
    EXPECT_TRUE(std::equal(head.begin(), head.end(), tr.prompt.begin()));
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), tr.prompt.end() - static_cast<std::ptrdiff_t>(tail.size())));
  }
}

TEST(Needle, TooLittleTextIsAnError) {
  const Tokenizer tok = Tokenizer::byte_level();
  std::vector<int32_t> few(100, 'a');
  auto t = make_needle_trials(tok, few, 4096, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("100 are available"), std::string::npos) << t.status().message();
  EXPECT_FALSE(make_needle_trials(tok, few, 4096, 0).ok());
}

}  // namespace
}  // namespace mlakv
