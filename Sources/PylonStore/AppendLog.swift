import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// A small append-only file of checksummed frames, for state that changes a little at event
/// rates (the push plugin's inbox, the tag manager's `gtm.lifetime` values): a change is one
/// frame appended with one `write`, never a rewrite of the file or of database pages; the whole
/// file is rewritten only by `rewrite` (compaction, decided by the owner), atomically.
///
/// The file is `magic` then frames `u32 length | u32 crc32 | body` (`FrameFile`, the format the
/// uploader's queue segments share). Reading stops at the first frame that does not fit the
/// file, is empty (a body always has its kind byte: a head of zeros is a tail a crash left
/// zero-filled), is longer than `maxFrameBytes` or fails its crc (`FrameFile.Damage.endsFile`): a torn
/// tail (a write a crash or power cut cut short), and the file is truncated there so the next
/// append follows the last whole frame. What survives is therefore always a prefix of the
/// frames appended.
///
/// Durability: `commit` returns once the bytes are in the kernel (they survive `kill -9` of the
/// process); `sync` (`fdatasync`) makes them survive an OS crash or power cut. I/O shell only:
/// what the frames mean is the owner's.
public final class AppendLog {
    /// The longest frame body read back or written (a longer length field is a torn tail).
    public static let maxFrameBytes = 64 << 20
    /// The largest file opened (its owner compacts long before; a larger one is refused with
    /// `EFBIG`, not read into memory).
    public static let maxFileBytes = 256 << 20
    public static let headBytes = FrameFile.headBytes

    public let path: String
    let magic: [UInt8]
    private var fd: Int32 = -1
    /// The file's size: magic and every whole frame written.
    public private(set) var bytes = 0
    /// Frames appended and not yet committed (one `write` at `commit`).
    private var pending: [UInt8] = []
    /// Bytes dropped at open: a torn tail.
    public private(set) var truncatedBytes = 0

    /// Opens `path` (creating it with `magic`), calls `frame` with each whole frame's body in
    /// order and truncates a torn tail. A file whose first bytes are not `magic` is refused. The
    /// file is a state file: created 0600, never through a symlink, and one left looser by an
    /// earlier run is tightened to 0600 (logged on `log`).
    public init(path: String, magic: [UInt8], log: Log = Log("store"), _ frame: (UnsafeRawBufferPointer) -> Void) throws(IOError) {
        self.path = path
        self.magic = magic
        fd = try System.syscall("open \(path)") { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, StateFile.mode) }
        StateFile.tighten(fd: fd, path: path)?.report(to: log)
        do throws(IOError) {
            let data = try System.readFile(atPath: path, maxBytes: Self.maxFileBytes)
            if data.isEmpty {
                try writeAll(magic)
                bytes = magic.count
                return
            }
            guard data.count >= magic.count, Array(data[0..<magic.count]) == magic else {
                throw IOError(errnoCode: EINVAL, reason: "\(path) is not a log of this kind")
            }
            let at = data.withUnsafeBytes { b in
                FrameFile.scan(b, from: magic.count, maxBodyBytes: Self.maxFrameBytes, damage: .endsFile) {
                    body, _ -> Void? in
                    frame(body)
                    return ()
                }.validEnd
            }
            bytes = at
            truncatedBytes = data.count - at
            if truncatedBytes > 0 { _ = try System.syscall("ftruncate \(path)") { ftruncate(fd, off_t(at)) } }
            _ = try System.syscall("lseek \(path)") { lseek(fd, off_t(at), SEEK_SET) }
        } catch {
            Glibc.close(fd)
            throw error
        }
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    /// Queues one frame; `commit` writes every queued frame with one `write`.
    public func append(_ body: [UInt8]) {
        Self.frame(body, into: &pending)
    }

    public var hasPending: Bool { !pending.isEmpty }

    /// Writes the queued frames (one `write`). On failure the file is cut back to its last whole
    /// frame and the frames are dropped; when it cannot be cut back, what the write left is
    /// overwritten with zeros (a head of zeros ends the frames read back), and the next commit
    /// writes from the last whole frame again.
    public func commit() throws(IOError) {
        guard !pending.isEmpty else { return }
        let out = pending
        pending.removeAll(keepingCapacity: true)
        do throws(IOError) {
            try writeAll(out)
            bytes += out.count
        } catch {
            if ftruncate(fd, off_t(bytes)) != 0 {
                let zeros = [UInt8](repeating: 0, count: out.count)
                // Nothing more to do when this fails too: the frames it left may be read back.
                _ = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress!, zeros.count, off_t(bytes)) }
            }
            // The offset of the next write; `lseek` of an open regular file does not fail.
            _ = lseek(fd, off_t(bytes), SEEK_SET)
            throw error
        }
    }

    /// `fdatasync`: what was committed survives an OS crash or power cut.
    public func sync() throws(IOError) {
        _ = try System.syscall("fdatasync \(path)") { fdatasync(fd) }
    }

    /// Replaces the file with `magic` and `bodies` (a new file, fsynced and renamed over it) and
    /// appends there afterwards. Frames queued and not committed are dropped.
    public func rewrite(_ bodies: [[UInt8]]) throws(IOError) {
        var out = magic
        for b in bodies { Self.frame(b, into: &out) }
        try System.writeFileAtomically(atPath: path, contents: out)
        let nfd = try System.syscall("open \(path)") { open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW) }
        do throws(IOError) {
            _ = try System.syscall("lseek \(path)") { lseek(nfd, off_t(out.count), SEEK_SET) }
        } catch {
            Glibc.close(nfd)
            throw error
        }
        Glibc.close(fd)
        fd = nfd
        bytes = out.count
        pending.removeAll(keepingCapacity: true)
    }

    private func writeAll(_ out: [UInt8]) throws(IOError) {
        var off = 0
        while off < out.count {
            let n = try System.syscall("write \(path)") { out.withUnsafeBytes { write(fd, $0.baseAddress! + off, out.count - off) } }
            off += n
        }
    }

    // MARK: Frames (pure)

    /// Appends a frame of `body` to `out` (`FrameFile.frame`).
    public static func frame(_ body: [UInt8], into out: inout [UInt8]) { FrameFile.frame(body, into: &out) }
}

/// Writes a frame body: unsigned LEB128 varints, strings as a varint length and their UTF-8.
public struct FrameWriter {
    public private(set) var bytes: [UInt8] = []
    public init(kind: UInt8) { bytes.append(kind) }

    public mutating func varint(_ v: UInt64) { Self.varint(v, to: &bytes) }
    /// A signed value (zigzag).
    public mutating func int(_ v: Int64) { varint(UInt64(bitPattern: (v << 1) ^ (v >> 63))) }
    public mutating func string(_ s: String) { Self.string(s, to: &bytes) }

    /// Appends `v` as an unsigned LEB128 varint to `out` (a body written in place, as the
    /// uploader's segment frames are).
    public static func varint(_ v: UInt64, to out: inout [UInt8]) {
        var v = v
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    /// Appends `s` as its UTF-8 length (a varint) and bytes to `out`.
    public static func string(_ s: String, to out: inout [UInt8]) {
        var s = s
        s.withUTF8 { u in
            varint(UInt64(u.count), to: &out)
            out.append(contentsOf: u)
        }
    }
}

/// Reads what `FrameWriter` wrote; nil from any read past the end or of a malformed value (a
/// frame that passed its crc but does not parse is the owner's to skip).
public struct FrameReader {
    let b: UnsafeRawBufferPointer
    /// The offset in the body of the next byte read.
    public private(set) var at: Int
    public init(_ b: UnsafeRawBufferPointer, at: Int = 0) {
        self.b = b
        self.at = at
    }

    public var atEnd: Bool { at >= b.count }

    public mutating func byte() -> UInt8? {
        guard at < b.count else { return nil }
        defer { at += 1 }
        return b[at]
    }
    public mutating func varint() -> UInt64? {
        var v: UInt64 = 0
        var shift: UInt64 = 0
        while let c = byte() {
            guard shift < 64 else { return nil }
            v |= UInt64(c & 0x7F) << shift
            if c < 0x80 { return v }
            shift += 7
        }
        return nil
    }
    public mutating func int() -> Int64? {
        guard let u = varint() else { return nil }
        return Int64(bitPattern: u >> 1) ^ -Int64(bitPattern: u & 1)
    }
    public mutating func string() -> String? {
        guard let n = varint(), n <= UInt64(b.count - at) else { return nil }
        let s = String(decoding: UnsafeRawBufferPointer(rebasing: b[at..<(at + Int(n))]), as: UTF8.self)
        at += Int(n)
        return s
    }
}
