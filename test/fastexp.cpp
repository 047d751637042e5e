// fastexp: cpu::exp_shifted (fastexp.h, the vectorised exp of the float log-softmax) against exp in double
// over floats in steps across [-110, 88] (normal results, subnormal ones and zeros), at the special
// values (-inf, NaN) and past overflow (up to +inf: inf), for row lengths that leave a partial vector, in place; then cpu::log_softmax<float>
// against the double one on vocabulary-sized rows. Error measure: |got - exp| / max(exp, 2^-126), within
// 2^-21 (8 ulp; the Taylor series' rest is below 2^-27, the rest is float rounding in Horner's scheme).
// The check itself is shown to reject a result off by four times that.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "../fastexp.h"
#include "../transformer.h"
#include "check.h"

static const double kTol = std::ldexp(1.0, -21), kFloor = std::ldexp(1.0, -126);

// exp_shifted over z (shift 0), checked element by element; `off` times the tolerance is added to one
// result before the check (0 for the real test).
static void check_row(Checker& chk, const std::vector<float>& z, double off, bool in_place) {
  std::vector<float> out(z.size() + 1, 7.0f);  // one element past the row, which must stay as it is
  if (in_place) std::copy(z.begin(), z.end(), out.begin());
  cpu::exp_shifted(out.data(), in_place ? out.data() : z.data(), 0.0f, (int)z.size());
  if (!z.empty()) out[z.size() / 2] += (float)(off * kTol * std::fmax(std::exp((double)z[z.size() / 2]), kFloor));
  for (size_t i = 0; i < z.size(); ++i) {
    char what[64];
    std::snprintf(what, sizeof what, "exp(%.9g), n=%zu%s", z[i], z.size(), in_place ? " in place" : "");
    const double want = std::exp((double)z[i]);
    if (std::isnan(z[i])) chk.expect(std::isnan(out[i]), "%s: got %g, want NaN", what, out[i]);
    else if ((float)want == std::numeric_limits<float>::infinity())  // overflows in float
      chk.expect(out[i] == std::numeric_limits<float>::infinity(), "%s: got %g, want inf", what, out[i]);
    else chk.close(out[i], want, kTol, kTol * kFloor, what);
  }
  chk.expect(out[z.size()] == 7.0f, "n=%zu: wrote past the row", z.size());
}

int main() {
  Checker chk("fastexp");
  std::printf("fastexp: the form run: %s\n", cpu::exp_shifted_form());
  std::vector<float> sweep;
  for (double x = -110; x <= 88; x += 0.0013) sweep.push_back((float)x);
  for (float x : {0.0f, -0.0f, -1e-30f, -87.33654f, -103.97f, -104.0f, -150.0f, -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 88.7f, 88.73f, 89.5f, 1e10f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity()})
    sweep.push_back(x);
  check_row(chk, sweep, 0.0, false);
  check_row(chk, sweep, 0.0, true);
  for (int n = 0; n <= 33; ++n) check_row(chk, std::vector<float>(sweep.begin() + 1000 * n, sweep.begin() + 1000 * n + n), 0.0, false);

  // the log-softmax of rows of V = 8360 (a partial vector at the end), in place, against double
  const int M = 3, V = 8360;
  std::vector<float> z((size_t)M * V);
  std::vector<double> zd(z.size()), want(z.size());
  uint64_t s = 42;
  for (size_t i = 0; i < z.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    z[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 40 - 30), zd[i] = z[i];
  }
  cpu::log_softmax(want.data(), zd.data(), M, V);
  cpu::log_softmax(z.data(), z.data(), M, V);
  for (size_t i = 0; i < z.size(); ++i) chk.close(z[i], want[i], 1e-6, 1e-6, "log_softmax<float> against <double>");

  // the check rejects an exp off by four times its tolerance
  Checker must_fail("fastexp, a deliberately wrong result (this FAIL line is expected)");
  check_row(must_fail, std::vector<float>(sweep.begin(), sweep.begin() + 40), 4.0, false);
  chk.expect(must_fail.failures == 1, "a result off by 4x the tolerance was not rejected (failures %ld)", must_fail.failures);
  return chk.finish();
}
