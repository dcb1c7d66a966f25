import PylonCore
import PylonStore
import Testing

@testable import pylon_gtm
@testable import pylon_push

#if canImport(Glibc)
import Glibc
#endif

/// A fresh temporary directory per test.
func tempDir() -> String {
    var t = Array("/tmp/pylon-storelog-XXXXXX".utf8CString)
    let p = t.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    return String(cString: p!)
}

func fileSize(_ path: String) -> Int {
    var st = stat()
    return stat(path, &st) == 0 ? Int(st.st_size) : -1
}

func appendBytes(_ path: String, _ bytes: [UInt8]) {
    let fd = open(path, O_WRONLY | O_APPEND)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress!, bytes.count) }
    close(fd)
}

func message(_ i: Int, app: String = "app") -> PushInbox.Message {
    .init(
        id: "m\(i)", appId: app, seq: Int64(i), payload: #"{"id":"m\#(i)","appId":"\#(app)","title":"Sale"}"#, expiresAt: 1 << 50,
        cold: i % 2 == 0)
}

@Suite struct AppendLogTests {
    @Test func framesReadBackInOrderAndATornTailIsCut() throws {
        let path = tempDir() + "/l"
        let log = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { _ in Issue.record("empty log has frames") }
        log.append([1, 2, 3])
        log.append([4])
        try log.commit()
        #expect(fileSize(path) == 8 + 8 + 3 + 8 + 1)
        // Half a frame, as a crash in the middle of a write leaves it.
        appendBytes(path, [200, 0, 0, 0, 9, 9])
        var got: [[UInt8]] = []
        let again = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { got.append(Array($0)) }
        #expect(got == [[1, 2, 3], [4]])
        #expect(again.truncatedBytes == 6)
        again.append([5])
        try again.commit()
        got = []
        _ = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { got.append(Array($0)) }
        #expect(got == [[1, 2, 3], [4], [5]])
    }

    @Test func aFrameFailingItsCrcEndsTheLog() throws {
        let path = tempDir() + "/l"
        let log = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { _ in }
        log.append([1, 2, 3])
        log.append([7, 7])
        try log.commit()
        // Flip a byte of the second frame's body.
        let fd = open(path, O_WRONLY)
        var b: UInt8 = 8
        _ = pwrite(fd, &b, 1, off_t(8 + 8 + 3 + 8))
        close(fd)
        var got: [[UInt8]] = []
        _ = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { got.append(Array($0)) }
        #expect(got == [[1, 2, 3]])
    }

    /// A tail of zeros (what a crash can leave of blocks allocated and never written, or what
    /// an undone commit leaves when the file cannot be cut back) is a torn tail: cut off, and
    /// the next frame follows the last whole one.
    @Test func aTailOfZerosIsCutOff() throws {
        let path = tempDir() + "/l"
        let log = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { _ in }
        log.append([1, 2, 3])
        try log.commit()
        appendBytes(path, [UInt8](repeating: 0, count: 40))
        var got: [[UInt8]] = []
        let again = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { got.append(Array($0)) }
        #expect(got == [[1, 2, 3]])
        #expect(again.truncatedBytes == 40 && fileSize(path) == 8 + 8 + 3)
        again.append([4])
        try again.commit()
        got = []
        _ = try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { got.append(Array($0)) }
        #expect(got == [[1, 2, 3], [4]])
    }

    @Test func anotherKindOfFileIsRefused() throws {
        let path = tempDir() + "/l"
        _ = System.writeFileAtomically(path, Array("SOMETHING ELSE".utf8))
        #expect(throws: IOError.self) { try AppendLog(path: path, magic: Array("TESTLOG1".utf8)) { _ in } }
    }
}

@Suite struct PushInboxTests {
    @Test func oneMessageIsOneSmallFrameAndAnAckASmallerOne() throws {
        let path = tempDir() + "/push.inbox"
        let inbox = try PushInbox(path: path, maxSeen: 100)
        let m = message(1)
        let s0 = fileSize(path)
        inbox.begin()
        #expect(try inbox.markSeen(appId: "app", keys: ["id:m1"]))
        try inbox.insert(m)
        try inbox.commit()
        let grew = fileSize(path) - s0
        #expect(grew > m.payload.utf8.count)
        #expect(grew <= m.payload.utf8.count + 60, "the message's bytes and two small frame heads, not pages")
        let s1 = fileSize(path)
        try inbox.remove(["m1"])
        #expect(fileSize(path) - s1 <= 16)
    }

    @Test func replayRestoresMessagesAndDedupKeys() throws {
        let path = tempDir() + "/push.inbox"
        do {
            let inbox = try PushInbox(path: path, maxSeen: 100)
            for i in 1...5 {
                _ = try inbox.markSeen(appId: "app", keys: ["id:m\(i)", "key:k\(i)"])
                try inbox.insert(message(i))
            }
            try inbox.remove(["m2", "m4"])
        }
        let inbox = try PushInbox(path: path, maxSeen: 100)
        #expect(inbox.entries == [message(1), message(3), message(5)])
        #expect(inbox.maxSeq == 5)
        #expect(try !inbox.markSeen(appId: "app", keys: ["id:m2"]), "an acknowledged id stays seen")
        #expect(try !inbox.markSeen(appId: "app", keys: ["id:new", "key:k3"]), "a seen msgKey is a duplicate")
        #expect(try inbox.markSeen(appId: "other", keys: ["id:m2"]), "keys are per app")
    }

    @Test func theOldestKeysAreForgottenPastMaxSeenAlsoAfterReplay() throws {
        let path = tempDir() + "/push.inbox"
        do {
            let inbox = try PushInbox(path: path, maxSeen: 3)
            for i in 1...5 { #expect(try inbox.markSeen(appId: "a", keys: ["id:\(i)"])) }
            #expect(try inbox.markSeen(appId: "a", keys: ["id:1"]), "forgotten: the 5 newest are 3, 4, 5")
        }
        let inbox = try PushInbox(path: path, maxSeen: 3)
        #expect(try !inbox.markSeen(appId: "a", keys: ["id:5"]))
        #expect(try !inbox.markSeen(appId: "a", keys: ["id:1"]), "seen again last")
        #expect(try inbox.markSeen(appId: "a", keys: ["id:3"]), "3 was forgotten when 1 came back, after replay too")
    }

    @Test func compactionKeepsWhatIsLiveAndBoundsTheFile() throws {
        let path = tempDir() + "/push.inbox"
        let inbox = try PushInbox(path: path, maxSeen: 50, compactMinBytes: 4096)
        for i in 1...2000 {
            inbox.begin()
            _ = try inbox.markSeen(appId: "app", keys: ["id:m\(i)"])
            try inbox.insert(message(i))
            try inbox.commit()
            if i % 7 != 0 { try inbox.remove(["m\(i)"]) }
        }
        #expect(inbox.compactions > 0)
        let live = inbox.entries
        #expect(live.count == 2000 / 7)
        #expect(fileSize(path) < 2 * inbox.liveEstimate + 4096 + 200)
        let again = try PushInbox(path: path, maxSeen: 50, compactMinBytes: 4096)
        #expect(again.entries == live)
        #expect(try !again.markSeen(appId: "app", keys: ["id:m2000"]))
        #expect(try again.markSeen(appId: "app", keys: ["id:m1"]), "older than the 50 newest keys")
    }

    @Test func theSQLiteInboxIsMigratedOnceAtFirstStart() throws {
        let dir = tempDir()
        let store = try PushStore(path: dir + "/push.db", maxSeen: 100)
        // As releases before the log wrote them.
        try store.db.exec(
            """
            INSERT INTO seen (app_id, key) VALUES ('app', 'id:m1'), ('app', 'id:m2'), ('b', 'key:x'), ('app', 'id:m3');
            INSERT INTO inbox (id, app_id, seq, payload, bytes, expires_at, cold) VALUES
                ('m3', 'app', 7, '{"id":"m3"}', 11, 999999999999, 1), ('m1', 'app', 5, '{"id":"m1"}', 11, 999999999999, 0);
            """)
        try PushInbox.migrate(from: store, to: dir + "/push.inbox", maxSeen: 100)
        let inbox = try PushInbox(path: dir + "/push.inbox", maxSeen: 100)
        #expect(inbox.entries.map(\.id) == ["m1", "m3"])
        #expect(inbox.entries.map(\.cold) == [false, true])
        #expect(inbox.payload("m3") == #"{"id":"m3"}"#)
        #expect(inbox.maxSeq == 7)
        #expect(try !inbox.markSeen(appId: "app", keys: ["id:m2"]))
        #expect(try !inbox.markSeen(appId: "b", keys: ["key:x"]))
        #expect(try store.db.query("SELECT count(*) FROM inbox")[0][0].int == 0)
        #expect(try store.db.query("SELECT count(*) FROM seen")[0][0].int == 0)
        // Later starts: nothing to migrate, the log is not touched.
        try inbox.remove(["m1"])
        try PushInbox.migrate(from: store, to: dir + "/push.inbox", maxSeen: 100)
        #expect(try PushInbox(path: dir + "/push.inbox", maxSeen: 100).entries.map(\.id) == ["m3"])
    }
}

@Suite struct LifetimeLogTests {
    @Test func aPushIsOneFrameAndValuesSurviveReopening() throws {
        let dir = tempDir()
        do {
            let store = try SavedStore(path: dir + "/gtm.db", nowMs: 1000)
            let s0 = fileSize(dir + "/gtm.lifetime")
            try store.persist(.uid(7), [("user.level", 5), ("user.name", "ada")], expiresAtMs: 5000, maxEntries: 10)
            #expect(fileSize(dir + "/gtm.lifetime") - s0 < 60, "one frame of the values, no pages")
            try store.persist(.uid(8), [("user.level", 9)], expiresAtMs: 3000, maxEntries: 10)
            try store.persist(.uid(7), [("user.level", 6)], expiresAtMs: 6000, maxEntries: 10)
        }
        let store = try SavedStore(path: dir + "/gtm.db", nowMs: 2000)
        let v = try store.lifetimeValues(nowMs: 2000).map { "\($0.0) \($0.1)=\($0.2.serialized)" }
        #expect(v == ["uid:7 user.name=\"ada\"", "uid:8 user.level=9", "uid:7 user.level=6"])
        let later = try SavedStore(path: dir + "/gtm.db", nowMs: 4000)
        #expect(try later.lifetimeValues(nowMs: 4000).map(\.0) == ["uid:7", "uid:7"], "uid 8's value expired")
    }

    @Test func pastMaxEntriesTheSoonestExpiringGoAndOnlyTheOwners() throws {
        let dir = tempDir()
        do {
            let store = try SavedStore(path: dir + "/gtm.db", nowMs: 0)
            try store.persist(.uid(1), [("a", 1)], expiresAtMs: 900, maxEntries: 2)
            try store.persist(.uid(2), [("z", 1)], expiresAtMs: 100, maxEntries: 2)
            try store.persist(.uid(1), [("b", 1)], expiresAtMs: 500, maxEntries: 2)
            try store.persist(.uid(1), [("c", 1)], expiresAtMs: 700, maxEntries: 2)
        }
        let store = try SavedStore(path: dir + "/gtm.db", nowMs: 0)
        #expect(Set(try store.lifetimeValues(nowMs: 0).map { "\($0.0) \($0.1)" }) == ["uid:1 a", "uid:1 c", "uid:2 z"])
    }

    @Test func compactionBoundsTheFile() throws {
        let path = tempDir() + "/gtm.lifetime"
        let log = try LifetimeLog(path: path, nowMs: 0, compactMinBytes: 2048)
        for i in 0..<1000 { try log.persist("uid:1", [("k\(i % 5)", "\(i)")], expiresAtMs: 1 << 40, maxEntries: 100) }
        #expect(log.compactions > 0)
        #expect(fileSize(path) < 2048 + 200)
        let again = try LifetimeLog(path: path, nowMs: 0)
        #expect(again.all.map { "\($0.1)=\($0.2)" } == ["k0=995", "k1=996", "k2=997", "k3=998", "k4=999"])
    }

    @Test func theSQLiteRowsAreMigratedOnceAtFirstStart() throws {
        let dir = tempDir()
        do {
            let db = try Database(path: dir + "/gtm.db")
            try db.exec(
                """
                CREATE TABLE owned_lifetime(owner TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                    expires_at INTEGER NOT NULL, PRIMARY KEY(owner, key));
                INSERT INTO owned_lifetime VALUES ('uid:3', 'user.level', '5', 9000), ('plugin:ma', 'x', '"y"', 9000),
                    ('uid:3', 'old', '1', 10);
                """)
            db.close()
        }
        let store = try SavedStore(path: dir + "/gtm.db", nowMs: 100)
        #expect(
            try store.lifetimeValues(nowMs: 100).map { "\($0.0) \($0.1)=\($0.2.serialized)" } == [
                "uid:3 user.level=5", "plugin:ma x=\"y\"",
            ])
        #expect(try store.db.query("SELECT count(*) FROM owned_lifetime")[0][0].int == 0)
        try store.persist(.uid(3), [("user.level", 6)], expiresAtMs: 9000, maxEntries: 10)
        let again = try SavedStore(path: dir + "/gtm.db", nowMs: 100)
        #expect(
            try again.lifetimeValues(nowMs: 100).map { "\($0.0) \($0.1)=\($0.2.serialized)" } == [
                "plugin:ma x=\"y\"", "uid:3 user.level=6",
            ])
    }
}
