import CLibUV

/// The output side of a libuv stream (`uv_pipe_t`, `uv_tcp_t`): bytes are appended to
/// `pending`; `flush()` hands them to the kernel with `uv_try_write` and queues whatever the
/// socket did not take with one `uv_write`, at most one write in flight. Used by `Connection`
/// (the bus's hot path) and the backend's `HTTPConnection`.
///
/// No allocation per write: the two buffers and the one `uv_write_t` are reused; a buffer
/// grows to the largest burst and shrinks back after a burst over 1 MiB (`ByteBuffer.clear`).
///
/// While a `uv_write` is in flight its bytes sit in a second buffer that is not touched until
/// the write callback, so `pending` can keep growing meanwhile. The callback clears it and
/// calls `onWritten(status)`; the owner flushes again from there (or closes on an error).
/// libuv calls it with `UV_ECANCELED` when the stream closes first, before the stream's close
/// callback, so the writer (owned by the stream's owner) is alive for it.
public final class StreamWriter {
    /// Bytes not yet handed to libuv. Append to it, then `flush()`.
    public let pending = ByteBuffer()
    /// Bytes of the `uv_write` in flight.
    private let inflight = ByteBuffer()
    private let request = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
    private let stream: UnsafeMutablePointer<uv_stream_t>
    /// A `uv_write` is in flight (`onWritten` will be called).
    public private(set) var isWriting = false
    /// Called from the `uv_write` callback with its status (0 or a negative libuv error), after
    /// the written bytes were dropped.
    public var onWritten: (Int32) -> Void = { _ in }

    /// A writer for `stream`, whose memory must outlive this writer's last callback (own both
    /// from the same object: the stream is freed only after its close callback, which libuv
    /// calls after the write callbacks).
    public init(stream: UnsafeMutablePointer<uv_stream_t>) {
        self.stream = stream
        request.initialize(to: uv_write_t())
        request.pointee.data = Unmanaged.passUnretained(self).toOpaque()
    }

    deinit { request.deallocate() }

    /// Bytes accepted and not yet taken by the kernel (pending plus in flight).
    public var queuedBytes: Int { pending.count + inflight.count }

    /// Writes what is pending: `uv_try_write` first, the rest with one `uv_write` (unless one
    /// is already in flight; its callback is the time to flush again). Returns 0, or the
    /// negative libuv error of a failed write (the stream is broken; the owner closes it).
    /// `UV_EAGAIN` from `uv_try_write` is not an error: everything goes to `uv_write`.
    public func flush() -> Int32 {
        guard !isWriting, pending.count > 0 else { return 0 }
        var buf = pylon_buf(pending.base.assumingMemoryBound(to: CChar.self), pending.count)
        let r = uv_try_write(stream, &buf, 1)
        if r > 0 {
            pending.consume(Int(r))
        } else if r < 0 && r != UV_EAGAIN.rawValue {
            return r
        }
        guard pending.count > 0 else { return 0 }
        // The rest goes to libuv from `inflight`, untouched until the callback.
        inflight.append(pending.bytes)
        pending.clear()
        isWriting = true
        buf = pylon_buf(inflight.base.assumingMemoryBound(to: CChar.self), inflight.count)
        let rc = uv_write(request, stream, &buf, 1) { req, status in
            Unmanaged<StreamWriter>.fromOpaque(req!.pointee.data).takeUnretainedValue().didWrite(status)
        }
        if rc < 0 {
            isWriting = false
            return rc
        }
        return 0
    }

    private func didWrite(_ status: Int32) {
        isWriting = false
        inflight.clear()
        onWritten(status)
    }

    /// Writes `bytes` only if the socket takes them now (`uv_try_write`), never queueing: a
    /// best-effort last word before closing (a refusal). Returns the bytes written or a negative
    /// libuv error.
    @discardableResult
    public func writeNowOrDrop(_ bytes: UnsafeRawBufferPointer) -> Int32 {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return 0 }
        var buf = pylon_buf(UnsafeMutableRawPointer(mutating: base).assumingMemoryBound(to: CChar.self), bytes.count)
        return uv_try_write(stream, &buf, 1)
    }
}
