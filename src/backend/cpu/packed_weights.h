// The CPU kernels' repacked weight layouts, made once per Model on first use.
//
// Why: a Q8_0 row is 34-byte blocks, each a scale and 32 codes. A one-token
// matvec over that layout reduces every (row, block) product across SIMD
// lanes, and on an AVX-512 VNNI CPU that reduction, not memory, bounded the
// decode (perf: 90% of a 110M Q8_0 decode in the matvec at 68 tok/s, below
// the F16 model's bandwidth per byte). WeightLayout::kQ8_0x16 interleaves
// 16 rows so that one vpdpbusd multiplies four codes of each of the 16 rows
// by four broadcast activation codes and sums them per row: no reduction at
// all, and the same tile is AMX's B operand (VNNI-ordered) as it stands.
//
// The kQ8_0x16 layout: rows in groups of 16 (n_rows a multiple of 16), per
// group g and block b (nb = n_cols / 32) a 544-byte record at
// (g * nb + b) * 544:
//   bytes [0, 512)   for kq < 8, r < 16: the four codes 4kq..4kq+3 of row
//                    16g + r's block b, each + 128 as an unsigned byte
//                    (vpdpbusd and AMX's tdpbsud take the weights unsigned,
//                    the activations signed: the sum is then
//                    sum(w * x) + 128 * sum(x), and 128 * sum(x) is one
//                    number per (token, block) the kernels subtract);
//   bytes [512, 544) the 16 rows' fp16 scales d.
// The record holds exactly the 16 rows' block bytes (16 x 34), so a packed
// matrix is exactly nbytes() of the file's.
//
// Contract: cpu_weights(model, w) returns w itself, or a view of the same
// values in the layout the chosen kernel variant wants
// (KernelTraits::q8_0_x16: the AVX-512 VNNI variants, for Q8_0 matrices of
// 16k rows), made the first time it is asked for (or by pack_resident,
// when the backend is prepared) and kept in the Model's
// extension for the Model's lifetime, shared by every session and backend
// using it. Once a matrix is packed its mapping's pages are dropped
// (GgufFile::page_out of the tensor's range), so the process holds one copy
// of the bytes as before, and a mapped replica (--replica mmap) still
// becomes resident on first use rather than at start; a later reader of
// the file layout (a Vulkan upload) faults the pages in again. The results
// do not depend on the layout: matmul over a packed view is bitwise matmul
// over the file layout in the same variant (kernels_test).
// Thread safety: concurrent first uses of a matrix pack it once (the others
// wait for it); views stay valid while the Model lives.
#pragma once

#include <cstdint>
#include <memory>

#include "model/model.h"

namespace spw::cpu {

inline constexpr int64_t kQ8_0x16Rows = 16;
inline constexpr size_t kQ8_0x16RecordBytes = 544;

// Whether the chosen kernel variant computes `w` from another layout.
bool wants_packed(const WeightMatrix& w);

// A packed copy owned by the caller (tests, the kernel probe): `view` reads
// `bytes`.
struct PackedMatrix {
  std::unique_ptr<uint8_t[]> bytes;
  WeightMatrix view;
};
// w (kGguf Q8_0, n_rows % 16 == 0) in the kQ8_0x16 layout.
PackedMatrix pack_q8_0x16(const WeightMatrix& w);

// The view of `w` (a matrix of `model`) the chosen variant computes from:
// w itself, or its packed copy (made now if it is the first use).
const WeightMatrix& cpu_weights(const Model& model, const WeightMatrix& w);

// Packs now the matrices of layers [layer_begin, layer_end) (and the output
// head when `output`) that the variant wants packed and whose file pages are
// all in memory (a prefaulted or paged-in model: CpuBackend::prepare). That
// costs no memory the process did not hold already, and the first request
// does not pay for it; the others (a --replica mmap model) pack on first use.
void pack_resident(const Model& model, int32_t layer_begin, int32_t layer_end, bool output);

}  // namespace spw::cpu
