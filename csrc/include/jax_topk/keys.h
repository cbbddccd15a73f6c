// Order-preserving keys: the heart of the order contract (DESIGN section 1).
//
// `ordered_key<Kind>(bits)` maps the raw bits of an element to an unsigned
// integer of the same width such that comparing keys as unsigned integers is
// the IEEE-754 total order for floats (-NaN < -inf < ... < -0 < +0 < ... <
// +inf < +NaN) and the ordinary order for integers. Ties are broken by lower
// index first, so "better" for a descending top-k means (larger key, smaller
// index). Usable from host and device code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "jax_topk/dtypes.h"
#include "jax_topk/gpu_compat.h"

namespace jax_topk {

template <typename U>
inline constexpr U kSignBit = U(U(1) << (sizeof(U) * 8 - 1));

template <KeyKind Kind, typename U>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE U ordered_key(U bits) {
  static_assert(std::is_unsigned_v<U>, "keys are built from raw unsigned bits");
  if constexpr (Kind == KeyKind::kFloat) {
    // Negative floats: flip every bit (larger magnitude -> smaller key).
    // Positive floats: set the sign bit (they rank above every negative one).
    const U negative = U(0) - U(bits >> (sizeof(U) * 8 - 1));  // all ones iff sign set
    return bits ^ U(negative | kSignBit<U>);
  } else if constexpr (Kind == KeyKind::kSigned) {
    return bits ^ kSignBit<U>;
  } else {
    return bits;
  }
}

// The inverse of ordered_key: recovers the exact bits (keys are a bijection).
template <KeyKind Kind, typename U>
JAX_TOPK_HOST_DEVICE JAX_TOPK_FORCE_INLINE U bits_from_key(U key) {
  if constexpr (Kind == KeyKind::kFloat) {
    const U was_positive = U(0) - U(key >> (sizeof(U) * 8 - 1));  // all ones iff key sign set
    return key ^ U(~was_positive | kSignBit<U>);
  } else if constexpr (Kind == KeyKind::kSigned) {
    return key ^ kSignBit<U>;
  } else {
    return key;
  }
}

}  // namespace jax_topk
