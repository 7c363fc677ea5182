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
// The kQ4_Kx16 layout, for Q4_K (the bulk of a Q4_K_M file): per group g and
// super-block b (nb = n_cols / 256) a 2368-byte record at (g * nb + b) * 2368:
//   bytes [0, 2048)    for chunk c < 4, kq < 8, r < 16: the four bytes
//                      qs[32c + 4kq .. +3] of row 16g + r's super-block b
//                      (low nibbles: sub-block 2c's codes 4kq..4kq+3, high
//                      nibbles: sub-block 2c + 1's), as in the file;
//   bytes [2048, 2176) the sub-block scales, sc[j][r] for j < 8 (6-bit,
//                      unpacked from the file's 12 bytes, one byte each);
//   bytes [2176, 2304) the sub-block mins, m[j][r], likewise;
//   bytes [2304, 2336) d[r], [2336, 2368) dmin[r] (fp16).
// 64 bytes more per record than the file's 16 x 144 (the scales and mins
// unpacked once instead of per token): 2.8% of the matrix, which the
// estimator adds (admission::HostKernels::q4_k_x16).
//
// Contract: cpu_weights(model, w) returns w itself, or a view of the same
// values in the layout the chosen kernel variant wants
// (KernelTraits::q8_0_x16: the AVX-512 VNNI variants, for Q8_0 and Q4_K
// matrices of 16k rows), made the first time it is asked for (or by pack_resident,
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

// Record sizes: model.h (kQ8_0x16RecordBytes, kQ4_Kx16RecordBytes).
inline constexpr int64_t kQ8_0x16Rows = kPackedGroupRows;
// Offsets inside a record (the layouts above).
inline constexpr size_t kQ8_0x16Scales = 512;  // d[16]
inline constexpr size_t kQ4_KxScales = 2048;   // sc[8][16]
inline constexpr size_t kQ4_KxMins = 2176;     // m[8][16]
inline constexpr size_t kQ4_KxD = 2304;        // d[16]
inline constexpr size_t kQ4_KxDmin = 2336;     // dmin[16]

// Whether the chosen kernel variant computes `w` from another layout.
bool wants_packed(const WeightMatrix& w);

// A packed copy owned by the caller (tests, the kernel probe): `view` reads
// `bytes`.
struct PackedMatrix {
  std::unique_ptr<uint8_t[]> bytes;
  WeightMatrix view;
};
// w (kGguf) in its packed_layout() (model.h), which must not be kGguf;
// any variant can pack (tests).
PackedMatrix pack(const WeightMatrix& w);

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
