// tokenizer.json (Tokenizer::from_json), the parser added by the tokenizer work.
// Invariants: an accepted tokenizer encodes a fixed mixed-script text (or refuses it
// with a Status, never kInternal) into ids inside [0, vocab_size) that decode without
// error, and every id it produced names a token (id_to_token succeeds).
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "mlakv/tokenizer.h"

using namespace mlakv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto t = Tokenizer::from_json(fuzz::as_text(data, size), "tokenizer.json");
  if (!t.ok()) {
    fuzz::check_not_internal(t.status());
    return 0;
  }
  MLAKV_FUZZ_CHECK(t->vocab_size() >= 0, "");
  for (const char* text : {"Hello, world! 123", "  tabs\tand\nnewlines  ", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82", ""}) {
    for (bool special : {false, true}) {
      auto ids = t->encode(text, special);
      if (!ids.ok()) {
        fuzz::check_not_internal(ids.status());
        continue;
      }
      for (int32_t id : *ids) {
        MLAKV_FUZZ_CHECK(id >= 0 && id < t->vocab_size(), std::to_string(id));
        MLAKV_FUZZ_CHECK(t->id_to_token(id).ok(), std::to_string(id));
      }
      auto back = t->decode(*ids);
      MLAKV_FUZZ_CHECK(back.ok(), back.status().to_string());
    }
  }
  return 0;
}
