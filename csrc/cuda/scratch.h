// Laying out a kernel family's temporaries in the one workspace buffer the
// FFI handler receives (an extra XLA result sized at lowering time): offsets
// are planned on the host first, so the planning and the launch agree.
#pragma once

#include <cstddef>

namespace jax_topk::cuda {

// CUB's temporaries and 16-byte vector accesses need far less; 256 keeps
// every region on its own cache lines.
inline constexpr size_t kScratchAlign = 256;

constexpr size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Bump allocator over the caller's scratch (offsets only; base added later).
struct ScratchCursor {
  size_t used = 0;
  size_t take(size_t bytes) {
    const size_t at = used;
    used += round_up(bytes, kScratchAlign);
    return at;
  }
};

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace jax_topk::cuda
