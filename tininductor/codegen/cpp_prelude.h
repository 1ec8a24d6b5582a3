// tininductor C++ kernel prelude: the few helpers generated kernels call.
// Every kernel includes it first; the code cache precompiles it once (a .gch), so kernels build fast.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef TINY_LIBMVEC
// glibc's vector math library: with these declarations a `#pragma omp simd` loop calling
// std::exp/log/sin/cos/pow calls 4/8/16-lane versions (_ZGVdN8v_expf...) instead of one value
// at a time. cpp_builder defines TINY_LIBMVEC (and links -lmvec) only where a probe works.
extern "C" {
float expf(float) noexcept __attribute__((simd("notinbranch")));
float logf(float) noexcept __attribute__((simd("notinbranch")));
float sinf(float) noexcept __attribute__((simd("notinbranch")));
float cosf(float) noexcept __attribute__((simd("notinbranch")));
float powf(float, float) noexcept __attribute__((simd("notinbranch")));
double exp(double) noexcept __attribute__((simd("notinbranch")));
double log(double) noexcept __attribute__((simd("notinbranch")));
double sin(double) noexcept __attribute__((simd("notinbranch")));
double cos(double) noexcept __attribute__((simd("notinbranch")));
double pow(double, double) noexcept __attribute__((simd("notinbranch")));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
// glibc 2.35 added tanh/erf/expm1/log1p to libmvec: gelu (either form) and sigmoid-like
// chains then vectorise too, instead of one scalar call per element.
float tanhf(float) noexcept __attribute__((simd("notinbranch")));
float erff(float) noexcept __attribute__((simd("notinbranch")));
float expm1f(float) noexcept __attribute__((simd("notinbranch")));
float log1pf(float) noexcept __attribute__((simd("notinbranch")));
double tanh(double) noexcept __attribute__((simd("notinbranch")));
double erf(double) noexcept __attribute__((simd("notinbranch")));
double expm1(double) noexcept __attribute__((simd("notinbranch")));
double log1p(double) noexcept __attribute__((simd("notinbranch")));
#endif
}
#endif

// NaN-propagating max/min, as torch.maximum / amax do (std::max would drop a NaN).
template <typename T> static inline T tiny_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> static inline T tiny_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> static inline T tiny_sign(T a) { return (a > T(0)) - (a < T(0)); }
template <typename T> static inline T tiny_floordiv(T a, T b) {
    T q = a / b;
    return (q * b != a && ((a < T(0)) != (b < T(0)))) ? q - T(1) : q;
}
template <typename T> static inline T tiny_remainder(T a, T b) {
    T r = a % b;
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
}
static inline float tiny_remainder(float a, float b) { float r = std::fmod(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }
static inline double tiny_remainder(double a, double b) { double r = std::fmod(a, b); return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r; }

// OpenMP reductions for the NaN-propagating max/min (usable by `omp simd` and `omp parallel for`).
#pragma omp declare reduction(tiny_max : float : omp_out = tiny_max(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(tiny_max : double : omp_out = tiny_max(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(tiny_max : int64_t : omp_out = tiny_max(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(tiny_min : float : omp_out = tiny_min(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(tiny_min : double : omp_out = tiny_min(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(tiny_min : int64_t : omp_out = tiny_min(omp_out, omp_in)) initializer(omp_priv = omp_orig)

// fp16 / bf16 are stored as 16-bit integers and computed in float: convert at load and store.
static inline float tiny_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);                 // inf / nan
    } else if (exp == 0) {                                        // zero / subnormal: mant * 2^-24
        float f = (float)mant * 5.9604644775390625e-08f;
        std::memcpy(&bits, &f, 4);
        bits |= sign;
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);        // rebias 15 -> 127
    }
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}

static inline uint16_t tiny_float_to_half(float f) {                // round to nearest even
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int32_t exp = (int32_t)((x >> 23) & 0xffu);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);           // overflow -> inf
    if (e <= 0) {                                                 // half subnormal (or zero)
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e), m = mant >> shift, rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;      // a carry may round up to inf: correct
    return (uint16_t)h;
}

static inline float tiny_bfloat16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}

static inline uint16_t tiny_float_to_bfloat16(float f) {            // round to nearest even
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);   // quiet nan
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Bounds check of an indirect index (embedding, gather, index, scatter): a negative index wraps
// by `size` as in eager; one still out of range is recorded here (the first one: flag, value, size)
// and read 0 instead, so the kernel never touches memory outside the tensor. CppKernelRunner
// reads the record after the call and raises IndexError in Python (what eager raises).
extern "C" { int64_t tiny_index_error[3] = {0, 0, 0}; }
static inline int64_t tiny_check_index(int64_t v, int64_t size) {
    int64_t w = v < 0 ? v + size : v;
    if (__builtin_expect(w < 0 || w >= size, 0)) {
        int64_t expected = 0;
        if (__atomic_compare_exchange_n(&tiny_index_error[0], &expected, 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            tiny_index_error[1] = v;
            tiny_index_error[2] = size;
        }
        return 0;
    }
    return w;
}
