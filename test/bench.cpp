// bench: one training step (forward, backward, Adam) of a model on a fixed batch of random sentence
// pairs, dropout on, timed after warm-up steps. Run by `make bench` (test/bench.sh), not by CTest.
//   bench --config base --batch 256 --len 32 [--steps 5] [--warmup 3] [--device cpu|cuda] [--precision fp32|tf32|bf16]
//         [--graphs on|off]   (the GPU step's CUDA graphs, set_cuda_graphs; on by default)
// prints: STEP config=base device=cpu B=256 L=32 step_ms=... tgt_tok_per_s=...
// On the GPU the timed steps end with a device synchronisation, so queued work is counted.
//   bench --count --config small --batch 256 --len 32 [--precision P]   (built against the emulated GPU)
// counts instead of timing: what one training step after the warm-up asks of the GPU, as the emulated
// GPU sees it: COUNT launches=... cublas=... to_device=... to_host=... on_device=... memsets=...
// device_MiB=... (allocated at the step's end) peak_MiB=... (the most at once during it) graphs=...
// (CUDA graph launches) host_launches=... (kernels launched outside them), then one KERNEL name=count line
// per kernel. The counted step comes after three warm-up steps: the step's CUDA graphs are made on the
// second time its shape comes, and the first step's buffers (allocated then) remake them once more.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "../transformer.h"
#ifdef TRANSFORMER_EMULATED_GPU
#include "cuda_emulator.h"
#endif

int main(int argc, char** argv) {
  std::string config = "base", device = "cpu", precision = "fp32";
  int B = 256, L = 32, steps = 5, warmup = 3;
  std::string graphs = "on";
  bool count = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--count") {
      count = true;
      continue;
    }
    if (i + 1 == argc) {
      std::fprintf(stderr, "bench: %s needs a value\n", a.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--config") config = v;
    else if (a == "--device") device = v;
    else if (a == "--precision") precision = v;
    else if (a == "--batch") B = std::atoi(v.c_str());
    else if (a == "--len") L = std::atoi(v.c_str());
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else if (a == "--warmup") warmup = std::atoi(v.c_str());
    else if (a == "--graphs") graphs = v;
    else {
      std::fprintf(stderr, "bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (B < 1 || L < 2 || steps < 1 || warmup < 0 || (device != "cpu" && device != "cuda") ||
      (precision != "fp32" && precision != "tf32" && precision != "bf16") || (graphs != "on" && graphs != "off")) {
    std::fprintf(stderr, "bench: --batch, --len (>= 2), --steps must be positive; --device cpu or cuda; --precision fp32, tf32 or bf16; "
                         "--graphs on or off\n");
    return 2;
  }
  if (count != gpu_emulated()) {  // bench.sh's probe: the timed rows of an emulated build run on the CPU
    std::fprintf(stderr, count ? "bench: --count needs the build against the emulated GPU (build/grade/test/bench)\n"
                               : "bench: this build's GPU is the emulated one, a test instrument: no timings (--count counts)\n");
    return 2;
  }
  if (count) device = "cuda", warmup = 3, steps = 1;
  if (precision != "fp32" && device != "cuda") {
    std::fprintf(stderr, "bench: --precision %s needs --device cuda\n", precision.c_str());
    return 2;
  }
  try {
    Config c = config_preset(config);
    c.V = 8000;  // the shared vocabulary of the benchmark shapes
    Transformer<float> m(c, 1);
    if (device == "cuda") {
      transformer_to_device(m, Device::cuda);
      set_precision(parse_precision(precision));
      set_cuda_graphs(graphs == "on");
    }
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
    double loss = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < warmup + steps; ++i) {
      if (i == warmup) {
        synchronize_device(m);
        t0 = std::chrono::steady_clock::now();
#ifdef TRANSFORMER_EMULATED_GPU
        emu::reset_counts();
#endif
      }
      zero_grad(m);
      loss = transformer_forward(m, batch, true);
      transformer_backward(m, batch, true);
      transformer_update(m);
    }
    synchronize_device(m);
#ifdef TRANSFORMER_EMULATED_GPU
    const emu::Counts& n = emu::counts();
    size_t launches = 0, blas = 0;
    for (auto& k : n.launches) launches += k.second;
    for (auto& k : n.blas_calls) blas += k.second;
    std::printf("COUNT config=%s precision=%s B=%d L=%d launches=%zu cublas=%zu to_device=%zu to_host=%zu on_device=%zu memsets=%zu "
                "device_MiB=%.1f peak_MiB=%.1f graphs=%zu host_launches=%zu weight_grad_stream=%zu\n", config.c_str(), precision.c_str(), B, L,
                launches, blas, n.to_device, n.to_host, n.on_device, n.memsets, n.device_bytes / 1048576.0, n.peak_device_bytes / 1048576.0,
                n.graph_launches, launches - n.graph_kernels, n.on_branches);
    for (auto& k : n.launches) std::printf("KERNEL %s=%zu\n", k.first.c_str(), k.second);
    for (auto& k : n.blas_calls) std::printf("KERNEL %s=%zu\n", k.first.c_str(), k.second);
    return 0;
#endif
    const double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps * 1e3;
    std::printf("STEP config=%s device=%s precision=%s B=%d L=%d params=%.1fM step_ms=%.2f tgt_tok_per_s=%.0f loss=%.3f\n", config.c_str(),
                device.c_str(), precision.c_str(), B, L, m.params.size() / 1e6, ms, batch.target_tokens() / (ms / 1e3), loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
