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
}
