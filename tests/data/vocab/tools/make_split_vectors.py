#!/usr/bin/env python3
"""Writes src/tokenizer/pre_tokenizer_splits.inc: expected pre-tokenizer
splits for the BPE pre-tokenizers whose vocabularies llama.cpp does not ship
(llama-bpe = Llama 3, qwen2, smollm, deepseek-v3, chameleon), so their ids
cannot be tested here.

The splits come from Python's `regex` module running the regexes exactly as
llama.cpp's llm_tokenizer_bpe lists them (commit c392e50), applied in order,
each to every piece the previous one produced, keeping matches and the text
between them (llama.cpp's unicode_regex_split). Inputs: llama.cpp's
test-tokenizer-0 texts (ggml-vocab-*.inp, all identical) and the valid UTF-8
texts of our spillway-extra.inp.

  python3 make_split_vectors.py            # write the .inc
  python3 make_split_vectors.py ./splitref # also compare with llama.cpp's own
                                           # unicode_regex_split (llama_split_ref.cpp
                                           # built against libllama); prints differences
"""
import os
import subprocess
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(DATA)))
SEP = b"\n__ggml_vocab_test__\n"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
PRES = {
    "llama-bpe": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "qwen2": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "smollm": [r"\p{N}", GPT2],
}

# deepseek-v3 and chameleon: llama.cpp runs these through its std::regex
# fallback on a "collapsed" text whose \p{S} is Unicode's S minus ASCII '~'
# (unicode.cpp's k_ucat_map lists $+<=>^`| for SYMBOL; '~' is Sm). Python's
# `regex` writes that quirk as a set difference (version 1 syntax); LLAMA_PRES
# keeps llama.cpp's own text for the comparison with its unicode_regex_split.
DSV3_PUNCT = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
NEW_PRES = {
    "deepseek-v3": [
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"(?V1)" + DSV3_PUNCT
        + r"|[^\r\n\p{L}\p{P}[\p{S}--[~]]]?[\p{L}\p{M}]+| ?[\p{P}[\p{S}--[~]]]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "chameleon": [
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2,
    ],
}
LLAMA_PRES = dict(PRES)
LLAMA_PRES["deepseek-v3"] = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    DSV3_PUNCT + "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
LLAMA_PRES["chameleon"] = NEW_PRES["chameleon"]

# Inputs aimed at what deepseek-v3 and chameleon do differently: digit runs,
# the CJK/kana ranges and their neighbours, ASCII punctuation before letters,
# '~' (not a symbol for llama.cpp), symbols and marks, newlines and whitespace
# runs, chameleon's sentinels and image tokens.
TARGETED = [
    "1234567 12 3 0.5 1,000,000 \u0661\u0662\u0663\u0664 \u00bd\u00bd \u2160\u2161",
    "\u4e00\u9fa5\u9fa6\u4dff \u3041\u3093\u30a2\u30f3\u30ff\u3040\u309f\u30a0 \u6f22\u5b57\u304b\u306a\u30ab\u30ca",
    "\uac00\ud7a3 \u3131 \uff21\uff22 \u8a9e123\u8a9e",
    "~ ~~ ~a ~~b a~b a~ ~\n ~1 (~) x~~~y ~\u00e9 ~\u4e00 ~ a",
    "$x +y <a> =b ^c `d |e !f @g #h %i &j *k ,l -m .n /o :p ;q ?r [s \\t ]u _v {w }x \"y 'z",
    "\u00a9 \u20ac100 \u00b1 \u2264x \U0001f600a \u2026b \u00bfQu\u00e9? \u00abok\u00bb",
    "e\u0301 \u0301a a\u0308\u0308 \u0915\u094d\u0937 \u0e01\u0e34",
    "a\n\nb\r\n \n\t\tc  \n  d   e\t \u3000f \u00a0g\u2003h\n\n\n",
    "!!!abc ...x ::y -->z '''s'' \"\"q\"\" ##\n %%\r\n",
    "<sentinel:12><sentinel:x>IMGIMGABCDZIMGIMGAZ IMGIMGJZ    four  two\t\ttabs",
    "Don't you're I'M 3.14159 \u00e9t\u00e9 \u00fcber-cool caf\u00e9!",
]


def split(text, patterns):
    pieces = [text]
    for p in patterns:
        rx = regex.compile(p)
        out = []
        for piece in pieces:
            prev = 0
            for m in rx.finditer(piece):
                if m.start() > prev:
                    out.append(piece[prev:m.start()])
                out.append(m.group())
                prev = m.end()
            if prev < len(piece):
                out.append(piece[prev:])
        pieces = out
    return pieces


def read_cases(path):
    raw = open(path, "rb").read()
    cases = raw.split(SEP)
    if cases and cases[-1] == b"":
        cases.pop()
    return cases


def inputs():
    out = []
    for c in read_cases(os.path.join(DATA, "ggml-vocab-llama-bpe.gguf.inp")) + read_cases(
        os.path.join(DATA, "spillway-extra.inp")
    ):
        try:
            out.append(c.decode("utf-8"))
        except UnicodeDecodeError:
            pass  # Python's regex needs text; invalid UTF-8 is covered by the id vectors
    return out


def c_string(s):
    out = '"'
    for b in s.encode("utf-8"):
        if b == 0x22 or b == 0x5C:
            out += "\\" + chr(b)
        elif 0x20 <= b < 0x7F and b != 0x3F:  # '?' escaped: no trigraph surprises
            out += chr(b)
        else:
            out += '\\x%02X""' % b  # "" ends the hex escape
    return out + '"'


# GPT-2's byte symbols back to bytes (llama.cpp's split returns encoded words).
def byte_decoder():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, n = {}, 0
    for b in range(256):
        if b in keep:
            m[chr(b)] = b
        else:
            m[chr(256 + n)] = b
            n += 1
    return m


def all_cases(texts):
    """(pre, python patterns, llama.cpp patterns, input) in .inc order."""
    out = [(pre, pats, LLAMA_PRES[pre], t) for pre, pats in PRES.items() for t in texts]
    out += [(pre, pats, LLAMA_PRES[pre], t) for pre, pats in NEW_PRES.items() for t in texts + TARGETED]
    return out


def compare(splitref, texts):
    dec = byte_decoder()
    bad = n = 0
    for pre, pats, llama_pats, t in all_cases(texts):
        record = str(len(t.encode())).encode() + b"\n" + t.encode()
        out = subprocess.run([splitref] + llama_pats, input=record, capture_output=True, check=True).stdout.decode()
        rec = out.split("--\n")[0]
        words = [bytes(dec[ch] for ch in bytes.fromhex(h).decode()).decode("utf-8", "replace") for h in rec.splitlines()]
        n += 1
        if words != split(t, pats):
            bad += 1
            print("DIFF", pre, repr(t), "\n  llama.cpp:", words, "\n  python:   ", split(t, pats))
    print("python vs llama.cpp: %d differences in %d cases" % (bad, n))


def main():
    texts = inputs()
    if len(sys.argv) > 1:
        compare(sys.argv[1], texts)
    lines = [
        "// Generated by tests/data/vocab/tools/make_split_vectors.py: do not edit.",
        "// Expected pre-tokenizer splits from Python's `regex` module running",
        "// llama.cpp's regexes for these pre-tokenizers (see the script). They check",
        "// the split only, not token ids: the vocabularies are not available.",
        "// {pre, input, {words...}}",
    ]
    cases = all_cases(texts)
    for pre, pats, _, t in cases:
        words = split(t, pats)
        assert "".join(words) == t
        lines.append("{%s, %s, {%s}}," % (c_string(pre), c_string(t), ", ".join(c_string(w) for w in words)))
    with open(os.path.join(ROOT, "src", "tokenizer", "pre_tokenizer_splits.inc"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d cases" % len(cases))


if __name__ == "__main__":
    main()
