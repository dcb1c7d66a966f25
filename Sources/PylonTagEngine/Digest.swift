/// MD5, SHA-1 and SHA-256 (for `_hsh`), base16 and base64 (for `_enc`/`_hsh`). Small and
/// self-contained so the engine links nothing but PCRE2; checked against known vectors in tests.
enum Digest {
    static func hex(_ b: [UInt8]) -> String {
        let d = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(b.count * 2)
        for x in b { out.append(d[Int(x >> 4)]); out.append(d[Int(x & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }

    static func fromHex(_ s: String) -> [UInt8]? {
        let u = Array(s.utf8)
        guard u.count % 2 == 0 else { return nil }
        func nib(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: return c - 0x30
            case 0x61...0x66: return c - 0x61 + 10
            case 0x41...0x46: return c - 0x41 + 10
            default: return nil
            }
        }
        var out = [UInt8]()
        var i = 0
        while i < u.count {
            guard let h = nib(u[i]), let l = nib(u[i + 1]) else { return nil }
            out.append(h << 4 | l)
            i += 2
        }
        return out
    }

    static func base64(_ b: [UInt8], url: Bool, pad: Bool) -> String {
        let a = Array(
            (url
                ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/").utf8)
        var out = [UInt8]()
        var i = 0
        while i < b.count {
            let n = min(3, b.count - i)
            let v = UInt32(b[i]) << 16 | (n > 1 ? UInt32(b[i + 1]) << 8 : 0) | (n > 2 ? UInt32(b[i + 2]) : 0)
            out.append(a[Int(v >> 18 & 63)])
            out.append(a[Int(v >> 12 & 63)])
            if n > 1 { out.append(a[Int(v >> 6 & 63)]) } else if pad { out.append(0x3D) }
            if n > 2 { out.append(a[Int(v & 63)]) } else if pad { out.append(0x3D) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Pads to 64-byte blocks with the bit length (big- or little-endian).
    private static func padded(_ m: [UInt8], bigEndian: Bool) -> [UInt8] {
        var b = m
        let bits = UInt64(m.count) &* 8
        b.append(0x80)
        while b.count % 64 != 56 { b.append(0) }
        for i in 0..<8 { b.append(UInt8(truncatingIfNeeded: bigEndian ? bits >> (56 - 8 * UInt64(i)) : bits >> (8 * UInt64(i)))) }
        return b
    }

    private static func rotl(_ x: UInt32, _ n: UInt32) -> UInt32 { x << n | x >> (32 - n) }
    private static func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { x >> n | x << (32 - n) }

    static func md5(_ m: [UInt8]) -> [UInt8] {
        let s: [UInt32] = [
            7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
            5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20,
            4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
            6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
        ]
        var k = [UInt32](repeating: 0, count: 64)
        for i in 0..<64 { k[i] = UInt32(truncatingIfNeeded: Int64(abs(sin(Double(i + 1))) * 4_294_967_296.0)) }
        var h: [UInt32] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476]
        let b = padded(m, bigEndian: false)
        for chunk in stride(from: 0, to: b.count, by: 64) {
            var w = [UInt32](repeating: 0, count: 16)
            for i in 0..<16 {
                w[i] =
                    UInt32(b[chunk + 4 * i]) | UInt32(b[chunk + 4 * i + 1]) << 8 | UInt32(b[chunk + 4 * i + 2]) << 16 | UInt32(
                        b[chunk + 4 * i + 3]) << 24
            }
            var a = h[0], bb = h[1], c = h[2], d = h[3]
            for i in 0..<64 {
                var f: UInt32
                let g: Int
                switch i {
                case 0..<16: f = (bb & c) | (~bb & d); g = i
                case 16..<32: f = (d & bb) | (~d & c); g = (5 * i + 1) % 16
                case 32..<48: f = bb ^ c ^ d; g = (3 * i + 5) % 16
                default: f = c ^ (bb | ~d); g = (7 * i) % 16
                }
                f = f &+ a &+ k[i] &+ w[g]
                a = d; d = c; c = bb
                bb = bb &+ rotl(f, s[i])
            }
            h[0] = h[0] &+ a; h[1] = h[1] &+ bb; h[2] = h[2] &+ c; h[3] = h[3] &+ d
        }
        return h.flatMap { x in (0..<4).map { UInt8(truncatingIfNeeded: x >> (8 * UInt32($0))) } }
    }

    static func sha1(_ m: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0]
        let b = padded(m, bigEndian: true)
        var w = [UInt32](repeating: 0, count: 80)
        for chunk in stride(from: 0, to: b.count, by: 64) {
            for i in 0..<16 {
                w[i] =
                    UInt32(b[chunk + 4 * i]) << 24 | UInt32(b[chunk + 4 * i + 1]) << 16 | UInt32(b[chunk + 4 * i + 2]) << 8
                    | UInt32(b[chunk + 4 * i + 3])
            }
            for i in 16..<80 { w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1) }
            var a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4]
            for i in 0..<80 {
                let f: UInt32, k: UInt32
                switch i {
                case 0..<20: f = (bb & c) | (~bb & d); k = 0x5A82_7999
                case 20..<40: f = bb ^ c ^ d; k = 0x6ED9_EBA1
                case 40..<60: f = (bb & c) | (bb & d) | (c & d); k = 0x8F1B_BCDC
                default: f = bb ^ c ^ d; k = 0xCA62_C1D6
                }
                let t = rotl(a, 5) &+ f &+ e &+ k &+ w[i]
                e = d; d = c; c = rotl(bb, 30); bb = a; a = t
            }
            h[0] = h[0] &+ a; h[1] = h[1] &+ bb; h[2] = h[2] &+ c; h[3] = h[3] &+ d; h[4] = h[4] &+ e
        }
        return h.flatMap { x in (0..<4).map { UInt8(truncatingIfNeeded: x >> (24 - 8 * UInt32($0))) } }
    }

    static func sha256(_ m: [UInt8]) -> [UInt8] {
        let k: [UInt32] = [
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
        ]
        var h: [UInt32] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]
        let b = padded(m, bigEndian: true)
        var w = [UInt32](repeating: 0, count: 64)
        for chunk in stride(from: 0, to: b.count, by: 64) {
            for i in 0..<16 {
                w[i] =
                    UInt32(b[chunk + 4 * i]) << 24 | UInt32(b[chunk + 4 * i + 1]) << 16 | UInt32(b[chunk + 4 * i + 2]) << 8
                    | UInt32(b[chunk + 4 * i + 3])
            }
            for i in 16..<64 {
                let s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
                let s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
                w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
            }
            var a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7]
            for i in 0..<64 {
                let s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)
                let ch = (e & f) ^ (~e & g)
                let t1 = hh &+ s1 &+ ch &+ k[i] &+ w[i]
                let s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)
                let maj = (a & bb) ^ (a & c) ^ (bb & c)
                let t2 = s0 &+ maj
                hh = g; g = f; f = e; e = d &+ t1; d = c; c = bb; bb = a; a = t1 &+ t2
            }
            h[0] = h[0] &+ a; h[1] = h[1] &+ bb; h[2] = h[2] &+ c; h[3] = h[3] &+ d
            h[4] = h[4] &+ e; h[5] = h[5] &+ f; h[6] = h[6] &+ g; h[7] = h[7] &+ hh
        }
        return h.flatMap { x in (0..<4).map { UInt8(truncatingIfNeeded: x >> (24 - 8 * UInt32($0))) } }
    }
}

#if canImport(Glibc)
import Glibc
#endif
