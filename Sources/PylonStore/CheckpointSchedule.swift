/// When a WAL database written on the loop is checkpointed, as a machine: it is fed the WAL's
/// size after each commit and the outcome of each checkpoint, and answers what to do. No I/O,
/// no clock (`WALCheckpointer` is the shell).
///
/// Why: SQLite's autocheckpoint runs inside the commit that crosses it, and on the loop that
/// commit then waits for the checkpoint's two fsyncs (the WAL, then the database): measured
/// 4-8 ms per 1000-page checkpoint, 16 a second under the `pylon_up` anchor, the uploader's
/// whole p99. So checkpoints run on libuv's thread pool ("rounds"), each copying what the WAL
/// gained since the last, while the loop keeps committing.
///
/// SQLite starts the WAL over (writes it again from the top) only at a commit that finds every
/// frame already in the database. Under steady load every round leaves the frames committed
/// while it ran, so the WAL grows until a round ends with nothing new (the load paused), or it
/// holds `maxFrames`: then the loop checkpoints the small tail the rounds left itself (short
/// fsyncs), and the next commit starts the WAL over.
public struct CheckpointSchedule: Equatable, Sendable {
    public struct Limits: Equatable, Sendable {
        /// A round starts once the WAL holds this many frames (pages) not yet in the database:
        /// SQLite's own autocheckpoint threshold, so the WAL is fsynced as often as before.
        public var startFrames = 1000
        /// Past this many frames the WAL is made to start over (32 MiB of 4 KiB pages; at
        /// ~16,000 frames a second, the most the uploader writes, about twice a second).
        public var maxFrames = 8192
        /// A tail of at most this many frames is checkpointed on the loop; a larger one gets
        /// another round first.
        public var finishFrames = 64
        /// Rounds in a row past `maxFrames` before the tail is checkpointed on the loop whatever
        /// its size (every round leaves one under load).
        public var maxRounds = 4

        public init(startFrames: Int = 1000, maxFrames: Int = 8192, finishFrames: Int = 64, maxRounds: Int = 4) {
            self.startFrames = startFrames
            self.maxFrames = maxFrames
            self.finishFrames = finishFrames
            self.maxRounds = maxRounds
        }
    }

    public enum Action: Equatable, Sendable {
        case none
        /// Checkpoint (PASSIVE) on the pool with a connection of its own, then report
        /// `roundFinished`.
        case startRound
        /// Checkpoint (PASSIVE) on the loop's connection now, then report `checkpointedHere`.
        case checkpointHere
    }

    public let limits: Limits
    /// Frames in the WAL after the last commit (SQLite's WAL hook).
    public private(set) var walFrames = 0
    /// Frames of the WAL already in the database (as the last round left them).
    public private(set) var backfilled = 0
    /// A round is running on the pool.
    public private(set) var running = false
    /// Rounds in a row past `maxFrames`.
    public private(set) var rounds = 0
    /// A commit happened while the round ran: the WAL holds frames the round did not see.
    private var wroteDuringRound = false

    public init(limits: Limits = Limits()) { self.limits = limits }

    /// A commit left `frames` frames in the WAL.
    public mutating func committed(walFrames frames: Int) -> Action {
        if frames < walFrames { backfilled = 0 }  // the WAL started over
        walFrames = frames
        if running {
            wroteDuringRound = true
            return .none
        }
        if frames >= limits.maxFrames { return finish() }
        return frames - backfilled >= limits.startFrames ? startRound() : .none
    }

    /// A round ended: the WAL held `log` frames when it began and `backfilled` of them are now in
    /// the database (`sqlite3_wal_checkpoint_v2`'s two counts). `failed`: the round could not
    /// checkpoint (the loop then does it, as SQLite's autocheckpoint would have).
    public mutating func roundFinished(log: Int, backfilled done: Int, failed: Bool = false) -> Action {
        running = false
        if failed {
            rounds = 0
            return .checkpointHere
        }
        backfilled = max(backfilled, done)
        // Nothing written meanwhile and all of it in the database: the next commit starts over.
        if !wroteDuringRound && done >= log { return .none }
        return walFrames >= limits.maxFrames ? finish() : .none
    }

    /// The loop checkpointed everything: the next commit starts the WAL over.
    public mutating func checkpointedHere() {
        backfilled = walFrames
        rounds = 0
    }

    /// Past `maxFrames`: the loop checkpoints a small tail, else another round shrinks it.
    private mutating func finish() -> Action {
        if walFrames - backfilled <= limits.finishFrames || rounds >= limits.maxRounds {
            rounds = 0
            return .checkpointHere
        }
        rounds += 1
        return startRound()
    }

    private mutating func startRound() -> Action {
        running = true
        wroteDuringRound = false
        return .startRound
    }
}
