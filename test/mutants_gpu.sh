#!/usr/bin/env bash
# mutants_gpu: plants one bug at a time in a copy of the GPU path (gpu/*.cuh), builds parity_gpu against the
# emulated GPU (test/cuda_emulator.h) and shows that the suite fails on each: the emulator and the parity test together
# must catch every bug of this list. Run by `make mutants` (CI does).
#   a mutant is caught when parity_gpu exits non-zero under the inorder or the reverse thread order
#   (a failed check, an emulator finding, a sanitizer report); it survives when both pass. parity_gpu runs
#   with CHECK_FAIL_FAST=1 (test/check.h): it stops at its first failed check, as that catches the mutant.
#   Each mutant's transformer.cu (with its copy of gpu/) is first built without a sanitizer (at -Og: the Makefile's MUTANT_CXXFLAGS):
#   most bugs show as a wrong result or a refused call.
#   One that passes there is built again with AddressSanitizer and run again: a write past a buffer's end
#   may show only there.
# Mutants are built and run one a core. The unmutated source must pass (the control, run beside the first
# mutants; and with AddressSanitizer too, after them, where a mutant was caught only so), and each mutant's
# original text must occur exactly once in those sources, so that the check cannot pass by mutating
# nothing. Exits non-zero if anything survives or cannot be planted.
# Usage: mutants_gpu.sh CXX "MUTANT_CXXFLAGS" "ASAN_FLAGS" "EMU_CXXFLAGS" "EMU_LDLIBS" "OBJECTS"   (the
# Makefile passes its own: a mutant's transformer.cu is compiled with the first flags, and the second added
# for the second pass, and linked with the third and the fourth; OBJECTS are the emulated build's objects
# but transformer.o, and parity_gpu.o, built with AddressSanitizer and UndefinedBehaviorSanitizer)
set -u
cd "$(dirname "$0")/.."
cxx="$1" mutant_flags="$2" asan_flags="$3" flags="$4" libs="$5" objs="$6"
for o in $objs; do [ -f "$o" ] || { echo "mutants_gpu: $o is missing: run make emu first"; exit 2; }; done
work="$(mktemp -d)"
# what transformer.cu's translation unit reads from this tree: a mutant's copy holds all of it
sources="$(ls transformer.cu *.h *.cuh gpu/*.cuh test/cuda_emulator.h 2>/dev/null)"
trap 'rm -rf "$work"' EXIT

# name | original text | mutated text   (python string literals; \n is a newline)
mutants=(
  "removed __syncthreads in block_reduce (the warps' results read before all are written)|if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;\n  __syncthreads();|if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;"
  "off-by-one grid-stride bound (i <= n)|threadIdx.x; i < (n); i += |threadIdx.x; i <= (n); i += "
  "wrong transpose flag in the products (op(B))|opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;|opb = tb ? CUBLAS_OP_N : CUBLAS_OP_T;"
  "wrong leading dimension in cublasSgemm (A with ldb)|&one, B.f, ldb, A.f, lda,|&one, B.f, ldb, A.f, ldb,"
  "write past the end by the last row (LayerNorm's mean)|y[d] = (x[d] - mu) * rs * g[d] + b[d];\n  if (lane == 0) mean[r] = mu,|y[d] = (x[d] - mu) * rs * g[d] + b[d];\n  if (lane == 0) mean[r + (r + 1 == M)] = mu,"
  "accumulating output not zeroed (the gradients between steps)|    gpu::fill(grads, 0, n);\n    CUDA_CHECK(cudaMemsetAsync(step_loss|    CUDA_CHECK(cudaMemsetAsync(step_loss"
  "race on a shared array (attention backward's row sums read before all are written)|copy_head_tile(qs, q, b, h, Lq, i0, D, Dk);\n      wait_for_copies();\n      __syncthreads();|copy_head_tile(qs, q, b, h, Lq, i0, D, Dk);\n      wait_for_copies();"
  "stale bf16 copy of the parameters (Adam's pass leaves it)|    if (copy) copy[i] = __float2bfloat16(params[i]);\n|"
  "a product's two bf16 operands rounded into one scratch buffer (project_backward)|d, O, operand(w, (size_t)I * O, kRight), O,|d, O, operand(w, (size_t)I * O, kLeft), O,"
  "a CUDA graph that replays its capture's dropout masks (the step not read from device memory)|graphed ? dropout_step : nullptr};|nullptr};"
  "a CUDA graph that replays its capture's batch place in the step (micro not read from device memory)|key.site + key.step->micro_site);|key.site);"
  "a producer that leaves its output's bf16 twin stale (residual + LayerNorm)|kWarpRowThreads, 0, out,\n           bf16_twin_of(out, (size_t)M * D), sum, mean,|kWarpRowThreads, 0, out,\n           nullptr, sum, mean,"
  "an FFN backward that takes the ReLU's mask from h, not from h's twin listed alone (h not written)|dh32, dh16, dw.b1, a.h, bf16_twin_of(a.h, n), (size_t)M,|dh32, dh16, dw.b1, a.h, nullptr, (size_t)M,"
  "an FFN forward whose gate reads hpre in fp32, which in bf16 its product no longer writes (only the rounding, in h16's place)|h16, h16 ? nullptr : a.hpre, w.b1,|h16, a.hpre, w.b1,"
  "a warp-level sync where the block must meet (the one-key-tile attention backward: ds read by key before the other warps stage it)|__syncthreads();  // ds and p' staged by every warp|__syncwarp();  // ds and p' staged by every warp"
  "an attention forward that writes ctx's twin only beside ctx (the twin listed alone in a training step left stale)|if (ctx16) ctx16[at] = __float2bfloat16(c);|if (ctx16 && ctx) ctx16[at] = __float2bfloat16(c);"
  "a launch past the 48 KiB of shared memory without raising the kernel's limit (the one-key-tile attention backward at Dk 100)|dynamic_shared_bytes(kernel, one_key_tile_shared_bytes(D / H))|one_key_tile_shared_bytes(D / H)"
  "a deferred zero fill taken by an op that writes less than all of it (the range's start matched, not its length)|f.p == p && f.n == n && (f.bias|f.p == p && (f.bias"
  "a residual connection that takes the FFN's deferred output bias and drops it (post-LN)|residual_dropout(x, y, y_bias ? y_bias + d : nullptr, drop|residual_dropout(x, y, nullptr, drop"
  "an op that takes a deferred zero fill and still adds into the buffer (the residual's backward, dy)|dy[i] = (add_dy ? dy[i] : 0.f) +|dy[i] = dy[i] +"
  "b1's gradient stored by each block of the FFN's gate pass, not added (a lost update)|atomicAdd(&db[c], sum);|db[c] = sum;"
  "a tile's asynchronous copies not waited for (wait_for_copies: the tiles read while their copies may still be in flight)|  __pipeline_commit();\n  __pipeline_wait_prior(0);\n|  __pipeline_commit();\n"
  "LayerNorm's column sums added to dg and db before every warp of the block has written its own (the barrier removed)|  __syncthreads();  // every group's column sums written\n|"
  "the tensor-core attention's scores (and dctx . v) reading the second tile as K, not K^T (a wmma operand's layout)|add_tf32_product<wmma::row_major, wmma::col_major>(st, a|add_tf32_product<wmma::row_major, wmma::row_major>(st, a"
  "the tensor cores' operands not rounded to TF32 (wmma then reads them truncated)|    for (int e = 0; e < fa.num_elements; ++e) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);\n    for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);\n|"
  "the tensor-core attention's scores read before the warps that form them have stored them (the barrier removed)|    __syncthreads();  // the scores are stored (and the key tile read)\n|"
  "the tensor-core attention backward's dk from ds, not ds^T (a wmma operand's layout)|add_tf32_product<wmma::col_major, wmma::row_major>(acc_k[t],|add_tf32_product<wmma::row_major, wmma::row_major>(acc_k[t],"
  "the tensor-core attention backward's dq stored over the queries' tile while other warps still read it for dk (the barrier removed)|    __syncthreads();  // the queries' tile read by all\n|"
  "attention's bf16 tile loader stepping a head's rows by Dk, not D (the rows read as if they lay one after another)|reinterpret_cast<const Bf16x4*>(head + (size_t)row(i) * D + d)|reinterpret_cast<const Bf16x4*>(head + (size_t)row(i) * Dk + d)"
  "projections that write q, k and v in fp32 where the attention reads their bf16 twins (left stale)|return twin ? Result(twin) : Result(p);|return Result(p);"
  "the loss's passes reading the logits' fp32 values where the output projection wrote only their twin|  if (z16) return f(z16);\n|"
  "a CUDA graph of the update that replays its capture's Adam step (staged only while captured)|*staged_adam = gpu::adam_step(lr, c.beta1, c.beta2, m.step);\n    const auto work = [&] {\n|const auto work = [&] {\n      *staged_adam = gpu::adam_step(lr, c.beta1, c.beta2, m.step);\n"
  "the residual connection's backward writes d_sub while weight gradients' products that read it wait to run (its wait removed)|  before_writing(dx, (size_t)M * D), before_writing(dy, (size_t)M * D);\n|"
  "a scratch buffer handed out to be written while a weight gradient's product still reads it (bf16_scratch's wait removed)|  wait_for_weight_grads(p[slot], size[slot] * sizeof(bf16));  // what is handed out is written\n|"
  "a backward that ends with the weight gradients' products not joined back (the update reads them before they are added)|      gpu::join_weight_grads();      // and the weight gradients' products are joined back\n|"
  "weight gradients' products forked from the main stream only once (the later ones may run before the work that writes their operands)|  CUDA_CHECK(cudaEventRecord(w.fork, stream()));\n  CUDA_CHECK(cudaStreamWaitEvent(w.stream, w.fork, 0));\n|  if (w.products == 0) {\n  CUDA_CHECK(cudaEventRecord(w.fork, stream()));\n  CUDA_CHECK(cudaStreamWaitEvent(w.stream, w.fork, 0));\n  }\n"
  "a kernel writing a buffer's bf16 twin while a weight gradient's product still reads the twin (before_writing's wait for the twin removed)|  if (const bf16* twin = bf16_copy_of(p, n)) wait_for_weight_grads(twin, n * sizeof(bf16));\n|"
  "a product of the main stream that writes its result while a weight gradient's product still reads it|    wait_for_weight_grads(C.h ? (const void*)C.h : C.f, batch.extent(batch.c, extent(M, N, ldc)) * (C.h ? sizeof(bf16) : sizeof(float)));\n|"
  "a fill over what a weight gradient's product still reads|  if (n == 0) return;\n  wait_for_weight_grads(p, n * sizeof(float));\n|  if (n == 0) return;\n"
  "attention's backward adding into dq, dk and dv (fp32) while a weight gradient's product still reads them|  if (dq) before_writing(dq, (size_t)B * Lq * D), before_writing(dk, (size_t)B * Lk * D), before_writing(dv, (size_t)B * Lk * D);\n|"
  "the embedding's backward adding into demb before the loss's product has added its part|  wait_for_weight_grads(demb, sizeof(float));  // the loss's product, which adds to all of demb, from its first row\n|"
  "a backward that throws with the weight gradients' products not joined back (the capture ends unjoined; its spans, stale, are waited for after)|        try {\n          gpu::join_weight_grads();\n        } catch (...) {        // (the backward's own error is the one to report,\n          cudaGetLastError();  // and the join's is not left for the next check)\n        }\n|"
  "a capture whose work threw leaving the capture's own error for the next check (a later pass fails on it)|    if (graph) cudaGraphDestroy(graph);\n    cudaGetLastError();  // (the capture's own, left for the next check of a launch, would fail it)\n|    if (graph) cudaGraphDestroy(graph);\n"
)

# plant NAME ORIGINAL MUTATED: in $work/NAME, a copy of transformer.cu's translation unit (its sources and
# headers, in the same folders, so that its includes find the copies) with the bug planted
plant() {
  local dir="$work/$1"
  mkdir -p "$dir"
  python3 - "$2" "$3" "$dir" $sources <<'PY'
import os, shutil, sys
orig, new = (a.encode().decode("unicode_escape") for a in sys.argv[1:3])
out, sources = sys.argv[3], sys.argv[4:]
texts = {path: open(path).read() for path in sources}
if orig:
    n = sum(text.count(orig) for text in texts.values())
    if n != 1:
        print(f"the original text occurs {n} times in the sources, not once: {orig!r}")
        sys.exit(1)
    path = next(path for path in sources if orig in texts[path])
    texts[path] = texts[path].replace(orig, new)
for path, text in texts.items():
    os.makedirs(os.path.join(out, os.path.dirname(path)), exist_ok=True)
    open(os.path.join(out, path), "w").write(text)
PY
}

# build NAME FLAGS...: $work/NAME/parity_gpu from the planted copy, its transformer.cu compiled with FLAGS
build() {
  local dir="$work/$1"
  shift
  $cxx "$@" -x c++ -c "$dir/transformer.cu" -o "$dir/transformer.o" >> "$dir/build.log" 2>&1 &&
    $cxx $flags "$dir/transformer.o" $objs -o "$dir/parity_gpu" $libs >> "$dir/build.log" 2>&1
}

# judge NAME: "caught (ORDER order): why", "caught with AddressSanitizer (ORDER order): why" or "survived"
judge() {
  local result
  build "$1" $mutant_flags && result="$(run "$1")" || return 3
  if [ "$result" = survived ]; then
    build "$1" $mutant_flags $asan_flags && result="$(run "$1")" || return 3
    [ "$result" = survived ] || result="${result/caught/caught with AddressSanitizer}"
  fi
  echo "$result"
}

# run NAME: "caught (ORDER order): why" or "survived"
run() {
  local dir="$work/$1" order
  for order in inorder reverse; do
    local rc=0
    # limits on CPU time, not wall time (ulimit -t: 600 s for the run), so that a run beside other work is not
    # cut short: CI runs the mutants at the lowest priority beside the test suite
    (ulimit -t 600; CHECK_FAIL_FAST=1 OMP_WAIT_POLICY=passive CUDA_EMULATOR_ORDER=$order CUDA_EMULATOR_TIMEOUT=120 \
      exec "$dir/parity_gpu") > "$dir/$order.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
      local why="" pattern
      for pattern in "^FAIL" "^cuda_emulator: kernel" "SUMMARY: " "what\(\)" "runtime error"; do  # the first finding that explains it
        [ -z "$why" ] && why="$(grep -m1 -E "$pattern" "$dir/$order.log" | cut -c1-160)"
      done
      echo "caught ($order order): ${why:-exit $rc}"
      return 0
    fi
  done
  echo "survived"
}

start=$SECONDS
status=0
cores=$(getconf _NPROCESSORS_ONLN)  # the emulated GPU runs a kernel's threads on one core: one job a core
# the control: the unmutated source, built as the mutants are first (without a sanitizer)
(plant control "" "" && build control $mutant_flags && result="$(run control)" || result="NOT BUILT"
 echo "$result" > "$work/control.result") &
running=1
i=0
for m in "${mutants[@]}"; do
  i=$((i + 1))
  IFS='|' read -r name orig new <<< "$m"
  if [ $running -ge "$cores" ]; then wait -n; running=$((running - 1)); fi
  (t0=$SECONDS
   if plant "m$i" "$orig" "$new" > "$work/m$i.plant"; then result="$(judge "m$i")" || result="NOT BUILT"
   else result="NOT PLANTED"; fi
   echo "$result ($((SECONDS - t0)) s)" > "$work/m$i.result") &
  running=$((running + 1))
done
wait
control="$(cat "$work/control.result")"
if [ "$control" != survived ]; then echo "mutants_gpu: the unmutated parity_gpu fails: $control"; exit 2; fi
echo "control (no mutation): parity_gpu passes under inorder and reverse"
if grep -q "caught with AddressSanitizer" "$work"/m*.result; then  # and so must it where a mutant needed the sanitizer
  build control $mutant_flags $asan_flags && control="$(run control)" || control="NOT BUILT"
  if [ "$control" != survived ]; then echo "mutants_gpu: the unmutated parity_gpu fails with AddressSanitizer: $control"; exit 2; fi
  echo "control (no mutation), with AddressSanitizer: parity_gpu passes under inorder and reverse"
fi
i=0
for m in "${mutants[@]}"; do
  i=$((i + 1))
  IFS='|' read -r name orig new <<< "$m"
  result="$(cat "$work/m$i.result")"
  if [[ "$result" == "NOT PLANTED"* ]]; then
    result="NOT PLANTED: $(tr '\n' ' ' < "$work/m$i.plant")"
    status=1
  elif [[ "$result" == "NOT BUILT"* ]]; then
    result="NOT BUILT: $(tail -3 "$work/m$i/build.log" 2>/dev/null | tr '\n' ' ')"
    status=1
  elif [[ "$result" != "caught"* ]]; then  # survived, or no result at all (a job killed)
    status=1
    [ -n "$result" ] || result="NO RESULT"
  fi
  printf '%-80s %s\n' "$name" "$result"
done
echo "mutants_gpu: ${#mutants[@]} mutants, $([ $status -eq 0 ] && echo "all caught" || echo "NOT all caught"), $((SECONDS - start)) s"
exit $status
