import CLibUV

/// A Swift object that owns a `UVHandle` and wants to hear when libuv has finished closing it.
public protocol UVHandleOwner: AnyObject {
    /// Runs in `uv_close`'s callback, just before the handle's reference to its owner is
    /// released: the last point where the handle is still the owner's. Default: nothing.
    func handleDidClose()
}

extension UVHandleOwner {
    public func handleDidClose() {}
}

/// The one way Pylon owns a libuv handle (`uv_timer_t`, `uv_pipe_t`, `uv_tcp_t`, `uv_poll_t`, …).
///
/// Lifetime contract (libuv's rule: a handle's memory must stay valid until its close callback):
/// - `init` allocates zeroed memory for the handle; the owner then calls its libuv init
///   function on `pointer` (`uv_timer_init`, `uv_pipe_init`, …) — libuv cannot fail those on
///   Unix, and a handle must be initialized before `close`.
/// - `retain(_:)` stores a *retained* reference to the owner in `handle->data`, so C callbacks
///   reach it with `Unmanaged<Owner>.fromOpaque(h.pointee.data).takeUnretainedValue()` (one
///   hop) and the owner cannot go away while libuv may still call back.
/// - `close()` calls `uv_close` once (a second call is ignored: `uv_is_closing`). Its callback
///   calls the owner's `handleDidClose()`, then releases the reference taken by `retain`.
/// - The memory is freed when the `UVHandle` itself is destroyed, i.e. in the owner's deinit,
///   which cannot run before that release. Nothing is freed earlier.
///
/// Noncopyable: exactly one owner holds it, as a `let` property, so reading `pointer` is a
/// plain load (no exclusivity check) on hot paths.
public struct UVHandle<Handle>: ~Copyable {
    /// The handle's memory, valid for the lifetime of this value.
    public let pointer: UnsafeMutablePointer<Handle>

    /// Zeroed, uninitialized handle memory.
    public init() {
        let raw = UnsafeMutableRawPointer.allocate(
            byteCount: MemoryLayout<Handle>.size,
            alignment: MemoryLayout<Handle>.alignment)
        raw.initializeMemory(as: UInt8.self, repeating: 0, count: MemoryLayout<Handle>.size)
        pointer = raw.bindMemory(to: Handle.self, capacity: 1)
    }

    deinit { UnsafeMutableRawPointer(pointer).deallocate() }

    /// The handle as `uv_handle_t`.
    @inline(__always)
    public var base: UnsafeMutablePointer<uv_handle_t> { asHandle(pointer) }

    /// Points `handle->data` at `owner`, retained until the close callback.
    public func retain(_ owner: some UVHandleOwner) {
        precondition(base.pointee.data == nil, "UVHandle.retain called twice")
        base.pointee.data = Unmanaged.passRetained(owner as AnyObject).toOpaque()
    }

    /// True once `close()` was called (`uv_is_closing`).
    public var isClosing: Bool { uv_is_closing(base) != 0 }

    /// Closes the handle (`uv_close`); safe to call more than once. The owner's `handleDidClose`
    /// runs from libuv's close callback, on a later loop iteration.
    public func close() {
        guard uv_is_closing(base) == 0 else { return }
        uv_close(base, uvHandleClosed)
    }
}

/// `uv_close` callback shared by every `UVHandle`: tell the owner, then drop the handle's
/// reference to it (which may run the owner's deinit and free the handle's memory; libuv does
/// not touch the handle after this callback returns).
private func uvHandleClosed(_ h: UnsafeMutablePointer<uv_handle_t>?) {
    guard let h, let data = h.pointee.data else { return }
    h.pointee.data = nil
    let owner = Unmanaged<AnyObject>.fromOpaque(data).takeRetainedValue()
    (owner as? any UVHandleOwner)?.handleDidClose()
}
