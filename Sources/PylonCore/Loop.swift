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
            Unmanaged<Loop>.fromOpaque(p!.pointee.data).takeUnretainedValue().flushDirty()
        }
        uv_unref(asHandle(prepare))
    }

    /// Milliseconds of the loop's cached monotonic clock (`uv_now`).
    public var nowMs: UInt64 { uv_now(uv) }
    /// Nanoseconds of the monotonic clock (`uv_hrtime`).
    public static var hrtimeNs: UInt64 { uv_hrtime() }

    /// Runs until no active handle remains or `stop()` is called (`uv_run(UV_RUN_DEFAULT)`).
    public func run() { uv_run(uv, UV_RUN_DEFAULT) }
    public func runOnce() { uv_run(uv, UV_RUN_ONCE) }
    public func runNoWait() { uv_run(uv, UV_RUN_NOWAIT) }
    public func stop() { uv_stop(uv) }
    public func updateTime() { uv_update_time(uv) }

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
