// config.json (parse_hf_config) and quantization settings (parse_weight_quant_options)
// from the same bytes, plus the shared JSON entry (parse -> serialize -> parse).
// Invariants: an accepted config validates, its counts are bounded (cache_layers,
// indexer layers), its softmax scale is finite and > 0; accepted quantization options
// have positive, bounded fp8 blocks and bits in [1, 64].
#include <cmath>

#include "core/untrusted_json.h"
#include "fuzz_common.h"
#include "mlakv/hf_config.h"
#include "mlakv/kv_b_proj.h"

using namespace mlakv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  auto j = json_util::parse(text, "fuzz", {.require_object = false});
  if (j.ok()) {
    const std::string once = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    auto k = json_util::parse(once, "fuzz-again", {.require_object = false});
    MLAKV_FUZZ_CHECK(k.ok(), k.status().to_string());
    MLAKV_FUZZ_CHECK(k->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) == once, once);
  } else {
    fuzz::check_not_internal(j.status());
  }

  auto c = parse_hf_config(text, "config.json");
  if (c.ok()) {
    MLAKV_FUZZ_CHECK(c->validate().ok(), c->validate().to_string());
    MLAKV_FUZZ_CHECK(c->cache_layers() <= 2 * int64_t{kMaxModelLayers}, "");
    MLAKV_FUZZ_CHECK(c->indexer_layers >= 0 && c->indexer_layers <= c->cache_layers(), "");
    const double s = c->softmax_scale();
    MLAKV_FUZZ_CHECK(std::isfinite(s) && s > 0, std::to_string(s));
  } else {
    fuzz::check_not_internal(c.status());
  }

  auto q = parse_weight_quant_options(text);
  if (q.ok()) {
    MLAKV_FUZZ_CHECK(q->fp8_block_rows >= 1 && q->fp8_block_rows <= kMaxFp8BlockExtent, "");
    MLAKV_FUZZ_CHECK(q->fp8_block_cols >= 1 && q->fp8_block_cols <= kMaxFp8BlockExtent, "");
    MLAKV_FUZZ_CHECK(q->bits >= 1 && q->bits <= 64, std::to_string(q->bits));
    MLAKV_FUZZ_CHECK(q->group_size == -1 || q->group_size >= 0, "");
  } else {
    fuzz::check_not_internal(q.status());
  }
  return 0;
}
