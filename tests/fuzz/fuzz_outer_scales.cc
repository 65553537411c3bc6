// Outer-scale files (parse_outer_scales). Invariants: accepted scales are finite, > 0
// and hold in float32; parse -> outer_scales_to_json -> parse gives identical values.
#include <cmath>

#include "fuzz_common.h"
#include "mlakv/outer_scales.h"

using namespace mlakv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto s = parse_outer_scales(fuzz::as_text(data, size), "scales.json");
  if (!s.ok()) {
    fuzz::check_not_internal(s.status());
    return 0;
  }
  MLAKV_FUZZ_CHECK(s->num_layers() >= 1, "");
  for (int l = 0; l < s->num_layers(); ++l) {
    const float f = s->scale_for(l);
    MLAKV_FUZZ_CHECK(std::isfinite(f) && f > 0.0f, std::to_string(l));
  }
  auto text = outer_scales_to_json(*s);
  MLAKV_FUZZ_CHECK(text.ok(), text.status().to_string());
  auto t = parse_outer_scales(*text, "again");
  MLAKV_FUZZ_CHECK(t.ok(), t.status().to_string());
  MLAKV_FUZZ_CHECK(t->scales == s->scales && t->max_abs == s->max_abs && t->latent_dim == s->latent_dim, *text);
  return 0;
}
