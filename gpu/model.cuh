// gpu/model.cuh: the GPU path's entry: the model on a GPU (GpuModel: its buffers, the training step as a
// CUDA graph, decoding) running transformer.cu's passes with GpuOps, which forward to the kernel families
// included below. Compiled only where TRANSFORMER_CUDA is set (nvcc, or g++ on the emulated GPU); else the
// stubs at the end say the build has no CUDA path. Included at the end of transformer.cu.
#pragma once

// ---- every build: the products' precisions by name, and the GPU step's CUDA graphs switch -----------------
const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}
Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16})
    if (name == precision_name(p)) return p;
  throw std::runtime_error("--precision " + name + ": expected fp32, tf32 or bf16");
}

static bool cuda_graphs = true;  // set_cuda_graphs (the GPU training step's)
void set_cuda_graphs(bool on) { cuda_graphs = on; }

// ---- the GPU path: the kernel families, in transformer.cu's order of their CPU twins -----------------------
#ifdef TRANSFORMER_CUDA
#include "common.cuh"
#include "bf16.cuh"
#include "matmul.cuh"
#include "dropout.cuh"
#include "attention.cuh"
#include "ffn.cuh"
#include "layernorm.cuh"
#include "embedding.cuh"
#include "loss.cuh"
#include "adam.cuh"
#include "decoding.cuh"

// ---- the model on the GPU: the same call list (forward_pass, backward_pass) with GpuOps ------------------
#define GPU_OP(name) \
  template <typename... A> static auto name(A&&... args) { return gpu::name(std::forward<A>(args)...); }
struct GpuOps {
  TRANSFORMER_OPS(GPU_OP)
  template <typename T> using Buffer = gpu::DeviceBuffer<T>;
  static void zero(float* p, size_t n) { gpu::defer_zero_fill(p, n); }  // the op after it may write instead
  static void copy(float* dst, const float* src, size_t n) {
    gpu::launch_deferred_fills();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, gpu::stream()));
  }
  template <typename T> static void upload(T* dst, const T* src, size_t n) { gpu::upload(dst, src, n); }
  static void download(float* dst, const float* src, size_t n) { gpu::download(dst, src, n); }
};

class GpuModel : public DeviceModel {
 public:
  explicit GpuModel(Transformer<float>& model) : m(model), n(model.params.size()) {
    params = gpu::alloc(n), grads = gpu::alloc(n), adam_m = gpu::alloc(n), adam_v = gpu::alloc(n);
    gpu::upload(params, m.params.data(), n);  // one upload of each buffer
    gpu::upload(grads, m.grads.data(), n);
    gpu::upload(adam_m, m.adam_m.data(), n);
    gpu::upload(adam_v, m.adam_v.data(), n);
    parameter_layout<float>(m.cfg, params, &W, nullptr);
    parameter_layout<float>(m.cfg, grads, &G, nullptr);
    gpu::keep_bf16_copy(params, n);  // read by the products in bf16 precision, kept current by Adam
    gpu::weight_grad_stream();       // made now: its allocation would fail a capture
    dropout_step = (DropoutStep*)gpu::alloc_bytes(sizeof(DropoutStep));
    adam_step = (gpu::AdamStep*)gpu::alloc_bytes(sizeof(gpu::AdamStep));
    step_loss = (double*)gpu::alloc_bytes(sizeof(double));
    loss_ring = (double*)gpu::alloc_bytes(kLossRing * sizeof(double));
    CUDA_CHECK(cudaMemset(loss_ring, 0xff, kLossRing * sizeof(double)));  // NaN: no step kept yet
    CUDA_CHECK(cudaMemset(step_loss, 0, sizeof(double)));
    CUDA_CHECK(cudaMallocHost(&staged_step, sizeof(DropoutStep)));
    CUDA_CHECK(cudaMallocHost(&staged_adam, sizeof(gpu::AdamStep)));
    for (cudaEvent_t* e : {&uploaded, &updated}) CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  ~GpuModel() override {  // no throwing from here: errors are ignored
    try {
      gpu::drop_bf16_copy(params);
      gpu::set_bf16_twins({}, nullptr);
    } catch (...) {
    }
    drop_graphs();
    for (void* p : {(void*)params, (void*)grads, (void*)adam_m, (void*)adam_v, (void*)arena, (void*)twins, (void*)ids, (void*)valid,
                    (void*)dropout_step, (void*)adam_step, (void*)step_loss, (void*)loss_ring})
      cudaFree(p);
    for (void* p : {(void*)staged_ids, (void*)staged_valid, (void*)staged_step, (void*)staged_adam}) cudaFreeHost(p);
    cudaEventDestroy(uploaded), cudaEventDestroy(updated);
  }
  // Training's forward and backward replay the batch shape's CUDA graphs (set_cuda_graphs), which read the
  // step and the batch's place in it from device memory (dropout_step); the loss is read after the forward's
  // replay.
  double forward(const Batch& b, bool train) override {
    if (!train || !cuda_graphs) {
      prepare(b, false);
      return forward_pass<GpuOps>(pass(train, false));
    }
    graphed_forward(b);
    return gpu::last_loss();
  }
  // A step's batch (accumulate_gradients): its loss, summed over its target tokens, is added to the step's
  // on the device (step_loss), which is read once, after the step's last batch (step_loss_sum).
  void forward_in_step(const Batch& b) override {
    if (cuda_graphs) return graphed_forward(b);
    prepare(b, false);
    forward_pass<GpuOps>(pass(true, false));
    gpu::add_step_loss(step_loss);
  }
  double step_loss_sum() override {
    double sum = 0;  // the step's one read from the device
    CUDA_CHECK(cudaMemcpy(&sum, step_loss, sizeof sum, cudaMemcpyDeviceToHost));
    return sum;
  }
  std::vector<double> step_loss_sums(long first, long count) override {
    if (count < 0 || first < 1 || first + kLossRing <= m.step || first + count - 1 > m.step)  // each kept, none overwritten
      throw std::logic_error("step_loss_sums: steps " + std::to_string(first) + " + " + std::to_string(count) + " are not among the last " +
                             std::to_string(kLossRing) + " of " + std::to_string(m.step));
    std::vector<double> ring(kLossRing), sums;
    CUDA_CHECK(cudaMemcpy(ring.data(), loss_ring, kLossRing * sizeof(double), cudaMemcpyDeviceToHost));  // one read
    for (long t = first; t < first + count; ++t) sums.push_back(ring[t % kLossRing]);
    return sums;
  }
  void backward(const Batch& b, bool train) override {
    gpu::set_bf16_twins(twin_list, twins);  // this model's, were another's set since its forward
    const bool graphed = train && cuda_graphs;
    if (b.B != B || (graphed ? rounded_length(b.S, m.cfg.max_len) : b.S) != S || (graphed ? rounded_length(b.T, m.cfg.max_len) : b.T) != Tl)
      throw std::logic_error("backward of another batch than the last forward");
    const auto run = [&](bool graph) {
      try {
        backward_pass<GpuOps>(pass(train, graph));
      } catch (...) {  // no fill of this backward's waits for the next one's ops (or for a reallocated arena), and
        gpu::drop_deferred_fills();  // its weight gradients' products are joined (a capture leaves none behind)
        try {
          gpu::join_weight_grads();
        } catch (...) {        // (the backward's own error is the one to report,
          cudaGetLastError();  // and the join's is not left for the next check)
        }
        throw;
      }
      gpu::launch_deferred_fills();  // a fill that no op took is launched within the backward (and its graph)
      gpu::join_weight_grads();      // and the weight gradients' products are joined back
    };
    if (!graphed) return run(false);
    Graphs& g = graphs_of_shape();
    replay(&g.backward, g.forwards > 1, [&] { run(true); });
  }
  void zero_grad() override {  // a step begins: its gradients and its summed loss are zeroed
    gpu::fill(grads, 0, n);
    CUDA_CHECK(cudaMemsetAsync(step_loss, 0, sizeof(double), gpu::stream()));
  }
  void scale_grads(double factor) override { GpuOps::scale_grads(grads, n, factor); }
  float* grads_data() override { return grads; }
  // [§5.3] optimizer_step on the device, replayed from one CUDA graph (set_cuda_graphs) from the second
  // update on: the step's rate and bias corrections are copied from pinned memory as it runs, and
  // clipping decides on the device, so the update reads nothing back. It keeps the step's summed loss in
  // the ring (step_loss_sums).
  void update(double lr) override {
    const Config& c = m.cfg;
    CUDA_CHECK(cudaEventSynchronize(updated));  // the last update has copied the staged step
    *staged_adam = gpu::adam_step(lr, c.beta1, c.beta2, m.step);
    const auto work = [&] {
      CUDA_CHECK(cudaMemcpyAsync(adam_step, staged_adam, sizeof(gpu::AdamStep), cudaMemcpyHostToDevice, gpu::stream()));
      if (c.clip_norm > 0) gpu::clip_grad_norm(grads, n, c.clip_norm);  // [DEVIATION] the paper has none
      gpu::adam_update(params, grads, adam_m, adam_v, n, adam_step, c.beta1, c.beta2, c.adam_eps);
      gpu::keep_step_loss(loss_ring, step_loss, adam_step);
    };
    if (!cuda_graphs) work();
    else {
      drop_stale_graphs();
      replay(&update_graph, ++updates > 1, work);
    }
    CUDA_CHECK(cudaEventRecord(updated, gpu::stream()));
  }
  void download() override {
    gpu::download(m.params.data(), params, n);
    gpu::download(m.grads.data(), grads, n);
    gpu::download(m.adam_m.data(), adam_m, n);
    gpu::download(m.adam_v.data(), adam_v, n);
  }
  void synchronize() override { gpu::synchronize(); }
  std::vector<Hypothesis> greedy_decode(const std::vector<std::vector<int>>& src, int max_extra) override {
    return greedy_decode_on<GpuOps>(decoding_model(), src, max_extra);
  }
  std::vector<std::vector<Hypothesis>> beam_search(const std::vector<std::vector<int>>& src, const DecodeOptions& opt) override {
    return beam_search_on<GpuOps>(decoding_model(), src, opt);
  }
  std::vector<float> decoder_logprobs(const std::vector<int>& src, const std::vector<int>& y) override {
    return decoder_logprobs_on<GpuOps>(decoding_model(), src, y);
  }

 private:
  // The batch with its lengths rounded up to a multiple of 8 (at most max_len), padded: fewer shapes, so
  // fewer graphs; none when they need no rounding. Padding changes no real token's result (masks); dropout
  // masks are laid out by position, so they fall differently than at the batch's own shape.
  static int rounded_length(int L, int max_len) { return std::max(L, std::min((L + 7) / 8 * 8, max_len)); }
  static std::optional<Batch> rounded_up(const Batch& b, int max_len) {
    if (rounded_length(b.S, max_len) == b.S && rounded_length(b.T, max_len) == b.T) return std::nullopt;
    Batch r;
    r.B = b.B, r.S = rounded_length(b.S, max_len), r.T = rounded_length(b.T, max_len);
    r.src.assign((size_t)r.B * r.S, kPadId), r.tgt_in.assign((size_t)r.B * r.T, kPadId), r.tgt_out.assign((size_t)r.B * r.T, kPadId);
    for (int i = 0; i < b.B; ++i) {
      std::copy_n(b.src.begin() + (size_t)i * b.S, b.S, r.src.begin() + (size_t)i * r.S);
      std::copy_n(b.tgt_in.begin() + (size_t)i * b.T, b.T, r.tgt_in.begin() + (size_t)i * r.T);
      std::copy_n(b.tgt_out.begin() + (size_t)i * b.T, b.T, r.tgt_out.begin() + (size_t)i * r.T);
    }
    return r;
  }
  // The graphs of one batch shape, made the second time the shape comes (the first runs op by op: its
  // scratch buffers are allocated then), whatever the batch's place in the step (micro, read with the step).
  struct Graphs {
    int forwards = 0;
    cudaGraphExec_t forward = nullptr, backward = nullptr;
  };
  // Training's forward at the batch's rounded shape, from its shape's graph, which also adds the batch's
  // summed loss to the step's.
  void graphed_forward(const Batch& b) {
    const std::optional<Batch> padded = rounded_up(b, m.cfg.max_len);
    prepare(padded ? *padded : b, true);
    Graphs& g = graphs_of_shape();
    ++g.forwards;
    replay(&g.forward, g.forwards > 1, [&] {
      forward_pass<GpuOps>(pass(true, true));
      gpu::add_step_loss(step_loss);
    });
  }
  Graphs& graphs_of_shape() {
    drop_stale_graphs();
    if (graphs.size() > kMaxShapes) drop_graphs();
    return graphs[{B, S, Tl}];
  }
  // A graph made before a buffer it reads moved (gpu::graph_epoch) would read the old one
  void drop_stale_graphs() {
    if (graphs_epoch != gpu::graph_epoch()) drop_graphs();
  }
  void drop_graphs() {
    for (auto& [shape, g] : graphs)
      for (cudaGraphExec_t e : {g.forward, g.backward})
        if (e) cudaGraphExecDestroy(e);
    graphs.clear();
    if (update_graph) cudaGraphExecDestroy(std::exchange(update_graph, nullptr));
    graphs_epoch = gpu::graph_epoch();
  }
  // Replays *exec, capturing it from work first if `capture`; or runs work op by op. True if replayed.
  template <typename F> static bool replay(cudaGraphExec_t* exec, bool capture, F work) {
    if (!*exec && !capture) {
      work();
      return false;
    }
    if (!*exec) *exec = gpu::capture(work);
    CUDA_CHECK(cudaGraphLaunch(*exec, gpu::stream()));
    return true;
  }
  // Carves the activation arena for the batch's shape and uploads its tokens and masks, and for a graphed
  // training pass the batch's part of the dropout keys (dropout_step).
  void prepare(const Batch& b, bool graphed) {
    validate_batch(m.cfg, b);
    prepare_activations(
        acts, m.cfg, b,
        [&](size_t need) {
          if (need > arena_size) {
            if (arena) gpu::release(arena);
            arena = gpu::alloc(need), arena_size = need;
            ++gpu::graph_epoch();
          }
          return arena;
        },
        gpu::products() == Precision::bf16);  // in bf16 the twins alone are all that is written (set_precision drops the graphs)
    const size_t ns = b.src.size(), nt = b.tgt_in.size();
    CUDA_CHECK(cudaEventSynchronize(uploaded));  // the last batch's copies have read the staging buffers
    if (ns + 2 * nt > ids_size) {
      gpu::release(ids), gpu::release(valid);
      if (staged_ids) CUDA_CHECK(cudaFreeHost(staged_ids));
      if (staged_valid) CUDA_CHECK(cudaFreeHost(staged_valid));
      ids = nullptr, valid = nullptr, staged_ids = nullptr, staged_valid = nullptr, ids_size = 0;  // if an allocation fails
      const size_t need = ns + 2 * nt;
      ids = gpu::alloc_ints(need), valid = gpu::alloc_bytes(need);
      CUDA_CHECK(cudaMallocHost(&staged_ids, need * sizeof(int)));
      CUDA_CHECK(cudaMallocHost(&staged_valid, need));
      ids_size = need;
      ++gpu::graph_epoch();
    }
    // The batch goes through pinned memory, so its copies are asynchronous: queued behind the previous
    // step's backward and Adam, while the host goes on to queue this step's forward.
    std::copy(b.src.begin(), b.src.end(), staged_ids);
    std::copy(b.tgt_in.begin(), b.tgt_in.end(), staged_ids + ns);
    std::copy(b.tgt_out.begin(), b.tgt_out.end(), staged_ids + ns + nt);
    std::copy(acts.src_valid.begin(), acts.src_valid.end(), staged_valid);
    std::copy(acts.tgt_valid.begin(), acts.tgt_valid.end(), staged_valid + ns);
    CUDA_CHECK(cudaMemcpyAsync(ids, staged_ids, (ns + 2 * nt) * sizeof(int), cudaMemcpyHostToDevice, gpu::stream()));
    CUDA_CHECK(cudaMemcpyAsync(valid, staged_valid, ns + nt, cudaMemcpyHostToDevice, gpu::stream()));
    if (graphed) {
      *staged_step = DropoutStep{dropout_step_stream(m.seed, m.step), dropout_micro_site(m.micro)};
      CUDA_CHECK(cudaMemcpyAsync(dropout_step, staged_step, sizeof(DropoutStep), cudaMemcpyHostToDevice, gpu::stream()));
    }
    CUDA_CHECK(cudaEventRecord(uploaded, gpu::stream()));
    B = b.B, S = b.S, Tl = b.T;
    keep_bf16_twins();
  }
  // [mixed precision] The activations that products read after their producer, which writes each one's
  // bf16 twin in the same pass (gpu::set_bf16_twins), so that no product rounds them again, forward or
  // backward: each attention's ctx (alone: its fp32 values are not written, as nothing but its products
  // reads ctx), each FFN's h (alone too: nothing but its products and the backward's ReLU mask, from the
  // twin's signs, reads h), the embedded inputs x0
  // (their embedding, then their dropout in place, each writes it), and post-LN each sub-layer
  // connection's output (the next sub-layer's input, the encoder's output, the decoder's). Pre-LN's
  // sub-layer inputs come from layernorm_forward, which writes none: they are rounded on their way into the
  // products. Two gradients too: the logits' (alone: the output projection's two products are all that
  // read it; the loss's backward writes it, taking the backward's fill, gpu::defer_zero_fill) and a
  // sub-layer's output's, d_sub (the residual's backward writes it, taking its fill; the embeddings'
  // backward uses it as scratch, through dropout's backward, which writes the twin too). Attention's q, k
  // and v (alone: their projections write them, the attention kernels read them) and the logits (alone:
  // the output projection writes them, the loss's two passes read them). Every pass of the model lists
  // them, an evaluation's too: its loss comes from the same bf16 logits as a training step's. The twins
  // listed alone here are the buffers that carve_activations carves at half width (half_width):
  // one listed alone there but not here would have its fp32 values written over the next buffer.
  void keep_bf16_twins() {
    twin_list.clear();
    if (gpu::products() == Precision::bf16) {
      const Config& c = m.cfg;
      const size_t Ms = (size_t)B * S, Mt = (size_t)B * Tl, D = c.D, F = c.F;
      const auto connection = [&](const SublayerActs<float>& a, size_t M) {
        if (!c.pre_ln) twin_list.push_back({a.out, M * D});
      };
      const auto attention = [&](const AttentionActs<float>& a, size_t Mq, size_t Mk) {  // q, k, v evenly apart where Mq = Mk
        twin_list.push_back({a.q, Mq * D, true}), twin_list.push_back({a.k, Mk * D, true}), twin_list.push_back({a.v, Mk * D, true});
        twin_list.push_back({a.ctx, Mq * D, true});
      };
      twin_list.push_back({acts.enc.x0, Ms * D}), twin_list.push_back({acts.dec.x0, Mt * D});
      for (const EncoderLayerActs<float>& l : acts.enc_layers) {
        attention(l.self, Ms, Ms), twin_list.push_back({l.ffn.h, Ms * F, true});
        connection(l.self_sub, Ms), connection(l.ffn_sub, Ms);
      }
      for (const DecoderLayerActs<float>& l : acts.dec_layers) {
        attention(l.self, Mt, Mt), attention(l.cross, Mt, Ms);
        twin_list.push_back({l.ffn.h, Mt * F, true});
        connection(l.self_sub, Mt), connection(l.cross_sub, Mt), connection(l.ffn_sub, Mt);
      }
      twin_list.push_back({acts.logits, Mt * c.V, true}), twin_list.push_back({acts.dlogits, Mt * c.V, true});
      twin_list.push_back({acts.d_sub, std::max(Ms, Mt) * D});
    }
    const size_t need = gpu::bf16_twin_storage(twin_list);
    if (need > twins_size) {
      if (twins) gpu::release(twins);
      twins = nullptr, twins_size = 0;  // if the allocation fails
      twins = gpu::alloc_of<gpu::bf16>(need), twins_size = need;
      ++gpu::graph_epoch();
    }
    gpu::set_bf16_twins(twin_list, twins);
  }
  // The model on the GPU, as decoding sees it: the encoder runs here over the sources.
  DecodingModel<float> decoding_model() {
    return {m.cfg, W, [this](const Batch& b) {
              prepare(b, false);
              encoder_forward<GpuOps>(pass(false, false));
              return (const float*)acts.enc.out;
            }};
  }
  // graphed: the dropout keys read (step, micro) from device memory (dropout_step), as a graph's replay needs
  Pass<float> pass(bool train, bool graphed) {
    const size_t ns = (size_t)B * S, nt = (size_t)B * Tl;
    return Pass<float>{m.cfg, W, G, acts, ids, ids + ns, ids + ns + nt, valid, valid + ns, B, S, Tl, m.seed, m.step, m.micro, train,
                       graphed ? dropout_step : nullptr};
  }
  static constexpr size_t kMaxShapes = 256;  // graphs kept at most; beyond, all are dropped and made again
  Transformer<float>& m;
  size_t n;
  float *params = nullptr, *grads = nullptr, *adam_m = nullptr, *adam_v = nullptr;  // one buffer each
  Weights<float> W, G;                                                              // views into them
  Activations<float> acts;  // carved in the device arena
  float* arena = nullptr;
  size_t arena_size = 0, ids_size = 0;
  std::vector<gpu::Bf16Twin> twin_list;  // the activations with a bf16 twin (keep_bf16_twins)
  gpu::bf16* twins = nullptr;                              // their twins, one after another
  size_t twins_size = 0;
  int* ids = nullptr;         // src, tgt_in, tgt_out of the batch
  uint8_t* valid = nullptr;   // src_valid, tgt_valid
  int* staged_ids = nullptr;          // their pinned host copies, from which they are uploaded
  uint8_t* staged_valid = nullptr;
  cudaEvent_t uploaded = nullptr;     // recorded after the uploads
  DropoutStep* dropout_step = nullptr;  // the batch's part of the dropout keys, on the device
  DropoutStep* staged_step = nullptr;   // and its pinned host copy
  gpu::AdamStep* adam_step = nullptr;     // Adam's rate and bias corrections for the step, on the device
  gpu::AdamStep* staged_adam = nullptr;   // and their pinned host copy
  cudaEvent_t updated = nullptr;          // recorded after each update
  double* step_loss = nullptr;            // the step's loss so far, summed over its target tokens, on the device
  double* loss_ring = nullptr;            // the last kLossRing steps' summed losses, by step (keep_step_loss)
  int B = 0, S = 0, Tl = 0;   // the shape of the last forward
  std::map<std::array<int, 3>, Graphs> graphs;  // by (B, S, T)
  cudaGraphExec_t update_graph = nullptr;       // the update's, made at the second update
  long updates = 0;
  size_t graphs_epoch = 0;                      // gpu::graph_epoch() when they were made
};

static std::unique_ptr<DeviceModel> make_gpu_model(Transformer<float>& m) {
  if (!gpu_available()) throw std::runtime_error("--device cuda: no GPU is present (use --device cpu)");
  if (m.cfg.D / m.cfg.H > gpu::kMaxHeadDim)  // the attention kernels keep tiles of 32 rows in shared memory
    throw std::runtime_error("--device cuda: the head dimension d_model / heads = " + std::to_string(m.cfg.D / m.cfg.H) +
                             " is above the GPU's " + std::to_string(gpu::kMaxHeadDim) + " (use more heads or --device cpu)");
  return std::make_unique<GpuModel>(m);
}
static bool gpu_has_bf16() {  // the current device (a rank's, under mpirun): Ampere and later
  int device = 0;
  cudaDeviceProp prop;
  return gpu_available() && cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess &&
         prop.major >= 8;
}
Precision default_precision() { return gpu_has_bf16() ? Precision::bf16 : Precision::fp32; }
void set_precision(Precision p) {
  const std::string flag = std::string("--precision ") + precision_name(p);
  if (!gpu_available()) throw std::runtime_error(flag + ": no GPU is present");
  if (p == Precision::bf16 && !gpu_has_bf16()) throw std::runtime_error(flag + ": this GPU has no bf16 tensor cores (before compute capability 8.0)");
  for (cublasHandle_t h : gpu::blas_handles()) CUBLAS_CHECK(cublasSetMathMode(h, gpu::math_mode(p)));
  gpu::products() = p;
  ++gpu::graph_epoch();
}
#else
bool gpu_available() { return false; }  // compiled by g++ without the emulator: no CUDA path in this build
bool gpu_emulated() { return false; }
std::string gpu_name() { return ""; }
static std::unique_ptr<DeviceModel> make_gpu_model(Transformer<float>&) {
  throw std::runtime_error("--device cuda: this build has no CUDA path (built with CPU=1 or without nvcc); use --device cpu");
}
Precision default_precision() { return Precision::fp32; }
void set_precision(Precision p) {
  throw std::runtime_error(std::string("--precision ") + precision_name(p) + ": this build has no CUDA path (built with CPU=1 or without nvcc)");
}
#endif

// ---- every build: where a model runs (Transformer::device, null on the CPU) --------------------------------
void transformer_download(Transformer<float>& m) {
  if (m.device) m.device->download();
}

void synchronize_device(Transformer<float>& m) {
  if (m.device) m.device->synchronize();
}

void transformer_to_device(Transformer<float>& m, Device d) {
  if (d == Device::cpu) {
    transformer_download(m);
    m.device.reset();
  } else if (!m.device) {
    m.device = make_gpu_model(m);
  }
}
