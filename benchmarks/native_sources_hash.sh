#!/usr/bin/env bash
# The hash of the C++/CUDA sources the compiled modules are built from (run from the repository
# root): a device call reuses prebuilt modules only for the same sources (gpu_session.sh,
# build_prebuilt.sh).
find csrc ffi CMakeLists.txt pyproject.toml -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
