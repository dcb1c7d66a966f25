import Foundation
import Glibc
import PylonCore
import PylonStore
import Testing

@testable import pylon_uploader

/// The segment fuzzer's seeds (`Fuzz/corpus/segment`, written by tools/fuzz-segment-seeds.py
/// from the format as docs/UPLOADER.md states it, not by this code) replayed as the fuzz target
/// does: each becomes the queue's only segment, and opens with what it holds. The on-disk
/// format is read as written elsewhere, and the replay's accounting is consistent.
struct SegmentSeedTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus/segment").path

    /// The segment file a seed stands for (`Fuzz/segment/FuzzSegment.swift`): an even first
    /// byte, the bytes after the magic as they are; odd, frame bodies each led by a length byte,
    /// sealed here.
    static func segment(_ input: [UInt8]) -> [UInt8] {
        var file = Frame.segmentMagic
        guard input[0] & 1 == 1 else { return file + input.dropFirst() }
        var i = 1
        while i < input.count {
            let n = Int(input[i])
            i += 1
            FrameFile.frame(Array(input[i..<min(input.count, i + n)]), into: &file)
            i += n
        }
        return file
    }

    /// What each seed holds once replayed: per stream, the ids of its queued records and of
    /// its batches' (by key).
    static let expected: [String: (queued: [String: [String]], batches: [String: [String]])] = [
        "plain-records": ([:], ["k1": ["r0", "r1"]]),
        "bodies-plain": ([:], ["k1": ["r0", "r1"]]),
        "packed-context": (["seed": ["r2", "r3"]], [:]),
        "bodies-packed": (["seed": ["r2", "r3"]], [:]),
        "packed-purged": ([:], [:]),
        "two-lanes": (["a": ["r0", "r1", "r3"], "b": ["r2"]], [:]),
    ]

    @Test(arguments: expected.keys.sorted()) func aSeedReplaysAsWritten(_ name: String) throws {
        let input = try [UInt8](Data(contentsOf: URL(fileURLWithPath: Self.corpus + "/" + name)))
        let path = StoreTests.tempPath()
        let dir = UploaderStore.queueDirectory(path)
        #expect(mkdir(dir, 0o700) == 0)
        try System.writeFileAtomically(atPath: dir + "/0000000001.seg", contents: Self.segment(input))
        let store = try UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: UploaderStore.minSegmentBytes)
        defer { store.close() }
        #expect(store.damagedRecords == 0 && store.truncatedBytes == 0 && store.log.quarantinedNow.isEmpty)
        #expect(store.segmentUseErrors().isEmpty)
        let want = try #require(Self.expected[name])
        var queued: [String: [String]] = [:]
        for (stream, q) in store.index.queues {
            let recs = q.recs.filter(\.queued)
            guard !recs.isEmpty else { continue }
            var ids: [String] = []
            try store.texts(recs) { t in ids.append(RecordText.parts(t).map { String(decoding: $0.escapedID, as: UTF8.self) } ?? "?") }
            queued[stream] = ids.map { String($0.dropFirst().dropLast()) }
        }
        #expect(queued == want.queued)
        var batches: [String: [String]] = [:]
        for b in store.index.batches.values { batches[b.key] = try SegmentQueueTests.ids(store, b.key, b.stream) }
        #expect(batches == want.batches)
    }

    /// Record `i` of the seeds (tools/fuzz-segment-seeds.py `text`).
    static func seedText(_ i: Int) -> [UInt8] {
        Array(
            (#"{"id":"r\#(i)","ts":\#(1_764_612_345_678 + i),"data":{"appKey":"seed","eventName":"purchase","property":{"sku":"A-\#(i)","price":9.99}}}"#)
                .utf8)
    }

    /// The writer: the frames written for the seeds' contents are byte for byte the seeds'
    /// (written by Python's zlib with the same deflate parameters), so what this code writes is
    /// the format as documented, packed frames included.
    @Test func theWriterWritesTheSeedsBytes() throws {
        func file(_ name: String) throws -> [UInt8] {
            Self.segment(try [UInt8](Data(contentsOf: URL(fileURLWithPath: Self.corpus + "/" + name))))
        }
        func chunk(_ ids: Range<Int>) -> Chunk {
            var c = Chunk()
            for i in ids { _ = Self.seedText(i).withUnsafeBytes { c.appendText($0) } }
            return c
        }
        var plain = Frame.segmentMagic
        Frame.appendLane(&plain, id: 0, stream: "seed", consent: "analytics")
        _ = Frame.appendRecords(&plain, lane: 0, positions: [0], enqueuedMs: 1_764_612_345_000, chunk: chunk(0..<1))
        _ = Frame.appendRecords(&plain, lane: 0, positions: [1], enqueuedMs: 1_764_612_345_000, chunk: chunk(1..<2))
        Frame.appendCut(&plain, key: "k1", stream: "seed", final: false, seq: 0, createdMs: 1_764_612_346_000, runs: [0...1])
        #expect(plain == (try file("plain-records")))

        var packed = Frame.segmentMagic
        Frame.appendLane(&packed, id: 0, stream: "seed", consent: "analytics")
        let stream = try LaneDeflate.deflater()
        for i in 0..<4 {
            try Frame.appendPacked(
                &packed, lane: 0, positions: [Int64(i)], enqueuedMs: 1_764_612_345_000, chunk: chunk(i..<(i + 1)), seq: UInt64(i),
                stream: stream)
        }
        Frame.appendCut(&packed, key: "k1", stream: "seed", final: false, seq: 0, createdMs: 1_764_612_346_000, runs: [0...1])
        Frame.appendEnded(&packed, [.init(key: "k1", stream: "seed", runs: [0...1])], zeroed: false)
        #expect(packed == (try file("packed-context")))
    }
}
