import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// The process's one libuv loop (`uv_default_loop`). Everything Pylon does runs on it; no object
/// in Pylon is touched from another thread (checked in debug builds: `preconditionInLoop`).
///
/// A `Loop` and its two internal handles live as long as the process: it is never freed.
public final class Loop {
    public let uv: UnsafeMutablePointer<uv_loop_t>
    private var dirty: [Connection] = []
    private let prepare: UnsafeMutablePointer<uv_prepare_t>

    /// The process's loop (`uv_default_loop`).
    public convenience init() { self.init(uv: uv_default_loop()) }

    /// A loop of its own (`uv_loop_init`), for tests that run beside other loop users in one
    /// process (Swift Testing runs suites concurrently). Never freed, like the default loop.
    public static func standalone() -> Loop {
        let l = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        l.initialize(to: uv_loop_t())
        precondition(uv_loop_init(l) == 0, "uv_loop_init failed")
        return Loop(uv: l)
    }

    private init(uv: UnsafeMutablePointer<uv_loop_t>) {
        self.uv = uv
        prepare = .allocate(capacity: 1)
        prepare.initialize(to: uv_prepare_t())
        uv_prepare_init(uv, prepare)
        prepare.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        // Before the loop blocks, write out whatever timers and callbacks queued this turn.
        uv_prepare_start(prepare) { p in
            let loop = Unmanaged<Loop>.fromOpaque(p!.pointee.data).takeUnretainedValue()
            loop.turn &+= 1
            loop.flushDirty()
        }
        uv_unref(asHandle(prepare))
    }

    private var deferred: [() -> Void] = []
    private lazy var idle: UnsafeMutablePointer<uv_idle_t> = {
        let h = UnsafeMutablePointer<uv_idle_t>.allocate(capacity: 1)
        h.initialize(to: uv_idle_t())
        uv_idle_init(uv, h)
        h.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        return h
    }()

    /// Runs `work` on the next loop turn, after the I/O of this one (a zero-delay timer would run
    /// within the current timers phase if started from a timer). Used to spread a peer's work
    /// over turns.
    public func nextTurn(_ work: @escaping () -> Void) {
        preconditionInLoop()
        if deferred.isEmpty {
            uv_idle_start(idle) { h in
                let loop = Unmanaged<Loop>.fromOpaque(h!.pointee.data).takeUnretainedValue()
                let work = loop.deferred
                loop.deferred = []
                for w in work { w() }
                if loop.deferred.isEmpty { uv_idle_stop(h) }
            }
        }
        deferred.append(work)
    }

    /// Counts loop iterations (bumped before the loop blocks): "once per turn" budgets use it.
    public private(set) var turn: UInt64 = 0

    /// Milliseconds of the loop's cached monotonic clock (`uv_now`).
    public var nowMs: UInt64 { uv_now(uv) }
    /// Nanoseconds of the monotonic clock (`uv_hrtime`).
    public static var hrtimeNs: UInt64 { uv_hrtime() }

    /// Runs until no active handle remains or `stop()` is called (`uv_run(UV_RUN_DEFAULT)`).
    public func run() { running { uv_run(uv, UV_RUN_DEFAULT) } }
    /// One non-blocking iteration (`uv_run(UV_RUN_NOWAIT)`).
    public func runNoWait() { running { uv_run(uv, UV_RUN_NOWAIT) } }
    public func stop() { uv_stop(uv) }

    /// Called by a connection that has queued output; its bytes are written at the end of the
    /// current read batch (or before the loop next blocks), so many messages share one syscall.
    func markDirty(_ c: Connection) { dirty.append(c) }

    // MARK: Loop confinement (debug builds)

    #if DEBUG
    /// The thread inside `run`/`runNoWait`, if any.
    private var runner: pthread_t?
    #endif

    private func running(_ body: () -> Int32) {
        #if DEBUG
        preconditionInLoop()
        let outer = runner
        runner = pthread_self()
        defer { runner = outer }
        #endif
        _ = body()
    }

    /// Traps (debug builds only; compiled out in release) when called from a thread other than
    /// the one running this loop. Pylon objects are confined to their loop's thread; libuv
    /// calls from another thread corrupt the loop silently. While the loop is not running (set
    /// up before `run`, tests between runs) any thread may touch it.
    @inline(__always)
    public func preconditionInLoop(file: StaticString = #fileID, line: UInt = #line) {
        #if DEBUG
        if let runner, pthread_equal(runner, pthread_self()) == 0 {
            preconditionFailure("loop-confined object used off the loop's thread", file: file, line: line)
        }
        #endif
    }

    /// Writes out every connection with queued output.
    public func flushDirty() {
        while !dirty.isEmpty {
            let batch = dirty
            dirty.removeAll(keepingCapacity: true)
            for c in batch { c.flushNow() }
        }
    }
}
