#include "backend/cpu/packed_weights.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/cpu/kernel_variant.h"
#include "gguf/ggml_types.h"
#include "gguf/quant_blocks.h"

namespace spw::cpu {
namespace {

// The packed copies of one Model's matrices, keyed by the Model's own
// WeightMatrix (its address is stable for the Model's lifetime).
class PackedWeights final : public ModelExtension {
 public:
  struct Entry {
    std::once_flag once;
    PackedMatrix packed;
  };
  Entry& entry(const WeightMatrix* w) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = entries_[w];
    if (!e) e = std::make_unique<Entry>();
    return *e;
  }

 private:
  std::mutex mu_;
  std::map<const WeightMatrix*, std::unique_ptr<Entry>> entries_;
};

}  // namespace

bool wants_packed(const WeightMatrix& w) {
  return active_kernel_traits().q8_0_x16 && w.layout == WeightLayout::kGguf &&
         packed_layout(w.type, w.n_rows) != WeightLayout::kGguf;
}

namespace {
// Groups [g0, g1) of w into p's buffer.
void pack_groups(const WeightMatrix& w, int64_t g0, int64_t g1, uint8_t* out) {
  const int64_t nb = w.n_cols / 32;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* rows = w.data + static_cast<size_t>(g * kQ8_0x16Rows) * w.row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* rec = out + static_cast<size_t>(g * nb + b) * kQ8_0x16RecordBytes;
      for (int64_t r = 0; r < kQ8_0x16Rows; ++r) {
        const uint8_t* blk =
            rows + static_cast<size_t>(r) * w.row_bytes + static_cast<size_t>(b) * gguf::kQ8_0BlockBytes;
        std::memcpy(rec + kQ8_0x16Scales + 2 * r, blk, 2);  // d
        for (int kq = 0; kq < 8; ++kq) {
          uint32_t q;
          std::memcpy(&q, blk + 2 + 4 * kq, 4);
          q ^= 0x80808080u;  // each signed code + 128, as an unsigned byte
          std::memcpy(rec + (kq * kQ8_0x16Rows + r) * 4, &q, 4);
        }
      }
    }
  }
}

// Groups [g0, g1) of a Q4_K matrix into the kQ4_Kx16 layout.
void pack_groups_q4_k(const WeightMatrix& w, int64_t g0, int64_t g1, uint8_t* out) {
  const int64_t nb = w.n_cols / 256;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* rec = out + static_cast<size_t>(g * nb + b) * kQ4_Kx16RecordBytes;
      for (int64_t r = 0; r < kQ8_0x16Rows; ++r) {
        const auto* blk = reinterpret_cast<const gguf::BlockQ4_K*>(
            w.data + static_cast<size_t>(g * kQ8_0x16Rows + r) * w.row_bytes +
            static_cast<size_t>(b) * sizeof(gguf::BlockQ4_K));
        for (int c = 0; c < 4; ++c)
          for (int kq = 0; kq < 8; ++kq) std::memcpy(rec + ((c * 8 + kq) * 16 + r) * 4, blk->qs + 32 * c + 4 * kq, 4);
        for (int j = 0; j < 8; ++j)
          gguf::unpack_scale_min_k4(blk->scales, j, rec + kQ4_KxScales + 16 * j + r, rec + kQ4_KxMins + 16 * j + r);
        std::memcpy(rec + kQ4_KxD + 2 * r, &blk->d, 2);
        std::memcpy(rec + kQ4_KxDmin + 2 * r, &blk->dmin, 2);
      }
    }
  }
}

void pack_range(const WeightMatrix& w, int64_t g0, int64_t g1, uint8_t* out) {
  if (w.type == gguf::GgmlType::kQ4_K) pack_groups_q4_k(w, g0, g1, out);
  else pack_groups(w, g0, g1, out);
}

PackedMatrix empty_pack(const WeightMatrix& w) {
  const WeightLayout layout = packed_layout(w.type, w.n_rows);
  assert(w.layout == WeightLayout::kGguf && layout != WeightLayout::kGguf);
  PackedMatrix p;
  // Left uninitialised: every byte is written by the packing, and a large
  // allocation's pages then become resident as they are written.
  p.bytes.reset(new uint8_t[layout_bytes(layout, w.n_rows, w.n_cols, w.nbytes())]);
  p.view = w;
  p.view.data = p.bytes.get();
  p.view.layout = layout;
  return p;
}
}  // namespace

PackedMatrix pack(const WeightMatrix& w) {
  PackedMatrix p = empty_pack(w);
  pack_range(w, 0, w.n_rows / kQ8_0x16Rows, p.bytes.get());
  return p;
}

const WeightMatrix& cpu_weights(const Model& model, const WeightMatrix& w) {
  if (!wants_packed(w)) return w;
  auto& packs = static_cast<PackedWeights&>(model.extension(ModelExtensionKey::kCpuPackedWeights, [] {
    return std::make_unique<PackedWeights>();
  }));
  PackedWeights::Entry& e = packs.entry(&w);
  std::call_once(e.once, [&] {
    // One copy of the bytes in the process: the file's pages of this tensor
    // go as their rows are packed (they fault in again for another reader),
    // so packing a resident model raises its RSS by about one chunk, not by
    // the tensor. Best effort: a failed madvise leaves pages resident.
    e.packed = empty_pack(w);
    const int64_t groups = w.n_rows / kQ8_0x16Rows;
    // 256 KiB of rows a chunk: with 1 MiB the in-flight chunks raised the
    // prepare-time peak RSS past the estimator's allowance on a mixture of
    // experts (2.9 MiB over the settled RSS, 2026-12-07; 2.1 MiB at 256 KiB,
    // and 0.9 -> 0.1 MiB on a dense 15M model) for a few more madvise calls.
    const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kPackChunkBytes / (kQ8_0x16Rows * w.row_bytes)));
    for (int64_t g = 0; g < groups; g += chunk) {
      const int64_t g1 = std::min(groups, g + chunk);
      pack_range(w, g, g1, e.packed.bytes.get());
      // This chunk's rows and the previous chunk's: page_out drops whole
      // pages only, so the page a chunk shares with the next goes next time.
      const size_t from = static_cast<size_t>(std::max<int64_t>(0, g - chunk) * kQ8_0x16Rows) * w.row_bytes;
      const size_t to = static_cast<size_t>(g1 * kQ8_0x16Rows) * w.row_bytes;
      (void)model.file().page_out(w.data + from, to - from);
    }
  });
  return e.packed.view;
}

void pack_resident(const Model& model, int32_t layer_begin, int32_t layer_end, bool output) {
  auto pack_if_resident = [&](const WeightMatrix& w) {
    if (wants_packed(w) && model.file().resident(w.data, w.nbytes())) (void)cpu_weights(model, w);
  };
  for (int32_t il = layer_begin; il < layer_end; ++il) {
    model.layer(il).for_each_matrix(pack_if_resident);
  }
  if (output) pack_if_resident(model.output());
}

}  // namespace spw::cpu
