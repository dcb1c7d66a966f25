#if canImport(Glibc)
import Glibc
#endif

/// A growable byte buffer with a stable base address, used for outbound socket data.
/// Owned by one connection; never shared across threads.
public final class ByteBuffer {
    public private(set) var base: UnsafeMutableRawPointer
    public private(set) var count = 0
    public private(set) var capacity: Int

    public init(capacity: Int = 4096) {
        self.capacity = max(capacity, 64)
        base = UnsafeMutableRawPointer.allocate(byteCount: self.capacity, alignment: 16)
    }
    deinit { base.deallocate() }

    public func append(_ p: UnsafeRawPointer, _ n: Int) {
        reserve(count + n)
        (base + count).copyMemory(from: p, byteCount: n)
        count += n
    }
    public func append(_ bytes: UnsafeRawBufferPointer) {
        if let b = bytes.baseAddress, bytes.count > 0 { append(b, bytes.count) }
    }
    public func append(byte: UInt8) {
        reserve(count + 1)
        base.storeBytes(of: byte, toByteOffset: count, as: UInt8.self)
        count += 1
    }
    public func append(_ s: String) {
        var s = s
        s.withUTF8 { append(UnsafeRawBufferPointer($0)) }
    }

    /// Appends what `body` writes at the end of the buffer: it gets room for `n` bytes and
    /// returns how many it wrote. One capacity check and one count update for a message written
    /// in pieces (the router's spliced lines).
    @inline(__always)
    public func append(upTo n: Int, _ body: (UnsafeMutableRawPointer) -> Int) {
        reserve(count + n)
        let written = body(base + count)
        count += written
    }

    /// Drops the first `n` bytes.
    public func consume(_ n: Int) {
        if n >= count { count = 0; return }
        memmove(base, base + n, count - n)
        count -= n
    }
    public func clear(shrinkAbove limit: Int = 1 << 20) {
        count = 0
        if capacity > limit {
            base.deallocate()
            capacity = 4096
            base = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
        }
    }
    private func reserve(_ need: Int) {
        guard need > capacity else { return }
        var c = capacity
        while c < need { c *= 2 }
        let nb = UnsafeMutableRawPointer.allocate(byteCount: c, alignment: 16)
        nb.copyMemory(from: base, byteCount: count)
        base.deallocate()
        base = nb
        capacity = c
    }
    public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }
}
