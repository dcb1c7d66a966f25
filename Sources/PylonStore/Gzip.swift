import CZlib

public struct GzipError: Error, CustomStringConvertible, Sendable {
    public enum Kind: Sendable { case failed, tooLarge }
    /// `.tooLarge`: the decompressed data would exceed the caller's limit.
    public var kind: Kind = .failed
    public let description: String
}

/// gzip (RFC 1952) compression and decompression with zlib.
public enum Gzip {
    public static func compress(_ input: [UInt8], level: Int32 = 6) throws(GzipError) -> [UInt8] {
        var s = z_stream()
        guard pylon_deflate_init_gzip(&s, level) == Z_OK else { throw GzipError(description: "deflateInit2 failed") }
        defer { deflateEnd(&s) }
        // Room for the worst case, not zero-filled first (zlib writes what it produces; only
        // that is kept).
        var rc: Int32 = Z_OK
        let out = [UInt8](unsafeUninitializedCapacity: Int(deflateBound(&s, uLong(input.count))) + 32) { outp, kept in
            // zlib's next_in is not const but is only read: no copy of the input is needed.
            rc = input.withUnsafeBytes { inp in
                s.next_in = UnsafeMutablePointer(mutating: inp.baseAddress?.assumingMemoryBound(to: Bytef.self))
                s.avail_in = uInt(inp.count)
                s.next_out = outp.baseAddress
                s.avail_out = uInt(outp.count)
                return deflate(&s, Z_FINISH)
            }
            kept = rc == Z_STREAM_END ? Int(s.total_out) : 0
        }
        guard rc == Z_STREAM_END else { throw GzipError(description: "deflate failed (\(rc))") }
        return out
    }

    /// Decompresses, refusing to produce more than `limit` bytes (a zip bomb is an error).
    public static func decompress(_ input: [UInt8], limit: Int) throws(GzipError) -> [UInt8] {
        var s = z_stream()
        guard pylon_inflate_init_gzip(&s) == Z_OK else { throw GzipError(description: "inflateInit2 failed") }
        defer { inflateEnd(&s) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var rc: Int32 = Z_OK
        input.withUnsafeBytes { inp in
            s.next_in = UnsafeMutablePointer(mutating: inp.baseAddress?.assumingMemoryBound(to: Bytef.self))
            s.avail_in = uInt(inp.count)
            repeat {
                chunk.withUnsafeMutableBytes { c in
                    s.next_out = c.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    s.avail_out = uInt(c.count)
                    rc = inflate(&s, Z_NO_FLUSH)
                }
                let produced = 65536 - Int(s.avail_out)
                out.append(contentsOf: chunk[0..<produced])
            } while rc == Z_OK && out.count <= limit && (s.avail_in > 0 || s.avail_out == 0)
        }
        if out.count > limit { throw GzipError(kind: .tooLarge, description: "decompressed body exceeds \(limit) bytes") }
        guard rc == Z_STREAM_END else { throw GzipError(description: "invalid gzip data (\(rc))") }
        return out
    }
}
