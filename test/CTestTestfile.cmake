# Hand-written CTest file: `make test` runs `ctest --test-dir test --output-on-failure`.
# Test programs are built by the Makefile into build/test/. GPU-only tests exit 77 when no GPU is
# present and carry SKIP_RETURN_CODE 77 and the label gpu. Tests that need Multi30k skip (77) without it.
set(BIN "${CMAKE_CURRENT_LIST_DIR}/../build/test")
set(ROOT "${CMAKE_CURRENT_LIST_DIR}/..")
add_test(gradcheck "${BIN}/gradcheck")
add_test(model_golden "${BIN}/model_golden" "${ROOT}/../shared/golden/model/tiny_postln.txt" "${ROOT}/../shared/golden/model/tiny_preln.txt")
set_tests_properties(model_golden PROPERTIES SKIP_RETURN_CODE 77)
