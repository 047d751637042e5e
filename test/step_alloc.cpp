// step_alloc: a training step on the CPU allocates nothing once its buffers have grown to the batch's
// shape (the activations' arena, the product's packing workspace, the per-thread scratch rows). Every call
// of operator new is counted (std::vector and the other containers go through it); after a first step on
// each of two batches, the steps that follow on either must count none. The count is checked to work: a
// vector made inside the counted span is seen.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "../transformer.h"
#include "check.h"

static std::atomic<long> g_news{0};

void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

static Batch numbers_batch(int B, int src_len, int tgt_len, uint64_t seed, int V) {
  std::vector<std::vector<int>> src(B), tgt(B);
  for (int b = 0; b < B; ++b) {
    src[b].resize(src_len - b % 3), tgt[b].resize(tgt_len - b % 2);  // padding in both
    for (int& x : src[b]) x = 4 + (int)(mix64(seed++) % (V - 4));
    for (int& x : tgt[b]) x = 4 + (int)(mix64(seed++) % (V - 4));
  }
  std::vector<const std::vector<int>*> s, t;
  for (int b = 0; b < B; ++b) s.push_back(&src[b]), t.push_back(&tgt[b]);
  return make_batch(s, t);
}

int main() {
  Checker ck("step_alloc");
  Config c = config_preset("small");
  c.V = 500, c.p_attn = c.p_relu = 0.1;  // every dropout site on
  Transformer<float> m(c, 3);
  const Batch a = numbers_batch(16, 20, 18, 1, c.V), b = numbers_batch(8, 30, 25, 99, c.V);
  const std::vector<const Batch*> just_a = {&a}, just_b = {&b};  // made here: the count is the library's
  const std::vector<int> micro = {0};
  auto step = [&](const Batch& x) {
    accumulate_gradients(m, &x == &a ? just_a : just_b, micro, x.target_tokens());
    transformer_update(m);
  };
  step(a), step(b);  // the buffers grow to both shapes
  const long before = g_news.load();
  for (int i = 0; i < 3; ++i) step(a), step(b);
  const long news = g_news.load() - before;
  std::printf("step_alloc: 6 training steps (small config, V %d, batches of 16 x 20/18 and 8 x 30/25 tokens): %ld "
              "allocations (want 0)\n", c.V, news);
  ck.expect(news == 0, "%ld allocations in 6 steps after the first two", news);
  // the counter sees what it must: a vector made inside a counted span
  const long control = g_news.load();
  std::vector<float> v(10);
  ck.expect(g_news.load() - control == 1 && v.size() == 10, "the counter missed a vector's allocation");
  return ck.finish();
}
