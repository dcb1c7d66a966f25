import PylonPluginKit
import PylonStore
import Testing

/// Checkpoints of the queue's WAL: the schedule as a machine, and the checkpointer against a real
/// database and libuv's thread pool.
struct CheckpointTests {
    typealias Action = CheckpointSchedule.Action
    static let small = CheckpointSchedule.Limits(startFrames: 100, maxFrames: 1000, finishFrames: 10, maxRounds: 2)

    @Test func aRoundStartsAtTheThresholdAndCommitsGoOnDuringIt() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 50) == .none)
        #expect(s.committed(walFrames: 100) == .startRound)
        #expect(s.committed(walFrames: 130) == .none, "one round at a time")
        #expect(s.committed(walFrames: 160) == .none)
        // The round saw 100 frames and copied them; 60 came meanwhile: nothing to do until 100 more.
        #expect(s.roundFinished(log: 100, backfilled: 100) == .none)
        #expect(s.backfilled == 100)
        #expect(s.committed(walFrames: 199) == .none)
        #expect(s.committed(walFrames: 200) == .startRound)
    }

    @Test func aRoundWithNoCommitDuringItLetsTheWALStartOver() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 120) == .startRound)
        #expect(s.roundFinished(log: 120, backfilled: 120) == .none)
        // SQLite wrote the next commit from the top of the WAL.
        #expect(s.committed(walFrames: 3) == .none)
        #expect(s.backfilled == 0)
        #expect(s.committed(walFrames: 99) == .none)
        #expect(s.committed(walFrames: 100) == .startRound)
    }

    @Test func pastTheCapASmallTailIsCheckpointedOnTheLoop() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 900) == .startRound)
        #expect(s.committed(walFrames: 1005) == .none)
        // 5 frames came during the round: the loop copies them and the WAL starts over.
        #expect(s.roundFinished(log: 1000, backfilled: 1000) == .checkpointHere)
        s.checkpointedHere()
        #expect(s.committed(walFrames: 4) == .none)
        #expect(s.backfilled == 0)
    }

    @Test func pastTheCapALargeTailGetsRoundsFirstButAtMostMaxRounds() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 900) == .startRound)
        #expect(s.committed(walFrames: 1100) == .none)
        #expect(s.roundFinished(log: 900, backfilled: 900) == .startRound, "a 200-frame tail: one more round")
        #expect(s.committed(walFrames: 1150) == .none)
        #expect(s.roundFinished(log: 1100, backfilled: 1100) == .startRound, "50 frames: a second round")
        #expect(s.committed(walFrames: 1170) == .none)
        #expect(s.roundFinished(log: 1150, backfilled: 1150) == .checkpointHere, "maxRounds reached: the loop finishes")
        s.checkpointedHere()
        #expect(s.rounds == 0)
    }

    @Test func pastTheCapWithoutARoundRunningTheTailDecides() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 100) == .startRound)
        #expect(s.committed(walFrames: 150) == .none)
        #expect(s.roundFinished(log: 100, backfilled: 100) == .none)
        #expect(s.committed(walFrames: 195) == .none)
        // The cap is crossed with 900 frames not yet in the database: a round, not the loop.
        #expect(s.committed(walFrames: 1000) == .startRound)
        #expect(s.roundFinished(log: 1000, backfilled: 1000) == .none, "nothing written meanwhile: the WAL starts over")
    }

    @Test func aFailedRoundFallsBackToTheLoop() {
        var s = CheckpointSchedule(limits: Self.small)
        #expect(s.committed(walFrames: 100) == .startRound)
        #expect(s.roundFinished(log: -1, backfilled: -1, failed: true) == .checkpointHere)
        #expect(!s.running)
    }

    // MARK: Against SQLite and the thread pool

    /// A WAL database with one table, its checkpointer on a loop of its own.
    static func open(_ limits: CheckpointSchedule.Limits) throws -> (Database, WALCheckpointer, Loop, String) {
        let path = StoreTests.tempPath()
        let db = try Database(path: path)
        try db.exec("PRAGMA journal_mode=WAL")
        try db.exec("PRAGMA synchronous=NORMAL")
        try db.exec("CREATE TABLE t(n INTEGER, x BLOB)")
        let loop = Loop.standalone()
        let c = try WALCheckpointer(db: db, path: path, synchronous: "NORMAL", loop: loop, limits: limits)
        return (db, c, loop, path)
    }

    static let page = [UInt8](repeating: 7, count: 3000)

    /// Reopens the database: every row is there and intact.
    static func verify(_ path: String, rows: Int) throws {
        let db = try Database(path: path)
        defer { db.close() }
        #expect(try db.query("SELECT COUNT(*), SUM(n) FROM t").first == [.int(Int64(rows)), .int(Int64(rows * (rows - 1) / 2))])
        #expect(try db.query("PRAGMA integrity_check").first?[0].text == "ok")
    }

    @Test func roundsOnThePoolKeepTheWALSmallWhenTheLoopIsNotBusy() throws {
        let (db, c, loop, path) = try Self.open(.init(startFrames: 20, maxFrames: 200, finishFrames: 4, maxRounds: 2))
        var most = 0
        for i in 0..<400 {
            try db.run("INSERT INTO t VALUES(?, ?)", [.int(Int64(i)), .blob(Self.page)])
            most = max(most, c.walFrames)
            loop.run()  // a round started by this commit reports back before the next one
        }
        loop.run()
        #expect(c.poolRounds >= 10)
        #expect(c.loopCheckpoints == 0, "every round caught up: the WAL started over without the loop's help")
        #expect(most < 25, "the WAL started over after each round (most \(most) frames)")
        c.close()
        db.close()
        try Self.verify(path, rows: 400)
    }

    @Test func pastTheCapTheLoopFinishesAndTheWALStartsOver() throws {
        // No round may repeat past the cap: the loop checkpoints the tail at once.
        let (db, c, loop, path) = try Self.open(.init(startFrames: 20, maxFrames: 100, finishFrames: 4, maxRounds: 0))
        for i in 0..<200 { try db.run("INSERT INTO t VALUES(?, ?)", [.int(Int64(i)), .blob(Self.page)]) }
        #expect(c.poolRounds == 1, "one round at a time; it has not reported back yet")
        #expect(c.walFrames > 100)
        loop.run()
        #expect(c.loopCheckpoints == 1)
        try db.run("INSERT INTO t VALUES(?, ?)", [.int(200), .blob(Self.page)])
        #expect(c.walFrames < 10, "the commit after the loop's checkpoint starts the WAL over (\(c.walFrames) frames)")
        c.close()
        db.close()
        try Self.verify(path, rows: 201)
    }
}
