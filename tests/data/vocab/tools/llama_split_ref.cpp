// Ground-truth helper (not project code): llama.cpp's unicode_regex_split
// words for records on stdin, one line per word as hex of the (byte-decoded)
// word, an empty line after each record. argv: the regexes.
#include <cstdio>
#include <string>
#include <vector>
std::vector<std::string> unicode_regex_split(const std::string& text, const std::vector<std::string>& regex_exprs);
int main(int argc, char** argv) {
  std::vector<std::string> res(argv + 1, argv + argc);
  while (true) {
    size_t n; if (scanf("%zu", &n) != 1) break; getchar();
    std::string s(n, '\0'); if (n && fread(&s[0], 1, n, stdin) != n) break;
    for (const auto& w : unicode_regex_split(s, res)) {
      for (unsigned char c : w) printf("%02x", c);
      printf("\n");
    }
    printf("--\n");
  }
}
