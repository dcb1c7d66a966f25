import CZlib

/// The frame format of Pylon's append-only files, one implementation for every owner
/// (`AppendLog`: the push inbox, the tag manager's lifetimes; the uploader's queue segments).
///
/// A file is the owner's magic bytes then frames `u32 length | u32 crc32 | body`, both
/// little-endian; `length` counts the body and `crc32` (zlib's) covers it. A frame is written
/// whole with one `write` after the ones before it, so a crash or power cut can only cut the
/// file short inside the last frame: a torn tail. `scan` finds where the whole frames end; the
/// owner truncates the file there, so the next append follows the last whole frame. Pure: no
/// I/O here.
public enum FrameFile {
    /// `u32 length | u32 crc32`.
    public static let headBytes = 8

    /// What `scan` does with a frame that fits the file but is not whole (its crc fails, or the
    /// owner cannot decode it).
    public enum Damage: Sendable {
        /// It ends the file: it and everything after it are the torn tail (`AppendLog`: what
        /// survives is always a prefix of the frames appended).
        case endsFile
        /// It is kept, marked, when a whole frame follows it (an overwrite a crash interrupted,
        /// or damage inside the file: its head is intact, since nothing rewrites a length); only
        /// the damaged frames after the last whole one are the torn tail (the queue's segments).
        case keptInside
    }

    /// A frame found by `scan`: where it starts, its whole length (head included), whether its
    /// crc matched, and what the owner decoded from its body (nil: not one of its frames).
    public struct Found<Value> {
        public var offset: Int
        public var length: Int
        public var crcOK: Bool
        public var value: Value?
        /// Whole: its crc matched and its body decoded.
        public var isWhole: Bool { crcOK && value != nil }
    }

    /// The frames of `b` from offset `start` and where its whole part ends (`validEnd`: the end
    /// of the last whole frame, or `start`). Reading stops at the first frame whose body is
    /// shorter than `minBodyBytes`, longer than `maxBodyBytes` or runs past the end of `b`.
    /// `decode` gets each body (and the offset it starts at in `b`); with `.endsFile` it is
    /// called only for bodies whose crc matched, in order, and never after the first that fails.
    public static func scan<Value>(
        _ b: UnsafeRawBufferPointer, from start: Int, minBodyBytes: Int = 1, maxBodyBytes: Int = .max, damage: Damage,
        _ decode: (_ body: UnsafeRawBufferPointer, _ bodyOffset: Int) -> Value?
    ) -> (frames: [Found<Value>], validEnd: Int) {
        var out: [Found<Value>] = []
        var pendingBad: [Found<Value>] = []
        var at = start
        var validEnd = start
        while at + headBytes <= b.count {
            let n = Int(u32(b, at))
            guard n >= minBodyBytes, n <= maxBodyBytes, n <= b.count - at - headBytes else { break }
            let body = UnsafeRawBufferPointer(rebasing: b[(at + headBytes)..<(at + headBytes + n)])
            let ok = crc32(body) == u32(b, at + 4)
            if !ok && damage == .endsFile { break }
            let f = Found(offset: at, length: headBytes + n, crcOK: ok, value: decode(body, at + headBytes))
            if f.isWhole {
                out += pendingBad
                pendingBad.removeAll()
                out.append(f)
                validEnd = at + f.length
            } else if damage == .endsFile {
                break
            } else {
                pendingBad.append(f)
            }
            at += headBytes + n
        }
        return (out, validEnd)
    }

    // MARK: Writing

    /// Appends a frame of `body` to `out`.
    public static func frame(_ body: [UInt8], into out: inout [UInt8]) {
        append(to: &out) { $0.append(contentsOf: body) }
    }

    /// Appends a frame whose body is what `body` writes after `out`'s end; the head is sealed
    /// afterwards.
    public static func append(to out: inout [UInt8], _ body: (inout [UInt8]) throws -> Void) rethrows {
        let start = out.count
        out.append(contentsOf: repeatElement(0, count: headBytes))
        try body(&out)
        seal(&out, at: start)
    }

    /// Writes the head (length and crc32 of the body, which runs to `out`'s end) of the frame
    /// starting at `start`: after its body was written, or rewritten in place.
    public static func seal(_ out: inout [UInt8], at start: Int) {
        let n = out.count - start - headBytes
        let crc = out.withUnsafeBytes { crc32(UnsafeRawBufferPointer(rebasing: $0[(start + headBytes)...])) }
        putU32(&out, at: start, UInt32(n))
        putU32(&out, at: start + 4, crc)
    }

    // MARK: Bytes

    /// zlib's `crc32` of `b`.
    public static func crc32(_ b: UnsafeRawBufferPointer) -> UInt32 {
        UInt32(truncatingIfNeeded: CZlib.crc32(0, b.baseAddress?.assumingMemoryBound(to: Bytef.self), uInt(b.count)))
    }

    /// The little-endian `u32` at `at`.
    public static func u32(_ b: UnsafeRawBufferPointer, _ at: Int) -> UInt32 {
        UInt32(b[at]) | UInt32(b[at + 1]) << 8 | UInt32(b[at + 2]) << 16 | UInt32(b[at + 3]) << 24
    }

    public static func u32(_ b: [UInt8], _ at: Int) -> UInt32 { b.withUnsafeBytes { u32($0, at) } }

    public static func putU32(_ out: inout [UInt8], at i: Int, _ v: UInt32) {
        out[i] = UInt8(truncatingIfNeeded: v)
        out[i + 1] = UInt8(truncatingIfNeeded: v >> 8)
        out[i + 2] = UInt8(truncatingIfNeeded: v >> 16)
        out[i + 3] = UInt8(truncatingIfNeeded: v >> 24)
    }
}
