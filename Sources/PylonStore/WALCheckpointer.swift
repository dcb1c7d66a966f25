import CSQLite
import PylonCore

/// Checkpoints a WAL database whose connection (`Database`) is used on the loop, mostly on
/// libuv's thread pool through a second connection of its own, as `CheckpointSchedule` says:
/// the loop then never waits for a big checkpoint's fsyncs. It replaces SQLite's autocheckpoint
/// on that connection (`wal_autocheckpoint=0`), at the same threshold.
///
/// Guarantees are SQLite's: a checkpoint is the same `sqlite3_wal_checkpoint_v2` (PASSIVE) with
/// the same `synchronous` setting, whichever connection runs it, and a process killed during
/// one recovers from the WAL as after any crash.
public final class WALCheckpointer {
    private let db: Database
    private let loop: Loop
    private var schedule: CheckpointSchedule
    /// The second connection, used only inside pool rounds (one at a time); nil when it could not
    /// be opened or SQLite is built without thread safety (SQLite's own autocheckpoint then runs, at
    /// the same threshold, and nothing here is counted).
    private let helper: HelperConnection?
    private var closed = false

    /// Rounds run on the pool, and checkpoints the schedule left to the loop, since start.
    public private(set) var poolRounds = 0
    public private(set) var loopCheckpoints = 0
    /// Frames in the WAL after the last commit.
    public var walFrames: Int { schedule.walFrames }

    /// Takes over checkpointing of `db` (the database at `path`), whose `synchronous` setting is
    /// `synchronous` (`NORMAL` or `FULL`: the helper uses the same).
    public init(db: Database, path: String, synchronous: String, loop: Loop, limits: CheckpointSchedule.Limits = .init())
        throws(SQLiteError)
    {
        self.db = db
        self.loop = loop
        schedule = CheckpointSchedule(limits: limits)
        helper = sqlite3_threadsafe() != 0 ? HelperConnection(path: path, synchronous: synchronous) : nil
        guard helper != nil else {
            // No second connection: SQLite's own autocheckpoint, at the same threshold.
            try db.exec("PRAGMA wal_autocheckpoint=\(limits.startFrames)")
            return
        }
        try db.exec("PRAGMA wal_autocheckpoint=0")
        sqlite3_wal_hook(
            db.db,
            { ctx, _, _, frames in
                Unmanaged<WALCheckpointer>.fromOpaque(ctx!).takeUnretainedValue().committed(frames: Int(frames))
                return SQLITE_OK
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Stops checkpointing (before `db` is closed). A round still running finishes on the pool;
    /// its connection is closed when it reports back.
    public func close() {
        guard !closed else { return }
        closed = true
        if helper != nil { sqlite3_wal_hook(db.db, nil, nil) }
        if !schedule.running { helper?.close() }
    }

    /// From SQLite's WAL hook, inside the commit: at most a round is started here.
    private func committed(frames: Int) {
        perform(schedule.committed(walFrames: frames))
    }

    private func perform(_ action: CheckpointSchedule.Action) {
        switch action {
        case .none: break
        case .startRound: startRound()
        case .checkpointHere:
            checkpointHere()
            schedule.checkpointedHere()
        }
    }

    private func startRound() {
        guard let helper else { return }
        poolRounds += 1
        loop.runOnThreadPool({ helper.checkpoint() }) { [self] r in
            if closed {
                helper.close()
                return
            }
            perform(schedule.roundFinished(log: r.log, backfilled: r.backfilled, failed: !r.ok))
        }
    }

    private func checkpointHere() {
        loopCheckpoints += 1
        var log: Int32 = 0
        var backfilled: Int32 = 0
        _ = sqlite3_wal_checkpoint_v2(db.db, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &backfilled)
    }
}

/// The checkpointer's own connection. Used by one pool job at a time and by nothing else, so it
/// may move between threads (SQLite's multi-thread mode: a connection is never used by two
/// threads at once).
private final class HelperConnection: @unchecked Sendable {
    private var h: OpaquePointer?

    init?(path: String, synchronous: String) {
        var c: OpaquePointer?
        guard sqlite3_open_v2(path, &c, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK, let c,
            sqlite3_exec(c, "PRAGMA synchronous=\(synchronous)", nil, nil, nil) == SQLITE_OK,
            // A first read opens the WAL: a connection that has read nothing yet does not know
            // the database is in WAL mode, and its checkpoint would do nothing.
            sqlite3_exec(c, "SELECT 1 FROM sqlite_schema LIMIT 1", nil, nil, nil) == SQLITE_OK
        else {
            sqlite3_close(c)
            return nil
        }
        h = c
    }

    struct Result: Sendable {
        var ok: Bool
        var log: Int
        var backfilled: Int
    }

    /// `sqlite3_wal_checkpoint_v2(PASSIVE)`: copies what it can to the database without waiting
    /// for anyone, fsyncing the WAL before. SQLite fsyncs the database only after a checkpoint
    /// that copied the whole WAL (a partial one needs no fsync: the WAL still holds every
    /// frame), which under load is the loop's final one: it would then write out every page the
    /// rounds copied (measured 5-10 ms). So the round syncs the database file itself, through
    /// SQLite's own file object of this connection (`SQLITE_FCNTL_FILE_POINTER`, its `xSync`):
    /// no descriptor of our own, whose `close` would drop the POSIX locks SQLite holds on the
    /// file for the whole process.
    func checkpoint() -> Result {
        var log: Int32 = 0
        var backfilled: Int32 = 0
        let rc = sqlite3_wal_checkpoint_v2(h, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &backfilled)
        if rc == SQLITE_OK, backfilled > 0 { syncDatabaseFile() }
        return Result(ok: rc == SQLITE_OK, log: Int(log), backfilled: Int(backfilled))
    }

    func close() {
        sqlite3_close(h)
        h = nil
    }

    private func syncDatabaseFile() {
        var file: UnsafeMutablePointer<sqlite3_file>?
        guard sqlite3_file_control(h, "main", SQLITE_FCNTL_FILE_POINTER, &file) == SQLITE_OK, let file,
            let sync = file.pointee.pMethods?.pointee.xSync
        else { return }
        _ = sync(file, SQLITE_SYNC_NORMAL)
    }
}
