import PylonCore
import PylonStore

/// The frames of the queue's segment files (docs/UPLOADER.md "On disk"), as pure values: what a
/// frame holds, its bytes, and reading a segment's bytes back into frames. No I/O here
/// (`SegmentLog` is the file side).
///
/// A frame is PylonStore's `FrameFile` frame, `u32 length | u32 crc32 | body` (the format
/// `AppendLog` writes too). The body's first byte is its kind; integers in it are unsigned
/// LEB128 varints and strings a varint length then their UTF-8 bytes (`FrameWriter`,
/// `FrameReader`).
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

    static let headBytes = FrameFile.headBytes
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

    /// Appends a frame whose body is what `body` writes (`FrameFile.append`).
    static func append(to out: inout [UInt8], _ body: (inout [UInt8]) throws -> Void) rethrows {
        try FrameFile.append(to: &out, body)
    }

    /// Writes the head of the frame starting at `start` (`FrameFile.seal`).
    static func seal(_ out: inout [UInt8], at start: Int) { FrameFile.seal(&out, at: start) }

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
            recordsHead(&o, .records, lane: lane, positions: positions, enqueuedMs: enqueuedMs, chunk: chunk)
            chunk.index.withUnsafeBytes { ix in
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
        try append(to: &out) { o in
            recordsHead(&o, .packed, lane: lane, positions: positions, enqueuedMs: enqueuedMs, chunk: chunk)
            varint(&o, seq)
            try stream.deflate(chunk.body, into: &o)
        }
    }

    /// What a records frame and a packed frame start with alike: kind, lane, first position,
    /// enqueue time, count, the other positions as deltas, each record's length.
    private static func recordsHead(
        _ o: inout [UInt8], _ kind: Kind, lane: UInt64, positions: [Int64], enqueuedMs: Int64, chunk: Chunk
    ) {
        o.append(kind.rawValue)
        varint(&o, lane)
        varint(&o, UInt64(bitPattern: positions[0]))
        varint(&o, UInt64(bitPattern: max(0, enqueuedMs)))
        varint(&o, UInt64(chunk.count))
        for i in 1..<max(1, positions.count) { varint(&o, UInt64(positions[i] - positions[i - 1])) }
        chunk.index.withUnsafeBytes { ix in
            for i in 0..<chunk.count { varint(&o, UInt64(Chunk.span(ix, i).count)) }
        }
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

    static func varint(_ out: inout [UInt8], _ v: UInt64) { FrameWriter.varint(v, to: &out) }

    static func string(_ out: inout [UInt8], _ s: String) { FrameWriter.string(s, to: &out) }

    // MARK: Reading

    /// A frame found in a segment's bytes: where it starts, its whole length (head included),
    /// whether its crc matched, and what it says (`frame`; nil when its body cannot be decoded).
    typealias Found = FrameFile.Found<Frame>

    /// The frames of a segment's bytes and where its valid part ends (`FrameFile.scan` with
    /// `.keptInside`): reading stops at the first frame that does not fit the file or whose crc
    /// and every later frame's fail (a torn tail: the caller truncates there). A frame that
    /// fits, fails its crc and is followed by frames that pass is kept with `crcOK == false` (an
    /// overwrite of purged records that a crash interrupted, or damage): its head is intact,
    /// since nothing rewrites a length.
    static func scan(_ b: UnsafeRawBufferPointer, from start: Int) -> (frames: [Found], validEnd: Int) {
        FrameFile.scan(b, from: start, damage: .keptInside) { body, at in decode(body, bodyStart: at) }
    }

    /// A frame's body (starting at file offset `bodyStart`); nil when it is not one.
    static func decode(_ b: UnsafeRawBufferPointer, bodyStart: Int) -> Frame? {
        var r = FrameReader(b, at: 1)
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
}

extension FrameFile.Found where Value == Frame {
    /// What the frame says (nil when its body cannot be decoded).
    var frame: Frame? { value }
}
