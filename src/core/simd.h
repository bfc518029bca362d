// COLONY_KERNEL: compile a hot loop for SSE2 and AVX2 and pick the variant at load time.
#pragma once

// x86-64's baseline target is SSE2, whose 4-wide vectors leave many loops compute-bound (an
// unsigned max takes five instructions, not one). A function marked COLONY_KERNEL is also
// compiled for AVX2 and the variant is chosen at load time (ifunc). Results are bit-identical:
// the same IEEE operations, and "avx2" does not enable FMA, so nothing is contracted. Not under
// sanitizers, whose runtime may not be initialised when ifunc resolvers run. Not for templates
// (clang cannot multiversion them). The loops themselves must vectorize: restrict pointers,
// no control flow, and -ftree-vectorize (or -O3) for the file.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define COLONY_NO_CLONES 1
#endif
#endif
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(COLONY_NO_CLONES)
#if __has_attribute(target_clones)
#define COLONY_KERNEL __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef COLONY_KERNEL
#define COLONY_KERNEL
#endif
