import Glibc
import PylonCore
import PylonStore
import Testing

@testable import pylon_uploader

/// Segment files the queue cannot read (docs/UPLOADER.md "Quarantine"): set aside at open,
/// never followed, and the rest of the queue replayed; and the files' modes.
struct SegmentQuarantineTests {
    typealias T = StoreTests

    /// A queue of three segments, records `a0…a4`, `b0…b4` and `c0…c4` in segments 1, 2 and 3;
    /// returns the database path.
    static func threeSegments() throws -> String {
        let path = T.tempPath()
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        for (i, prefix) in ["a", "b", "c"].enumerated() {
            if i > 0 { try store.log.startSegment() }
            try T.enqueue(store, "s", T.numbered(prefix, 0..<5))
        }
        #expect(store.log.numbers == [1, 2, 3])
        return path
    }

    static func fileType(_ path: String) -> mode_t? {
        var st = stat()
        return lstat(path, &st) == 0 ? st.st_mode & S_IFMT : nil
    }

    /// What replaces segment 2: a symlink (to a valid segment: following it would replay that
    /// file's records), a dangling symlink, a directory, a FIFO, and bytes that are not a
    /// segment's. Each is renamed aside as it is (a link stays a link, its target untouched),
    /// the other segments are replayed, and the queue takes new records after them.
    @Test(arguments: ["symlink", "dangling", "directory", "fifo", "garbage"])
    func anUnreadableSegmentIsQuarantinedAndTheRestReplayed(kind: String) throws {
        let path = try Self.threeSegments()
        let dir = UploaderStore.queueDirectory(path)
        let seg2 = dir + "/0000000002.seg"
        let elsewhere = dir + "/../elsewhere.seg"
        #expect(rename(seg2, elsewhere) == 0)
        let before = try System.readFile(atPath: elsewhere, maxBytes: 1 << 20)
        switch kind {
        case "symlink": #expect(symlink(elsewhere, seg2) == 0)
        case "dangling": #expect(symlink(dir + "/nowhere", seg2) == 0)
        case "directory": #expect(mkdir(seg2, 0o700) == 0)
        case "fifo": #expect(mkfifo(seg2, 0o600) == 0)
        default: #expect(System.writeFileAtomically(seg2, Array(repeating: UInt8(ascii: "x"), count: 100)))
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.log.numbers == [1, 3])
        #expect(store.log.quarantinedNow.map(\.file) == ["0000000002.seg.quarantined"], "\(store.log.quarantinedNow)")
        #expect(store.log.quarantinedFiles == ["0000000002.seg.quarantined"])
        #expect(Self.fileType(seg2) == nil)
        let aside = dir + "/0000000002.seg.quarantined"
        let expected: [String: mode_t] = [
            "symlink": S_IFLNK, "dangling": S_IFLNK, "directory": S_IFDIR, "fifo": S_IFIFO, "garbage": S_IFREG,
        ]
        #expect(Self.fileType(aside) == expected[kind], "renamed as it is, never followed")
        #expect(try System.readFile(atPath: elsewhere, maxBytes: 1 << 20) == before, "a link's target is untouched")
        #expect(try store.summaries()["s"]?.queued == 10)
        try T.enqueue(store, "s", [("after", "1")])
        #expect(try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 11)
        #expect(
            try SegmentQueueTests.ids(store, "k") == T.numbered("a", 0..<5).map { $0.0 } + T.numbered("c", 0..<5).map { $0.0 } + ["after"])
        #expect(store.segmentUseErrors().isEmpty)
    }

    /// The case: a symlink numbered past every segment (it would be the active one).
    /// Set aside; appends go to a real segment; a second open finds nothing new to set aside
    /// but still names the file; a second file of the same name is kept beside the first.
    @Test func aSymlinkPastTheLastSegmentIsSetAsideAndNamedUntilRemoved() throws {
        let path = try Self.threeSegments()
        let dir = UploaderStore.queueDirectory(path)
        #expect(symlink("/etc/passwd", dir + "/0000000900.seg") == 0)
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            #expect(store.log.numbers == [1, 2, 3] && store.log.active == 3)
            #expect(store.log.quarantinedNow == [.init(file: "0000000900.seg.quarantined", reason: "a symbolic link")])
            try T.enqueue(store, "s", [("after", "1")])
            #expect(store.log.numbers.allSatisfy { $0 < 900 })
            store.close()
        }
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            #expect(store.log.quarantinedNow.isEmpty)
            #expect(store.log.quarantinedFiles == ["0000000900.seg.quarantined"])
            #expect(try store.summaries()["s"]?.queued == 16)
            store.close()
        }
        #expect(mkdir(dir + "/0000000900.seg", 0o700) == 0)
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.log.quarantinedNow.map(\.file) == ["0000000900.seg.quarantined.2"])
        #expect(store.log.quarantinedFiles == ["0000000900.seg.quarantined", "0000000900.seg.quarantined.2"])
    }

    /// The queue's lock planted as a symlink or a directory: set aside and made anew (nothing
    /// could have locked it: every opener uses O_NOFOLLOW), the queue opens.
    @Test(arguments: ["symlink", "directory"]) func aLockThatIsNotAFileIsSetAside(kind: String) throws {
        let path = try Self.threeSegments()
        let lock = UploaderStore.queueDirectory(path) + "/lock"
        #expect(unlink(lock) == 0)
        #expect(kind == "symlink" ? symlink("/etc/passwd", lock) == 0 : mkdir(lock, 0o700) == 0)
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.log.quarantinedNow.map(\.file) == ["lock.quarantined"])
        #expect(store.log.quarantinedFiles == ["lock.quarantined"])
        #expect(Self.fileType(lock) == S_IFREG && Self.mode(lock) == 0o600)
        #expect(try store.summaries()["s"]?.queued == 15)
    }

    /// A batch whose records were in a quarantined segment (its cut frame in a later one) keeps
    /// no record; records enqueued afterwards get positions past every one a batch names, so
    /// they never join that batch at the next open (they would, numbered from the highest
    /// position still readable).
    @Test func newRecordsNeverJoinABatchWhoseRecordsWereQuarantined() throws {
        let path = T.tempPath()
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            try T.enqueue(store, "s", T.numbered("lost", 0..<5))
            try store.log.startSegment()
            #expect(try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 5)
            store.close()
        }
        let dir = UploaderStore.queueDirectory(path)
        #expect(rename(dir + "/0000000001.seg", dir + "/held") == 0)
        #expect(mkdir(dir + "/0000000001.seg", 0o700) == 0)
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            #expect(store.log.quarantinedNow.count == 1)
            #expect(store.records(ofBatch: "k").isEmpty)
            try T.enqueue(store, "s", T.numbered("new", 0..<5))
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.records(ofBatch: "k").isEmpty, "the new records are not batch k's")
        #expect(try store.summaries()["s"]?.queued == 5)
        #expect(try store.cutBatch(stream: "s", key: "n", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 5)
        #expect(try SegmentQueueTests.ids(store, "n") == T.numbered("new", 0..<5).map { $0.0 })
    }

    static func mode(_ path: String) -> mode_t? {
        var st = stat()
        return lstat(path, &st) == 0 ? st.st_mode & 0o7777 : nil
    }

    /// Files an earlier release left 0644 (the database, its `-wal` and `-shm`, a segment and the
    /// queue's lock) are 0600 after an open, each reported once; the files created afterwards
    /// are 0600 whatever the umask.
    @Test func stateFilesAreTightenedTo0600AtOpen() throws {
        let path = T.tempPath()
        let dir = UploaderStore.queueDirectory(path)
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            try T.enqueue(store, "s", T.numbered("r", 0..<3))
            try store.recordOwner(stream: "s", owner: "uid:1", nowMs: 1)
            // Still open: the -wal and -shm exist.
            for f in [path, path + "-wal", path + "-shm", dir + "/0000000001.seg", dir + "/lock"] {
                #expect(Self.mode(f) == 0o600, "\(f)")
                #expect(chmod(f, 0o644) == 0)
            }
            // What SQLite does not close: left as a crash would leave them.
            store.log.close()
        }
        let old = umask(0o022)
        defer { umask(old) }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(Set(store.db.tightened.map(\.path)) == [path, path + "-wal", path + "-shm"])
        #expect(store.db.tightened.allSatisfy { $0.oldMode == 0o644 })
        #expect(Set(store.log.tightened.map(\.path)) == [dir + "/0000000001.seg", dir + "/lock"])
        try store.log.startSegment()
        try T.enqueue(store, "s", T.numbered("later", 0..<3))
        for f in [path, path + "-wal", path + "-shm", dir + "/0000000001.seg", dir + "/0000000002.seg", dir + "/lock"] {
            #expect(Self.mode(f) == 0o600, "\(f)")
        }
    }

    /// A database created fresh under umask 022 is 0600, its -wal and -shm too (SQLite copies
    /// the database file's mode); a symlink where the database should be is refused, not
    /// followed.
    @Test func aNewDatabaseIs0600AndASymlinkedOneIsRefused() throws {
        let old = umask(0o022)
        defer { umask(old) }
        let path = T.tempPath()
        let db = try Database(path: path)
        try db.exec("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES(1)")
        #expect(db.tightened.isEmpty)
        for f in [path, path + "-wal", path + "-shm"] { #expect(Self.mode(f) == 0o600, "\(f)") }
        db.close()
        let link = path + ".link"
        #expect(symlink(path, link) == 0)
        #expect(throws: SQLiteError.self) { try Database(path: link) }
    }
}
