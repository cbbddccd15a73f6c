// The one list of FFI targets this library registers. Each row: the op family
// (the key Python looks up), the XLA custom-call target name (the same on every
// platform), and the stem of the handler symbols (`<stem>Cpu`, `<stem>Cuda`).
#pragma once

#define JAX_TOPK_FOR_EACH_TARGET(X) X(top_k, "jax_topk_top_k", JaxTopkTopK)
