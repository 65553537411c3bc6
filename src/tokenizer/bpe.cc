// BPE merges, as the library applies them (Word::merge_all in
// tokenizers/src/models/bpe/word.rs): every adjacent pair with a merge goes into a
// priority queue ordered by (rank, position); the lowest is merged, stale entries are
// skipped, and the new symbol's pairs with its neighbours are queued. O(n log n) per
// word; words up to kCacheMaxWordBytes are cached.
#include <queue>

#include <fmt/format.h>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace mlakv::tok {

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes; 0 once merged into its left neighbour
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue pops the largest: make the lowest (rank, pos) the largest.
  bool operator<(const QueuedMerge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

Status Bpe::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return Status::Ok();
    }
  }
  const std::size_t first = out->size();
  MLAKV_RETURN_IF_ERROR(merge_word(word, out));
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::move(key), std::vector<int32_t>(out->begin() + static_cast<std::ptrdiff_t>(first), out->end()));
    }
  }
  return Status::Ok();
}

Status Bpe::merge_word(std::string_view word, std::vector<int32_t>* out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(std::string(word)); it != vocab.end()) {
      out->push_back(it->second);
      return Status::Ok();
    }
  }
  // BPE::merge_word: one symbol per character; characters without a token become unk
  // (fused into one when fuse_unk).
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&syms](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(syms.size());
    if (n > 0) syms.back().next = n;
    syms.push_back({id, n - 1, -1, len});
  };
  bool have_unk = false;
  uint32_t unk_len = 0;
  std::string ch;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t len = utf8_char_len(static_cast<unsigned char>(word[i]));
    ch.assign(word.substr(i, len));
    if (auto it = vocab.find(ch); it != vocab.end()) {
      if (have_unk) add(*unk_id, unk_len);
      have_unk = false;
      add(it->second, static_cast<uint32_t>(len));
    } else if (unk_id) {
      if (have_unk && fuse_unk) {
        unk_len += static_cast<uint32_t>(len);
      } else {
        if (have_unk) add(*unk_id, unk_len);
        have_unk = true;
        unk_len = static_cast<uint32_t>(len);
      }
    } else {
      return invalid_argument(fmt::format(
          "the character U+{:04X} has no token in the BPE vocab and the model has no unk_token "
          "(the tokenizers library would drop it silently)",
          decode_utf8_at(word, i)));
    }
    i += len;
  }
  if (have_unk) add(*unk_id, unk_len);

  std::priority_queue<QueuedMerge> queue;
  for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
    if (auto it = merges.find(pair_key(syms[i].id, syms[i + 1].id)); it != merges.end()) {
      queue.push({it->second.rank, static_cast<int32_t>(i), it->second.new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& cur = syms[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = syms[next_pos];
    // A stale entry: the pair at this position is no longer the one queued.
    auto it = merges.find(pair_key(cur.id, right.id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (auto m = merges.find(pair_key(syms[cur.prev].id, cur.id)); m != merges.end()) {
        queue.push({m->second.rank, cur.prev, m->second.new_id});
      }
    }
    if (cur.next >= 0) {
      if (auto m = merges.find(pair_key(cur.id, syms[cur.next].id)); m != merges.end()) {
        queue.push({m->second.rank, top.pos, m->second.new_id});
      }
    }
  }
  for (const Symbol& s : syms) {
    if (s.len != 0) out->push_back(s.id);
  }
  return Status::Ok();
}

}  // namespace mlakv::tok
