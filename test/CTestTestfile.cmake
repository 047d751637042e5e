# Hand-written CTest file: `make check` runs `ctest --test-dir test --output-on-failure`, `make test` the
# tests labelled quick.
# Test programs are built by the Makefile into build/test/. GPU-only tests exit 77 when no GPU is
# present and carry SKIP_RETURN_CODE 77 and the label gpu. Tests that need Multi30k skip (77) before
# `make data`, with one line saying so. The outside references (PyTorch, sacreBLEU) are in test/golden.
# ctest runs each test in this directory (test/), so paths are relative to it (CTest script mode does
# not define CMAKE_CURRENT_LIST_DIR).
# The test programs: the Makefile's build/test, or the folder $TEST_BIN names (test/aarch64.sh's, whose
# programs start build-aarch64's under qemu-aarch64)
if(DEFINED ENV{TEST_BIN})
  set(BIN "$ENV{TEST_BIN}")
else()
  set(BIN "../build/test")
endif()
set(ROOT "..")
add_test(gradcheck "${BIN}/gradcheck")
add_test(gemm "${BIN}/gemm")
add_test(fastexp "${BIN}/fastexp")
add_test(model_golden "${BIN}/model_golden" "${ROOT}/test/golden/model/tiny_postln.txt" "${ROOT}/test/golden/model/tiny_preln.txt")
add_test(paper_values "${BIN}/paper_values")
add_test(notes_refs bash "${ROOT}/test/notes_refs.sh" "${ROOT}")
add_test(decoding "${BIN}/decoding")
add_test(bpe "${BIN}/bpe")
add_test(bpe_multi30k "${BIN}/bpe" --multi30k "${ROOT}/data/multi30k")
set_tests_properties(bpe_multi30k PROPERTIES SKIP_RETURN_CODE 77)
add_test(bleu_golden "${BIN}/bleu_golden" "${ROOT}/test/golden/bleu")
add_test(numbers "${BIN}/numbers")
add_test(data_sha256 bash "${ROOT}/test/data_sha256.sh" "${ROOT}")
add_test(checkpoint "${BIN}/checkpoint" "${ROOT}/test/fuzz/corpus/checkpoint")
add_test(train_cli bash "${ROOT}/test/train_cli.sh" "${ROOT}")
add_test(translate_cli bash "${ROOT}/test/translate_cli.sh" "${ROOT}")
add_test(crash_safety bash "${ROOT}/test/crash_safety.sh" "${ROOT}" 60)
add_test(accumulate "${BIN}/accumulate")
add_test(step_alloc "${BIN}/step_alloc")
add_test(data_parallel bash "${ROOT}/test/data_parallel.sh" "${ROOT}")
set_tests_properties(data_parallel PROPERTIES SKIP_RETURN_CODE 77)
# The course grader on the solution: markers and sheets valid, every check passes, hidden example included
# (course/ci.sh, run by .ci/run, checks handouts and planted wrong answers).
add_test(course bash -c "cd ${ROOT} && python3 course/handout.py --check && python3 course/grade.py --expect-full --results build/grade/course/results.json && python3 course/grade.py --expect-full --hidden course/hidden-example --results build/grade/course/results-hidden.json")
add_test(parity_gpu "${BIN}/parity_gpu")
set(EMU "../build/emu/test")
add_test(cuda_emulator "${EMU}/cuda_emulator")
add_test(parity_gpu_emulated "${EMU}/parity_gpu")
add_test(parity_gpu_emulated_reverse "${EMU}/parity_gpu")
add_test(parity_gpu_emulated_shuffle "${EMU}/parity_gpu")
set_tests_properties(cuda_emulator parity_gpu_emulated PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;CUDA_EMULATOR_ORDER=inorder" LABELS emulated)
set_tests_properties(parity_gpu_emulated_reverse PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;CUDA_EMULATOR_ORDER=reverse" LABELS emulated)
add_test(gpu_counts bash "${ROOT}/test/gpu_counts.sh" "${ROOT}")
set_tests_properties(gpu_counts PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive" LABELS emulated)
add_test(loss_reads bash "${ROOT}/test/loss_reads.sh" "${ROOT}")
set_tests_properties(loss_reads PROPERTIES LABELS emulated)
set_tests_properties(parity_gpu_emulated_shuffle PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;CUDA_EMULATOR_ORDER=shuffle;CUDA_EMULATOR_SEED=7" LABELS emulated)
add_test(sanitize_gpu bash "${ROOT}/test/sanitize_gpu.sh" "${BIN}")
add_test(bf16_numbers bash "${ROOT}/test/bf16_numbers.sh" "${ROOT}")
set_tests_properties(parity_gpu sanitize_gpu bf16_numbers PROPERTIES SKIP_RETURN_CODE 77 LABELS gpu)
add_test(bf16_numbers_emulated bash "${ROOT}/test/bf16_numbers.sh" "${ROOT}" "${ROOT}/build/grade/train")
set_tests_properties(bf16_numbers_emulated PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive" LABELS emulated SKIP_RETURN_CODE 77)
# The quick suite (`make test`, `ctest -L quick`): every kind of check at a small size. The GPU path's
# parity test there runs on build/grade's emulated GPU (optimised, no sanitizers: make check's three
# orders run build/emu's, sanitized), and the crash test kills ./train 6 times, not 60.
add_test(parity_gpu_quick "../build/grade/test/parity_gpu")
set_tests_properties(parity_gpu_quick PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;CUDA_EMULATOR_ORDER=inorder" LABELS "quick;emulated")
add_test(crash_safety_quick bash "${ROOT}/test/crash_safety.sh" "${ROOT}" 6)
set_tests_properties(gradcheck gemm fastexp model_golden paper_values notes_refs decoding bpe bpe_multi30k bleu_golden
                     numbers data_sha256 checkpoint train_cli translate_cli crash_safety_quick accumulate step_alloc course
                     PROPERTIES LABELS quick)
# What each long test costs (seconds, plain build, 2-core CI machine), so that `ctest -j` starts the longest
# first and the short ones fill in beside them.
set_tests_properties(bf16_numbers_emulated PROPERTIES COST 912)
set_tests_properties(data_parallel PROPERTIES COST 120)
set_tests_properties(loss_reads PROPERTIES COST 70)
set_tests_properties(parity_gpu_emulated_shuffle PROPERTIES COST 66)
set_tests_properties(train_cli PROPERTIES COST 64)
set_tests_properties(crash_safety PROPERTIES COST 48)
set_tests_properties(translate_cli PROPERTIES COST 44)
set_tests_properties(parity_gpu_emulated_reverse PROPERTIES COST 43)
set_tests_properties(parity_gpu_emulated PROPERTIES COST 40)
set_tests_properties(parity_gpu_quick PROPERTIES COST 10)
set_tests_properties(gpu_counts PROPERTIES COST 30)
