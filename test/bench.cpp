// bench: one training step (forward, backward, Adam) of a model on a fixed batch of random sentence
// pairs, dropout on, timed after warm-up steps. Run by `make bench` (test/bench.sh), not by CTest.
//   bench --config base --batch 256 --len 32 [--steps 5] [--warmup 2]
// prints: STEP config=base device=cpu B=256 L=32 step_ms=... tgt_tok_per_s=...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "../transformer.h"

int main(int argc, char** argv) {
  std::string config = "base";
  int B = 256, L = 32, steps = 5, warmup = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--config") config = v;
    else if (a == "--batch") B = std::atoi(v.c_str());
    else if (a == "--len") L = std::atoi(v.c_str());
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else if (a == "--warmup") warmup = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (B < 1 || L < 2 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "bench: --batch, --len (>= 2), --steps must be positive\n");
    return 2;
  }
  try {
    Config c = config_preset(config);
    c.V = 8000;  // the shared vocabulary of the benchmark shapes
    Transformer<float> m(c, 1);
    // a fixed batch: L tokens on each side (L-1 words and </s>), ids drawn from a fixed LCG
    std::vector<std::vector<int>> src(B), tgt(B);
    uint64_t s = 12345;
    for (int b = 0; b < B; ++b) {
      src[b].resize(L - 1), tgt[b].resize(L - 1);
      for (auto* x : {&src[b], &tgt[b]})
        for (int& id : *x) {
          s = s * 6364136223846793005ull + 1442695040888963407ull;
          id = 4 + (int)((s >> 33) % (c.V - 4));
        }
    }
    std::vector<const std::vector<int>*> ps, pt;
    for (int b = 0; b < B; ++b) ps.push_back(&src[b]), pt.push_back(&tgt[b]);
    Batch batch = make_batch(ps, pt);
    double loss = 0, seconds = 0;
    for (int i = 0; i < warmup + steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      zero_grad(m);
      loss = transformer_forward(m, batch, true);
      transformer_backward(m, batch, true);
      transformer_update(m);
      if (i >= warmup) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double ms = seconds / steps * 1e3;
    std::printf("STEP config=%s device=cpu B=%d L=%d params=%.1fM step_ms=%.1f tgt_tok_per_s=%.0f loss=%.3f\n",
                config.c_str(), B, L, m.params.size() / 1e6, ms, batch.target_tokens() / (ms / 1e3), loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
