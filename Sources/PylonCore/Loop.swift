import CLibUV

/// The process's one libuv loop (`uv_default_loop`). Everything Pylon does runs on it; no object
/// in Pylon is touched from another thread.
public final class Loop {
    public let uv: UnsafeMutablePointer<uv_loop_t>
    private var dirty: [Connection] = []
    private let prepare: UnsafeMutablePointer<uv_prepare_t>

    public init() {
        uv = uv_default_loop()
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
    public func run() { uv_run(uv, UV_RUN_DEFAULT) }
    public func runNoWait() { uv_run(uv, UV_RUN_NOWAIT) }
    public func stop() { uv_stop(uv) }

    /// Called by a connection that has queued output; its bytes are written at the end of the
    /// current read batch (or before the loop next blocks), so many messages share one syscall.
    func markDirty(_ c: Connection) { dirty.append(c) }

    /// Writes out every connection with queued output.
    public func flushDirty() {
        while !dirty.isEmpty {
            let batch = dirty
            dirty.removeAll(keepingCapacity: true)
            for c in batch { c.flushNow() }
        }
    }
}
