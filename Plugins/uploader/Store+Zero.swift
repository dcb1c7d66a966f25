import PylonCore
import PylonStore

/// Purged records' texts overwritten with zeros in the segment files (consent denied, a batch
/// set aside), and frames rewritten with their crc recomputed (the replay's repairs).
extension UploaderStore {
    /// Overwrites the texts of `recs` (gone already) with zeros: each records frame holding one
    /// is rewritten with its crc recomputed; a packed frame's text cannot be zeroed alone (the
    /// later frames of its context depend on it), so the live records of every context holding
    /// one are copied forward first (fdatasynced), then every frame of those contexts has its
    /// whole deflated payload zeroed. Then each segment touched is fdatasynced.
    func zeroTexts(_ recs: [Rec]) throws {
        var touched = Set<UInt32>()
        for c in try copyCompanionsForward(recs).sorted(by: { ($0.seg, $0.start) < ($1.seg, $1.start) }) {
            try zeroContext(c)
            touched.insert(c.seg)
        }
        var byFrame: [Int: (seg: UInt32, ranges: [Range<Int>])] = [:]
        var order: [(UInt32, Int)] = []
        for r in recs where !r.packed {
            let k = r.frame ^ (Int(r.seg) << 40)
            if byFrame[k] == nil {
                byFrame[k] = (r.seg, [])
                order.append((r.seg, r.frame))
            }
            byFrame[k]!.ranges.append(r.text..<(r.text + Int(r.len)))
        }
        for (seg, frame) in order {
            let ranges = byFrame[frame ^ (Int(seg) << 40)]!.ranges
            try rewriteFrame(seg: seg, at: frame, sync: false) { _, r in ranges.contains(r) }
            touched.insert(seg)
        }
        for s in touched.sorted() { try log.sync(s) }
    }

    /// The deflate contexts holding packed records of `recs`, once every live record sharing
    /// one with them (but `recs`) is copied forward, fdatasynced, to new contexts: the first step
    /// of zeroing them.
    func copyCompanionsForward(_ recs: [Rec]) throws -> Set<Context> {
        let contexts = Set(recs.filter(\.packed).map { Context(seg: $0.seg, start: $0.contextStart) })
        guard !contexts.isEmpty else { return [] }
        let purged = Set(recs.map(\.pos))
        // The copies go to new contexts, never to one about to be zeroed.
        packs.removeAll()
        _ = try copyRecordsForward(suffix: []) {
            $0.packed && !purged.contains($0.pos) && contexts.contains(Context(seg: $0.seg, start: $0.contextStart))
        }
        return contexts
    }

    /// Zeroes the deflated payload of every frame of context `c` (its lane's packed frames from
    /// `c.start` up to the lane's next context), in order, each with its crc recomputed; not
    /// fdatasynced.
    func zeroContext(_ c: Context) throws {
        guard let size = log.sizes[c.seg], c.start < size else { return }
        // Read in windows: a context ends long before its segment does, mostly.
        let window = zeroReadWindow
        var buf: [UInt8] = []
        var bufStart = c.start
        var lane: UInt64?
        var taken = 0
        var at = c.start
        while at + Frame.headBytes <= size, taken < UploaderStore.packContextBytes {
            if at + Frame.headBytes > bufStart + buf.count {
                bufStart = at
                buf = try log.read(c.seg, at..<min(size, at + window))
            }
            let n = Int(Chunk.u32(buf, at - bufStart))
            guard n > 0, at + Frame.headBytes + n <= size else { break }
            if at + Frame.headBytes + n > bufStart + buf.count {
                bufStart = at
                buf = try log.read(c.seg, at..<min(size, at + max(window, Frame.headBytes + n)))
            }
            defer { at += Frame.headBytes + n }
            let o = at - bufStart + Frame.headBytes
            let decoded = buf.withUnsafeBytes { Frame.decode(UnsafeRawBufferPointer(rebasing: $0[o..<(o + n)]), bodyStart: 0) }
            guard case .packed(let l, _, _, _, let lengths, let seq, _)? = decoded, lane == nil || l == lane else { continue }
            if lane != nil && seq == 0 { break }
            lane = l
            // The writer starts a new context once this one has taken `packContextBytes`.
            taken += Frame.textBytes(lengths)
            try rewriteFrame(seg: c.seg, at: at, sync: false) { _, _ in true }
        }
    }

    /// Rewrites the records frame at `offset` of segment `seg` with the texts `zeroing` picks
    /// (by position and file range) overwritten with zeros, and its crc recomputed. A packed
    /// frame has its whole deflated payload zeroed (its texts cannot be zeroed one by one); any
    /// other frame has its crc recomputed only.
    func rewriteFrame(seg: UInt32, at offset: Int, sync: Bool = true, zeroing: (Int64, Range<Int>) -> Bool) throws {
        guard log.sizes[seg] != nil else { return }
        let head = try log.read(seg, offset..<(offset + Frame.headBytes))
        let n = Int(Chunk.u32(head, 0))
        var frame = try log.read(seg, offset..<(offset + Frame.headBytes + n))
        let decoded = frame.withUnsafeBytes {
            Frame.decode(UnsafeRawBufferPointer(rebasing: $0[Frame.headBytes...]), bodyStart: offset + Frame.headBytes)
        }
        if case .records(_, let first, _, let deltas, let lengths, let textStart)? = decoded {
            var pos = first
            var at = textStart
            for (i, len) in lengths.enumerated() {
                if i > 0 { pos += Int64(deltas[i - 1]) }
                if zeroing(pos, at..<(at + len)) { for k in (at - offset)..<(at - offset + len) { frame[k] = 0 } }
                at += len + 1
            }
        } else if case .packed(_, _, _, _, _, _, let dataStart)? = decoded {
            for k in (dataStart - offset)..<frame.count { frame[k] = 0 }
        }
        Frame.seal(&frame, at: 0)
        readCursor = nil
        try log.overwrite(seg, at: offset, frame)
        if sync { try log.sync(seg) }
    }

}
