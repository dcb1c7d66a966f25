/// SipHash with its 128-bit output (Aumasson and Bernstein, the reference `siphash.c` with
/// `cROUNDS`/`dROUNDS`): a keyed hash of a byte string, in one pass. `compressionRounds: 1,
/// finalizationRounds: 3` is SipHash-1-3, the variant Swift's `Hasher` runs; 2 and 4 is the
/// reference SipHash-2-4 (tested against its vectors).
public enum SipHash128 {
    /// The two 64-bit halves of the 128-bit output: bytes 0-7 and 8-15 of the reference output,
    /// read little-endian.
    @inline(__always)
    public static func hash(
        _ data: UnsafeRawBufferPointer, key k: (UInt64, UInt64), compressionRounds c: Int = 1, finalizationRounds d: Int = 3
    ) -> (UInt64, UInt64) {
        var v0: UInt64 = 0x736f_6d65_7073_6575 ^ k.0
        var v1: UInt64 = 0x646f_7261_6e64_6f6d ^ k.1 ^ 0xee
        var v2: UInt64 = 0x6c79_6765_6e65_7261 ^ k.0
        var v3: UInt64 = 0x7465_6462_7974_6573 ^ k.1
        @inline(__always) func round() {
            v0 &+= v1
            v1 = v1.rotl(13)
            v1 ^= v0
            v0 = v0.rotl(32)
            v2 &+= v3
            v3 = v3.rotl(16)
            v3 ^= v2
            v0 &+= v3
            v3 = v3.rotl(21)
            v3 ^= v0
            v2 &+= v1
            v1 = v1.rotl(17)
            v1 ^= v2
            v2 = v2.rotl(32)
        }
        @inline(__always) func absorb(_ m: UInt64) {
            v3 ^= m
            for _ in 0..<c { round() }
            v0 ^= m
        }
        let n = data.count
        var i = 0
        if let base = data.baseAddress {
            while i + 8 <= n {
                absorb(UInt64(littleEndian: (base + i).loadUnaligned(as: UInt64.self)))
                i += 8
            }
        }
        var last = UInt64(truncatingIfNeeded: n) << 56
        var shift: UInt64 = 0
        while i < n {
            last |= UInt64(data[i]) << shift
            shift += 8
            i += 1
        }
        absorb(last)
        v2 ^= 0xee
        for _ in 0..<d { round() }
        let a = v0 ^ v1 ^ v2 ^ v3
        v1 ^= 0xdd
        for _ in 0..<d { round() }
        return (a, v0 ^ v1 ^ v2 ^ v3)
    }
}

extension UInt64 {
    @inline(__always) fileprivate func rotl(_ b: UInt64) -> UInt64 { (self << b) | (self >> (64 - b)) }
}
