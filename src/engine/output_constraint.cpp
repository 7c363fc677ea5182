#include "engine/output_constraint.h"

#include <map>
#include <mutex>

namespace spw {

std::shared_ptr<const grammar::VocabTrie> vocab_trie_for(const Tokenizer& tokenizer) {
  // A process serves one or two vocabularies (a fallback model shares its
  // tokenizer): never evicted.
  static std::mutex mu;
  static std::map<std::pair<uint64_t, int32_t>, std::shared_ptr<const grammar::VocabTrie>> cache;
  const std::pair<uint64_t, int32_t> key{tokenizer.fingerprint(), tokenizer.n_vocab()};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<std::string> pieces(static_cast<size_t>(tokenizer.n_vocab()));
  for (TokenId id = 0; id < tokenizer.n_vocab(); ++id) {
    const TokenType t = tokenizer.token_type(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused || tokenizer.is_eog(id)) {
      continue;  // no text of their own: never allowed as part of a document
    }
    pieces[static_cast<size_t>(id)] = tokenizer.token_piece(id);
  }
  auto trie = std::make_shared<const grammar::VocabTrie>(pieces);
  cache[key] = trie;
  return trie;
}

Result<std::unique_ptr<OutputConstraint>> OutputConstraint::create(const grammar::ConstraintSpec& spec,
                                                                   const Tokenizer& tokenizer) {
  SPW_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Grammar> g, grammar::compile_constraint(spec));
  return std::unique_ptr<OutputConstraint>(new OutputConstraint(std::move(g), vocab_trie_for(tokenizer), tokenizer));
}

Status OutputConstraint::allowed(std::vector<uint64_t>& mask) {
  matcher_.allowed_tokens(*vocab_, mask);
  bool any = false;
  for (uint64_t w : mask) any = any || w != 0;
  if (matcher_.complete()) {
    for (TokenId id : tokenizer_.eog_ids()) {
      if (id >= 0 && static_cast<size_t>(id) / 64 < mask.size()) mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
      any = true;
    }
  }
  if (!any) {
    return Status::resource_exhausted(
        "response_format: no token of the vocabulary continues the JSON document here (nesting past " +
        std::to_string(grammar::kMaxDepth) + " levels, or bytes the vocabulary cannot spell)");
  }
  return Status::ok_status();
}

Status OutputConstraint::accept(TokenId id) {
  if (!matcher_.feed(tokenizer_.token_piece(id))) {
    return Status::failed_precondition("response_format: token " + std::to_string(id) +
                                       " does not continue the JSON document");
  }
  return Status::ok_status();
}

Status OutputConstraint::replay(std::span<const TokenId> generated) {
  for (TokenId id : generated) SPW_RETURN_IF_ERROR(accept(id));
  return Status::ok_status();
}

}  // namespace spw
