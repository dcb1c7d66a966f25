import PylonCore
import PylonStore

/// Segments removed once nothing in them is live, or their live part copied forward first, as
/// the index decides (`QueueIndex.nextReclaim`).
extension UploaderStore {
    /// What the index's `segmentUse` should hold, counted from scratch, where it differs, and
    /// live segments removed (tests, the segment fuzzer).
    func segmentUseErrors() -> [String] { index.segmentUseErrors(segments: Set(log.numbers)) }

    /// Removes the oldest segments while nothing in them is live (never the active one); the
    /// oldest one mostly dead is copied forward first (its live records and live cut frames
    /// appended again, fdatasynced), so one stuck record does not keep every later segment.
    /// Only the oldest goes: a `done` frame is never removed while the records it ended are on
    /// disk. Also copied forward, whatever its live part, while the files hold more than twice
    /// the live records plus two segments; and an active segment past a quarter of its size
    /// with nothing live in it is closed, so it goes too.
    func reclaim() throws {
        while true {
            switch index.nextReclaim(
                sizes: log.sizes, active: log.active, maxSegmentBytes: log.maxSegmentBytes,
                compactLiveFraction: UploaderStore.compactLiveFraction)
            {
            case .done: return
            case .closeActive:
                try log.startSegment()
                packs.removeAll()  // the closed segment's deflate streams
            case .remove(let head):
                if readCursor?.c.seg == head { readCursor = nil }
                try log.remove(head)
                index.removed(head)
            case .copyForward(let head):
                try copyForward(head)
            }
        }
    }

    /// Appends segment `seg`'s live records (at their positions) and live cut frames to the
    /// active segment, fdatasynced, and points the index at the copies.
    private func copyForward(_ seg: UInt32) throws {
        var cuts: [UInt8] = []
        for b in index.batches.values.sorted(by: { $0.seq < $1.seq }) where b.cutSeg == seg {
            Frame.appendCut(&cuts, key: b.key, stream: b.stream, final: b.final, seq: b.seq, createdMs: b.createdMs, runs: b.runs)
        }
        let to = try copyRecordsForward(suffix: cuts) { $0.seg == seg }
        index.movedCuts(from: seg, to: to)
    }

    /// Appends the live records `match` picks (at their positions), then `suffix`, to the
    /// active segment with one write, fdatasynced, and points the index at the copies. Returns
    /// the segment written to.
    func copyRecordsForward(suffix: [UInt8], _ match: (Rec) -> Bool) throws -> UInt32 {
        var chunks: [(stream: String, consent: String, chunk: Chunk, positions: [Int64]?, enqueuedMs: Int64)] = []
        for (name, q) in index.queues.sorted(by: { $0.key < $1.key }) {
            var byConsent: [Int32: [Rec]] = [:]
            for r in q.recs where !r.gone && match(r) { byConsent[r.consent, default: []].append(r) }
            for (c, recs) in byConsent.sorted(by: { $0.key < $1.key }) {
                var i = 0
                while i < recs.count {
                    let part = Array(recs[i..<min(recs.count, i + Chunk.targetRecords)])
                    var chunk = Chunk()
                    try texts(part) { t in chunk.appendText(t) }
                    chunks.append((name, index.consents[Int(c)], chunk, part.map(\.pos), part.map(\.enqueuedMs).min() ?? 0))
                    i += part.count
                }
            }
        }
        let saved = index.nextPosition
        let r = try appendChunks(chunks, prefix: [], suffix: suffix, sync: true)
        index.nextPosition = saved
        index.moved(r.placed, to: r.seg)
        return r.seg
    }
}
