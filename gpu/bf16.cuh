// gpu/bf16.cuh: mixed precision, the bf16 copies of the parameters and the bf16 twins of the
// activations that the tensor cores read. No CPU twin: the CPU computes in the scalar type throughout.
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- bf16 operands (mixed precision): what the tensor cores read in bf16 precision ------------------
// The parameters keep a bf16 copy (keep_bf16_copy), which adam_update rewrites in its pass. A training
// step's buffer that products read has a bf16 twin (set_bf16_twins; GpuModel::keep_bf16_twins lists them),
// which each kernel that writes the buffer writes in the same pass; attention's q, k and v have twins too,
// which their projections write (product_result) and the attention kernels read. Any other operand is
// rounded into a scratch buffer on its way into the product.
using bf16 = __nv_bfloat16;
__global__ void to_bf16_kernel(bf16* out, const float* in, size_t n) { GRID_STRIDE(i, n) out[i] = __float2bfloat16(in[i]); }
struct Bf16Copy {
  const float* base;
  bf16* copy;
  size_t n;
  bool twin;   // an activation's twin (set_bf16_twins), in its owner's storage; else a parameter copy, ours
  bool alone;  // a twin that its producer writes without the fp32 values (Bf16Twin)
};
static std::vector<Bf16Copy>& bf16_copies() {
  static std::vector<Bf16Copy> copies;
  return copies;
}
// The floats at an entry's base that are its buffer's own: a twin alone's buffer may be carved for the twin
// alone, the first half of the fp32 bytes (carve_activations), and what lies past that is another buffer's.
static size_t own_floats(const Bf16Copy& c) { return c.alone ? (c.n + 1) / 2 : c.n; }
// The entry of the buffer that holds p, if it has a bf16 copy or twin.
static const Bf16Copy* bf16_entry_of(const float* p) {
  for (const Bf16Copy& c : bf16_copies())
    if (p >= c.base && p < c.base + own_floats(c)) return &c;
  return nullptr;
}
// The bf16 copy (or twin) of the n elements at p, if they lie in a buffer that has one.
static bf16* bf16_copy_of(const float* p, size_t n = 1) {
  const Bf16Copy* c = bf16_entry_of(p);
  return c && n <= (size_t)(c->base + c->n - p) ? c->copy + (p - c->base) : nullptr;
}
void keep_bf16_copy(const float* p, size_t n) {
  if (bf16_copy_of(p)) return;
  bf16* copy = alloc_of<bf16>(n);
  if (n) LAUNCH(to_bf16_kernel, blocks_for(n), 256, 0, copy, p, n);
  bf16_copies().push_back({p, copy, n, false, false});
}
// A producer of a listed buffer must write its twin (and, unless the twin is alone, the fp32 values). A twin
// alone takes the first half of its fp32 buffer's bytes, which nothing else writes or reads while it is
// listed: its storage costs nothing more (a bf16 arena carves those bytes alone, carve_activations).
void set_bf16_twins(const std::vector<Bf16Twin>& twins, void* storage) {
  auto& v = bf16_copies();
  v.erase(std::remove_if(v.begin(), v.end(), [](const Bf16Copy& c) { return c.twin; }), v.end());
  bf16* at = static_cast<bf16*>(storage);
  for (const Bf16Twin& t : twins)
    v.push_back({t.p, t.alone ? reinterpret_cast<bf16*>(const_cast<float*>(t.p)) : std::exchange(at, at + t.n), t.n, true, t.alone});
}
size_t bf16_twin_storage(const std::vector<Bf16Twin>& twins) {
  size_t n = 0;
  for (const Bf16Twin& t : twins) n += t.alone ? 0 : t.n;
  return n;
}
std::vector<Bf16Twin> bf16_twins() {
  std::vector<Bf16Twin> t;
  for (const Bf16Copy& c : bf16_copies())
    if (c.twin) t.push_back({c.base, c.n, c.alone});
  return t;
}
void drop_bf16_copy(const float* p) {
  auto& v = bf16_copies();
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it->base == p && !it->twin) {
      bf16* copy = it->copy;
      v.erase(it);  // first: a failed cudaFree must not leave a stale entry
      CUDA_CHECK(cudaFree(copy));
      return;
    }
}
// The twin a producer writes beside its output, the n elements at p (bf16 products, p listed by
// set_bf16_twins), else null; *alone: whether the twin is listed alone (ffn_forward's h, attention's q, k, v
// and ctx, the logits and the loss's dlogits in a bf16 model's passes, whose producers then write no fp32
// values).
static bf16* bf16_twin_of(const float* p, size_t n, bool* alone = nullptr) {
  const Bf16Copy* c = products() == Precision::bf16 ? bf16_entry_of(p) : nullptr;
  if (alone) *alone = c && c->twin && c->alone;
  if (!c || !c->twin) return nullptr;
  if (n > (size_t)(c->base + c->n - p)) throw std::logic_error("a producer writes past its output's bf16 twin");
  return c->copy + (p - c->base);
}
// Before a kernel of the main stream writes n floats at p, and their bf16 twin if they have one: it waits for
// the weight gradients' products that read or write them.
static void before_writing(const float* p, size_t n) {
  wait_for_weight_grads(p, n * sizeof(float));
  if (const bf16* twin = bf16_copy_of(p, n)) wait_for_weight_grads(twin, n * sizeof(bf16));
}
std::vector<float> bf16_copy(const float* p, size_t n) {
  const bf16* c = bf16_copy_of(p, n);
  if (!c) throw std::logic_error("bf16_copy: the elements have no bf16 copy or twin");
  std::vector<bf16> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), c, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}
// Scratch for rounded operands, one per role, grown when a larger one is needed: a product's left and
// right operands, an input that several products share (rounded once for all of them), and the attention
// backward's three gradients, which its kernel rounds as it writes them (read by later products), one after
// another, and the FFN's hidden units where they have no twin (and their gradient), which a product writes
// and a pass of ours turns into what the next product reads, in place; and the gradient of attention's
// context rows, dctx, which a product writes rounded for the attention backward's kernel.
enum Slot { kLeft, kRight, kShared, kDqkv, kHidden, kDctx, kSlots };
static bf16* bf16_scratch(Slot slot, size_t n) {
  static bf16* p[kSlots] = {};
  static size_t size[kSlots] = {};
  wait_for_weight_grads(p[slot], size[slot] * sizeof(bf16));  // what is handed out is written
  if (n > size[slot]) {
    if (p[slot]) release(p[slot]);
    p[slot] = nullptr, size[slot] = 0;  // if the allocation fails
    p[slot] = alloc_of<bf16>(n), size[slot] = n;
    ++graph_epoch();
  }
  return p[slot];
}
// An operand of a product: its fp32 elements, and in bf16 precision its bf16 ones (else null).
struct Operand {
  const float* f;
  const bf16* h;
};
// The operand of `extent` elements at p (a row-major matrix's (rows - 1) * ld + cols) as the product reads it.
static Operand operand(const float* p, size_t extent, Slot slot) {
  if (products() != Precision::bf16 || extent == 0) return {p, nullptr};
  if (const bf16* c = bf16_copy_of(p, extent)) return {p, c};
  bf16* s = bf16_scratch(slot, extent);
  LAUNCH(to_bf16_kernel, blocks_for(extent), 256, 0, s, p, extent);
  return {p, s};
}
// Where a pass of ours rounds a product's operand of n elements on its way, or a product writes its result
// rounded for a kernel of ours: the slot's scratch in bf16, else null.
static bf16* rounded_in_pass(size_t n, Slot slot) { return products() == Precision::bf16 && n ? bf16_scratch(slot, n) : nullptr; }
static size_t extent(int rows, int cols, int ld) { return rows == 0 || cols == 0 ? 0 : (size_t)(rows - 1) * ld + cols; }

}  // namespace gpu
