// Float steps rounded as the CPU rounds them, for the shaders' EXACT_F64
// variants (devices with float64).
//
// fma_rn(a, b, c): fma(a, b, c) rounded once, as the CPU's std::fma and FMA
// instructions are. GLSL's fma() need not be fused (lavapipe lowers it to a
// multiply and an add), so with float64 it is computed: a * b is exact in
// float64 (48 significant bits), s = p + c with its exact error e (TwoSum:
// s + e == p + c), and s rounds to the float nearest p + c unless s lies
// exactly halfway between two floats, where e's sign decides. (float64 add
// and multiply and the conversion to float are correctly rounded, to nearest
// even.) Without float64, fma().
float fma_rn(float a, float b, float c) {
#ifdef EXACT_F64
  precise const double p = double(a) * double(b);
  precise const double s = p + double(c);
  precise const double bb = s - p;
  precise const double e = (p - (s - bb)) + (double(c) - bb);
  const float f = float(s);
  if (e == 0.0LF) return f;
  precise const double df = double(f);
  precise const double g = df + 2.0LF * (s - df);  // s's mirror image about f
  // s is halfway between f and g exactly when g is the float next to f.
  if (g != df && double(float(g)) == g && (e > 0.0LF) == (g > df)) return float(g);
  return f;
#else
  return fma(a, b, c);
#endif
}

#ifdef EXACT_F64
// a / b correctly rounded (GLSL's float division may be off by 2.5 ulp): a
// float64 quotient has more than twice float's precision plus two bits, so
// rounding it to float rounds the exact quotient once.
float div_rn(float a, float b) { return float(double(a) / double(b)); }
#endif

#ifdef EXACT_F64
// backend/cpu's exp steps (attention.cpp's exp_neg, kernels.cpp's swiglu
// exp): 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in two fused
// steps, exp(r) by its Taylor polynomial to r^7 (Horner, fused); 0 below -87.
float exp_steps(float x) {
  const float n = roundEven(x * 1.44269504088896341);
  float r = fma_rn(-n, 0.693359375, x);
  r = fma_rn(-n, -2.12194440e-4, r);
  float p = 1.98412701e-4;
  p = fma_rn(p, r, 1.38888892e-3);
  p = fma_rn(p, r, 8.33333377e-3);
  p = fma_rn(p, r, 4.16666679e-2);
  p = fma_rn(p, r, 1.66666672e-1);
  p = fma_rn(p, r, 0.5);
  p = fma_rn(p, r, 1.0);
  p = fma_rn(p, r, 1.0);
  return p * uintBitsToFloat(uint(int(n) + 127) << 23);
}
float exp_neg(float x) { return !(x >= -87.0) ? 0.0 : exp_steps(x); }
// kernels.cpp's swiglu_exp: also +inf above 88.
float exp_any(float x) { return !(x >= -87.0) ? 0.0 : x > 88.0 ? uintBitsToFloat(0x7f800000u) : exp_steps(x); }
// kernels.cpp's tanh_steps: (1 - e) / (1 + e), e = exp_neg(-2|x|), the sign restored.
float tanh_steps(float x) {
  precise const float e = exp_neg(-2.0 * abs(x));
  const float t = div_rn(1.0 - e, 1.0 + e);
  return x < 0.0 || (x == 0.0 && floatBitsToUint(x) != 0u) ? -t : t;
}
#endif
