// Ground-truth helper (not project code): prints llama.cpp's token ids for
// each input, read as length-prefixed records from stdin.
#include "llama.h"
#include <cstdio>
#include <string>
#include <vector>
#include <iostream>
int main(int argc, char** argv) {
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  auto mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* m = llama_model_load_from_file(argv[1], mp);
  if (!m) { fprintf(stderr, "load failed\n"); return 1; }
  const llama_vocab* v = llama_model_get_vocab(m);
  bool parse_special = argc > 2 && std::string(argv[2]) == "1";
  // input: records "<len>\n<bytes>"
  std::string line;
  while (true) {
    size_t n; if (scanf("%zu", &n) != 1) break; getchar();
    std::string s(n, '\0'); if (n && fread(&s[0], 1, n, stdin) != n) break;
    std::vector<llama_token> t(n * 4 + 16);
    int k = llama_tokenize(v, s.data(), (int)s.size(), t.data(), (int)t.size(), false, parse_special);
    for (int i = 0; i < k; ++i) printf("%s%d", i ? " " : "", t[i]);
    printf("\n");
  }
  return 0;
}
