// VulkanBackend (vulkan_backend.h): the device's setup and teardown, the
// weights' upload (prepare) and the Backend calls around the device: KV pools,
// health, reinitialisation. The other parts: vulkan_backend_internal.h.
#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/vulkan/vulkan_backend_internal.h"

namespace spw {

bool vulkan_built_in() { return true; }

namespace {

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return std::string(b, 8);
}

}  // namespace

// ------------------------------------------------------------------ Impl: the device

Status VulkanBackend::Impl::init() {
  SPW_ASSIGN_OR_RETURN(ctx, VulkanContext::create(opts, &faults));
  publish(ctx);
  info = ctx->info();
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kPoolSets * kMaxBindings};
  VkDescriptorPoolCreateInfo pci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pci.maxSets = kPoolSets;
  pci.poolSizeCount = 1;
  pci.pPoolSizes = &ps;
  return ctx->check(vkCreateDescriptorPool(ctx->device(), &pci, nullptr, &dpool), "vkCreateDescriptorPool");
}

void VulkanBackend::Impl::teardown() {
  if (!ctx) return;
  publish(nullptr);
  ctx->wait_idle();
  if (ctx->in_flight()) {
    // The GPU never finished: keep every object alive (leaked with the
    // abandoned context) rather than free memory it may still use.
    for (auto& [m, w] : models) keep_forever(std::shared_ptr<ModelWeights>(w.release()));
    models.clear();
    keep_forever(std::make_shared<Scratch>(std::move(scratch)));
    keep_forever(std::make_shared<DeviceBuffer>(std::move(staging)));
    for (auto& [n, p] : pipes) {
      keep_forever_vk(p.pipe);
      keep_forever_vk(p.layout);
      keep_forever_vk(p.dsl);
      keep_forever_vk(p.module);
    }
    pipes.clear();
    keep_forever_vk(dpool);
    dpool = VK_NULL_HANDLE;
    ctx.reset();
    return;
  }
  models.clear();
  scratch = Scratch();
  staging.reset();
  VkDevice dev = ctx->device();
  for (auto& [n, p] : pipes) {
    if (p.pipe) vkDestroyPipeline(dev, p.pipe, nullptr);
    if (p.layout) vkDestroyPipelineLayout(dev, p.layout, nullptr);
    if (p.dsl) vkDestroyDescriptorSetLayout(dev, p.dsl, nullptr);
    if (p.module) vkDestroyShaderModule(dev, p.module, nullptr);
  }
  pipes.clear();
  if (dpool) vkDestroyDescriptorPool(dev, dpool, nullptr);
  dpool = VK_NULL_HANDLE;
  ctx.reset();
}

// ------------------------------------------------------------------ Impl: uploads

Status VulkanBackend::Impl::upload(DeviceBuffer& dst, const void* src, uint64_t bytes) {
  const uint64_t chunk = std::min<uint64_t>(kStagingBytes, ctx->max_buffer_bytes());
  if (!staging.valid() || staging.size() < std::min(bytes, chunk)) {
    staging.reset();
    SPW_ASSIGN_OR_RETURN(staging, alloc(std::min(bytes, chunk), MemoryCategory::kStaging, "staging", true));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t off = 0; off < bytes; off += staging.size()) {
    const uint64_t n = std::min<uint64_t>(staging.size(), bytes - off);
    std::memcpy(staging.mapped(), s + off, n);
    Recorder rec(*this);
    rec.copy(staging.buffer(), dst.buffer(), (n + 3) & ~uint64_t{3}, 0, off);
    SPW_RETURN_IF_ERROR(rec.finish());
  }
  return Status();
}

Status VulkanBackend::Impl::upload_matrix(const WeightMatrix& w, const std::string& owner, DevMatrix& out) {
  // prepare() checks first; this guards other callers (op_matmul).
  SPW_RETURN_IF_ERROR(vulkan_check_weight_type(w));
  if (w.type == gguf::GgmlType::kF16 && w.n_cols % 2 != 0)
    return Status::invalid_argument("vulkan: F16 matrix with an odd row length");
  out.type = w.type;
  out.n_rows = w.n_rows;
  out.n_cols = w.n_cols;
  out.row_bytes = w.row_bytes;
  out.chunks.clear();
  const uint64_t maxb = ctx->weight_chunk_bytes();
  const int64_t rows_per = static_cast<int64_t>(maxb / w.row_bytes);
  if (rows_per < 1) return Status::invalid_argument("vulkan: one row of " + (w.name ? *w.name : std::string("?")) +
                                                    " exceeds the largest buffer");
  for (int64_t r0 = 0; r0 < w.n_rows; r0 += rows_per) {
    DevChunk c;
    c.row0 = r0;
    c.n_rows = std::min(rows_per, w.n_rows - r0);
    const uint64_t bytes = static_cast<uint64_t>(c.n_rows) * w.row_bytes;
    SPW_ASSIGN_OR_RETURN(c.buf, alloc(bytes, MemoryCategory::kWeights, owner));
    SPW_RETURN_IF_ERROR(upload(c.buf, w.data + static_cast<size_t>(r0) * w.row_bytes, bytes));
    out.chunks.push_back(std::move(c));
  }
  return Status();
}

Status VulkanBackend::Impl::upload_vector(const std::vector<float>& v, const std::string& owner, DeviceBuffer& out) {
  SPW_ASSIGN_OR_RETURN(out, alloc(v.size() * sizeof(float), MemoryCategory::kWeights, owner));
  return upload(out, v.data(), v.size() * sizeof(float));
}

Status VulkanBackend::Impl::upload_experts(const MoeWeights& w, const std::string& owner, DevLayer& d) {
  SPW_RETURN_IF_ERROR(upload_matrix(w.router, owner, d.moe_router));
  const size_t n = w.gate.size();
  d.e_gate.resize(n);
  d.e_up.resize(n);
  d.e_down.resize(n);
  for (size_t e = 0; e < n; ++e) {
    SPW_RETURN_IF_ERROR(upload_matrix(w.gate[e], owner, d.e_gate[e]));
    SPW_RETURN_IF_ERROR(upload_matrix(w.up[e], owner, d.e_up[e]));
    SPW_RETURN_IF_ERROR(upload_matrix(w.down[e], owner, d.e_down[e]));
  }
  if (w.shared_gate.n_rows == 0) return Status();
  SPW_RETURN_IF_ERROR(upload_matrix(w.shared_gate, owner, d.s_gate));
  SPW_RETURN_IF_ERROR(upload_matrix(w.shared_up, owner, d.s_up));
  SPW_RETURN_IF_ERROR(upload_matrix(w.shared_down, owner, d.s_down));
  // The shared expert's gate vector as a one-row F32 matrix: its logit is
  // one more matmul output.
  WeightMatrix gate_row;
  gate_row.data = reinterpret_cast<const uint8_t*>(w.shared_router.data());
  gate_row.type = gguf::GgmlType::kF32;
  gate_row.n_cols = static_cast<int64_t>(w.shared_router.size());
  gate_row.n_rows = 1;
  gate_row.row_bytes = w.shared_router.size() * sizeof(float);
  gate_row.name = w.shared_gate.name;
  return upload_matrix(gate_row, owner, d.s_router);
}

Result<ModelWeights*> VulkanBackend::Impl::weights(const Model& model) {
  auto it = models.find(&model);
  if (it == models.end() || it->second->fingerprint != model.fingerprint_hash())
    return Status::failed_precondition("model not prepared on " + name() + " (call prepare)");
  return it->second.get();
}

Status VulkanBackend::Impl::prepare(const Model& model, int32_t lb, int32_t le, bool output) {
  const auto& hp = model.hparams();
  if (lb < 0 || le > hp.n_layer || lb > le)
    return Status::invalid_argument(name() + ": bad layer range [" + std::to_string(lb) + ", " + std::to_string(le) +
                                    ")");
  SPW_RETURN_IF_ERROR(healthy_or_error());
  // Refuse types without shaders before anything is allocated or uploaded.
  SPW_RETURN_IF_ERROR(vulkan_check_weight_types(model, lb, le, output));
  auto& slot = models[&model];
  if (slot && slot->fingerprint != model.fingerprint_hash()) slot.reset();  // a different model at the same address
  const bool created = !slot;
  if (!slot) {
    slot = std::make_unique<ModelWeights>();
    slot->fingerprint = model.fingerprint_hash();
    slot->owner = "model:" + hex64(model.fingerprint_hash());
    slot->layers.resize(static_cast<size_t>(hp.n_layer));
  }
  ModelWeights& mw = *slot;
  // All-or-nothing per call: build into temporaries, commit on success.
  std::vector<std::pair<int32_t, DevLayer>> fresh;
  std::unique_ptr<DevMatrix> out;
  DeviceBuffer out_norm;
  Status st;
  for (int32_t il = lb; st.ok() && il < le; ++il) {
    if (mw.layers[static_cast<size_t>(il)].present) continue;
    const LlamaLayerWeights& L = model.layer(il);
    DevLayer d;
    st = upload_vector(L.attn_norm, mw.owner, d.attn_norm);
    if (st.ok()) st = upload_vector(L.ffn_norm, mw.owner, d.ffn_norm);
    const std::pair<const std::vector<float>*, DeviceBuffer*> optional[] = {
        {&L.bq, &d.bq},         {&L.bk, &d.bk},         {&L.bv, &d.bv},
        {&L.q_norm, &d.q_norm}, {&L.k_norm, &d.k_norm}, {&L.post_attn_norm, &d.post_attn_norm},
        {&L.post_ffn_norm, &d.post_ffn_norm}};
    for (const auto& [v, buf] : optional)
      if (st.ok() && !v->empty()) st = upload_vector(*v, mw.owner, *buf);
    const std::pair<const WeightMatrix*, DevMatrix*> mats[] = {
        {&L.wq, &d.wq},       {&L.wk, &d.wk},   {&L.wv, &d.wv},      {&L.wo, &d.wo},
        {&L.w_gate, &d.gate}, {&L.w_up, &d.up}, {&L.w_down, &d.down}};
    // A mixture of experts: its dense gate/up/down are empty; the router and
    // experts are uploaded, or stay on the host (vulkan_backend.h).
    d.host_experts = L.is_moe() && experts_on_host(model, il);
    const size_t n_mats = L.is_moe() ? 4 : std::size(mats);
    for (size_t i = 0; st.ok() && i < n_mats; ++i) st = upload_matrix(*mats[i].first, mw.owner, *mats[i].second);
    if (st.ok() && L.is_moe() && !d.host_experts) st = upload_experts(L.moe, mw.owner, d);
    if (st.ok() && d.host_experts && !host_pool)
      host_pool = std::make_unique<ThreadPool>(std::max(1, opts.host_threads));
    d.present = true;
    fresh.emplace_back(il, std::move(d));
  }
  // The embedding runs on the host (embed): nothing of it is uploaded. A
  // tied head is token_embd's rows (Model::output()).
  if (st.ok() && output && !mw.output) {
    out = std::make_unique<DevMatrix>();
    st = upload_matrix(model.output(), mw.owner, *out);
    if (st.ok()) st = upload_vector(model.output_norm(), mw.owner, out_norm);
  }
  staging.reset();  // bounded, but not kept between prepares
  if (!st.ok()) {
    if (created) models.erase(&model);
    return st;
  }
  for (auto& [il, d] : fresh) mw.layers[static_cast<size_t>(il)] = std::move(d);
  if (out) {
    mw.output = std::move(out);
    mw.output_norm = std::move(out_norm);
  }
  return Status();
}

// ------------------------------------------------------------------ VulkanBackend

VulkanBackend::VulkanBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VulkanBackend::~VulkanBackend() = default;

Result<std::shared_ptr<VulkanBackend>> VulkanBackend::create(const VulkanBackendOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  SPW_RETURN_IF_ERROR(impl->init());
  return std::shared_ptr<VulkanBackend>(new VulkanBackend(std::move(impl)));
}

std::string VulkanBackend::name() const { return impl_->name(); }
const VulkanDeviceInfo& VulkanBackend::device_info() const { return impl_->info; }
const VulkanBackendOptions& VulkanBackend::options() const { return impl_->opts; }
FaultInjector& VulkanBackend::faults() { return impl_->faults; }

// These three never take the queue (impl_->mu): the allocator and the
// context's health have locks of their own, held for microseconds.
DeviceMemoryStats VulkanBackend::memory_stats() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  return c ? c->allocator().stats() : DeviceMemoryStats{};
}

VulkanWorkCounts VulkanBackend::work_counts() const {
  return {impl_->n_submissions.load(std::memory_order_relaxed), impl_->n_dispatches.load(std::memory_order_relaxed)};
}

bool VulkanBackend::healthy() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  return c && c->healthy();
}

std::string VulkanBackend::health_reason() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  if (!c) return "not initialised";
  return c->healthy() ? std::string() : c->health_reason();
}

Status VulkanBackend::reinitialize() {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  impl_->teardown();
  return impl_->init();
}

void VulkanBackend::release_model(const Model& model) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  if (impl_->ctx) impl_->ctx->wait_idle();
  impl_->models.erase(&model);
}

Status VulkanBackend::set_cpu_experts(const Model& model, bool on_host, int32_t first_layers) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  const auto host = [&](int32_t il) { return on_host && (first_layers <= 0 || il < first_layers); };
  const auto it = impl_->models.find(&model);
  if (it != impl_->models.end() && it->second->fingerprint == model.fingerprint_hash()) {
    for (int32_t il = 0; il < model.hparams().n_layer; ++il) {
      const DevLayer& d = it->second->layers[static_cast<size_t>(il)];
      if (d.present && model.layer(il).is_moe() && d.host_experts != host(il))
        return Status::failed_precondition(name() + ": layer " + std::to_string(il) + "'s experts are already " +
                                           (d.host_experts ? "on the host" : "on the device") +
                                           " (release_model first)");
    }
  }
  if (on_host) {
    impl_->cpu_experts[&model] = {model.fingerprint_hash(), first_layers};
  } else {
    impl_->cpu_experts.erase(&model);
  }
  return Status();
}

Status VulkanBackend::prepare(const Model& model, int32_t lb, int32_t le, bool embedding, bool output) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  return impl_->prepare(model, lb, le, output);  // the embedding is the host's (embed)
}

Result<std::shared_ptr<KvPool>> VulkanBackend::create_kv_pool(const KvPoolOptions& o, const std::string& owner) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  SPW_RETURN_IF_ERROR(impl_->healthy_or_error());
  if (o.layer_end <= o.layer_begin || o.n_blocks <= 0 || o.block_tokens <= 0 || o.n_embd_kv <= 0)
    return KvPool::create_on_device(o, nullptr).status();  // the pool's own option errors
  // F16 rows are packed two halves per uint (unpackHalf2x16 in the shaders,
  // no 16-bit storage feature needed); Q8_0 is not stored on the device.
  SPW_RETURN_IF_ERROR(check_device_kv_type(o.type, o.n_embd_kv, o.head_dim > 0 ? o.head_dim : o.n_embd_kv)
                          .with_context(impl_->name()));
  auto st = std::make_unique<VulkanKvStorage>();
  st->ctx = impl_->ctx;
  st->dev_name = impl_->name();
  st->type = o.type;
  // A sliding-window layer's buffers hold the window plane's blocks (kv_cache.h).
  auto bytes_of = [&](int32_t l) {
    return static_cast<uint64_t>(kv_layer_blocks(o, l)) * static_cast<uint64_t>(o.block_tokens) *
           kv_row_bytes(o.type, static_cast<uint64_t>(o.n_embd_kv));
  };
  for (int32_t l = o.layer_begin; l < o.layer_end; ++l) {
    if (bytes_of(l) > impl_->ctx->max_buffer_bytes())
      return Status::invalid_argument("KV of one layer (" + std::to_string(bytes_of(l)) +
                                      " bytes) exceeds the largest " + impl_->name() + " buffer (" +
                                      std::to_string(impl_->ctx->max_buffer_bytes()) + "); use fewer blocks");
  }
  const std::string own = "kv:" + owner;
  for (int32_t l = o.layer_begin; l < o.layer_end; ++l) {
    const uint64_t layer_bytes = bytes_of(l);
    SPW_ASSIGN_OR_RETURN(DeviceBuffer k, impl_->alloc(layer_bytes, MemoryCategory::kKv, own));
    SPW_ASSIGN_OR_RETURN(DeviceBuffer v, impl_->alloc(layer_bytes, MemoryCategory::kKv, own));
    st->k.push_back(std::move(k));
    st->v.push_back(std::move(v));
    st->total += 2 * layer_bytes;
  }
  return KvPool::create_on_device(o, std::move(st));
}

bool VulkanBackend::accepts_kv(const KvPool& pool) const {
  auto* st = dynamic_cast<const VulkanKvStorage*>(pool.device_storage());
  std::lock_guard<TimedMutex> lk(impl_->mu);
  return st != nullptr && impl_->ctx != nullptr && st->ctx == impl_->ctx;
}

}  // namespace spw
