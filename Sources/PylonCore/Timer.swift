import CLibUV

/// A libuv timer (`uv_timer_t`). Call `close()` when done; the handle is freed in its close callback.
public final class Timer {
    let handle: UnsafeMutablePointer<uv_timer_t>
    public var callback: () -> Void
    private var closed = false

    public init(loop: Loop, unref: Bool = false, _ callback: @escaping () -> Void) {
        self.callback = callback
        handle = .allocate(capacity: 1)
        handle.initialize(to: uv_timer_t())
        uv_timer_init(loop.uv, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        if unref { uv_unref(asHandle(handle)) }
    }

    /// Fires once after `ms`, then every `repeatMs` if non-zero (`uv_timer_start`).
    public func start(after ms: UInt64, repeat repeatMs: UInt64 = 0) {
        guard !closed else { return }
        uv_timer_start(handle, { h in
            Unmanaged<Timer>.fromOpaque(h!.pointee.data).takeUnretainedValue().callback()
        }, ms, repeatMs)
    }
    public func stop() { if !closed { uv_timer_stop(handle) } }
    public var isActive: Bool { !closed && uv_is_active(asHandle(handle)) != 0 }

    public func close() {
        guard !closed else { return }
        closed = true
        callback = {}
        uv_close(asHandle(handle)) { h in
            let t = h!.withMemoryRebound(to: uv_timer_t.self, capacity: 1) { $0 }
            Unmanaged<Timer>.fromOpaque(t.pointee.data).release()
            t.deallocate()
        }
    }
}

/// A libuv signal watcher (`uv_signal_t`).
public final class SignalWatcher {
    let handle: UnsafeMutablePointer<uv_signal_t>
    public var callback: (Int32) -> Void
    private var closed = false

    public init(loop: Loop, signal: Int32, unref: Bool = true, _ callback: @escaping (Int32) -> Void) {
        self.callback = callback
        handle = .allocate(capacity: 1)
        handle.initialize(to: uv_signal_t())
        uv_signal_init(loop.uv, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        uv_signal_start(handle, { h, sig in
            Unmanaged<SignalWatcher>.fromOpaque(h!.pointee.data).takeUnretainedValue().callback(sig)
        }, signal)
        if unref { uv_unref(asHandle(handle)) }
    }

    public func close() {
        guard !closed else { return }
        closed = true
        uv_close(asHandle(handle)) { h in
            let s = h!.withMemoryRebound(to: uv_signal_t.self, capacity: 1) { $0 }
            Unmanaged<SignalWatcher>.fromOpaque(s.pointee.data).release()
            s.deallocate()
        }
    }
}
