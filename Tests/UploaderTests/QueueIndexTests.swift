import PylonStore
import Testing

@testable import pylon_uploader

/// The queue's index as a value: rebuilt from segment bytes made in memory (no directory, no
/// file), changed as the store changes it, and its decisions (which records a batch takes,
/// what the reclaim does next) on hand-made shapes.
struct QueueIndexTests {
    typealias Rec = QueueIndex.Rec

    /// A chunk of records `ids` (each `{"id":"<id>","ts":1,"data":<data>}`).
    static func chunk(_ ids: [String], data: String = "1") -> Chunk {
        var c = Chunk()
        for id in ids {
            Array("\"\(id)\"".utf8).withUnsafeBytes { i in
                Array(data.utf8).withUnsafeBytes { d in _ = c.append(escapedID: i, ts: 1, data: d) }
            }
        }
        return c
    }

    /// Replays segments given as their bytes, numbered from 1.
    static func replay(_ segments: [[UInt8]]) throws -> QueueIndex.Replay.Result {
        var r = QueueIndex.Replay()
        for (i, bytes) in segments.enumerated() {
            try bytes.withUnsafeBytes { b in
                r.beginSegment(UInt32(i + 1))
                for f in Frame.scan(b, from: Frame.segmentMagic.count).frames { try r.apply(f, in: b) }
            }
        }
        return r.finish()
    }

    static func key(_ id: String) -> RecordKey { Array("\"\(id)\"".utf8).withUnsafeBytes { RecordKey($0) } }

    /// Ids of the records of `stream` in `state`, in position order.
    static func ids(_ index: QueueIndex, _ stream: String, _ state: QueueIndex.RecordState) -> [Int64] {
        (index.queues[stream]?.recs ?? []).filter { $0.state == state }.map(\.pos)
    }

    // MARK: Replay: applying frames

    /// Records frames make queued records; a cut frame puts the queued records of its runs in a
    /// batch; `final` marks it; the next position follows the highest one seen; every record's
    /// id is in the duplicate check, and the use of each segment is counted.
    @Test func framesRebuildRecordsBatchesAndCounts() throws {
        var seg = Frame.segmentMagic
        Frame.appendLane(&seg, id: 0, stream: "s", consent: "c")
        _ = Frame.appendRecords(&seg, lane: 0, positions: [0, 1, 2, 5], enqueuedMs: 7, chunk: Self.chunk(["a", "b", "c", "d"]))
        Frame.appendCut(&seg, key: "k", stream: "s", final: false, seq: 3, createdMs: 9, runs: [0...1])
        Frame.appendKeys(&seg, .final, ["k"])
        let r = try Self.replay([seg])
        let index = r.index
        #expect(r.damagedRecords == 0 && r.damaged.isEmpty && r.unreadableFrames.isEmpty)
        #expect(index.nextPosition == 6 && index.nextCutSeq == 4)
        guard let id = index.batchIDs["k"], let b = index.batch("k") else {
            Issue.record("batch k not replayed")
            return
        }
        #expect(b.final && b.positions == [0, 1] && b.cutSeg == 1)
        #expect(Self.ids(index, "s", .batched(id)) == [0, 1])
        #expect(Self.ids(index, "s", .queued) == [2, 5])
        #expect(index.records(ofBatch: "k").map(\.pos) == [0, 1])
        #expect(index.ids["s"] == Set(["a", "b", "c", "d"].map(Self.key)))
        #expect(index.segmentUse[1]?.recs == 4 && index.segmentUse[1]?.cuts == 1)
        #expect(index.segmentUseErrors(segments: [1]).isEmpty)
        #expect(index.segmentUseErrors(segments: []) == ["segment 1 removed while live"])
        #expect(index.summaries()["s"]?.queued == 2 && index.summaries()["s"]?.pendingBatches == ["k"])
    }

    /// An `ended` frame ends its batch's records (gone, out of the index); a batch whose cut
    /// frame went with a removed segment ends its queued records by the runs the frame names; a
    /// dissolved batch's records are queued again.
    @Test func endedAndDissolvedBatches() throws {
        var seg = Frame.segmentMagic
        Frame.appendLane(&seg, id: 0, stream: "s", consent: "c")
        _ = Frame.appendRecords(
            &seg, lane: 0, positions: [0, 1, 2, 3, 4, 5], enqueuedMs: 7, chunk: Self.chunk(["a", "b", "c", "d", "e", "f"]))
        Frame.appendCut(&seg, key: "k1", stream: "s", final: false, seq: 0, createdMs: 9, runs: [0...1])
        Frame.appendCut(&seg, key: "k2", stream: "s", final: false, seq: 1, createdMs: 9, runs: [2...2])
        Frame.appendEnded(&seg, [.init(key: "k1", stream: "s", runs: [0...1])], zeroed: false)
        // A batch cut in a segment no longer there.
        Frame.appendEnded(&seg, [.init(key: "gone", stream: "s", runs: [4...5])], zeroed: false)
        Frame.appendKeys(&seg, .unbatch, ["k2"])
        let index = try Self.replay([seg]).index
        #expect(index.batches.isEmpty)
        #expect(index.queues["s"]?.recs.map(\.pos) == [2, 3], "the ended records left the index")
        #expect(Self.ids(index, "s", .queued) == [2, 3])
        #expect(index.ids["s"] == Set(["c", "d"].map(Self.key)))
        #expect(index.segmentUse[1]?.recs == 2 && index.segmentUse[1]?.cuts == 0)
    }

    /// A position read twice (a record copied forward to a later segment before the older
    /// one was removed) is the first one read; the frame failing its crc is reported to be
    /// rewritten, and a record whose text does not read is counted lost unless its batch ended.
    @Test func damageAndForwardCopies() throws {
        var one = Frame.segmentMagic
        Frame.appendLane(&one, id: 0, stream: "s", consent: "c")
        let starts = Frame.appendRecords(&one, lane: 0, positions: [0, 1], enqueuedMs: 7, chunk: Self.chunk(["a", "b"]))
        Frame.appendCut(&one, key: "k", stream: "s", final: false, seq: 0, createdMs: 9, runs: [0...0])
        // Record 1's text damaged: its frame fails its crc (a whole frame follows it).
        one[starts[1] + 3] ^= 0xff
        var two = Frame.segmentMagic
        Frame.appendLane(&two, id: 0, stream: "s", consent: "c")
        _ = Frame.appendRecords(&two, lane: 0, positions: [0], enqueuedMs: 7, chunk: Self.chunk(["a"]))
        let r = try Self.replay([one, two])
        #expect(r.damaged.count == 1 && r.damaged.first?.seg == 1)
        // Record 0 read from segment 1 (its text there still reads), record 1 lost.
        #expect(r.index.queues["s"]?.recs.map(\.seg) == [1])
        #expect(r.damagedRecords == 1)
        #expect(r.index.isLive(pos: 0, seg: 1, text: starts[0]) && !r.index.isLive(pos: 0, seg: 2, text: starts[0]))
    }

    /// A record whose text is zeroed (a purge) and whose batch ended is not counted as lost;
    /// one whose text is zeroed with no ending is.
    @Test func zeroedTextsCountOnlyWhenNotEnded() throws {
        for ended in [true, false] {
            var seg = Frame.segmentMagic
            Frame.appendLane(&seg, id: 0, stream: "s", consent: "c")
            let recordsAt = seg.count
            let starts = Frame.appendRecords(&seg, lane: 0, positions: [0, 1], enqueuedMs: 7, chunk: Self.chunk(["a", "b"]))
            for i in starts[1]..<(starts[1] + 20) { seg[i] = 0 }
            // Resealed, as a purge does: the frame is whole, its text is not a record's.
            var frame = Array(seg[recordsAt...])
            Frame.seal(&frame, at: 0)
            seg.replaceSubrange(recordsAt..., with: frame)
            if ended { Frame.appendEnded(&seg, [.init(key: "x", stream: "s", runs: [1...1])], zeroed: true) }
            let r = try Self.replay([seg])
            #expect(r.damaged.isEmpty)
            #expect(r.damagedRecords == (ended ? 0 : 1))
            #expect(r.index.queues["s"]?.recs.map(\.pos) == [0])
        }
    }

    /// Packed frames are read through their lane's context: each record placed at its offset
    /// in the frame's texts, with its share of the frame.
    @Test func packedFramesPlaceRecordsInTheirContext() throws {
        var seg = Frame.segmentMagic
        Frame.appendLane(&seg, id: 0, stream: "s", consent: "c")
        let stream = try LaneDeflate.deflater()
        let first = seg.count
        try Frame.appendPacked(&seg, lane: 0, positions: [0, 1], enqueuedMs: 7, chunk: Self.chunk(["a", "b"]), seq: 0, stream: stream)
        let second = seg.count
        try Frame.appendPacked(&seg, lane: 0, positions: [2], enqueuedMs: 7, chunk: Self.chunk(["c"]), seq: 1, stream: stream)
        let recs = try Self.replay([seg]).index.queues["s"]?.recs ?? []
        #expect(recs.map(\.pos) == [0, 1, 2])
        #expect(recs.map(\.frame) == [first, first, second])
        #expect(recs.map(\.contextStart) == [first, first, first])
        // Each text `{"id":"a","ts":1,"data":1}` is 26 bytes, then a comma.
        #expect(recs.map(\.text) == [0, 27, 0])
        #expect(recs.allSatisfy { $0.packed && $0.fileBytes > 0 })
    }

    // MARK: Changes and decisions

    static func placed(_ stream: String, _ positions: [Int64], consent: Int32 = 0, len: Int32 = 10) -> [QueueIndex.Placed] {
        positions.map {
            .init(stream: stream, consent: consent, pos: $0, frame: 8, text: 16 + Int($0) * 11, len: len, key: key("\($0)"), enqueuedMs: $0)
        }
    }

    /// A batch takes the oldest queued records of one switch, within the count and the bytes;
    /// leaving the ledger it ends them (gone, their use of the segment released) or queues them
    /// again.
    @Test func batchesTakeTheOldestRecordsAndEndOrDissolve() {
        var index = QueueIndex()
        let c0 = index.consentID("a")
        let c1 = index.consentID("b")
        index.insert(
            Self.placed("s", [0, 1], consent: c0) + Self.placed("s", [2], consent: c1) + Self.placed("s", [3], consent: c0), seg: 1)
        // The oldest record's switch, stopping at a record of another.
        let pick = index.selectBatch(stream: "s", maxCount: 10, maxBytes: 1 << 20, only: nil)
        #expect(pick?.positions == [0, 1] && pick?.runs == [0...1])
        // One switch named: its records past the others, in runs.
        let only = index.selectBatch(stream: "s", maxCount: 10, maxBytes: 1 << 20, only: c0)
        #expect(only?.positions == [0, 1, 3] && only?.runs == [0...1, 3...3])
        #expect(index.selectBatch(stream: "s", maxCount: 1, maxBytes: 1 << 20, only: c0)?.positions == [0])
        #expect(index.selectBatch(stream: "s", maxCount: 10, maxBytes: 1, only: c0)?.positions == [0], "at least one")
        #expect(index.selectBatch(stream: "none", maxCount: 10, maxBytes: 1, only: nil) == nil)

        index.addBatch(.init(key: "k", stream: "s", final: false, seq: 0, createdMs: 0, runs: [0...1], positions: [0, 1], cutSeg: 2))
        #expect(index.segmentUse[2]?.cuts == 1)
        #expect(index.selectBatch(stream: "s", maxCount: 10, maxBytes: 1 << 20, only: c0)?.positions == [3], "batched records stay out")
        index.removeBatch("k", recordsGone: false)
        #expect(Self.ids(index, "s", .queued) == [0, 1, 2, 3] && index.segmentUse[2]?.cuts == 0)

        index.addBatch(.init(key: "k", stream: "s", final: false, seq: 1, createdMs: 0, runs: [0...1], positions: [0, 1], cutSeg: 2))
        let before = index.segmentUse[1]!
        let gone = index.removeBatch("k", recordsGone: true)
        #expect(gone == [Self.key("0"), Self.key("1")])
        #expect(Self.ids(index, "s", .gone) == [0, 1])
        #expect(index.segmentUse[1]!.recs == before.recs - 2)
        #expect(index.segmentUseErrors(segments: [1, 2]).isEmpty)
    }

    /// Records copied forward point at their copies; the old segment's use moves with them.
    @Test func movedRecordsAndCutsFollowTheirCopies() {
        var index = QueueIndex()
        index.insert(Self.placed("s", [0, 1, 2]), seg: 1)
        index.addBatch(.init(key: "k", stream: "s", final: false, seq: 0, createdMs: 0, runs: [2...2], positions: [2], cutSeg: 1))
        var copies = Self.placed("s", [0, 1, 2])
        for i in copies.indices { copies[i].frame = 100 }
        index.moved(copies, to: 3)
        index.movedCuts(from: 1, to: 3)
        #expect(index.queues["s"]?.recs.allSatisfy { $0.seg == 3 && $0.frame == 100 } == true)
        #expect(index.segmentUse[1] == QueueIndex.SegmentUse())
        #expect(index.segmentUse[3]?.recs == 3 && index.segmentUse[3]?.cuts == 1 && index.batch("k")?.cutSeg == 3)
        #expect(index.segmentUseErrors(segments: [1, 3]).isEmpty)
    }

    /// The reclaim: a dead oldest segment is removed; a mostly dead one (or too many bytes on
    /// disk) is copied forward; a live one stays; the active one alone, dead and past a quarter
    /// of its size, is closed so it can go.
    @Test func theReclaimDecidesFromTheSegmentsUse() {
        let max = 1000
        func step(_ index: QueueIndex, _ sizes: [UInt32: Int], active: UInt32) -> QueueIndex.ReclaimStep {
            index.nextReclaim(sizes: sizes, active: active, maxSegmentBytes: max, compactLiveFraction: 4)
        }
        var index = QueueIndex()
        #expect(step(index, [:], active: 0) == .done)
        #expect(step(index, [1: 100, 2: 50], active: 2) == .remove(1), "nothing live in the oldest")
        #expect(step(index, [1: 200], active: 1) == .done, "the active one under a quarter")
        #expect(step(index, [1: 300], active: 1) == .closeActive)
        index.insert(Self.placed("s", [0], len: 400), seg: 1)
        let live = index.segmentUse[1]!.bytes
        #expect(step(index, [1: live * 2, 2: 50], active: 2) == .done, "mostly live")
        #expect(step(index, [1: live * 4 + 1, 2: 50], active: 2) == .copyForward(1), "mostly dead")
        #expect(step(index, [1: live, 2: 2 * live + 2 * max], active: 2) == .copyForward(1), "too many bytes on disk")
        #expect(step(index, [1: live], active: 1) == .done, "the active one holds a live record")
    }

    /// A record's state is an enum, its place too, in 72 bytes.
    @Test func aRecordsStateAndPlace() {
        var r = Rec(pos: 1, seg: 2, frame: 100, text: 20, len: 10, consent: 0, enqueuedMs: 0, key: Self.key("x"))
        #expect(r.queued && !r.packed && r.contextStart == 100 && r.fileBytes == r.charge)
        r.place = .packed(context: 40, share: 7)
        r.state = .batched(3)
        #expect(!r.queued && !r.gone && r.packed && r.contextStart == 60 && r.fileBytes == 7)
        #expect(MemoryLayout<Rec>.stride == 72)
    }
}
