// Non-temporal stores: large results that are not read again soon, written past the caches.
// A normal store first reads each destination cache line (read-for-ownership) and evicts hotter
// data; these do neither. For received tensors: a decoded all-reduce result, for example.
#pragma once

#include <cstddef>

namespace colony {

// Data of at least this many bytes (more than most cores' L2 cache) is not in cache anyway when
// it is read next, so writing it past the caches costs its reader nothing.
inline constexpr size_t kStreamMinBytes = size_t{4} << 20;

// Copies n bytes from src to dst, bypassing the caches for dst on x86-64 (memcpy elsewhere).
// The stores are weakly ordered: call StreamFence before another thread may read dst.
void StreamStore(void* dst, const void* src, size_t n);

// Orders the calling thread's earlier StreamStores before its later stores.
void StreamFence();

}  // namespace colony
