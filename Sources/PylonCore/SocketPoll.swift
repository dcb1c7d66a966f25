import CLibUV

/// Watches a socket that a C library reads and writes itself (curl, libmosquitto) for
/// readiness (`uv_poll_t` via `uv_poll_init_socket`). `onEvent(status, events)` gets libuv's
/// status (negative on a poll error) and `UV_READABLE`/`UV_WRITABLE` bits.
///
/// `close()` stops watching at once (`uv_poll_stop`: the library may close or reuse the
/// descriptor right after) and frees the handle after libuv's close callback (`UVHandle`).
public final class SocketPoll: UVHandleOwner {
    let handle = UVHandle<uv_poll_t>()
    let loop: Loop
    public let fd: Int32
    public var onEvent: (_ status: Int32, _ events: Int32) -> Void
    /// The events asked for by the last `watch`, 0 when stopped.
    public private(set) var events: Int32 = 0

    public init(loop: Loop, fd: Int32, _ onEvent: @escaping (_ status: Int32, _ events: Int32) -> Void) {
        self.loop = loop
        self.fd = fd
        self.onEvent = onEvent
        uv_poll_init_socket(loop.uv, handle.pointer, fd)
        handle.retain(self)
    }

    /// Watches for `events` (`uv_poll_start`; replaces the previous set). Ignored once closed.
    public func watch(_ events: Int32) {
        loop.preconditionInLoop()
        guard !handle.isClosing else { return }
        self.events = events
        uv_poll_start(handle.pointer, events) { h, status, events in
            let p = Unmanaged<SocketPoll>.fromOpaque(h!.pointee.data).takeUnretainedValue()
            p.onEvent(status, events)
        }
    }

    /// Stops watching now and closes; safe to call more than once.
    public func close() {
        loop.preconditionInLoop()
        guard !handle.isClosing else { return }
        uv_poll_stop(handle.pointer)
        events = 0
        onEvent = { _, _ in }
        handle.close()
    }
}
