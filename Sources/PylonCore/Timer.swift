import CLibUV

/// A libuv timer (`uv_timer_t`). Call `close()` when done; the handle is freed after libuv's
/// close callback (`UVHandle`). For a timer that fires once, see `Loop.after(ms:_:)`.
public final class Timer: UVHandleOwner {
    let handle = UVHandle<uv_timer_t>()
    let loop: Loop
    public var callback: () -> Void
    /// Set by `Loop.after`: the timer closes itself just before its callback runs.
    var closesWhenFired = false

    public init(loop: Loop, unref: Bool = false, _ callback: @escaping () -> Void) {
        self.loop = loop
        self.callback = callback
        uv_timer_init(loop.uv, handle.pointer)
        handle.retain(self)
        if unref { uv_unref(handle.base) }
    }

    /// Fires once after `ms`, then every `repeatMs` if non-zero (`uv_timer_start`). Restarts a
    /// running timer. Ignored once closed.
    public func start(after ms: UInt64, repeat repeatMs: UInt64 = 0) {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        uv_timer_start(
            handle.pointer,
            { h in
                Unmanaged<Timer>.fromOpaque(h!.pointee.data).takeUnretainedValue().fire()
            }, ms, repeatMs)
    }

    private func fire() {
        guard closesWhenFired else { return callback() }
        let work = callback
        close()
        work()
    }

    /// Stops the timer (`uv_timer_stop`); it can be started again.
    public func stop() {
        loop.preconditionInLoop()
        if !isClosed { uv_timer_stop(handle.pointer) }
    }
    public var isActive: Bool { !isClosed && uv_is_active(handle.base) != 0 }
    /// True once `close()` was called (or a one-shot timer fired).
    public var isClosed: Bool { handle.isClosing }

    /// Stops the timer for good and frees it; safe to call more than once. For a timer from
    /// `Loop.after`, this is how it is cancelled.
    public func close() {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        callback = {}
        handle.close()
    }

    /// Same as `close()`: reads better for a one-shot timer.
    public func cancel() { close() }
}

extension Loop {
    /// Runs `work` once, `ms` milliseconds from now (`uv_timer_start` on a timer of its own,
    /// closed when it fires). The returned timer cancels it: `cancel()` (or `close()`) before it
    /// fires and `work` never runs; after, it does nothing. Keeping the result is optional: the
    /// timer stays alive until it fires or is cancelled. `unref`: does not keep `run()` going.
    @discardableResult
    public func after(ms: UInt64, unref: Bool = false, _ work: @escaping () -> Void) -> Timer {
        let t = Timer(loop: self, unref: unref, work)
        t.closesWhenFired = true
        t.start(after: ms)
        return t
    }
}

/// A libuv signal watcher (`uv_signal_t`).
public final class SignalWatcher: UVHandleOwner {
    let handle = UVHandle<uv_signal_t>()
    public var callback: (Int32) -> Void

    public init(loop: Loop, signal: Int32, unref: Bool = true, _ callback: @escaping (Int32) -> Void) {
        self.callback = callback
        uv_signal_init(loop.uv, handle.pointer)
        handle.retain(self)
        uv_signal_start(
            handle.pointer,
            { h, sig in
                Unmanaged<SignalWatcher>.fromOpaque(h!.pointee.data).takeUnretainedValue().callback(sig)
            }, signal)
        if unref { uv_unref(handle.base) }
    }

    /// Stops watching and frees the handle; safe to call more than once.
    public func close() {
        guard !handle.isClosing else { return }
        callback = { _ in }
        handle.close()
    }
}
