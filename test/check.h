// Shared by every test program: counts checks, keeps the worst error next to its tolerance, and turns
// any failure into a non-zero exit. A test that checks nothing fails too.
// CHECK_FAIL_FAST=1 in the environment ends the program at its first failed check (exit 1): the mutation
// check (test/mutants_gpu.sh) needs one finding per mutant, not the rest of the run.
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

struct Checker {
  std::string name;
  long checks = 0, failures = 0;
  double worst_rel = 0, worst_tol = 0;  // the largest relative error seen and the tolerance it had
  std::string worst_what;
  std::string first_failure;  // the message of the first failed check

  explicit Checker(std::string n) : name(std::move(n)) {}

  static bool fail_fast() {
    static const bool on = [] {
      const char* v = std::getenv("CHECK_FAIL_FAST");
      return v && *v && std::string(v) != "0";
    }();
    return on;
  }

  // A yes/no property; `fmt` describes it and is printed on failure.
  bool expect(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    ++checks;
    if (!ok) {
      ++failures;
      char msg[512];
      va_list ap;
      va_start(ap, fmt);
      std::vsnprintf(msg, sizeof msg, fmt, ap);
      va_end(ap);
      std::fflush(stdout);  // a log of both streams then has this line whole, after what came before
      std::fprintf(stderr, "FAIL %s: %s\n", name.c_str(), msg);
      if (first_failure.empty()) first_failure = msg;
      if (fail_fast()) {
        std::fflush(nullptr);
        std::_Exit(1);
      }
    }
    return ok;
  }

  // |got - want| <= max(rtol * |want|, atol); the relative error |got - want| / max(|want|, atol / rtol)
  // is what gets reported.
  bool close(double got, double want, double rtol, double atol, const char* what) {
    double err = std::fabs(got - want);
    double scale = std::fmax(std::fabs(want), atol / rtol);
    double rel = std::isfinite(err) ? err / scale : INFINITY;
    if (worst_what.empty() || !(rel <= worst_rel)) {
      worst_rel = rel;
      worst_tol = rtol;
      worst_what = what;
    }
    return expect(rel <= rtol, "%s: got %.17g want %.17g (rel err %.3g > tol %.3g, abs floor %.3g)",
                  what, got, want, rel, rtol, atol);
  }

  // Prints the summary line and returns the process exit status.
  int finish() const {
    if (checks == 0) {
      std::printf("%s: no checks ran\n", name.c_str());
      return 1;
    }
    std::printf("%s: %ld checks, max rel err %.3g (tol %.3g, at %s), %ld failed\n", name.c_str(), checks, worst_rel,
                worst_tol, worst_what.empty() ? "-" : worst_what.c_str(), failures);
    return failures ? 1 : 0;
  }
};
