// gpu/attention.cuh: [Eq. 1, §3.2.1] scaled dot-product attention and §3.2.2 multi-head
// attention (cpu::attention_forward/backward, cpu::multihead_attention_forward/backward).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- [Eq. 1, §3.2.1] attention: one block per (sentence, head) and tile of 32 queries or keys ----------
// A block's 8 warps each take 4 of the tile's 32 rows; a lane takes one key (scores), one query (dK, dV)
// or the head's columns d = lane + 32 t (weighted sums). Keys, values, queries and dctx rows pass through
// shared memory a tile of 32 at a time; the probabilities p (B, H, Lq, Lk) live in global memory, so any
// length works. A tile's rows are attention_ld(Dk) floats apart: the dot products over the head's columns
// read 4 of a row at a time (one 16-byte load, zeros past Dk), and the rows are an odd number of 16-byte
// groups long, so that the 8 lanes of a quarter-warp, each reading its own row, hit distinct banks.
constexpr int kAttentionTile = 32;  // rows of a tile: one per lane of a warp
constexpr int kAttentionWarps = 8;
constexpr int kAttentionThreads = kAttentionTile * kAttentionWarps;
constexpr int kRowsPerWarp = kAttentionTile / kAttentionWarps;
static_assert(kRowsPerWarp == 4, "a lane's staged rows are one 16-byte load (load4)");
// A warp's staging area: two values per lane and row of the warp (kStageFloats a warp), where the warp's
// lanes leave what the others read (stage_rows), in place of a shuffle per value.
constexpr int kStageFloats = 2 * kAttentionTile * kRowsPerWarp;
// A tile's row stride in floats: Dk rounded up to whole 16-byte groups, then to an odd number of them.
__host__ __device__ constexpr int attention_ld(int Dk) { return 4 * ((Dk + 3) / 4 | 1); }
// Where the staging areas start in the dynamic shared memory (in floats): past three tiles and 32 floats.
__host__ __device__ constexpr size_t attention_stages_at(int Dk) {
  return 3 * (size_t)kAttentionTile * attention_ld(Dk) + kAttentionTile;
}
constexpr size_t attention_shared_bytes(int Dk) { return (attention_stages_at(Dk) + kAttentionWarps * kStageFloats) * sizeof(float); }
// Without raising a kernel's limit a launch gets 48 KiB of dynamic shared memory: three tiles, 32 floats
// and the warps' staging areas fit for a head dimension Dk = D / H up to 100 (the paper's 64). A lane
// keeps ceil(Dk / 32) sums.
constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr int kMaxHeadDim = [] {
  int Dk = 1;
  while (attention_shared_bytes(Dk + 1) <= kDefaultSharedBytes) ++Dk;
  return Dk;
}();
constexpr int kHeadDimSlots = (kMaxHeadDim + 31) / 32;
// bytes, the dynamic shared memory of a kernel's launches; past kDefaultSharedBytes the kernel's limit is raised
template <typename K> static size_t dynamic_shared_bytes(K kernel, size_t bytes) {
  if (bytes > kDefaultSharedBytes)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)std::min<size_t>(bytes, std::numeric_limits<int>::max())));
  return bytes;
}
// The calling warp's staging area.
__device__ float* warp_stage(int Dk) { return dynamic_shared<float>() + attention_stages_at(Dk) + threadIdx.x / 32 * kStageFloats; }
// x[r] of every lane of the warp into st, where any lane reads lane l's x[r] at st[l kRowsPerWarp + r] once
// the warp is past a __syncwarp: a shuffle per value becomes one load (one 16-byte load per lane l), and
// the warp meets once per stage, not once per value. stage_rows writes and meets; write_rows only writes
// (for two arrays staged at one meeting).
__device__ void write_rows(float* st, const float (&x)[kRowsPerWarp]) {
  for (int r = 0; r < kRowsPerWarp; ++r) st[threadIdx.x % 32 * kRowsPerWarp + r] = x[r];
}
__device__ void stage_rows(float* st, const float (&x)[kRowsPerWarp]) {
  write_rows(st, x);
  __syncwarp();
}
// Four floats at p (16-byte aligned) in one load.
__device__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// Lane l's x[0..3] from a staging area, as write_rows left them: one 16-byte load.
__device__ void read_rows(float (&x)[kRowsPerWarp], const float* st, int l) {
  const float4 v = load4(st + l * kRowsPerWarp);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

// Rows first .. first + 31 of x's head h ((B, L, D) rows, columns h Dk ..) into a tile (rows attention_ld(Dk)
// apart); zeros past L and past Dk. Warp w takes rows w, w + 8, ..., a lane 4 columns (where the head's
// columns are 16-byte aligned: Dk and D multiples of 4) or one column at a time. The copies go straight
// to shared memory (__pipeline_memcpy_async: cp.async) and are only issued here: they are all in flight
// at once, those of several tiles too, until the thread waits for its own (wait_for_copies); a copy
// through registers waited for each load before the next.
__device__ void copy_head_tile(float* tile, const float* x, int b, int h, int L, int first, int D, int Dk) {
  const int ld = attention_ld(Dk), lane = threadIdx.x % 32;
  const bool by4 = Dk % 4 == 0 && D % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int r = threadIdx.x / 32; r < kAttentionTile; r += kAttentionWarps) {
    const bool in = first + r < L;
    const float* row = x + ((size_t)b * L + first + r) * D + h * Dk;  // read only where in
    float* to = tile + r * ld;
    if (by4) {
      for (int d = 4 * lane; d < ld; d += 128)
        if (in && d < Dk) __pipeline_memcpy_async(to + d, row + d, 16);
        else *reinterpret_cast<float4*>(to + d) = float4{};
    } else {
      for (int d = lane; d < ld; d += 32)
        if (in && d < Dk) __pipeline_memcpy_async(to + d, row + d, sizeof(float));
        else to[d] = 0.f;
    }
  }
}
// The same from bf16 rows (in a bf16 training step q, k, v and dctx: what their products wrote), widened to
// fp32 in the tile, so that the kernels' arithmetic is the same as from fp32 rows holding those values. An
// asynchronous copy cannot widen, so the loads go through registers: where the head's columns are 8-byte
// aligned (Dk and D multiples of 4), a lane loads 4 columns of each of its warp's 4 rows (one 8-byte load
// each, all 4 issued before any is stored), then stores them widened (one 16-byte store each); else a lane takes
// one element at a time. The tile is written when the thread returns (the wait_for_copies after it has nothing
// of it to wait for).
struct alignas(8) Bf16x4 {
  bf16 e[4];
};
static_assert(4 * 32 >= attention_ld(kMaxHeadDim), "a lane's 4 columns: a warp covers a tile's row");
__device__ void copy_head_tile(float* tile, const bf16* x, int b, int h, int L, int first, int D, int Dk) {
  const int ld = attention_ld(Dk), lane = threadIdx.x % 32;
  const bf16* head = x + ((size_t)b * L + first) * D + h * Dk;  // row r at head + r D, read only where first + r < L
  auto row = [&](int i) { return (int)threadIdx.x / 32 + i * kAttentionWarps; };  // the warp's i-th row
  if (Dk % 4 == 0 && D % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 8 == 0) {
    const int d = 4 * lane;
    Bf16x4 in[kRowsPerWarp] = {};
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (d < Dk && first + row(i) < L) in[i] = *reinterpret_cast<const Bf16x4*>(head + (size_t)row(i) * D + d);
    for (int i = 0; i < kRowsPerWarp; ++i)  // zeros past L and from Dk to ld (4 columns or none)
      if (d < ld)
        *reinterpret_cast<float4*>(tile + row(i) * ld + d) =
            float4{__bfloat162float(in[i].e[0]), __bfloat162float(in[i].e[1]), __bfloat162float(in[i].e[2]), __bfloat162float(in[i].e[3])};
  } else {
    for (int i = 0; i < kRowsPerWarp; ++i)
      for (int d = lane; d < ld; d += 32) tile[row(i) * ld + d] = first + row(i) < L && d < Dk ? __bfloat162float(head[(size_t)row(i) * D + d]) : 0.f;
  }
}
// Until the calling thread's copies (copy_head_tile) are done; the other threads' are seen after a
// __syncthreads that follows their own wait.
__device__ void wait_for_copies() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
}
template <typename In>  // float, or bf16
__device__ void load_head_tile(float* tile, const In* x, int b, int h, int L, int first, int D, int Dk) {
  copy_head_tile(tile, x, b, h, L, first, D, Dk);
  wait_for_copies();
}

// dot[r] = (row row_of(r) of tile `rows`) . (row `lane` of tile `lanes`) over Dk columns, for a warp's rows:
// 4 columns at a time, each a 16-byte load (a row's 4 values shared by the lanes, broadcast)
__device__ void rows_dot_lanes(float (&dot)[kRowsPerWarp], const float* rows, const float* lanes, int Dk) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, ld = attention_ld(Dk);
  for (int r = 0; r < kRowsPerWarp; ++r) dot[r] = 0;
  // not unrolled: nvcc's unrolling put more 16-byte loads in flight than the 64 registers a thread has
  // (__launch_bounds__) hold, and the attention kernels spilled to local memory
#pragma unroll 1
  for (int d = 0; d < Dk; d += 4) {  // past Dk the tiles hold zeros
    const float4 x = load4(lanes + lane * ld + d);
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float4 y = load4(rows + (warp + r * kAttentionWarps) * ld + d);
      dot[r] += y.x * x.x;
      dot[r] += y.y * x.y;
      dot[r] += y.z * x.z;
      dot[r] += y.w * x.w;
    }
  }
}

// acc[r][t] += sum_l w_l(r) x_l(lane + 32 t) over the first n rows x_l of a tile, for the warp's rows r that lie
// before `rows` (row_of(r) < rows; the others, past the end, are left): a weighted sum of the tile's rows, each
// lane summing the head's columns lane + 32 t (0 past Dk), with the weights w_l(r) as lane l staged them in st
// (write_rows), read as one 16-byte load a row l. The forward's ctx and the backward's dq, dk and dv.
template <int kSlots>
__device__ void add_weighted_rows(float (&acc)[kRowsPerWarp][kSlots], const float* st, const float* tile, int n, int rows, int Dk) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, ld = attention_ld(Dk);
  // not unrolled (as rows_dot_lanes): the loads that nvcc's unrolling put in flight spilled the kernels' sums
  // to local memory. sm_90, bytes spilled in the forward at Dk 64 and in the backward whose keys take two
  // tiles at Dk 64 and 96: 36, 20 and 304 unrolled; 16, 0 and 84 not; 28, 40 and 96 with the loop written
  // out in each kernel (before this function).
#pragma unroll 1
  for (int l = 0; l < n; ++l) {
    float x[kSlots];
    for (int t = 0; t < kSlots; ++t) x[t] = lane + 32 * t < Dk ? tile[l * ld + lane + 32 * t] : 0.f;
    float w[kRowsPerWarp];  // lane l's weights
    read_rows(w, st, l);
    for (int r = 0; r < kRowsPerWarp && warp + r * kAttentionWarps < rows; ++r)
      for (int t = 0; t < kSlots; ++t) acc[r][t] += w[r] * x[t];
  }
}

// f(at, r, t) for the warp's rows i = i0 + w + 8 r of a tile that lie before L and the lane's columns
// c = lane + 32 t of head h that lie before Dk, at = (b, i, h Dk + c)'s offset in a (B, L, D) tensor: where the
// attention kernels write their sums acc[r][t] of those rows and columns (context rows, gradients)
template <int kSlots, typename F>
__device__ void for_warp_rows(int b, int h, int L, int i0, int D, int Dk, F f) {
  const int lane = threadIdx.x % 32;
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = i0 + (int)threadIdx.x / 32 + r * kAttentionWarps;
    if (i >= L) break;
    for (int t = 0; t < kSlots; ++t)
      if (lane + 32 * t < Dk) f(((size_t)b * L + i) * D + h * Dk + lane + 32 * t, r, t);
  }
}

// The forward's context rows: context(r, t), ctx_i's column lane + 32 t of head h for the warp's rows i of the
// block's query tile, into ctx, and into ctx16, its bf16 twin for the products (or null). A training step lists
// the twin alone (ctx null): nothing but the products reads ctx in bf16, so only the twin is written. (It was
// written from ctx after a barrier, ctx's fp32 values written and read back: 64 MiB of traffic for each of the
// base step's 18 attentions.)
template <int kSlots, typename F>
__device__ void write_context(float* ctx, bf16* ctx16, int H, int Lq, int D, F context) {
  for_warp_rows<kSlots>(blockIdx.x / H, blockIdx.x % H, Lq, blockIdx.y * kAttentionTile, D, D / H, [&](size_t at, int r, int t) {
    const float c = context(r, t);
    if (ctx) ctx[at] = c;
    if (ctx16) ctx16[at] = __float2bfloat16(c);
  });
}

// attention_forward_kernel's first pass: m[r], the max of the warp's row r's scores, and l[r], its sum of
// exp(s_ij - m[r]), over the key tiles in turn (scores(s, j0) leaves the tile at j0's scores of the warp's rows
// and the lane's key in s, -inf where masked), the sum rescaled as the max grows. s keeps the last tile's.
template <typename Scores>
__device__ void softmax_statistics(float (&m)[kRowsPerWarp], float (&l)[kRowsPerWarp], float (&s)[kRowsPerWarp], int Lk, Scores scores) {
  for (int r = 0; r < kRowsPerWarp; ++r) m[r] = -INFINITY, l[r] = 0;
  for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
    scores(s, j0);
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float tile_max = warp_max(s[r]);
      if (tile_max == -INFINITY) continue;  // no visible key in this tile
      const float mx = fmaxf(m[r], tile_max);
      l[r] = l[r] * expf(m[r] - mx) + warp_sum(expf(s[r] - mx));
      m[r] = mx;
    }
  }
}
// The forward kernels' second pass, one weight: p_ij = exp(s_ij - m_i) / l_i, written into p at `at` where (i, j)
// lies inside the matrix (in); a masked key, and every key of a row with none visible, get 0, as on the CPU.
// Returns p'_ij: 0 where attention dropout drops it, else p_ij / (1 - p_drop).
__device__ float attention_weight(float* p, size_t at, bool in, float s, float m, float l, const DropoutKey& drop, float keep_scale) {
  const float pij = s == -INFINITY ? 0.f : expf(s - m) / l;
  if (in) p[at] = pij;
  return drop.p > 0 && pij != 0 && !dropout_keeps(drop, at) ? 0.f : pij * keep_scale;
}

// Forward: grid (B H, query tiles). Two passes over the key tiles, the scores s_ij = q_i . k_j / sqrt(Dk) in
// registers (a lane's key j, a warp's rows i): the first finds each row's max m_i and its sum l_i of
// exp(s_ij - m_i), rescaled as the max grows; the second writes p_ij = exp(s_ij - m_i) / l_i and sums
// ctx_i = sum_j p'_ij v_j. Where the keys fit one tile, their tile and the values' are copied with the
// queries' (one wait, one barrier) and the second pass reuses the first one's scores, so no score is formed
// twice and none goes through global memory.
// kSlots = ceil(Dk / 32): the head's columns a lane sums (a template argument, so that the sums stay in
// registers and no lane loops over columns a smaller head does not have).
template <int kSlots, typename In>  // In: q, k and v's elements, float or bf16 (copy_head_tile)
__global__ void __launch_bounds__(kAttentionThreads, 4)  // 4 blocks an SM: at most 64 registers a thread
    attention_forward_kernel(float* ctx, bf16* ctx16, float* p, const In* q, const In* k, const In* v,
                             const uint8_t* key_valid, bool causal, DropoutKey drop, int H, int Lq, int Lk, int D) {
  drop = at_step(drop);
  float acc[kRowsPerWarp][kSlots] = {};  // ctx_i for the warp's rows i and the lane's columns (write_context)
  // BEGIN SOLUTION task=attention_kernel points=5
  const int b = blockIdx.x / H, h = blockIdx.x % H, Dk = D / H, ld = attention_ld(Dk), i0 = blockIdx.y * kAttentionTile;
  const int lane = threadIdx.x % 32;
  float* qs = dynamic_shared<float>();  // (32, ld): the tile's queries
  float* ks = qs + kAttentionTile * ld;  // (32, ld): a tile of keys
  float* vs = ks + kAttentionTile * ld;  // (32, ld): a tile of values
  float* ws = warp_stage(Dk);            // the warp's p'_ij, lane by lane
  const float scale = rsqrtf((float)Dk), keep_scale = (float)dropout_scale(drop);
  auto p_row = [&](int i) { return ((size_t)blockIdx.x * Lq + i) * Lk; };           // p's offset of row i
  auto row_of = [&](int r) { return (int)threadIdx.x / 32 + r * kAttentionWarps; };  // the warp's r-th row of the tile
  // s[r] = s_ij of the warp's rows i and the lane's key j of the key tile at j0, -inf where j is masked
  auto scores = [&](float (&s)[kRowsPerWarp], int j0) {
    if (Lk > kAttentionTile) load_head_tile(ks, k, b, h, Lk, j0, D, Dk);
    __syncthreads();  // the key tile is loaded
    rows_dot_lanes(s, qs, ks, Dk);
    const int j = j0 + lane;
    const bool valid = j < Lk && key_valid[(size_t)b * Lk + j];
    for (int r = 0; r < kRowsPerWarp; ++r) s[r] = valid && (!causal || j <= i0 + row_of(r)) ? s[r] * scale : -INFINITY;
    __syncthreads();  // the key tile read by all, before the next overwrites it
  };
  copy_head_tile(qs, q, b, h, Lq, i0, D, Dk);
  if (Lk <= kAttentionTile) copy_head_tile(ks, k, b, h, Lk, 0, D, Dk), copy_head_tile(vs, v, b, h, Lk, 0, D, Dk);
  wait_for_copies();
  float s[kRowsPerWarp], m[kRowsPerWarp], l[kRowsPerWarp];
  softmax_statistics(m, l, s, Lk, scores);  // the rows' max and sum of exponentials
  for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
    if (Lk > kAttentionTile) scores(s, j0), load_head_tile(vs, v, b, h, Lk, j0, D, Dk);  // else s holds the only tile's scores
    float w[kRowsPerWarp];  // p'_ij of the warp's rows i and the lane's key j: dropped out or scaled
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = i0 + row_of(r), j = j0 + lane;
      w[r] = attention_weight(p, p_row(i) + j, i < Lq && j < Lk, s[r], m[r], l[r], drop, keep_scale);
    }
    __syncthreads();  // the value tile is loaded
    stage_rows(ws, w);
    add_weighted_rows(acc, ws, vs, min(kAttentionTile, Lk - j0), Lq - i0, Dk);  // (past Lk w is 0)
    __syncthreads();  // before the next tile overwrites this one
  }
  // END SOLUTION
  write_context<kSlots>(ctx, ctx16, H, Lq, D, [&](int r, int t) { return acc[r][t]; });  // from registers
}

// [Eq. 1] The forward on the tensor cores (TF32 products, fp32 sums: wmma's m16n16k8), where the products are
// not fp32 (--precision tf32 or bf16) and Dk is a multiple of 16 (the paper's 64 and every preset's): the two
// passes of attention_forward_kernel, each key tile's scores q_i . k_j and weighted sum sum_j p'_ij v_j formed
// as 16 x 16 tiles by the warps. The scores go through shared memory (32 x 32, kScoreLd floats a row): warps
// 0-3 each form a quarter, then each row's scores are read by kTileRowLanes adjacent lanes, kTileRowKeys keys a
// lane (tile_row_key: lane c of the row takes keys c, c + 8, c + 16, c + 24), whose max and sum of exponentials are
// a reduction over those 8 lanes (row_softmax_statistics), and each lane writes p'_ij where it read s_ij; each
// warp sums its kTiles tiles of ctx (16 rows, 16 of the head's columns) in fragments over the key tiles, and
// the fragments pass through the query tile's space to the context rows. Its scores and sums differ from the
// fp32 kernel's by the operands' rounding to TF32's 10-bit mantissa (a relative 2^-11), a bound that
// test/parity_gpu.cpp holds it to.
constexpr int kScoreLd = kAttentionTile + 4;  // a multiple of 4 floats (wmma), not of 32 (banks)
constexpr int kTileRowLanes = kAttentionThreads / kAttentionTile;  // 8 lanes a row of the scores' tile
constexpr int kTileRowKeys = kAttentionTile / kTileRowLanes;       // 4 keys a lane
// The calling thread's e-th key of its row of the tile (of kTileRowKeys): lane c of the row takes keys c, c + 8,
// c + 16, c + 24, so the row's 8 lanes' e-th keys are 8 adjacent floats (one 32-byte sector of p).
__device__ int tile_row_key(int e) { return threadIdx.x % kTileRowLanes + kTileRowLanes * e; }
// The tensor-core forward's first pass: m, the max of the scores of this thread's row, and l, its sum of
// exp(s_ij - m), over the key tiles in turn (scores(s, j0) leaves the thread's keys' scores of the tile at j0 in
// s, -inf where masked), the sum rescaled as the max grows: as softmax_statistics, over the row's 8 lanes (3
// shuffles each, where a lane holding a key of 4 rows takes 5 for each row: a warp's 4 rows take 6 shuffles a
// key tile, not 40). A tile with no visible key leaves m and l. s keeps the last tile's.
template <typename Scores>
__device__ void row_softmax_statistics(float& m, float& l, float (&s)[kTileRowKeys], int Lk, Scores scores) {
  m = -INFINITY, l = 0;
  for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
    scores(s, j0);
    float x = s[0];
    for (int e = 1; e < kTileRowKeys; ++e) x = fmaxf(x, s[e]);
    const float mx = fmaxf(m, warp_reduce<kTileRowLanes>(x, Max{}));  // -inf while no key of the row is visible
    float sum = 0;  // (every lane sums and shuffles: the warp's other rows may have visible keys)
    for (int e = 0; e < kTileRowKeys; ++e) sum += s[e] == -INFINITY ? 0.f : expf(s[e] - mx);
    sum = warp_reduce<kTileRowLanes>(sum, Sum{});
    l = m == -INFINITY ? sum : l * expf(m - mx) + sum;
    m = mx;
  }
}
constexpr size_t attention_tensor_core_shared_bytes(int Dk) {
  return (3 * (size_t)kAttentionTile * attention_ld(Dk) + kAttentionTile * kScoreLd) * sizeof(float);
}
using Tf32Sums = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;
// acc += A B over n (a multiple of 8) of A's columns and B's rows, both rounded to TF32: A, 16 rows at a, B, 16
// columns at b, each row-major (lda, ldb floats a row) or column-major (floats a column)
template <typename ALayout, typename BLayout>
__device__ __forceinline__ void add_tf32_product(Tf32Sums& acc, const float* a, int lda, const float* b, int ldb, int n) {
  namespace wmma = nvcuda::wmma;
  // not unrolled: sm_90 spills at Dk 64 and 96 fell from 68 and 92 bytes to 16 and 44 (the forward with fp32
  // inputs, when each lane held a key of 4 rows; since a row's scores went to 8 lanes, 0 and 0)
#pragma unroll 1
  for (int k = 0; k < n; k += 8) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, ALayout> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, BLayout> fb;
    wmma::load_matrix_sync(fa, std::is_same_v<ALayout, wmma::col_major> ? a + (size_t)k * lda : a + k, lda);
    wmma::load_matrix_sync(fb, std::is_same_v<BLayout, wmma::col_major> ? b + k : b + (size_t)k * ldb, ldb);
    for (int e = 0; e < fa.num_elements; ++e) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
    for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}
// Where warp w's t-th 16 x 16 tile of a 32-row result lies: rows r0 (0 or 16), columns c0 (past Dk: none). (The
// warp passed in: read from threadIdx here, sm_90 spilled 100 bytes in the forward at Dk 96, not 44.)
struct WarpTile {
  int r0, c0;
};
__device__ WarpTile warp_tile(int warp, int t) {
  const int tile = warp + kAttentionWarps * t;
  return {16 * (tile % 2), 16 * (tile / 2)};
}
// out (32 x 32, kScoreLd floats a row) = a B^T: the dot products of the rows of tile a with those of tile b over
// the head's Dk columns (tiles attention_ld(Dk) floats a row), as four 16 x 16 products by warps 0-3 (B^T: b's
// rows read as columns, column-major). The caller meets the block before and after.
__device__ void tile_rows_dot_rows(float* out, const float* a, const float* b, int Dk) {
  namespace wmma = nvcuda::wmma;
  const int warp = threadIdx.x / 32, ld = attention_ld(Dk);
  if (warp >= 4) return;
  const int r0 = 16 * (warp / 2), c0 = 16 * (warp % 2);
  Tf32Sums st;
  wmma::fill_fragment(st, 0.f);
  add_tf32_product<wmma::row_major, wmma::col_major>(st, a + r0 * ld, ld, b + c0 * ld, ld, Dk);
  wmma::store_matrix_sync(out + r0 * kScoreLd + c0, st, kScoreLd, wmma::mem_row_major);
}
template <int kTiles, typename In>  // a warp's tiles of ctx: ceil(2 (Dk / 16) / 8); In as attention_forward_kernel's
__global__ void __launch_bounds__(kAttentionThreads, 4)
    attention_forward_tensor_core_kernel(float* ctx, bf16* ctx16, float* p, const In* q, const In* k, const In* v,
                                         const uint8_t* key_valid, bool causal, DropoutKey drop, int H, int Lq, int Lk, int D) {
  namespace wmma = nvcuda::wmma;
  drop = at_step(drop);
  const int b = blockIdx.x / H, h = blockIdx.x % H, Dk = D / H, ld = attention_ld(Dk), i0 = blockIdx.y * kAttentionTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row = threadIdx.x / kTileRowLanes, i = i0 + row;  // this thread's row of the scores' tile, its query
  float* qs = dynamic_shared<float>();   // (32, ld): the tile's queries; at the end, their context rows
  float* ks = qs + kAttentionTile * ld;  // (32, ld): a tile of keys
  float* vs = ks + kAttentionTile * ld;  // (32, ld): a tile of values
  float* ss = vs + kAttentionTile * ld;  // (32, kScoreLd): a key tile's scores, then its p'_ij
  const float scale = rsqrtf((float)Dk), keep_scale = (float)dropout_scale(drop);
  const size_t p_row = ((size_t)blockIdx.x * Lq + i) * Lk;  // p's offset of row i
  // s[e] = s_ij of the thread's row i and its e-th key j of the key tile at j0, -inf where j is masked
  auto scores = [&](float (&s)[kTileRowKeys], int j0) {
    if (Lk > kAttentionTile) load_head_tile(ks, k, b, h, Lk, j0, D, Dk);
    __syncthreads();  // the key tile is loaded, and the last tile's p' read by all
    tile_rows_dot_rows(ss, qs, ks, Dk);  // q_i . k_j
    __syncthreads();  // the scores are stored (and the key tile read)
    for (int e = 0; e < kTileRowKeys; ++e) {
      const int j = j0 + tile_row_key(e);
      const bool visible = j < Lk && key_valid[(size_t)b * Lk + j] && (!causal || j <= i);
      s[e] = visible ? ss[row * kScoreLd + tile_row_key(e)] * scale : -INFINITY;
    }
  };
  copy_head_tile(qs, q, b, h, Lq, i0, D, Dk);
  if (Lk <= kAttentionTile) copy_head_tile(ks, k, b, h, Lk, 0, D, Dk), copy_head_tile(vs, v, b, h, Lk, 0, D, Dk);
  wait_for_copies();
  float s[kTileRowKeys], m, l;
  row_softmax_statistics(m, l, s, Lk, scores);  // the row's max and sum of exponentials
  Tf32Sums acc[kTiles];
  for (int t = 0; t < kTiles; ++t) wmma::fill_fragment(acc[t], 0.f);
  for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
    if (Lk > kAttentionTile) scores(s, j0), load_head_tile(vs, v, b, h, Lk, j0, D, Dk);  // else s holds the only tile's scores
    for (int e = 0; e < kTileRowKeys; ++e) {
      const int j = j0 + tile_row_key(e);
      ss[row * kScoreLd + tile_row_key(e)] = attention_weight(p, p_row + j, i < Lq && j < Lk, s[e], m, l, drop, keep_scale);
    }
    __syncthreads();  // p' and the value tile are in place
    const int keys = (min(kAttentionTile, Lk - j0) + 7) / 8 * 8;  // (past Lk p' is 0, and the value rows too)
    for (int t = 0; t < kTiles; ++t) {
      const auto [r0, c0] = warp_tile(warp, t);
      if (c0 < Dk) add_tf32_product<wmma::row_major, wmma::row_major>(acc[t], ss + r0 * kScoreLd, kScoreLd, vs + c0, ld, keys);
    }
    __syncthreads();  // before the next tile overwrites these
  }
  __syncthreads();  // every thread's copies of the queries landed (with no keys, no barrier was met since), and read
  for (int t = 0; t < kTiles; ++t) {  // the sums into the queries' space, which no warp reads any more
    const auto [r0, c0] = warp_tile(warp, t);
    if (c0 < Dk) wmma::store_matrix_sync(qs + r0 * ld + c0, acc[t], ld, wmma::mem_row_major);
  }
  __syncthreads();  // every warp's tiles stored
  // the warp's r-th row of the tile, as for_warp_rows takes them
  write_context<2 * kTiles>(ctx, ctx16, H, Lq, D, [&](int r, int t) { return qs[(warp + r * kAttentionWarps) * ld + lane + 32 * t]; });
}

// What the two backward kernels below share, besides add_weighted_rows. The forward was
// ctx_i = sum_j p'_ij v_j with p'_ij = p_ij keep_ij, p_i = softmax(s_i), s_ij = scale q_i . k_j; so
// dp_ij = keep_ij (dctx_i . v_j) and ds_ij = p_ij (dp_ij - sum_l p_il dp_il). keep_ij (ij: p's offset of the
// entry) is 0 where attention dropout dropped the weight, 1 / (1 - p) where it kept it, 1 without dropout.
__device__ float keep_factor(const DropoutKey& drop, size_t ij, float keep_scale) {
  return drop.p > 0 ? (dropout_keeps(drop, ij) ? keep_scale : 0.f) : 1.f;
}
// A gradient's element x[at] = value, or x[at] += value (add). x16: x's rounding for the products after, or
// null; written in place of x (not added to), it is all the products read, and x's fp32 values are not written.
__device__ void store_gradient(float* x, bf16* x16, size_t at, float value, bool add) {
  if (add) value += x[at];
  if (x16) x16[at] = __float2bfloat16(value);
  if (add || !x16) x[at] = value;
}

// Where the keys fit one tile: ds[r] = ds_ij and pk[r] = p'_ij for the warp's rows i = w + 8 r of a query tile
// (0 from row `rows` on, past the end) and the lane's key j (0 from Lk on), from dot[r] = dctx_i . v_j and p,
// whose row i starts at p_tile + i Lk: dp_ij = keep_ij dot, ds_ij = p_ij (dp_ij - sum_l p_il dp_il), the row's
// sum over the warp's lanes.
__device__ void one_key_tile_softmax_backward(float (&ds)[kRowsPerWarp], float (&pk)[kRowsPerWarp], const float (&dot)[kRowsPerWarp],
                                              const float* p, size_t p_tile, int rows, int Lk, const DropoutKey& drop, float keep_scale) {
  const int j = threadIdx.x % 32;
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = (int)threadIdx.x / 32 + r * kAttentionWarps;
    const size_t ij = p_tile + (size_t)i * Lk + j;
    const float pij = i < rows && j < Lk ? p[ij] : 0.f, kij = pij == 0 ? 0.f : keep_factor(drop, ij, keep_scale);
    const float dp = dot[r] * kij, row_sum = warp_sum(pij == 0 ? 0.f : pij * dp);  // (rows past the end: 0)
    ds[r] = pij == 0 ? 0.f : pij * (dp - row_sum);
    pk[r] = pij * kij;
  }
}
// The tensor-core backward's: the same for a tile's rows as row_softmax_statistics holds them (a row to 8
// adjacent lanes, keys c, c + 8, c + 16, c + 24 to its lane c): reads dctx_i . v_j from ds_tile and writes ds_ij in
// its place, and p'_ij into pk_tile (both 32 x kScoreLd), the row sum reduced over the row's 8 lanes (3 shuffles
// for the warp's 4 rows, where one_key_tile_softmax_backward takes 5 for each row). Exact zeros as there: a
// row with one visible key sums its one term and zeros, so its ds is exactly 0.
__device__ void row_softmax_backward(float* ds_tile, float* pk_tile, const float* p, size_t p_tile, int rows, int Lk,
                                     const DropoutKey& drop, float keep_scale) {
  const int i = threadIdx.x / kTileRowLanes;
  float pij[kTileRowKeys], dp[kTileRowKeys], row_sum = 0;
  for (int e = 0; e < kTileRowKeys; ++e) {
    const int j = tile_row_key(e);
    const size_t ij = p_tile + (size_t)i * Lk + j;
    pij[e] = i < rows && j < Lk ? p[ij] : 0.f;
    const float kij = pij[e] == 0 ? 0.f : keep_factor(drop, ij, keep_scale);
    dp[e] = ds_tile[i * kScoreLd + j] * kij;
    pk_tile[i * kScoreLd + j] = pij[e] * kij;
    row_sum += pij[e] == 0 ? 0.f : pij[e] * dp[e];
  }
  row_sum = warp_reduce<kTileRowLanes>(row_sum, Sum{});
  for (int e = 0; e < kTileRowKeys; ++e) {
    const int j = tile_row_key(e);
    ds_tile[i * kScoreLd + j] = pij[e] == 0 ? 0.f : pij[e] * (dp[e] - row_sum);
  }
}

// Backward where the keys fit one tile (Lk <= kAttentionTile: the benchmark's 32 tokens a side, most Multi30k
// batches): grid (B H), one block for a (sentence, head)'s dq, dk and dv. It holds the keys' and values' tiles
// and takes the query tiles in turn, each with its dctx rows, and forms dctx_i . v_j, the row sums and ds_ij
// once; the kernel below forms them in a query tile's block and again in a key tile's. ds_ij is staged twice:
// by the warp's own rows i (a warp's 4 rows of key j in one 16-byte load, as stage_rows leaves them), for
// dq_i = scale sum_j ds_ij k_j; and, with p'_ij, by the warps' keys j, for dk_j = scale sum_i ds_ij q_i and
// dv_j = sum_i p'_ij dctx_i, a warp's keys j = w + 8 r of query i at by_key[w kByKeyLd + 4 i + r] (one 16-byte
// load too). A warp's area there is padded by 4 floats, so that the lanes writing one row's 32 keys hit
// distinct banks. dk and dv are summed over the query tiles in registers; nothing is added atomically.
constexpr int kByKeyLd = kAttentionTile * kRowsPerWarp + 4;
// where its shared memory's staged values start, past four tiles (floats)
__host__ __device__ constexpr size_t one_key_tile_by_row_at(int Dk) { return 4 * (size_t)kAttentionTile * attention_ld(Dk); }
// Four tiles, each warp's ds by its rows, then ds and p' by the warps' keys: 47,360 bytes at Dk 64, and over
// the 48 KiB a launch gets without asking from Dk 69 (Dk 100: 63,744)
constexpr size_t one_key_tile_shared_bytes(int Dk) {
  return (one_key_tile_by_row_at(Dk) + kAttentionWarps * ((size_t)kAttentionTile * kRowsPerWarp + 2 * kByKeyLd)) * sizeof(float);
}
template <int kSlots, typename In>  // In: dctx, q, k and v's elements, float or bf16 (copy_head_tile)
__global__ void __launch_bounds__(kAttentionThreads, 4)
    attention_backward_one_key_tile_kernel(float* dq, float* dk, float* dv, bf16* dq16, bf16* dk16, bf16* dv16, const In* dctx,
                                           const float* p, const In* q, const In* k, const In* v, DropoutKey drop,
                                           bool add, int H, int Lq, int Lk, int D) {
  drop = at_step(drop);
  const int b = blockIdx.x / H, h = blockIdx.x % H, Dk = D / H, ld = attention_ld(Dk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ks = dynamic_shared<float>();                  // (32, ld): the keys
  float* vs = ks + kAttentionTile * ld;                 // (32, ld): their values
  float* qs = vs + kAttentionTile * ld;                 // (32, ld): a tile of queries
  float* dcs = qs + kAttentionTile * ld;                // (32, ld): their dctx rows
  float* by_row = dynamic_shared<float>() + one_key_tile_by_row_at(Dk);
  float* by_key = by_row + kAttentionWarps * kAttentionTile * kRowsPerWarp;  // ds_ij by the warps' keys
  float* pk_by_key = by_key + kAttentionWarps * kByKeyLd;                    // p'_ij likewise
  by_row += warp * kAttentionTile * kRowsPerWarp;  // the warp's ds_ij, lane (key) by lane
  const float scale = rsqrtf((float)Dk), keep_scale = (float)dropout_scale(drop);
  auto at = [&](int i, int j) { return ((size_t)blockIdx.x * Lq + i) * Lk + j; };  // p's offset of (i, j)
  auto row_of = [&](int r) { return warp + r * kAttentionWarps; };                 // the warp's r-th row of a tile
  float acc_k[kRowsPerWarp][kSlots] = {}, acc_v[kRowsPerWarp][kSlots] = {};  // dk_j, dv_j of the warp's keys j
  // the keys and values, waited for with the first query tile (no query tile: no copy left in flight)
  if (Lq > 0) copy_head_tile(ks, k, b, h, Lk, 0, D, Dk), copy_head_tile(vs, v, b, h, Lk, 0, D, Dk);
  for (int i0 = 0; i0 < Lq; i0 += kAttentionTile) {
    copy_head_tile(qs, q, b, h, Lq, i0, D, Dk), copy_head_tile(dcs, dctx, b, h, Lq, i0, D, Dk);
    wait_for_copies();
    __syncthreads();  // the tiles are loaded
    float dot[kRowsPerWarp], ds[kRowsPerWarp], pk[kRowsPerWarp];  // dctx_i . v_j, ds_ij, p'_ij: the warp's rows i, the lane's key j
    rows_dot_lanes(dot, dcs, vs, Dk);
    one_key_tile_softmax_backward(ds, pk, dot, p, at(i0, 0), Lq - i0, Lk, drop, keep_scale);
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int y = lane % kAttentionWarps * kByKeyLd + row_of(r) * kRowsPerWarp + lane / kAttentionWarps;
      by_key[y] = ds[r], pk_by_key[y] = pk[r];
    }
    write_rows(by_row, ds);
    __syncthreads();  // ds and p' staged by every warp
    float acc[kRowsPerWarp][kSlots] = {};  // dq_i of the warp's rows i
    add_weighted_rows(acc, by_row, ks, Lk, Lq - i0, Dk);
    for_warp_rows<kSlots>(b, h, Lq, i0, D, Dk, [&](size_t at, int r, int t) { store_gradient(dq, dq16, at, acc[r][t] * scale, add); });
    const int queries = min(kAttentionTile, Lq - i0);  // (past Lk ds and p' are 0)
    add_weighted_rows(acc_k, by_key + warp * kByKeyLd, qs, queries, Lk, Dk);
    add_weighted_rows(acc_v, pk_by_key + warp * kByKeyLd, dcs, queries, Lk, Dk);
    __syncthreads();  // before the next query tile overwrites the tiles and the staged values
  }
  for_warp_rows<kSlots>(b, h, Lk, 0, D, Dk, [&](size_t at, int r, int t) {
    store_gradient(dk, dk16, at, acc_k[r][t] * scale, add);
    store_gradient(dv, dv16, at, acc_v[r][t], add);
  });
}

// The same on the tensor cores (products not fp32, Dk a multiple of 16, as the forward): a block holds a
// (sentence, head)'s keys and values and takes the query tiles in turn, its products TF32 wmma with fp32 sums.
// Warps 0-3 form dctx_i . v_j (a 16 x 16 quarter each) into shared memory, where each row's 8 lanes read it and
// leave ds_ij and p'_ij in their tiles (row_softmax_backward); each warp then
// forms its tiles of dq = scale ds K (16 queries by 16 columns, through the queries' tile to dq) and adds to its
// tiles of dk = scale ds^T Q and dv = p'^T dctx (16 keys by 16 columns, in fragments over the query tiles, at
// the end through the keys' and values' tiles), reading ds and p' transposed (column-major) where they lie.
constexpr size_t one_key_tile_tensor_core_shared_bytes(int Dk) {
  return (4 * (size_t)kAttentionTile * attention_ld(Dk) + 2 * kAttentionTile * kScoreLd) * sizeof(float);
}
template <int kTiles, typename In>  // a warp's tiles of dq, dk and dv: ceil(2 (Dk / 16) / 8); In as the kernel above's
__global__ void __launch_bounds__(kAttentionThreads, kTiles == 1 ? 4 : 3)  // Dk 80 and 96: 3 blocks an SM (their shared memory too)
    attention_backward_tensor_core_kernel(float* dq, float* dk, float* dv, bf16* dq16, bf16* dk16, bf16* dv16, const In* dctx,
                                          const float* p, const In* q, const In* k, const In* v, DropoutKey drop, bool add,
                                          int H, int Lq, int Lk, int D) {
  namespace wmma = nvcuda::wmma;
  drop = at_step(drop);
  const int b = blockIdx.x / H, h = blockIdx.x % H, Dk = D / H, ld = attention_ld(Dk), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ks = dynamic_shared<float>();                   // (32, ld): the keys; at the end, dk
  float* vs = ks + kAttentionTile * ld;                  // (32, ld): their values; at the end, dv
  float* qs = vs + kAttentionTile * ld;                  // (32, ld): a tile of queries, then their dq
  float* dcs = qs + kAttentionTile * ld;                 // (32, ld): their dctx rows
  float* ds_tile = dcs + kAttentionTile * ld;            // (32, kScoreLd): dctx_i . v_j, then ds_ij
  float* pk_tile = ds_tile + kAttentionTile * kScoreLd;  // (32, kScoreLd): p'_ij
  const float scale = rsqrtf((float)Dk), keep_scale = (float)dropout_scale(drop);
  auto row_of = [&](int r) { return warp + r * kAttentionWarps; };  // the warp's r-th row of a tile
  const int keys = (Lk + 7) / 8 * 8;  // the keys the products sum over (past Lk ds and p' are 0)
  Tf32Sums acc_k[kTiles], acc_v[kTiles];  // the warp's tiles of dk / scale and dv
  for (int t = 0; t < kTiles; ++t) wmma::fill_fragment(acc_k[t], 0.f), wmma::fill_fragment(acc_v[t], 0.f);
  // the keys and values, waited for with the first query tile (no query tile: no copy left in flight)
  if (Lq > 0) copy_head_tile(ks, k, b, h, Lk, 0, D, Dk), copy_head_tile(vs, v, b, h, Lk, 0, D, Dk);
  for (int i0 = 0; i0 < Lq; i0 += kAttentionTile) {
    copy_head_tile(qs, q, b, h, Lq, i0, D, Dk), copy_head_tile(dcs, dctx, b, h, Lq, i0, D, Dk);
    wait_for_copies();
    __syncthreads();  // the tiles are loaded
    tile_rows_dot_rows(ds_tile, dcs, vs, Dk);  // dctx_i . v_j
    __syncthreads();  // dctx_i . v_j stored
    row_softmax_backward(ds_tile, pk_tile, p, ((size_t)blockIdx.x * Lq + i0) * Lk, Lq - i0, Lk, drop, keep_scale);
    __syncthreads();  // ds and p' in place
    const int queries = (min(kAttentionTile, Lq - i0) + 7) / 8 * 8;  // (past Lq ds and p' are 0)
    Tf32Sums acc_q[kTiles];
    for (int t = 0; t < kTiles; ++t) {
      const auto [r0, c0] = warp_tile(warp, t);
      if (c0 >= Dk) continue;
      wmma::fill_fragment(acc_q[t], 0.f);
      add_tf32_product<wmma::row_major, wmma::row_major>(acc_q[t], ds_tile + r0 * kScoreLd, kScoreLd, ks + c0, ld, keys);
      add_tf32_product<wmma::col_major, wmma::row_major>(acc_k[t], ds_tile + r0, kScoreLd, qs + c0, ld, queries);  // (keys r0..)
      add_tf32_product<wmma::col_major, wmma::row_major>(acc_v[t], pk_tile + r0, kScoreLd, dcs + c0, ld, queries);
    }
    __syncthreads();  // the queries' tile read by all
    for (int t = 0; t < kTiles; ++t) {
      const auto [r0, c0] = warp_tile(warp, t);
      if (c0 < Dk) wmma::store_matrix_sync(qs + r0 * ld + c0, acc_q[t], ld, wmma::mem_row_major);
    }
    __syncthreads();  // dq's tiles stored
    for_warp_rows<2 * kTiles>(b, h, Lq, i0, D, Dk, [&](size_t at, int r, int t) {
      store_gradient(dq, dq16, at, qs[row_of(r) * ld + lane + 32 * t] * scale, add);
    });
    __syncthreads();  // before the next query tile overwrites the tiles
  }
  for (int t = 0; t < kTiles; ++t) {  // into the keys' and values' tiles, which no warp reads any more
    const auto [r0, c0] = warp_tile(warp, t);
    if (c0 < Dk) {
      wmma::store_matrix_sync(ks + r0 * ld + c0, acc_k[t], ld, wmma::mem_row_major);
      wmma::store_matrix_sync(vs + r0 * ld + c0, acc_v[t], ld, wmma::mem_row_major);
    }
  }
  __syncthreads();  // every warp's tiles stored
  for_warp_rows<2 * kTiles>(b, h, Lk, 0, D, Dk, [&](size_t at, int r, int t) {
    store_gradient(dk, dk16, at, ks[row_of(r) * ld + lane + 32 * t] * scale, add);
    store_gradient(dv, dv16, at, vs[row_of(r) * ld + lane + 32 * t], add);
  });
}

// Backward where the keys take more than one tile: grid (B H, query tiles + key tiles), one launch. A query
// tile's block writes dq, a key tile's dk and dv, so nothing is added atomically, and a scratch that holds
// nothing yet is written, not zeroed first and added to (add: false). Both form dp_ij, the row sums
// sum_l p_il dp_il and ds_ij themselves, the row sums by row_sums, so neither waits for the other. (Not as
// dctx_i . ctx_i, equal in exact arithmetic, as FlashAttention takes it: that left ds of a row with one visible
// key at a rounding error instead of 0, which Adam turned into steps of the learning rate's size on parameters
// whose gradient is otherwise 0: 2 ranks against --accumulate 2 on the emulated GPU moved apart 100 times
// more, 3.0e-6 after 6 steps instead of 3.5e-8.)
template <int kSlots, typename In>  // In as the kernels' above
__global__ void __launch_bounds__(kAttentionThreads, 4)
    attention_backward_kernel(float* dq, float* dk, float* dv, bf16* dq16, bf16* dk16, bf16* dv16, const In* dctx, const float* p,
                              const In* q, const In* k, const In* v, DropoutKey drop, bool add, int H, int Lq, int Lk, int D) {
  drop = at_step(drop);
  const int b = blockIdx.x / H, h = blockIdx.x % H, Dk = D / H, ld = attention_ld(Dk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, query_tiles = (Lq + kAttentionTile - 1) / kAttentionTile;
  float* t0 = dynamic_shared<float>();  // three (32, ld) tiles and 32 floats (then the warps' staging areas)
  float* t1 = t0 + kAttentionTile * ld;
  float* t2 = t1 + kAttentionTile * ld;
  float* rowdot = t2 + kAttentionTile * ld;
  float* st = warp_stage(Dk);  // the warp's ds_ij (and p'_ij), lane by lane
  const float scale = rsqrtf((float)Dk), keep_scale = (float)dropout_scale(drop);
  auto at = [&](int i, int j) { return ((size_t)blockIdx.x * Lq + i) * Lk + j; };  // p's offset of (i, j)
  auto keep = [&](size_t ij) { return keep_factor(drop, ij, keep_scale); };
  auto row_of = [&](int r) { return warp + r * kAttentionWarps; };  // the warp's r-th row of a tile
  // row_sums(rd, dcs, stream, i0): rd[r] = sum_j p_ij dp_ij for the warp's rows i = i0 + row_of(r), their dctx
  // rows in the tile dcs, over the key tiles in order, each one's values loaded into the tile stream
  auto row_sums = [&](float (&rd)[kRowsPerWarp], const float* dcs, float* stream, int i0) {
    for (int r = 0; r < kRowsPerWarp; ++r) rd[r] = 0;
    for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
      __syncthreads();  // dcs is loaded, and stream read by all
      load_head_tile(stream, v, b, h, Lk, j0, D, Dk);
      __syncthreads();
      float dot[kRowsPerWarp];  // dctx_i . v_j for the warp's rows i and the lane's key j
      rows_dot_lanes(dot, dcs, stream, Dk);
      for (int r = 0; r < kRowsPerWarp && i0 + row_of(r) < Lq; ++r) {
        const int i = i0 + row_of(r), j = j0 + lane;
        const float pij = j < Lk ? p[at(i, j)] : 0.f;
        rd[r] += warp_sum(pij == 0 ? 0.f : pij * (dot[r] * keep(at(i, j))));
      }
    }
    __syncthreads();  // stream read by all before it is overwritten
  };
  float acc[kRowsPerWarp][kSlots] = {}, acc_v[kRowsPerWarp][kSlots] = {};
  if ((int)blockIdx.y < query_tiles) {  // dq_i = scale sum_j ds_ij k_j for the tile's queries
    const int i0 = blockIdx.y * kAttentionTile;
    float *dcs = t0, *ks = t1, *vs = t2;
    load_head_tile(dcs, dctx, b, h, Lq, i0, D, Dk);
    float rd[kRowsPerWarp], ds[kRowsPerWarp];
    row_sums(rd, dcs, vs, i0);
    for (int j0 = 0; j0 < Lk; j0 += kAttentionTile) {
      copy_head_tile(ks, k, b, h, Lk, j0, D, Dk);
      copy_head_tile(vs, v, b, h, Lk, j0, D, Dk);
      wait_for_copies();
      __syncthreads();
      float dot[kRowsPerWarp];  // dctx_i . v_j for the warp's rows i and the lane's key j
      rows_dot_lanes(dot, dcs, vs, Dk);
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int i = i0 + row_of(r), j = j0 + lane;
        const float pij = i < Lq && j < Lk ? p[at(i, j)] : 0.f;
        ds[r] = pij == 0 ? 0.f : pij * (dot[r] * keep(at(i, j)) - rd[r]);
      }
      stage_rows(st, ds);
      add_weighted_rows(acc, st, ks, min(kAttentionTile, Lk - j0), Lq - i0, Dk);  // (past Lk ds is 0)
      __syncthreads();  // before the next tiles overwrite these
    }
    for_warp_rows<kSlots>(b, h, Lq, i0, D, Dk, [&](size_t at, int r, int t) { store_gradient(dq, dq16, at, acc[r][t] * scale, add); });
  } else {  // dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p'_ij dctx_i for the tile's keys
    const int j0 = (blockIdx.y - query_tiles) * kAttentionTile;
    float *vks = t0, *qs = t1, *dcs = t2;  // the tile's values; a tile of queries and their dctx rows
    if (Lq > 0) copy_head_tile(vks, v, b, h, Lk, j0, D, Dk);  // waited for with the first query tile's (none: no copy)
    float ds[kRowsPerWarp], pk[kRowsPerWarp];
    for (int i0 = 0; i0 < Lq; i0 += kAttentionTile) {
      load_head_tile(dcs, dctx, b, h, Lq, i0, D, Dk);
      float rd[kRowsPerWarp];
      row_sums(rd, dcs, qs, i0);  // the query tile's space streams the values first
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (lane == 0) rowdot[row_of(r)] = rd[r];
      copy_head_tile(qs, q, b, h, Lq, i0, D, Dk);
      wait_for_copies();
      __syncthreads();
      float dot[kRowsPerWarp];  // dctx_i . v_j for the lane's query i and the warp's keys j
      rows_dot_lanes(dot, vks, dcs, Dk);
      const float rd_lane = rowdot[lane];  // sum_l p_il dp_il for the lane's query i
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int j = j0 + row_of(r), i = i0 + lane;
        const float pij = i < Lq && j < Lk ? p[at(i, j)] : 0.f, kij = pij == 0 ? 0.f : keep(at(i, j));
        ds[r] = pij == 0 ? 0.f : pij * (dot[r] * kij - rd_lane);
        pk[r] = pij * kij;
      }
      write_rows(st, ds);
      write_rows(st + kStageFloats / 2, pk);
      __syncwarp();  // both staged
      const int queries = min(kAttentionTile, Lq - i0);  // (past Lq ds and p' are 0)
      add_weighted_rows(acc, st, qs, queries, Lk - j0, Dk);
      add_weighted_rows(acc_v, st + kStageFloats / 2, dcs, queries, Lk - j0, Dk);
      __syncthreads();  // before the next tiles overwrite these
    }
    for_warp_rows<kSlots>(b, h, Lk, j0, D, Dk, [&](size_t at, int r, int t) {
      store_gradient(dk, dk16, at, acc[r][t] * scale, add);
      store_gradient(dv, dv16, at, acc_v[r][t], add);
    });
  }
}

// launch(std::integral_constant<int, ceil(Dk / 32)>): the attention kernel compiled for the head dimension
template <typename F> static void with_head_slots(int D, int H, F launch) {
  static_assert(kHeadDimSlots == 4, "one case per slot count");
  switch ((D / H + 31) / 32) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 3: return launch(std::integral_constant<int, 3>{});
    case 4: if (D / H <= kMaxHeadDim) return launch(std::integral_constant<int, 4>{});
  }
  throw std::invalid_argument("gpu attention: head dimension " + std::to_string(D / H) + " is outside 1.." +
                              std::to_string(kMaxHeadDim));
}

// Whether attention's products go to the tensor cores (attention_forward_tensor_core_kernel, and where the keys
// fit one tile attention_backward_tensor_core_kernel): the products are not fp32, and Dk is a multiple of 16
static bool attention_on_tensor_cores(int Dk) { return products() != Precision::fp32 && Dk % 16 == 0 && Dk <= kMaxHeadDim; }
// f(q, k, v) with attention's q, k and v as its kernels read them: their bf16 twins where a bf16 training step
// lists all three (alone: their projections write only those), else their fp32 elements. (In: the elements'
// type, the kernels' template argument.)
constexpr const char* kQkvTwins = "attention: q, k and v have bf16 twins all three or none";
template <typename F> static void with_attention_inputs(const float* q, const float* k, const float* v, size_t nq, size_t nk, F f) {
  const bf16 *q16 = bf16_twin_of(q, nq), *k16 = bf16_twin_of(k, nk), *v16 = bf16_twin_of(v, nk);
  if (q16 && k16 && v16) return f(q16, k16, v16);
  if (q16 || k16 || v16) throw std::logic_error(kQkvTwins);
  f(q, k, v);
}
template <typename T> using Elements = std::remove_const_t<std::remove_pointer_t<T>>;  // float or bf16, of a pointer's type
void attention_forward(float* ctx, float* p, const float* q, const float* k, const float* v, const uint8_t* key_valid,
                       bool causal, DropoutKey drop, int B, int Lq, int Lk, int D, int H) {
  if ((size_t)B * H * Lq == 0) return;
  const dim3 grid(B * H, (Lq + kAttentionTile - 1) / kAttentionTile);
  const size_t nq = (size_t)B * Lq * D;
  bool alone;
  bf16* ctx16 = bf16_twin_of(ctx, nq, &alone);
  const int Dk = D / H;
  with_attention_inputs(q, k, v, nq, (size_t)B * Lk * D, [&](auto q, auto k, auto v) {
    using In = Elements<decltype(q)>;
    if (attention_on_tensor_cores(Dk)) {
      const size_t bytes = attention_tensor_core_shared_bytes(Dk);
      if (Dk <= 64) LAUNCH((attention_forward_tensor_core_kernel<1, In>), grid, kAttentionThreads, bytes, alone ? nullptr : ctx, ctx16, p, q,
                           k, v, key_valid, causal, drop, H, Lq, Lk, D);
      else LAUNCH((attention_forward_tensor_core_kernel<2, In>), grid, kAttentionThreads, bytes, alone ? nullptr : ctx, ctx16, p, q, k, v,
                  key_valid, causal, drop, H, Lq, Lk, D);
      return;
    }
    with_head_slots(D, H, [&](auto slots) {
      LAUNCH((attention_forward_kernel<decltype(slots)::value, In>), grid, kAttentionThreads, attention_shared_bytes(D / H),
             alone ? nullptr : ctx, ctx16, p, q, k, v, key_valid, causal, drop, H, Lq, Lk, D);
    });
  });
}

// attention_backward with dq, dk and dv added to (add) or written, and their bf16 roundings written (dq16, dk16, dv16, or
// null; written in place of dq, dk and dv, not added to, they are all the kernel writes); dctx, q, k and v all fp32 or all
// bf16 (In)
template <typename In>
static void attention_backward(float* dq, float* dk, float* dv, bf16* dq16, bf16* dk16, bf16* dv16, bool add, const In* dctx,
                               const float* p, const In* q, const In* k, const In* v, DropoutKey drop, int B, int Lq, int Lk, int D,
                               int H) {
  if ((size_t)B * H * (Lq + Lk) == 0) return;
  if (dq) before_writing(dq, (size_t)B * Lq * D), before_writing(dk, (size_t)B * Lk * D), before_writing(dv, (size_t)B * Lk * D);
  const int Dk = D / H;
  if (attention_on_tensor_cores(Dk) && Lk <= kAttentionTile) {
    const size_t bytes = one_key_tile_tensor_core_shared_bytes(Dk);
    if (Dk <= 64)
      LAUNCH((attention_backward_tensor_core_kernel<1, In>), B * H, kAttentionThreads,
             dynamic_shared_bytes(attention_backward_tensor_core_kernel<1, In>, bytes), dq, dk, dv, dq16, dk16, dv16, dctx, p, q, k, v, drop,
             add, H, Lq, Lk, D);
    else
      LAUNCH((attention_backward_tensor_core_kernel<2, In>), B * H, kAttentionThreads,
             dynamic_shared_bytes(attention_backward_tensor_core_kernel<2, In>, bytes), dq, dk, dv, dq16, dk16, dv16, dctx, p, q, k, v, drop,
             add, H, Lq, Lk, D);
    return;
  }
  with_head_slots(D, H, [&](auto slots) {
    constexpr int kSlots = decltype(slots)::value;
    if (Lk <= kAttentionTile) {
      const auto kernel = attention_backward_one_key_tile_kernel<kSlots, In>;
      LAUNCH(kernel, B * H, kAttentionThreads, dynamic_shared_bytes(kernel, one_key_tile_shared_bytes(D / H)), dq, dk, dv, dq16, dk16,
             dv16, dctx, p, q, k, v, drop, add, H, Lq, Lk, D);
    } else {
      const dim3 grid(B * H, (Lq + kAttentionTile - 1) / kAttentionTile + (Lk + kAttentionTile - 1) / kAttentionTile);
      LAUNCH((attention_backward_kernel<kSlots, In>), grid, kAttentionThreads, attention_shared_bytes(D / H), dq, dk, dv, dq16, dk16,
             dv16, dctx, p, q, k, v, drop, add, H, Lq, Lk, D);
    }
  });
}
// (dctx read as q, k and v are: in bf16 its twin where an op's caller lists one, else rounded on its way in)
void attention_backward(float* dq, float* dk, float* dv, const float* dctx, const float* p, const float* q, const float* k,
                        const float* v, DropoutKey drop, int B, int Lq, int Lk, int D, int H) {
  const size_t nq = (size_t)B * Lq * D;
  with_attention_inputs(q, k, v, nq, (size_t)B * Lk * D, [&](auto q, auto k, auto v) {
    decltype(q) dc;
    if constexpr (std::is_same_v<Elements<decltype(q)>, bf16>) dc = operand(dctx, nq, kDctx).h;
    else dc = dctx;
    attention_backward(dq, dk, dv, nullptr, nullptr, nullptr, true, dc, p, q, k, v, drop, B, Lq, Lk, D, H);
  });
}

void multihead_attention_forward(float* out, const AttentionActs<float>& a, const float* xq, const float* xkv,
                                 const AttentionWeights<float>& w, const uint8_t* key_valid, bool causal, DropoutKey drop,
                                 int B, int Lq, int Lk, int D, int H) {
  // [§3.2.2] Q = xq Wq, K = xkv Wk, V = xkv Wv; Concat(heads) W^O. In bf16 each input is rounded once, and in
  // a training step the projections write Q, K and V rounded alone, into their twins (product_result): the
  // attention kernels read nothing else of them. The projections of one input are one product where their
  // weights and outputs lie evenly apart (the model's do; an op's caller may pass any buffers): Q, K and V in
  // self-attention, K and V in the decoder's second.
  const size_t nq = (size_t)B * Lq * D, nk = (size_t)B * Lk * D, dd = (size_t)D * D;
  const Operand q_in = operand(xq, nq, kShared);
  const Operand kv_in = xkv == xq ? q_in : operand(xkv, nk, kLeft);
  const Result rq = product_result(a.q, nq), rk = product_result(a.k, nk), rv = product_result(a.v, nk);
  const bool in_bf16 = rq.h;
  if (in_bf16 != (rk.h != nullptr) || in_bf16 != (rv.h != nullptr)) throw std::logic_error(kQkvTwins);
  const ptrdiff_t qkv_at = in_bf16 ? even_stride<bf16>({rq.h, rk.h, rv.h}, nq) : even_stride<float>({rq.f, rk.f, rv.f}, nq);
  const ptrdiff_t kv_at = in_bf16 ? even_stride<bf16>({rk.h, rv.h}, nk) : even_stride<float>({rk.f, rv.f}, nk);
  if (xkv == xq && Lq == Lk && qkv_at && weights_adjacent({w.wq, w.wk, w.wv}, dd)) {
    project_batched(rq, qkv_at, q_in, w.wq, 3, B * Lq, D, D);
  } else {
    project(rq, q_in, w.wq, B * Lq, D, D);
    if (kv_at && weights_adjacent({w.wk, w.wv}, dd)) project_batched(rk, kv_at, kv_in, w.wk, 2, B * Lk, D, D);
    else project(rk, kv_in, w.wk, B * Lk, D, D), project(rv, kv_in, w.wv, B * Lk, D, D);
  }
  attention_forward(a.ctx, a.p, a.q, a.k, a.v, key_valid, causal, drop, B, Lq, Lk, D, H);
  linear_forward(out, a.ctx, w.wo, nullptr, B * Lq, D, D);
}

void multihead_attention_backward(float* dxq, float* dxkv, const AttentionWeights<float>& dw, const float* dout,
                                  const AttentionActs<float>& a, const AttentionActs<float>& s, const float* xq,
                                  const float* xkv, const AttentionWeights<float>& w, DropoutKey drop, int B, int Lq, int Lk,
                                  int D, int H) {
  // the forward call list, in reverse; s holds scratch for dq, dk, dv, dctx, each written (not added); in
  // a bf16 training step the product writes dctx rounded, for the attention's kernel, as it reads q, k and v;
  // in bf16 that kernel writes dq, dk and dv rounded, and not their fp32 values (the products read only the
  // roundings), dq's then dk's then dv's in one scratch. dxkv (and dxq, if another buffer) taken
  // zeroed is written by its first product. The weights' gradients of the projections of one input are one
  // product where the forward's were.
  const size_t nq = (size_t)B * Lq * D, nk = (size_t)B * Lk * D, dd = (size_t)D * D;
  const bool add_kv = !took_zero_fill(dxkv, nk), add_q = dxq == dxkv || !took_zero_fill(dxq, nq);
  bf16* d16 = rounded_in_pass(nq + 2 * nk, kDqkv);
  bf16 *dq16 = d16, *dk16 = d16 ? d16 + nq : nullptr, *dv16 = d16 ? d16 + nq + nk : nullptr;
  with_attention_inputs(a.q, a.k, a.v, nq, nk, [&](auto q, auto k, auto v) {
    using In = Elements<decltype(q)>;  // dctx as the kernels read q, k and v: in bf16 W^O's product writes it rounded alone
    In* dctx;
    if constexpr (std::is_same_v<In, bf16>) dctx = rounded_in_pass(nq, kDctx);
    else dctx = s.ctx;
    linear_backward(Result(dctx), false, dw.wo, nullptr, operand(dout, nq, kLeft), a.ctx, w.wo, B * Lq, D, D);
    attention_backward(s.q, s.k, s.v, dq16, dk16, dv16, false, (const In*)dctx, a.p, q, k, v, drop, B, Lq, Lk, D, H);
  });
  // the products read d16 where it is written, else s's fp32 values: their strides
  const ptrdiff_t d_qkv_at = d16 ? even_stride<bf16>({dq16, dk16, dv16}, nq) : even_stride<float>({s.q, s.k, s.v}, nq);
  const ptrdiff_t d_kv_at = d16 ? even_stride<bf16>({dk16, dv16}, nk) : even_stride<float>({s.k, s.v}, nk);
  const ptrdiff_t dw_qkv_at = even_stride<float>({dw.wq, dw.wk, dw.wv}, dd), dw_kv_at = even_stride<float>({dw.wk, dw.wv}, dd);
  const bool qkv = xq == xkv && Lq == Lk && d_qkv_at && dw_qkv_at, kv = !qkv && d_kv_at && dw_kv_at;
  const Operand kv_in = operand(xkv, nk, kShared);  // in bf16 rounded once for dWv and dWk
  project_backward(dxkv, add_kv, qkv || kv ? nullptr : dw.wv, {s.v, dv16}, kv_in, w.wv, B * Lk, D, D);
  project_backward(dxkv, true, qkv || kv ? nullptr : dw.wk, {s.k, dk16}, kv_in, w.wk, B * Lk, D, D);
  if (kv) weight_grads_batched(dw.wk, dw_kv_at, kv_in, {s.k, dk16}, d_kv_at, 2, B * Lk, D, D);
  const Operand q_in = xq == xkv ? kv_in : operand(xq, nq, kShared);
  project_backward(dxq, add_q, qkv ? nullptr : dw.wq, {s.q, dq16}, q_in, w.wq, B * Lq, D, D);
  if (qkv) weight_grads_batched(dw.wq, dw_qkv_at, q_in, {s.q, dq16}, d_qkv_at, 3, B * Lq, D, D);
}

}  // namespace gpu
