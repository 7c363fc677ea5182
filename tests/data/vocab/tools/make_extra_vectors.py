#!/usr/bin/env python3
"""Writes spillway-extra.inp and, for each vocabulary, <vocab>.extra.out: the
token ids llama.cpp gives for our extra inputs (special tokens, stripping,
Unicode whitespace, invalid UTF-8, ...), which its own .inp does not cover.

Ground truth comes from llama.cpp itself: build llama_tokenize_ref.cpp against
a llama.cpp build (libllama), e.g.
  g++ -O1 -std=c++17 llama_tokenize_ref.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
      -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin -o reftok
  python3 make_extra_vectors.py ./reftok
The checked-in outputs were made with llama.cpp c392e5094deaf2d1a7c18683214f007fad3fe42b.
Each .extra.out has 2N lines: N with parse_special=false, then N with true
(add_special=false in both, as test-tokenizer-0).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
SEP = b"\n__ggml_vocab_test__\n"

INPUTS = [
    "<|endoftext|>Hello<|endoftext|>  world <|endoftext|>",
    "   <|endoftext|>   ",
    "<s>[INST] hi [/INST]</s>  ok</s>",
    "<|user|>\n  Hi<|end|>\n<|assistant|>  Sure  <|end|>  \n",
    "<|system|> x <|placeholder1|>y<unk> z",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>hi<\uff5cend\u2581of\u2581sentence\uff5c>",
    "a\u00a0b\u3000c\u2028d\u0085e\u180ef  \u2003 g\u3000\u3000h",
    "I'M YOU'RE we'Ll it'S don't 'tis ''s 'S",
    "1 12 123 1234 12345 \u0661\u0662\u0663 \u00bd \u00b2 3.14 1,000,000",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440! \u4f60\u597d\uff0c\u4e16\u754c\u3002 "
    "\u3053\u3093\u306b\u3061\u306f \uc548\ub155\ud558\uc138\uc694 \u0645\u0631\u062d\u0628\u0627 "
    "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F3F3\ufe0f\u200d\U0001F308 a\U0001F999b",
    "\n\n\n  \t\t  x\r\n\r\n y   \n",
    "hello   ",
    "   \n  ",
    "def f(x):\n    return x**2  # comment\n\tif a<=b and c!=d: pass",
    "a" + " " * 50 + "b",
    "!!!???...,,, --- ''' \"\"\" ``` ~~~ $$$ +++ <<< >>> ||| ^^^",
    "e\u0301 n\u0303 \ufb01 \u01c5 \u00e9",
    "",
]
# Invalid UTF-8 (bytes; llama.cpp replaces what it cannot decode by U+FFFD).
RAW_INPUTS = [
    b"a\xffb\x80c\xe4\xbd d\xc0\xaf e\xed\xa0\x80 f",
    b"\xe4\xbd\xa0\xe5",
]

VOCABS = ["gpt-2", "mpt", "refact", "starcoder", "falcon", "deepseek-coder", "deepseek-llm", "phi-3"]


def main():
    reftok = sys.argv[1]
    cases = [s.encode("utf-8") for s in INPUTS] + RAW_INPUTS
    with open(os.path.join(DATA, "spillway-extra.inp"), "wb") as f:
        f.write(SEP.join(cases) + SEP)
    records = b"".join(str(len(c)).encode() + b"\n" + c for c in cases)
    for v in VOCABS:
        gguf = os.path.join(DATA, "ggml-vocab-%s.gguf" % v)
        lines = []
        for special in ("0", "1"):
            out = subprocess.run([reftok, gguf, special], input=records, capture_output=True, check=True).stdout
            got = out.decode().splitlines()
            assert len(got) == len(cases), (v, len(got))
            lines += got
        with open(gguf + ".extra.out", "w") as f:
            f.write("\n".join(lines) + "\n")
        print(v, "ok")


if __name__ == "__main__":
    main()
