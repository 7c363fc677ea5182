#!/usr/bin/env python3
"""Writes the GGUF fuzz seed corpus (fuzz/corpus/gguf/*.gguf). Run from anywhere.

Small hand-built files covering every value type, nested arrays, v2 and v3,
non-default alignment and F32/F16/Q8_0 tensors. Kept tiny: libFuzzer mutates.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def s(x: bytes) -> bytes:
    return struct.pack("<Q", len(x)) + x


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key.encode()) + struct.pack("<I", vtype) + payload


def arr(elem: int, items: list) -> bytes:
    return struct.pack("<IQ", elem, len(items)) + b"".join(items)


def header(version, n_tensors, n_kv):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor(name, ne, ggml_type, offset):
    return s(name.encode()) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", ggml_type, offset)


def pad(b: bytes, a: int) -> bytes:
    return b + b"\0" * ((-len(b)) % a)


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    write("empty_v3.gguf", header(3, 0, 0))
    scalars = [
        kv("u8", 0, struct.pack("<B", 200)), kv("i8", 1, struct.pack("<b", -3)),
        kv("u16", 2, struct.pack("<H", 60000)), kv("i16", 3, struct.pack("<h", -30000)),
        kv("u32", 4, struct.pack("<I", 7)), kv("i32", 5, struct.pack("<i", -7)),
        kv("f32", 6, struct.pack("<f", 1.5)), kv("bool", 7, b"\x01"),
        kv("str", 8, s(b"llama")), kv("u64", 10, struct.pack("<Q", 1 << 40)),
        kv("i64", 11, struct.pack("<q", -(1 << 40))), kv("f64", 12, struct.pack("<d", 0.1)),
    ]
    write("scalars_v2.gguf", header(2, 0, len(scalars)) + b"".join(scalars))
    arrays = [
        kv("tokenizer.ggml.tokens", 9, arr(8, [s(b"<unk>"), s(b"<s>"), s(b"</s>"), s(b"\xe2\x96\x81a")])),
        kv("tokenizer.ggml.scores", 9, arr(6, [struct.pack("<f", -i) for i in range(4)])),
        kv("tokenizer.ggml.token_type", 9, arr(5, [struct.pack("<i", t) for t in (2, 3, 3, 1)])),
        kv("nested", 9, arr(9, [arr(4, [struct.pack("<I", 1), struct.pack("<I", 2)]), arr(8, [s(b"x")])])),
        kv("empty", 9, arr(0, [])),
    ]
    write("arrays.gguf", header(3, 0, len(arrays)) + b"".join(arrays))

    # Tensors: F32 [8], F16 [4, 2], Q8_0 [32, 2], alignment 64.
    f32 = struct.pack("<8f", *[i * 0.5 for i in range(8)])
    f16 = struct.pack("<8H", *[0x3C00 + i for i in range(8)])
    q8 = (struct.pack("<H", 0x3C00) + bytes(range(32))) * 2
    kvs = [kv("general.alignment", 4, struct.pack("<I", 64)), kv("general.architecture", 8, s(b"llama"))]
    infos = [tensor("a.f32", [8], 0, 0), tensor("b.f16", [4, 2], 1, 64), tensor("c.q8_0", [32, 2], 8, 128)]
    body = pad(header(3, 3, len(kvs)) + b"".join(kvs) + b"".join(infos), 64)
    body += pad(f32, 64) + pad(f16, 64) + q8
    write("tensors_align64.gguf", body)

    # Default alignment, 4-D tensor.
    infos = [tensor("w", [2, 1, 1, 2], 0, 0)]
    body = pad(header(3, 1, 0) + b"".join(infos), 32) + struct.pack("<4f", 1, 2, 3, 4)
    write("tensor_4d.gguf", body)


if __name__ == "__main__":
    main()
