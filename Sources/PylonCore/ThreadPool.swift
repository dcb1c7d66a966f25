import CLibUV

/// Work on libuv's thread pool (`uv_queue_work`): the only threads Pylon runs besides the loop's.
/// For blocking calls that must not stall the loop (an fsync), on resources the loop does not
/// touch while the work runs (the work's own SQLite connection, say).
extension Loop {
    /// Runs `work` on a pool thread, then `done` with its result on this loop. `work` must touch
    /// nothing the loop uses, only what it captured; libuv orders the two (everything `work`
    /// wrote is visible to `done`). The job cannot be cancelled: `done` always runs, also while
    /// the loop is being stopped, as long as the loop runs again.
    public func runOnThreadPool<T: Sendable>(_ work: @escaping @Sendable () -> T, done: @escaping (T) -> Void) {
        preconditionInLoop()
        let job = PoolJob(work: work, done: done)
        let req = UnsafeMutablePointer<uv_work_t>.allocate(capacity: 1)
        req.initialize(to: uv_work_t())
        req.pointee.data = Unmanaged.passRetained(job).toOpaque()
        let rc = uv_queue_work(
            uv, req,
            { r in Unmanaged<PoolJob>.fromOpaque(r!.pointee.data).takeUnretainedValue().run() },
            { r, _ in
                // Status is UV_ECANCELED only after uv_cancel, which Pylon never calls.
                let job = Unmanaged<PoolJob>.fromOpaque(r!.pointee.data).takeRetainedValue()
                r!.deinitialize(count: 1)
                r!.deallocate()
                job.finish()
            })
        precondition(rc == 0, "uv_queue_work failed")
    }
}

/// One `runOnThreadPool` job: `run` on the pool thread, `finish` on the loop after it.
private final class PoolJob {
    private let work: () -> Void
    private let done: () -> Void

    init<T: Sendable>(work: @escaping @Sendable () -> T, done: @escaping (T) -> Void) {
        let result = ResultSlot<T>()
        self.work = { result.value = work() }
        self.done = { done(result.value!) }
    }

    func run() { work() }
    func finish() { done() }
}

/// Written once by the pool thread, read once by the loop after it (ordered by libuv).
private final class ResultSlot<T>: @unchecked Sendable {
    var value: T?
}
