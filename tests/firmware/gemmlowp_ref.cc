// gemmlowp's fixed-point functions, as TFLite's reference kernels call them, from the header
// itself (Debian's libgemmlowp-dev: /usr/include/gemmlowp/fixedpoint/fixedpoint.h). The
// reference that tests/firmware/test_fixedpoint.py holds firmware/fixedpoint.py to, bit for
// bit; tests/firmware/gemmlowp.py builds it and writes the table the test reads.
//
// stdin: one query a line, "exp I x", "recip x", "srdhm a b" or "rdbpot x e" (decimal int32,
// I the input's integer bits, 0 to 10); stdout: the raw int32 answer, a line each.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <gemmlowp/fixedpoint/fixedpoint.h>

using gemmlowp::FixedPoint;

template <int I>
static std::int32_t exp_raw(std::int32_t x) {
  return gemmlowp::exp_on_negative_values(FixedPoint<std::int32_t, I>::FromRaw(x)).raw();
}

static bool exp_any(int bits, std::int32_t x, std::int32_t *out) {
  switch (bits) {
    case 0: *out = exp_raw<0>(x); return true;
    case 1: *out = exp_raw<1>(x); return true;
    case 2: *out = exp_raw<2>(x); return true;
    case 3: *out = exp_raw<3>(x); return true;
    case 4: *out = exp_raw<4>(x); return true;
    case 5: *out = exp_raw<5>(x); return true;
    case 6: *out = exp_raw<6>(x); return true;
    case 7: *out = exp_raw<7>(x); return true;
    case 8: *out = exp_raw<8>(x); return true;
    case 9: *out = exp_raw<9>(x); return true;
    case 10: *out = exp_raw<10>(x); return true;
  }
  return false;
}

int main() {
  char func[16];
  long long x, y;
  while (std::scanf("%15s %lld", func, &x) == 2) {
    std::int32_t out;
    if (!std::strcmp(func, "recip")) {
      out = gemmlowp::one_over_one_plus_x_for_x_in_0_1(
                FixedPoint<std::int32_t, 0>::FromRaw(static_cast<std::int32_t>(x))).raw();
    } else if (std::scanf("%lld", &y) != 1) {
      std::fprintf(stderr, "gemmlowp_ref: '%s' needs two numbers\n", func);
      return 2;
    } else if (!std::strcmp(func, "exp")) {
      if (!exp_any(static_cast<int>(x), static_cast<std::int32_t>(y), &out)) {
        std::fprintf(stderr, "gemmlowp_ref: integer bits %lld; allowed: 0 to 10\n", x);
        return 2;
      }
    } else if (!std::strcmp(func, "srdhm")) {
      out = gemmlowp::SaturatingRoundingDoublingHighMul(static_cast<std::int32_t>(x),
                                                        static_cast<std::int32_t>(y));
    } else if (!std::strcmp(func, "rdbpot")) {
      out = gemmlowp::RoundingDivideByPOT(static_cast<std::int32_t>(x), static_cast<int>(y));
    } else {
      std::fprintf(stderr, "gemmlowp_ref: unknown function '%s'; allowed: exp, recip, "
                   "srdhm, rdbpot\n", func);
      return 2;
    }
    std::printf("%d\n", out);
  }
  return 0;
}
