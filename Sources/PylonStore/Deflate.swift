import CZlib

/// What zlib refused (`Deflater`, `Inflater`, `Gzip`).
public struct ZlibError: Error, CustomStringConvertible, Sendable {
    public enum Kind: Sendable { case failed, tooLarge }
    /// `.tooLarge`: the decompressed data would exceed the caller's limit.
    public var kind: Kind = .failed
    public let description: String
}

/// The name `Gzip` threw before the pair below was shared (the backend and the uploader).
public typealias GzipError = ZlibError

/// zlib's deflate streams, the one wrapper of them in Pylon (with `Inflater`): gzip members for
/// HTTP bodies (`Gzip`), raw streams for the uploader's packed queue frames.
public final class Deflater {
    public enum Format: Sendable {
        /// RFC 1952: header, deflate data, crc32 and length.
        case gzip
        /// Deflate data alone (RFC 1951): no header, no checksum.
        case raw
    }

    /// The sync flush's final empty stored block: `deflate(_:into:)` leaves it off every output
    /// and `Inflater.inflate(_:expected:)` puts it back.
    public static let syncTail: [UInt8] = [0, 0, 0xff, 0xff]

    private let s: UnsafeMutablePointer<z_stream>

    /// `deflateInit2` with a window of `1 << windowBits` bytes and `memLevel` (zlib's defaults:
    /// 15 and 8; smaller ones cost less memory: `(1 << (windowBits + 2)) + (1 << (memLevel + 9))`
    /// bytes plus about 6 KiB of state).
    public init(format: Format, level: Int32 = 6, windowBits: Int32 = 15, memLevel: Int32 = 8) throws(ZlibError) {
        let bits = format == .gzip ? windowBits + 16 : -windowBits
        s = try zStream("deflateInit2") { deflateInit2_($0, level, Z_DEFLATED, bits, memLevel, Z_DEFAULT_STRATEGY, zlibVersion(), $1) }
    }

    deinit {
        deflateEnd(s)
        s.deallocate()
    }

    /// Starts the stream anew (`deflateReset`): what follows decodes without what came before.
    public func reset() { deflateReset(s) }

    /// All of `input` compressed and the stream finished (`Z_FINISH`): a whole gzip member, or a
    /// whole raw stream. The stream is reset afterwards.
    public func finish(_ input: [UInt8]) throws(ZlibError) -> [UInt8] {
        defer { deflateReset(s) }
        // Room for the worst case, not zero-filled first (zlib writes what it produces; only that
        // is kept).
        var rc: Int32 = Z_OK
        let out = [UInt8](unsafeUninitializedCapacity: Int(deflateBound(s, uLong(input.count))) + 32) { outp, kept in
            // zlib's next_in is not const but is only read: no copy of the input is needed.
            rc = input.withUnsafeBytes { inp in
                s.pointee.next_in = UnsafeMutablePointer(mutating: inp.baseAddress?.assumingMemoryBound(to: Bytef.self))
                s.pointee.avail_in = uInt(inp.count)
                s.pointee.next_out = outp.baseAddress
                s.pointee.avail_out = uInt(outp.count)
                return CZlib.deflate(s, Z_FINISH)
            }
            kept = rc == Z_STREAM_END ? Int(s.pointee.total_out) : 0
        }
        guard rc == Z_STREAM_END else { throw ZlibError(description: "deflate failed (\(rc))") }
        return out
    }

    /// Appends `input` compressed and sync-flushed (`Z_SYNC_FLUSH`) to `out`, `syncTail` left
    /// off: the stream goes on, and the next call's output back-references this one's.
    public func deflate(_ input: [UInt8], into out: inout [UInt8]) throws(ZlibError) {
        let start = out.count
        let room = Int(deflateBound(s, uLong(input.count))) + 16
        out.append(contentsOf: repeatElement(0, count: room))
        let rc = input.withUnsafeBytes { inp in
            out.withUnsafeMutableBytes { o in
                s.pointee.next_in = UnsafeMutablePointer(mutating: inp.baseAddress?.assumingMemoryBound(to: Bytef.self))
                s.pointee.avail_in = uInt(inp.count)
                s.pointee.next_out = (o.baseAddress! + start).assumingMemoryBound(to: Bytef.self)
                s.pointee.avail_out = uInt(room)
                return CZlib.deflate(s, Z_SYNC_FLUSH)
            }
        }
        let produced = room - Int(s.pointee.avail_out)
        guard rc == Z_OK, s.pointee.avail_in == 0, s.pointee.avail_out > 0, produced >= 4,
            Array(out[(start + produced - 4)..<(start + produced)]) == Deflater.syncTail
        else {
            out.removeLast(room)
            throw ZlibError(description: "deflate failed (\(rc))")
        }
        out.removeLast(room - produced + 4)
    }
}

/// zlib's inflate streams (with `Deflater`, the one wrapper of them in Pylon).
public final class Inflater {
    private let s: UnsafeMutablePointer<z_stream>
    private let format: Deflater.Format

    /// `inflateInit2` for `format` with a window of up to `1 << windowBits` bytes (15, the
    /// largest, reads whatever window the writer used).
    public init(format: Deflater.Format, windowBits: Int32 = 15) throws(ZlibError) {
        self.format = format
        let bits = format == .gzip ? windowBits + 16 : -windowBits
        s = try zStream("inflateInit2") { inflateInit2_($0, bits, zlibVersion(), $1) }
    }

    deinit {
        inflateEnd(s)
        s.deallocate()
    }

    /// Starts the stream anew (`inflateReset`).
    public func reset() { inflateReset(s) }

    /// All of `input` decompressed, refusing to produce more than `limit` bytes (a zip bomb is
    /// an error, `.tooLarge`); `input` must end the stream. The stream is reset afterwards.
    public func finish(_ input: [UInt8], limit: Int) throws(ZlibError) -> [UInt8] {
        defer { inflateReset(s) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var rc: Int32 = Z_OK
        input.withUnsafeBytes { inp in
            s.pointee.next_in = UnsafeMutablePointer(mutating: inp.baseAddress?.assumingMemoryBound(to: Bytef.self))
            s.pointee.avail_in = uInt(inp.count)
            repeat {
                chunk.withUnsafeMutableBytes { c in
                    s.pointee.next_out = c.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    s.pointee.avail_out = uInt(c.count)
                    rc = CZlib.inflate(s, Z_NO_FLUSH)
                }
                let produced = 65536 - Int(s.pointee.avail_out)
                out.append(contentsOf: chunk[0..<produced])
            } while rc == Z_OK && out.count <= limit && (s.pointee.avail_in > 0 || s.pointee.avail_out == 0)
        }
        if out.count > limit { throw ZlibError(kind: .tooLarge, description: "decompressed body exceeds \(limit) bytes") }
        guard rc == Z_STREAM_END else { throw ZlibError(description: "invalid \(format == .gzip ? "gzip" : "deflate") data (\(rc))") }
        return out
    }

    /// The `expected` bytes `payload` (what `Deflater.deflate(_:into:)` wrote, after the
    /// payloads before it on the same stream) inflates to; nil when it does not (zeroed,
    /// damaged, or out of order).
    public func inflate(_ payload: UnsafeRawBufferPointer, expected: Int) -> [UInt8]? {
        var input = [UInt8](payload)
        input += Deflater.syncTail
        var out = [UInt8](repeating: 0, count: expected + 1)
        let rc = input.withUnsafeMutableBytes { inp in
            out.withUnsafeMutableBytes { o in
                s.pointee.next_in = inp.baseAddress!.assumingMemoryBound(to: Bytef.self)
                s.pointee.avail_in = uInt(inp.count)
                s.pointee.next_out = o.baseAddress!.assumingMemoryBound(to: Bytef.self)
                s.pointee.avail_out = uInt(o.count)
                return CZlib.inflate(s, Z_SYNC_FLUSH)
            }
        }
        guard rc == Z_OK, s.pointee.avail_in == 0, Int(s.pointee.avail_out) == 1 else { return nil }
        out.removeLast()
        return out
    }
}

/// gzip (RFC 1952) compression and decompression of whole buffers, over `Deflater` and
/// `Inflater`.
public enum Gzip {
    public static func compress(_ input: [UInt8], level: Int32 = 6) throws(ZlibError) -> [UInt8] {
        try Deflater(format: .gzip, level: level).finish(input)
    }

    /// Decompresses, refusing to produce more than `limit` bytes (a zip bomb is an error).
    public static func decompress(_ input: [UInt8], limit: Int) throws(ZlibError) -> [UInt8] {
        try Inflater(format: .gzip).finish(input, limit: limit)
    }
}

/// A `z_stream` on the heap, initialised by `initialise` (zlib's `*Init2_`, given the stream and
/// its size); freed again when that fails.
private func zStream(
    _ name: String, _ initialise: (UnsafeMutablePointer<z_stream>, Int32) -> Int32
) throws(ZlibError) -> UnsafeMutablePointer<z_stream> {
    let s = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
    s.initialize(to: z_stream())
    let rc = initialise(s, Int32(MemoryLayout<z_stream>.size))
    guard rc == Z_OK else {
        s.deallocate()
        throw ZlibError(description: "\(name) failed (\(rc))")
    }
    return s
}
