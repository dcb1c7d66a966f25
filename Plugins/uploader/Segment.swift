import CZlib
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The frames of the queue's segment files (docs/UPLOADER.md "On disk"), as pure values: what a
/// frame holds, its bytes, and reading a segment's bytes back into frames. No I/O here
/// (`SegmentLog` is the file side).
///
/// A frame is `u32 length | u32 crc32 | body`, both little-endian; `length` counts the body,
/// `crc32` (zlib's) covers the body. The body's first byte is its kind; integers in it are
/// unsigned LEB128 varints and strings a varint length then their UTF-8 bytes.
enum Frame: Equatable {
    /// Declares lane `id` of this segment: records of `stream` stored under switch `consent`.
    /// Every segment declares the lanes its record frames use before them.
    case lane(id: UInt64, stream: String, consent: String)
    /// Records of one lane: positions `first`, `first + deltas[0]`, …; `lengths` are the
    /// records' text lengths; the texts follow in the upload body's form, joined by commas
    /// (`{"id":…,"ts":…,"data":…},{…}`), so a batch body is these bytes copied.
    case records(lane: UInt64, first: Int64, enqueuedMs: Int64, deltas: [UInt64], lengths: [Int], textStart: Int)
    /// Records of one lane as `records`, their texts (`lengths` are the uncompressed ones, joined
    /// by commas as there) one raw-deflate chunk from `dataStart` to the frame's end: the output
    /// of the lane's running deflate stream, ended with a sync flush whose final empty stored
    /// block (`00 00 ff ff`) is left off. `seq` numbers the frames of one context (a run of the
    /// lane's packed frames in one segment, decodable only in order): 0 starts a new context,
    /// and a frame whose `seq` is not its lane's previous one plus 1 breaks the context (one
    /// lost in between). `docs/UPLOADER.md` "On disk".
    case packed(lane: UInt64, first: Int64, enqueuedMs: Int64, deltas: [UInt64], lengths: [Int], seq: UInt64, dataStart: Int)
    /// A batch: every record of `stream` whose position is in one of `runs` (closed ranges)
    /// belongs to batch `key`. `seq` orders batches as they were cut.
    case cut(key: String, stream: String, final: Bool, seq: UInt64, createdMs: Int64, runs: [ClosedRange<Int64>])
    /// These batches are final (consent denied: sent once, then purged).
    case final([String])
    /// These batches are gone: delivered, purged or set aside; `zeroed`: their texts were
    /// overwritten with zeros.
    case done(keys: [String], zeroed: Bool)
    /// These batches are dissolved: their records are queued again at their places.
    case unbatch([String])
    /// These batches are gone (as `done`), each with its stream and runs, so the records end
    /// even when the segment holding the batch's cut frame was removed first. Written instead of
    /// `done`.
    case ended([Ended], zeroed: Bool)

    struct Ended: Equatable {
        var key: String
        var stream: String
        var runs: [ClosedRange<Int64>]
    }

    static let headBytes = 8
    /// The first bytes of every segment file: magic and format.
    static let segmentMagic = Array("PYLQSEG1".utf8)

    enum Kind: UInt8 {
        case lane = 1, records = 2, cut = 3, final = 4, done = 5, unbatch = 6, ended = 7, packed = 8
    }

    /// The length of a records or packed frame's texts joined by commas (`lengths`: each text's).
    static func textBytes(_ lengths: [Int]) -> Int { lengths.reduce(lengths.count - 1, +) }

    /// The uncompressed texts of one packed frame are at most this many bytes (a chunk is cut
    /// at `Chunk.targetBytes` plus one record): a frame claiming more is not one.
    static let maxPackedTextBytes = 64 << 20

    // MARK: Writing

    /// Appends a frame whose body is what `body` writes: the head is patched afterwards.
    static func append(to out: inout [UInt8], _ body: (inout [UInt8]) -> Void) {
        let start = out.count
        out.append(contentsOf: [0, 0, 0, 0, 0, 0, 0, 0])
        body(&out)
        seal(&out, at: start)
    }

    /// Writes the head (length and crc32 of the body) of the frame starting at `start`.
    static func seal(_ out: inout [UInt8], at start: Int) {
        let n = out.count - start - headBytes
        let crc = out.withUnsafeBytes { crc32(of: UnsafeRawBufferPointer(rebasing: $0[(start + headBytes)...])) }
        putU32(&out, at: start, UInt32(n))
        putU32(&out, at: start + 4, crc)
    }

    static func crc32(of b: UnsafeRawBufferPointer) -> UInt32 {
        UInt32(truncatingIfNeeded: CZlib.crc32(0, b.baseAddress?.assumingMemoryBound(to: Bytef.self), uInt(b.count)))
    }

    static func appendLane(_ out: inout [UInt8], id: UInt64, stream: String, consent: String) {
        append(to: &out) {
            $0.append(Kind.lane.rawValue)
            varint(&$0, id)
            string(&$0, stream)
            string(&$0, consent)
        }
    }

    /// A records frame for `chunk`'s records at `positions` (ascending); returns where each
    /// record's text starts in `out`.
    static func appendRecords(
        _ out: inout [UInt8], lane: UInt64, positions: [Int64], enqueuedMs: Int64, chunk: Chunk
    ) -> [Int] {
        var starts: [Int] = []
        starts.reserveCapacity(chunk.count)
        append(to: &out) { o in
            o.append(Kind.records.rawValue)
            varint(&o, lane)
            varint(&o, UInt64(bitPattern: positions[0]))
            varint(&o, UInt64(bitPattern: max(0, enqueuedMs)))
            varint(&o, UInt64(chunk.count))
            for i in 1..<max(1, positions.count) { varint(&o, UInt64(positions[i] - positions[i - 1])) }
            chunk.index.withUnsafeBytes { ix in
                for i in 0..<chunk.count { varint(&o, UInt64(Chunk.span(ix, i).count)) }
                let base = o.count
                for i in 0..<chunk.count { starts.append(base + Chunk.span(ix, i).lowerBound) }
            }
            o.append(contentsOf: chunk.body)
        }
        return starts
    }

    /// A packed frame for `chunk`'s records at `positions`, its texts deflated by `stream`
    /// (frame `seq` of its context: `stream` was reset for 0).
    static func appendPacked(
        _ out: inout [UInt8], lane: UInt64, positions: [Int64], enqueuedMs: Int64, chunk: Chunk, seq: UInt64, stream: Deflater
    ) throws {
        let start = out.count
        out.append(contentsOf: [0, 0, 0, 0, 0, 0, 0, 0])
        out.append(Kind.packed.rawValue)
        varint(&out, lane)
        varint(&out, UInt64(bitPattern: positions[0]))
        varint(&out, UInt64(bitPattern: max(0, enqueuedMs)))
        varint(&out, UInt64(chunk.count))
        for i in 1..<max(1, positions.count) { varint(&out, UInt64(positions[i] - positions[i - 1])) }
        chunk.index.withUnsafeBytes { ix in
            for i in 0..<chunk.count { varint(&out, UInt64(Chunk.span(ix, i).count)) }
        }
        varint(&out, seq)
        try stream.deflate(chunk.body, into: &out)
        seal(&out, at: start)
    }

    static func appendCut(
        _ out: inout [UInt8], key: String, stream: String, final: Bool, seq: UInt64, createdMs: Int64, runs: [ClosedRange<Int64>]
    ) {
        append(to: &out) {
            $0.append(Kind.cut.rawValue)
            string(&$0, key)
            string(&$0, stream)
            $0.append(final ? 1 : 0)
            varint(&$0, seq)
            varint(&$0, UInt64(bitPattern: max(0, createdMs)))
            varint(&$0, UInt64(runs.count))
            for r in runs {
                varint(&$0, UInt64(bitPattern: r.lowerBound))
                varint(&$0, UInt64(r.upperBound - r.lowerBound))
            }
        }
    }

    static func appendEnded(_ out: inout [UInt8], _ entries: [Ended], zeroed: Bool) {
        append(to: &out) {
            $0.append(Kind.ended.rawValue)
            $0.append(zeroed ? 1 : 0)
            varint(&$0, UInt64(entries.count))
            for e in entries {
                string(&$0, e.key)
                string(&$0, e.stream)
                varint(&$0, UInt64(e.runs.count))
                for r in e.runs {
                    varint(&$0, UInt64(bitPattern: r.lowerBound))
                    varint(&$0, UInt64(r.upperBound - r.lowerBound))
                }
            }
        }
    }

    static func appendKeys(_ out: inout [UInt8], _ kind: Kind, _ keys: [String], zeroed: Bool = false) {
        append(to: &out) {
            $0.append(kind.rawValue)
            if kind == .done { $0.append(zeroed ? 1 : 0) }
            varint(&$0, UInt64(keys.count))
            for k in keys { string(&$0, k) }
        }
    }

    static func varint(_ out: inout [UInt8], _ v: UInt64) {
        var v = v
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    static func string(_ out: inout [UInt8], _ s: String) {
        varint(&out, UInt64(s.utf8.count))
        out.append(contentsOf: s.utf8)
    }

    static func putU32(_ out: inout [UInt8], at i: Int, _ v: UInt32) {
        out[i] = UInt8(truncatingIfNeeded: v)
        out[i + 1] = UInt8(truncatingIfNeeded: v >> 8)
        out[i + 2] = UInt8(truncatingIfNeeded: v >> 16)
        out[i + 3] = UInt8(truncatingIfNeeded: v >> 24)
    }

    // MARK: Reading

    /// A frame found in a segment's bytes: where it starts, its whole length (head included),
    /// whether its crc32 matched, and what it says (nil when its body cannot be decoded).
    struct Found {
        var offset: Int
        var length: Int
        var crcOK: Bool
        var frame: Frame?
    }

    /// The frames of a segment's bytes and where its valid part ends: reading stops at the first
    /// frame that does not fit the file or whose crc and every later frame's fail (a torn
    /// tail: the caller truncates there). A frame that fits, fails its crc and is followed by
    /// frames that pass is kept with `crcOK == false` (an overwrite of purged records that a
    /// crash interrupted, or damage): its head is intact, since nothing rewrites a length.
    static func scan(_ b: UnsafeRawBufferPointer, from start: Int) -> (frames: [Found], validEnd: Int) {
        var out: [Found] = []
        var at = start
        var pendingBad: [Found] = []
        var validEnd = start
        while at + headBytes <= b.count {
            let n = Int(Chunk.u32(b, at))
            guard n > 0, at + headBytes + n <= b.count else { break }
            let body = UnsafeRawBufferPointer(rebasing: b[(at + headBytes)..<(at + headBytes + n)])
            let ok = crc32(of: body) == Chunk.u32(b, at + 4)
            let f = Found(offset: at, length: headBytes + n, crcOK: ok, frame: decode(body, bodyStart: at + headBytes))
            if ok && f.frame != nil {
                out += pendingBad
                pendingBad.removeAll()
                out.append(f)
                validEnd = at + f.length
            } else {
                pendingBad.append(f)
            }
            at += headBytes + n
        }
        return (out, validEnd)
    }

    /// A frame's body (starting at file offset `bodyStart`); nil when it is not one.
    static func decode(_ b: UnsafeRawBufferPointer, bodyStart: Int) -> Frame? {
        var r = Reader(b: b, at: 1)
        guard let first = b.first, let kind = Kind(rawValue: first) else { return nil }
        switch kind {
        case .lane:
            guard let id = r.varint(), let s = r.string(), let c = r.string(), r.at == b.count else { return nil }
            return .lane(id: id, stream: s, consent: c)
        case .records, .packed:
            let packed = kind == .packed
            guard let lane = r.varint(), let first = r.varint(), let ms = r.varint(), let count = r.varint(),
                count > 0, count <= UInt64(b.count)
            else { return nil }
            var deltas: [UInt64] = []
            for _ in 1..<count {
                guard let d = r.varint(), d > 0 else { return nil }
                deltas.append(d)
            }
            var lengths: [Int] = []
            var total = 0
            let most = UInt64(packed ? maxPackedTextBytes : b.count)
            for _ in 0..<count {
                guard let l = r.varint(), l > 0, l < most else { return nil }
                lengths.append(Int(l))
                total += Int(l)
            }
            if packed {
                guard let seq = r.varint(), total + Int(count) - 1 <= maxPackedTextBytes, r.at < b.count else { return nil }
                return .packed(
                    lane: lane, first: Int64(bitPattern: first), enqueuedMs: Int64(bitPattern: ms), deltas: deltas, lengths: lengths,
                    seq: seq, dataStart: bodyStart + r.at)
            }
            guard r.at + total + Int(count) - 1 == b.count else { return nil }
            return .records(
                lane: lane, first: Int64(bitPattern: first), enqueuedMs: Int64(bitPattern: ms), deltas: deltas, lengths: lengths,
                textStart: bodyStart + r.at)
        case .cut:
            guard let key = r.string(), let stream = r.string(), let fin = r.byte(), let seq = r.varint(), let ms = r.varint(),
                let n = r.varint(), n <= UInt64(b.count)
            else { return nil }
            var runs: [ClosedRange<Int64>] = []
            for _ in 0..<n {
                guard let a = r.varint(), let d = r.varint(), a < UInt64(Int64.max / 2), d < UInt64(Int64.max / 2) else { return nil }
                runs.append(Int64(a)...Int64(a + d))
            }
            guard r.at == b.count else { return nil }
            return .cut(key: key, stream: stream, final: fin != 0, seq: seq, createdMs: Int64(bitPattern: ms), runs: runs)
        case .ended:
            guard let z = r.byte(), let n = r.varint(), n <= UInt64(b.count) else { return nil }
            var entries: [Ended] = []
            for _ in 0..<n {
                guard let key = r.string(), let stream = r.string(), let k = r.varint(), k <= UInt64(b.count) else { return nil }
                var runs: [ClosedRange<Int64>] = []
                for _ in 0..<k {
                    guard let a = r.varint(), let d = r.varint(), a < UInt64(Int64.max / 2), d < UInt64(Int64.max / 2) else { return nil }
                    runs.append(Int64(a)...Int64(a + d))
                }
                entries.append(Ended(key: key, stream: stream, runs: runs))
            }
            guard r.at == b.count else { return nil }
            return .ended(entries, zeroed: z != 0)
        case .final, .unbatch, .done:
            var zeroed = false
            if kind == .done {
                guard let z = r.byte() else { return nil }
                zeroed = z != 0
            }
            guard let n = r.varint(), n <= UInt64(b.count) else { return nil }
            var keys: [String] = []
            for _ in 0..<n {
                guard let k = r.string() else { return nil }
                keys.append(k)
            }
            guard r.at == b.count else { return nil }
            switch kind {
            case .final: return .final(keys)
            case .unbatch: return .unbatch(keys)
            default: return .done(keys: keys, zeroed: zeroed)
            }
        }
    }

    struct Reader {
        let b: UnsafeRawBufferPointer
        var at: Int

        mutating func byte() -> UInt8? {
            guard at < b.count else { return nil }
            defer { at += 1 }
            return b[at]
        }

        mutating func varint() -> UInt64? {
            var v: UInt64 = 0
            var shift: UInt64 = 0
            while at < b.count, shift < 64 {
                let c = b[at]
                at += 1
                v |= UInt64(c & 0x7f) << shift
                if c & 0x80 == 0 { return v }
                shift += 7
            }
            return nil
        }

        mutating func string() -> String? {
            guard let n = varint(), n <= UInt64(b.count - at) else { return nil }
            let s = String(decoding: UnsafeRawBufferPointer(rebasing: b[at..<(at + Int(n))]), as: UTF8.self)
            at += Int(n)
            return s
        }
    }
}

/// A lane's running raw-deflate stream in the active segment (the writer of packed frames):
/// `windowBits` and `memLevel` small, so a lane costs `memoryBytes` (docs/UPLOADER.md).
final class Deflater {
    /// zlib's level 3 (its fast strategy): within a byte per record of level 9 on near-identical
    /// records, at about half the CPU of level 6.
    static let level: Int32 = 3
    /// A 4 KiB window: some twenty records of a device's event back, all a record repeats.
    static let windowBits: Int32 = 12
    static let memLevel: Int32 = 2
    /// What zlib allocates for one stream: `(1 << (windowBits + 2)) + (1 << (memLevel + 9))`
    /// plus its state (about 6 KiB).
    static let memoryBytes = (1 << (Int(windowBits) + 2)) + (1 << (Int(memLevel) + 9)) + 6 * 1024
    /// The sync flush's final empty stored block, left off every frame and put back to inflate.
    static let syncTail: [UInt8] = [0, 0, 0xff, 0xff]

    private let s: UnsafeMutablePointer<z_stream>

    init() throws {
        s = .allocate(capacity: 1)
        s.initialize(to: z_stream())
        let rc = deflateInit2_(
            s, Deflater.level, Z_DEFLATED, -Deflater.windowBits, Deflater.memLevel, Z_DEFAULT_STRATEGY, zlibVersion(),
            Int32(MemoryLayout<z_stream>.size))
        guard rc == Z_OK else {
            s.deallocate()
            throw QueueError(message: "deflateInit2 failed (\(rc))")
        }
    }

    deinit {
        deflateEnd(s)
        s.deallocate()
    }

    /// Starts a new context: what follows decodes without what came before.
    func reset() { deflateReset(s) }

    /// Appends `input` deflated and sync-flushed to `out`, the sync tail left off.
    func deflate(_ input: [UInt8], into out: inout [UInt8]) throws {
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
        else { throw QueueError(message: "deflate failed (\(rc))") }
        out.removeLast(room - produced + 4)
    }
}

/// The reader of packed frames: one raw-inflate stream, fed a context's frames in order.
final class Inflater {
    private let s: UnsafeMutablePointer<z_stream>

    init() throws {
        s = .allocate(capacity: 1)
        s.initialize(to: z_stream())
        // The largest window: reads whatever window the writer used.
        let rc = inflateInit2_(s, -15, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
        guard rc == Z_OK else {
            s.deallocate()
            throw QueueError(message: "inflateInit2 failed (\(rc))")
        }
    }

    deinit {
        inflateEnd(s)
        s.deallocate()
    }

    func reset() { inflateReset(s) }

    /// The `expected` bytes `payload` (a packed frame's deflated texts) inflates to, after the
    /// frames of its context before it; nil when it does not (zeroed, damaged, or out of order).
    func inflate(_ payload: UnsafeRawBufferPointer, expected: Int) -> [UInt8]? {
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

/// The packed contexts of one segment followed frame by frame in file order (the replay, and
/// the tests that look for what a file still gives up): per lane one inflate stream, where its
/// context starts and the `seq` it expects next. A frame that is not its lane's next, fails its
/// crc or does not inflate to its texts breaks the rest of its context, up to the next `seq` 0.
struct PackedContexts {
    struct Context {
        let inflater: Inflater
        /// The offset of the context's first frame.
        var start: Int
        var seq: UInt64
        var broken: Bool
    }

    private(set) var lanes: [UInt64: Context] = [:]

    /// The texts (joined by commas) of packed frame `seq` of `lane` at `offset`, whose deflated
    /// payload is `payload`; nil when its context cannot read it.
    mutating func texts(
        lane: UInt64, seq: UInt64, offset: Int, crcOK: Bool, payload: UnsafeRawBufferPointer, lengths: [Int]
    ) throws -> [UInt8]? {
        if seq == 0 {
            if let c = lanes[lane] {
                c.inflater.reset()
                lanes[lane] = Context(inflater: c.inflater, start: offset, seq: 0, broken: false)
            } else {
                lanes[lane] = Context(inflater: try Inflater(), start: offset, seq: 0, broken: false)
            }
        }
        guard var c = lanes[lane] else { return nil }
        var texts: [UInt8]?
        if crcOK, !c.broken, c.seq == seq { texts = c.inflater.inflate(payload, expected: Frame.textBytes(lengths)) }
        c.broken = texts == nil
        c.seq = seq + 1
        lanes[lane] = c
        return texts
    }
}

/// The segment files of the queue: `<dir>/<number>.seg`, numbered upwards from 1 (ten decimal
/// digits), mode 0600 in a directory of mode 0700. Records and the batch ledger are appended to
/// the newest (the active one); a full one is closed and the next one started; the oldest is
/// removed once nothing in it is live (`UploaderStore.reclaim`). Loop thread only.
///
/// A segment file that cannot be read as one (a symlink, a directory or anything not a regular
/// file, a file this user cannot open or read, one without the segment magic) is quarantined
/// at open: renamed `<number>.seg.quarantined` beside it, never followed or opened through a
/// link, and the queue goes on without it (docs/UPLOADER.md "Quarantine").
final class SegmentLog {
    let dir: String
    /// An active segment holding at least this many bytes is closed before the next append.
    let maxSegmentBytes: Int
    let fsyncEveryAppend: Bool
    /// Segment number → its size on disk.
    private(set) var sizes: [UInt32: Int] = [:]
    private(set) var active: UInt32 = 0
    private var fds: [UInt32: Int32] = [:]
    /// Tests: the next append fails with this error before writing anything.
    var failNextAppend: IOError?

    /// A segment file set aside: its name in the queue directory now, and why.
    struct Quarantined: Equatable {
        var file: String
        var reason: String
    }

    /// What a quarantined file's name gets: `0000000900.seg.quarantined` (then `.2`, `.3`, …
    /// when that name is taken). The queue's `lock`, when it is not a regular file, is set
    /// aside the same way (`lock.quarantined`) and made anew.
    static let quarantineSuffix = ".quarantined"
    /// At most this many files of one segment's name are kept aside; one more is refused (the
    /// queue does not open until an operator clears them).
    static let maxQuarantinedPerName = 100
    /// The files this open set aside (each logged once, by the uploader).
    private(set) var quarantinedNow: [Quarantined] = []
    /// The names of every file set aside in the queue directory (this open's and earlier
    /// ones' until an operator removes them), sorted.
    private(set) var quarantinedFiles: [String] = []
    /// Segment files this open tightened to `StateFile.mode` (each logged once, by the uploader).
    private(set) var tightened: [StateFile.Tightened] = []

    /// Bytes of every segment file.
    var fileBytes: Int { sizes.values.reduce(0, +) }
    var numbers: [UInt32] { sizes.keys.sorted() }

    /// How long an open waits for the queue's lock: an uploader whose host was killed may still
    /// be running for a moment while its successor starts.
    static let lockWaitMs = 10_000
    /// `<dir>/lock`, held (`flock`, exclusive) while this log is open: one process at a time
    /// appends, replays and removes segments.
    private var lockFD: Int32

    init(dir: String, maxSegmentBytes: Int, fsyncEveryAppend: Bool, lockWaitMs: Int = SegmentLog.lockWaitMs) throws {
        self.dir = dir
        self.maxSegmentBytes = maxSegmentBytes
        self.fsyncEveryAppend = fsyncEveryAppend
        try System.createDirectories(atPath: dir, mode: 0o700)
        _ = chmod(dir, 0o700)
        let lock = dir + "/lock"
        // A lock that is not a regular file (a planted symlink or directory) is set aside too:
        // no process could have locked it, since each opens it with O_NOFOLLOW.
        var lockAside: Quarantined?
        var f = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, StateFile.mode)
        var unusable: String?
        var st = stat()
        if f < 0, errno == ELOOP || errno == EISDIR || errno == ENXIO {
            unusable = errno == EISDIR ? "a directory" : errno == ELOOP ? "a symbolic link" : "not a regular file"
        } else if f >= 0, fstat(f, &st) == 0, st.st_mode & S_IFMT != S_IFREG {
            Glibc.close(f)
            unusable = "not a regular file"
        }
        if let reason = unusable {
            lockAside = Quarantined(file: try SegmentLog.setAside(lock, in: dir, reason: reason), reason: reason)
            f = open(lock, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, StateFile.mode)
        }
        guard f >= 0 else { throw IOError(errnoCode: errno, reason: "open \(lock)") }
        lockFD = f
        quarantinedNow += lockAside.map { [$0] } ?? []
        if let t = StateFile.tighten(fd: lockFD, path: lock) { tightened.append(t) }
        var waited = 0
        while flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            guard e == EWOULDBLOCK || e == EINTR, waited < lockWaitMs else {
                Glibc.close(lockFD)
                throw IOError(errnoCode: e, reason: "lock \(lock): another process holds the queue")
            }
            var ts = timespec(tv_sec: 0, tv_nsec: 20_000_000)
            _ = nanosleep(&ts, nil)
            waited += 20
        }
        for n in try SegmentLog.list(dir) {
            if let reason = try openExisting(n) { try quarantine(n, reason: reason) }
        }
        quarantinedFiles = try SegmentLog.listQuarantined(dir)
        active = sizes.keys.max() ?? 0
    }

    /// Checks that existing segment `n` opens for reading and appending, never through a
    /// symlink, and tightens its mode; returns why it cannot be used (nil: it can). A shortage
    /// of descriptors or memory throws: it says nothing about the file.
    private func openExisting(_ n: UInt32) throws -> String? {
        let p = path(n)
        var st = stat()
        guard lstat(p, &st) == 0 else { return "lstat: " + String(cString: strerror(errno)) }
        guard st.st_mode & S_IFMT == S_IFREG else { return SegmentLog.kind(st.st_mode) }
        let f = open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard f >= 0 else {
            let e = errno
            if SegmentLog.transientErrnos.contains(e) { throw IOError(errnoCode: e, reason: "open \(p)") }
            return "open: " + String(cString: strerror(e))
        }
        defer { Glibc.close(f) }
        guard fstat(f, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { return SegmentLog.kind(st.st_mode) }
        if let t = StateFile.tighten(fd: f, path: p) { tightened.append(t) }
        sizes[n] = Int(st.st_size)
        return nil
    }

    /// Failures of the process, not of a file: never a reason to set a segment aside.
    static let transientErrnos: Set<Int32> = [EMFILE, ENFILE, ENOMEM, EINTR, EAGAIN]

    /// Whether `error` is one of `transientErrnos`.
    static func isTransient(_ error: any Error) -> Bool {
        (error as? IOError).map { transientErrnos.contains($0.errnoCode) } ?? false
    }

    /// What a file that is not a regular one is, for the quarantine's reason.
    private static func kind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFLNK: return "a symbolic link"
        case S_IFDIR: return "a directory"
        default: return "not a regular file"
        }
    }

    /// Sets segment `n` aside (`<name>.quarantined`): closed, forgotten, renamed (the name
    /// itself: a symlink is moved, never followed), the directory fsynced. The queue goes on
    /// without it; what it held is lost to the queue.
    func quarantine(_ n: UInt32, reason: String) throws {
        if let f = fds.removeValue(forKey: n) { Glibc.close(f) }
        sizes[n] = nil
        let name = try SegmentLog.setAside(path(n), in: dir, reason: reason)
        quarantinedNow.append(Quarantined(file: name, reason: reason))
        quarantinedFiles = (quarantinedFiles + [name]).sorted()
        if active == n { active = sizes.keys.max() ?? 0 }
    }

    /// Renames `from` (a name in `dir`) to `<name>.quarantined` (`.2`, … when taken) and
    /// fsyncs `dir`; returns the new name.
    private static func setAside(_ from: String, in dir: String, reason: String) throws -> String {
        let base = from + quarantineSuffix
        var to = base
        var st = stat()
        var k = 1
        while lstat(to, &st) == 0 {
            k += 1
            guard k <= maxQuarantinedPerName else {
                throw QueueError(message: "\(from): cannot be read (\(reason)) and \(k - 1) files of its name are quarantined already")
            }
            to = base + ".\(k)"
        }
        _ = try System.syscall("rename \(from)") { rename(from, to) }
        let d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if d >= 0 {
            _ = fsync(d)
            Glibc.close(d)
        }
        return String(to.dropFirst(dir.count + 1))
    }

    /// Names of the files set aside in `dir` (`*.quarantined`, `*.quarantined.N`).
    static func listQuarantined(_ dir: String) throws -> [String] {
        guard let d = opendir(dir) else { throw IOError(errnoCode: errno, reason: "opendir \(dir)") }
        defer { closedir(d) }
        var out: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name.hasSuffix(quarantineSuffix) || name.contains(quarantineSuffix + ".") { out.append(name) }
        }
        return out.sorted()
    }

    func path(_ n: UInt32) -> String {
        let digits = String(n)
        return dir + "/" + String(repeating: "0", count: max(0, 10 - digits.count)) + digits + ".seg"
    }

    static func list(_ dir: String) throws -> [UInt32] {
        guard let d = opendir(dir) else { throw IOError(errnoCode: errno, reason: "opendir \(dir)") }
        defer { closedir(d) }
        var out: [UInt32] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            guard name.hasSuffix(".seg"), name.count == 14, let n = UInt32(name.dropLast(4)), n > 0 else { continue }
            out.append(n)
        }
        return out.sorted()
    }

    /// The whole file of segment `n` as its size was at open (at start-up, and for a
    /// compaction), never through a symlink.
    func read(_ n: UInt32) throws -> [UInt8] {
        if fds[n] != nil { return try read(n, 0..<(sizes[n] ?? 0)) }
        // Not kept open: the replay reads every segment once, most are never written again.
        let f = try System.syscall("open \(path(n))") { open(path(n), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        defer { Glibc.close(f) }
        return try read(f, n, 0..<(sizes[n] ?? 0))
    }

    private func fd(_ n: UInt32) throws -> Int32 {
        if let f = fds[n] { return f }
        let f = try System.syscall("open \(path(n))") { open(path(n), O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        fds[n] = f
        return f
    }

    /// Cuts segment `n` back to `size` bytes (a torn tail found at start-up, or a failed append).
    func truncate(_ n: UInt32, to size: Int) throws {
        let f = try fd(n)
        _ = try System.syscall("ftruncate \(path(n))") { ftruncate(f, off_t(size)) }
        sizes[n] = size
    }

    /// Whether the next append of `bytes` starts a new segment.
    func needsNewSegment(for bytes: Int) -> Bool {
        guard active != 0, let size = sizes[active] else { return true }
        return size > Frame.segmentMagic.count && size + bytes > maxSegmentBytes
    }

    /// Closes the active segment (fdatasync: it is never written again) and starts the next.
    func startSegment() throws {
        if active != 0, let f = fds[active] { _ = try System.syscall("fdatasync") { fdatasync(f) } }
        let n = active + 1
        let f = try System.syscall("create \(path(n))") { open(path(n), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        fds[n] = f
        _ = fchmod(f, 0o600)
        try writeAll(f, Frame.segmentMagic, at: 0, n)
        _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) }
        syncDirectory()
        sizes[n] = Frame.segmentMagic.count
        active = n
    }

    /// Appends `bytes` to the active segment with one write (and one fdatasync with `fsync:
    /// full`, or when `sync`); returns the offset they start at. A failed append leaves the
    /// segment as it was.
    @discardableResult
    func append(_ bytes: [UInt8], sync: Bool = false) throws -> Int {
        if let e = failNextAppend {
            failNextAppend = nil
            throw e
        }
        if active == 0 { try startSegment() }
        let n = active
        let f = try fd(n)
        let at = sizes[n]!
        do {
            try writeAll(f, bytes, at: at, n)
            if fsyncEveryAppend || sync { _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) } }
        } catch {
            _ = ftruncate(f, off_t(at))
            throw error
        }
        sizes[n] = at + bytes.count
        return at
    }

    private func writeAll(_ f: Int32, _ bytes: [UInt8], at: Int, _ n: UInt32) throws {
        var off = 0
        while off < bytes.count {
            let w = try System.syscall("write \(path(n))") {
                bytes.withUnsafeBytes { pwrite(f, $0.baseAddress! + off, bytes.count - off, off_t(at + off)) }
            }
            off += w
        }
    }

    /// Bytes `range` of segment `n`.
    func read(_ n: UInt32, _ range: Range<Int>) throws -> [UInt8] { try read(try fd(n), n, range) }

    private func read(_ f: Int32, _ n: UInt32, _ range: Range<Int>) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: range.count)
        var off = 0
        while off < range.count {
            let r = try System.syscall("read \(path(n))") {
                out.withUnsafeMutableBytes { pread(f, $0.baseAddress! + off, range.count - off, off_t(range.lowerBound + off)) }
            }
            if r == 0 { throw IOError(errnoCode: EIO, reason: "read \(path(n)): short segment") }
            off += r
        }
        return out
    }

    /// Overwrites `bytes` at `offset` of segment `n` (a purge rewriting a frame).
    func overwrite(_ n: UInt32, at offset: Int, _ bytes: [UInt8]) throws { try writeAll(try fd(n), bytes, at: offset, n) }

    func sync(_ n: UInt32) throws {
        let f = try fd(n)
        _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) }
    }

    /// Removes segment `n` (never the active one).
    func remove(_ n: UInt32) throws {
        if let f = fds.removeValue(forKey: n) { Glibc.close(f) }
        _ = try System.syscall("unlink \(path(n))") { unlink(path(n)) }
        sizes[n] = nil
        syncDirectory()
    }

    func syncDirectory() {
        let d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard d >= 0 else { return }
        _ = fsync(d)
        Glibc.close(d)
    }

    /// Closes the files and releases the lock.
    func close() {
        for f in fds.values { Glibc.close(f) }
        fds.removeAll()
        if lockFD >= 0 { Glibc.close(lockFD) }
        lockFD = -1
    }
}
