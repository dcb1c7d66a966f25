#!/usr/bin/env python3
"""Writes the seed corpus of the `segment` fuzz target (Fuzz/corpus/segment): small uploader
segment files in both of the target's forms (docs/UPLOADER.md "On disk"; Fuzz/segment).

Each seed is one first byte (0: the file after its magic, frames sealed here; 1: frame bodies
each led by a length byte, the target seals them) and then the frames: a lane, records (kind 2)
or packed (kind 8: raw deflate, window 12, sync flush without its final 00 00 ff ff), a cut, an
ended frame. Usage: python3 tools/fuzz-segment-seeds.py [DIR]
"""
import json
import os
import struct
import sys
import zlib


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(s):
    b = s.encode()
    return varint(len(b)) + b


def text(i):
    data = {"appKey": "seed", "eventName": "purchase", "property": {"sku": "A-%d" % i, "price": 9.99}}
    return ('{"id":"r%d","ts":%d,"data":%s}' % (i, 1764612345678 + i, json.dumps(data, separators=(",", ":")))).encode()


def lane(lid, stream, consent):
    return bytes([1]) + varint(lid) + string(stream) + string(consent)


def head(kind, lid, first, texts):
    b = bytes([kind]) + varint(lid) + varint(first) + varint(1764612345000) + varint(len(texts))
    b += b"".join(varint(1) for _ in texts[1:])
    return b + b"".join(varint(len(t)) for t in texts)


def records(lid, first, texts):
    return head(2, lid, first, texts) + b",".join(texts)


def packed(lid, first, groups):
    """One packed frame per group, all in one context (seq 0, 1, ...)."""
    d = zlib.compressobj(3, zlib.DEFLATED, -12, 2)
    out, pos = [], first
    for seq, texts in enumerate(groups):
        z = d.compress(b",".join(texts)) + d.flush(zlib.Z_SYNC_FLUSH)
        assert z.endswith(b"\x00\x00\xff\xff")
        out.append(head(8, lid, pos, texts) + varint(seq) + z[:-4])
        pos += len(texts)
    return out


def cut(key, stream, first, last):
    return bytes([3]) + string(key) + string(stream) + b"\x00" + varint(0) + varint(1764612346000) + varint(1) + varint(first) + varint(last - first)


def ended(key, stream, first, last, zeroed):
    return bytes([7, 1 if zeroed else 0]) + varint(1) + string(key) + string(stream) + varint(1) + varint(first) + varint(last - first)


def seal(body):
    return struct.pack("<II", len(body), zlib.crc32(body) & 0xFFFFFFFF) + body


def seed(bodies, sealed_here):
    if sealed_here:
        return b"\x00" + b"".join(seal(b) for b in bodies)
    assert all(len(b) < 256 for b in bodies)
    return b"\x01" + b"".join(bytes([len(b)]) + b for b in bodies)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "Fuzz", "corpus", "segment")
    os.makedirs(out, exist_ok=True)
    t = [text(i) for i in range(6)]
    plain = [lane(0, "seed", "analytics"), records(0, 0, t[:1]), records(0, 1, t[1:2]), cut("k1", "seed", 0, 1)]
    pack = [lane(0, "seed", "analytics")] + packed(0, 0, [[x] for x in t[:4]]) + [cut("k1", "seed", 0, 1), ended("k1", "seed", 0, 1, False)]
    purged = [lane(0, "seed", "analytics")] + packed(0, 0, [[x] for x in t[:3]]) + [cut("k2", "seed", 0, 2), ended("k2", "seed", 0, 2, True)]
    two = [lane(0, "a", "analytics"), lane(1, "b", "device")] + packed(0, 0, [[t[0]], [t[1]]]) + packed(1, 2, [[t[2]]]) + [records(0, 3, t[3:4])]
    seeds = {
        "plain-records": seed(plain, True), "packed-context": seed(pack, True), "packed-purged": seed(purged, True),
        "two-lanes": seed(two, True), "bodies-plain": seed(plain, False), "bodies-packed": seed(pack, False),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), out))


if __name__ == "__main__":
    main()
